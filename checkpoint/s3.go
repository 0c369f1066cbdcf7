package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Options address a bucket of an S3-compatible service.
type S3Options struct {
	Endpoint string // host:port
	Bucket   string
	Prefix   string // without leading or trailing slash
	Region   string
	TLS      bool
	// AccessKey and SecretKey, when set, are the credentials; otherwise the
	// usual environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
	// MINIO_ROOT_USER/MINIO_ROOT_PASSWORD, MINIO_ACCESS_KEY/MINIO_SECRET_KEY)
	// and ~/.aws/credentials are tried in that order.
	AccessKey, SecretKey, SessionToken string
	// CreateBucket creates the bucket when it is missing.
	CreateBucket bool
	// Retries is minio-go's own retry count per request (default 3; ours
	// wrap it).
	Retries int
}

// S3Store keeps objects in a bucket of an S3-compatible service.
type S3Store struct {
	cli    *minio.Client
	opts   S3Options
	prefix string // "" or "prefix/"
}

// NewS3Store connects to the bucket, creating it when missing and allowed.
func NewS3Store(ctx context.Context, o S3Options) (*S3Store, error) {
	var creds *credentials.Credentials
	if o.AccessKey != "" || o.SecretKey != "" {
		creds = credentials.NewStaticV4(o.AccessKey, o.SecretKey, o.SessionToken)
	} else {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{}, &credentials.EnvMinio{}, &minioRootEnv{}, &credentials.FileAWSCredentials{},
		})
	}
	retries := o.Retries
	if retries == 0 {
		retries = 3
	}
	cli, err := minio.New(o.Endpoint, &minio.Options{Creds: creds, Secure: o.TLS, Region: o.Region, MaxRetries: retries})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: s3 endpoint %q: %w", o.Endpoint, permanent(err))
	}
	s := &S3Store{cli: cli, opts: o}
	if o.Prefix != "" {
		s.prefix = o.Prefix + "/"
	}
	// A server still starting answers 503: retried, within ctx.
	var exists bool
	err = DefaultBackoff.do(ctx, func(ctx context.Context) error {
		var err error
		exists, err = cli.BucketExists(ctx, o.Bucket)
		return classify(err)
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: bucket %s at %s: %w", o.Bucket, o.Endpoint, classify(err))
	}
	if !exists {
		if !o.CreateBucket {
			return nil, fmt.Errorf("%w: bucket %s does not exist at %s", ErrNoLocation, o.Bucket, o.Endpoint)
		}
		if err := cli.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{Region: o.Region}); err != nil {
			if r := minio.ToErrorResponse(err); r.Code != "BucketAlreadyOwnedByYou" && r.Code != "BucketAlreadyExists" {
				return nil, fmt.Errorf("checkpoint: bucket %s does not exist at %s and could not be created: %w", o.Bucket, o.Endpoint, classify(err))
			}
		}
	}
	return s, nil
}

// minioRootEnv reads MinIO's root credentials from the environment, as a
// local MinIO is usually started with them.
type minioRootEnv struct{ credentials.Expiry }

func (e *minioRootEnv) Retrieve() (credentials.Value, error) {
	return e.RetrieveWithCredContext(nil)
}

func (e *minioRootEnv) RetrieveWithCredContext(*credentials.CredContext) (credentials.Value, error) {
	v := credentials.Value{AccessKeyID: os.Getenv("MINIO_ROOT_USER"), SecretAccessKey: os.Getenv("MINIO_ROOT_PASSWORD"), SignerType: credentials.SignatureV4}
	if v.AccessKeyID == "" || v.SecretAccessKey == "" {
		v.SignerType = credentials.SignatureAnonymous
	}
	return v, nil
}

func (e *minioRootEnv) IsExpired() bool { return false }

// Location is the store's URL, without credentials.
func (s *S3Store) Location() string { return Location{S3: &s.opts}.String() }

func (s *S3Store) key(name string) string { return s.prefix + name }

// Put uploads data; large objects go up as parallel multipart uploads.
func (s *S3Store) Put(ctx context.Context, name string, data []byte) error {
	_, err := s.cli.PutObject(ctx, s.opts.Bucket, s.key(name), bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{ContentType: "application/octet-stream", NumThreads: 4, PartSize: 16 << 20})
	if err != nil {
		return fmt.Errorf("checkpoint: put %s to %s: %w", name, s.Location(), classify(err))
	}
	return nil
}

// ReadAt reads a byte range of an object.
func (s *S3Store) ReadAt(ctx context.Context, name string, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	o := minio.GetObjectOptions{}
	if err := o.SetRange(off, off+int64(len(p))-1); err != nil {
		return permanent(err)
	}
	obj, err := s.cli.GetObject(ctx, s.opts.Bucket, s.key(name), o)
	if err != nil {
		return fmt.Errorf("checkpoint: read %s: %w", name, classify(err))
	}
	defer obj.Close()
	if _, err := io.ReadFull(obj, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("checkpoint: read %s bytes [%d,%d): %w", name, off, off+int64(len(p)), classify(err))
	}
	return nil
}

// List lists the objects under prefix.
func (s *S3Store) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	var first error
	for o := range s.cli.ListObjects(ctx, s.opts.Bucket, minio.ListObjectsOptions{Prefix: s.key(prefix), Recursive: true}) {
		if o.Err != nil {
			if first == nil {
				first = o.Err
			}
			continue
		}
		out = append(out, ObjectInfo{Name: strings.TrimPrefix(o.Key, s.prefix), Size: o.Size, Modified: o.LastModified})
	}
	if first != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", s.Location(), classify(first))
	}
	return out, nil
}

// Delete removes an object.
func (s *S3Store) Delete(ctx context.Context, name string) error {
	if err := s.cli.RemoveObject(ctx, s.opts.Bucket, s.key(name), minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("checkpoint: delete %s: %w", name, classify(err))
	}
	return nil
}

// classify marks the errors no retry can mend as permanent and a missing
// object as ErrNotFound.
func classify(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	r := minio.ToErrorResponse(err)
	switch {
	case r.Code == "NoSuchKey" || r.Code == "NoSuchBucket":
		return fmt.Errorf("%w: %s", ErrNotFound, r.Message)
	case r.StatusCode == http.StatusRequestTimeout || r.StatusCode == http.StatusTooManyRequests || r.StatusCode >= 500:
		return err
	case r.StatusCode >= 400:
		return permanent(err)
	}
	return err
}
