package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

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
	// Resolver checks that the endpoint's name resolves (nil:
	// net.DefaultResolver).
	Resolver *net.Resolver
}

// S3Store keeps objects in a bucket of an S3-compatible service.
type S3Store struct {
	cli    *minio.Client
	opts   S3Options
	prefix string // "" or "prefix/"
	// beforeComplete, when set (by tests), runs after a multipart upload's
	// parts are stored and before it is completed.
	beforeComplete func(key string)
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
	if err := resolves(ctx, o.Resolver, o.Endpoint); err != nil {
		return nil, err
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

// resolves fails at once, permanently, when endpoint's host name does not
// resolve (a typo, or the default s3.amazonaws.com where there is no
// Internet), rather than after the bucket lookup's retries.
func resolves(ctx context.Context, r *net.Resolver, endpoint string) error {
	host := endpoint
	if h, _, err := net.SplitHostPort(endpoint); err == nil {
		host = h
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r == nil {
		r = net.DefaultResolver
	}
	if _, err := r.LookupHost(rctx, host); err != nil {
		return fmt.Errorf("checkpoint: s3 endpoint %s: its name does not resolve (give ?endpoint=host:port): %w", endpoint, permanent(err))
	}
	return nil
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

// s3PartSize is the size of a multipart upload's parts; an object of at most
// this size goes up in one PUT.
const s3PartSize = 16 << 20

// s3PartThreads is how many parts of one object upload at once.
const s3PartThreads = 4

// putTokenHeader carries a random token per Put in the object's metadata, so
// that a refusal caused by this Put's own earlier attempt (a request retried
// by minio-go after its answer was lost) is recognised as success.
const putTokenHeader = "X-Amz-Meta-Phalanx-Put"

// Put uploads data under name unless an object of that name exists: the
// object appears complete or not at all, and an existing one is never
// replaced, even by concurrent puts of the same name (exactly one wins).
// The refusal is conditional on the server (If-None-Match: *), on the single
// PUT and on the completion of a multipart upload alike, so it is race-free;
// it wraps fs.ErrExist (as the local store's does) and is permanent.
// Objects over 16 MiB go up as multipart uploads, 4 parts at a time.
func (s *S3Store) Put(ctx context.Context, name string, data []byte) error {
	var nonce [12]byte
	rand.Read(nonce[:])
	token := hex.EncodeToString(nonce[:])
	key := s.key(name)
	var err error
	if len(data) <= s3PartSize {
		opts := minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true,
			UserMetadata: map[string]string{putTokenHeader: token}}
		opts.SetMatchETagExcept("*")
		_, err = s.cli.PutObject(ctx, s.opts.Bucket, key, bytes.NewReader(data), int64(len(data)), opts)
	} else {
		err = s.putMultipart(ctx, key, data, token)
	}
	if err == nil {
		return nil
	}
	if isPreconditionFailed(err) {
		if s.putLanded(ctx, key, token) {
			return nil
		}
		return fmt.Errorf("checkpoint: put %s to %s: %w", name, s.Location(),
			permanent(fmt.Errorf("object %s exists (the store refused to replace it): %w", name, fs.ErrExist)))
	}
	return fmt.Errorf("checkpoint: put %s to %s: %w", name, s.Location(), classify(err))
}

// putMultipart uploads data in parts. minio-go's own PutObject (v7.4.1)
// sends If-None-Match on the initiation of a multipart upload but drops it
// from the completion (completeUploadOpts keeps only encryption, checksum
// and replication options), so two uploads initiated before either completes
// would both succeed; here the condition goes on the completion too, where
// the server checks it under the object's lock.
func (s *S3Store) putMultipart(ctx context.Context, key string, data []byte, token string) (err error) {
	core := minio.Core{Client: s.cli}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", UserMetadata: map[string]string{putTokenHeader: token}}
	opts.SetMatchETagExcept("*") // refused early when the name exists already
	id, err := core.NewMultipartUpload(ctx, s.opts.Bucket, key, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil { // the parts of a failed upload are not left behind
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			core.AbortMultipartUpload(actx, s.opts.Bucket, key, id)
			cancel()
		}
	}()
	n := (len(data) + s3PartSize - 1) / s3PartSize
	parts := make([]minio.CompletePart, n)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error // the first part's failure, as minio-go returned it (classify reads its type)
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, s3PartThreads)
	for i := 0; i < n && pctx.Err() == nil; i++ {
		chunk := data[i*s3PartSize : min((i+1)*s3PartSize, len(data))]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			p, err := core.PutObjectPart(pctx, s.opts.Bucket, key, id, i+1, bytes.NewReader(chunk), int64(len(chunk)), minio.PutObjectPartOptions{})
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
				return
			}
			parts[i] = minio.CompletePart{PartNumber: i + 1, ETag: p.ETag}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if err := pctx.Err(); err != nil {
		return err
	}
	if s.beforeComplete != nil {
		s.beforeComplete(key)
	}
	var done minio.PutObjectOptions
	done.SetMatchETagExcept("*")
	_, err = core.CompleteMultipartUpload(ctx, s.opts.Bucket, key, id, parts, done)
	return err
}

// isPreconditionFailed reports whether the server refused a conditional
// request because its condition (here: no object of the name) failed.
func isPreconditionFailed(err error) bool {
	r := minio.ToErrorResponse(err)
	return r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed"
}

// putLanded reports whether the object under key is the one a Put with
// token wrote: its request was retried after its answer was lost.
func (s *S3Store) putLanded(ctx context.Context, key, token string) bool {
	info, err := s.cli.StatObject(ctx, s.opts.Bucket, key, minio.StatObjectOptions{})
	return err == nil && info.Metadata.Get(putTokenHeader) == token
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
	case r.StatusCode == http.StatusRequestTimeout || r.StatusCode == http.StatusTooManyRequests || r.StatusCode >= 500,
		r.Code == "ConditionalRequestConflict": // a concurrent conditional write on S3: retry

		return err
	case r.StatusCode >= 400:
		return permanent(err)
	}
	return err
}
