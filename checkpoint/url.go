package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7/pkg/s3utils"
)

// Credentials are S3 credentials given explicitly (flags); empty fields
// leave them to the environment.
type Credentials struct {
	AccessKey, SecretKey, SessionToken string
}

// Location is a parsed --checkpoint address: a local directory, or a bucket
// and prefix of an S3-compatible service.
type Location struct {
	Dir string     // local
	S3  *S3Options // or S3
}

// ParseLocation parses "s3://bucket/prefix?endpoint=host:port[&region=R][&tls=true|false]"
// or a directory ("./dir", "/abs/dir", "file:///abs/dir"). The endpoint
// defaults to s3.amazonaws.com; TLS defaults to off for a loopback endpoint
// and on otherwise.
func ParseLocation(raw string) (Location, error) {
	if raw == "" {
		return Location{}, fmt.Errorf("checkpoint: empty location")
	}
	if !strings.Contains(raw, "://") {
		return Location{Dir: raw}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Location{}, fmt.Errorf("checkpoint: location %q: %w", raw, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.Path == "" || len(u.Query()) > 0 {
			return Location{}, fmt.Errorf("checkpoint: location %q: want file:///absolute/dir", raw)
		}
		return Location{Dir: u.Path}, nil
	case "s3":
	default:
		return Location{}, fmt.Errorf("checkpoint: location %q: scheme %q: want s3:// or a directory", raw, u.Scheme)
	}
	if u.User != nil {
		return Location{}, fmt.Errorf("checkpoint: location %q: credentials do not belong in the URL; use the flags or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY", redact(u))
	}
	o := &S3Options{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"), Endpoint: "s3.amazonaws.com", CreateBucket: true}
	if err := s3utils.CheckValidBucketNameStrict(o.Bucket); err != nil {
		return Location{}, fmt.Errorf("checkpoint: location %q: bucket %q: %w", raw, o.Bucket, err)
	}
	if strings.Contains(o.Prefix, "//") {
		return Location{}, fmt.Errorf("checkpoint: location %q: empty component in prefix %q", raw, o.Prefix)
	}
	tls := ""
	for k, vs := range u.Query() {
		if len(vs) != 1 {
			return Location{}, fmt.Errorf("checkpoint: location %q: %s given %d times", raw, k, len(vs))
		}
		switch v := vs[0]; k {
		case "endpoint":
			if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
				if strings.Contains(v, ":") || v == "" {
					return Location{}, fmt.Errorf("checkpoint: location %q: endpoint %q: want host or host:port", raw, v)
				}
			}
			o.Endpoint = v
		case "region":
			o.Region = v
		case "tls":
			tls = v
		case "create-bucket":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return Location{}, fmt.Errorf("checkpoint: location %q: create-bucket=%q: want true or false", raw, v)
			}
			o.CreateBucket = b
		default:
			return Location{}, fmt.Errorf("checkpoint: location %q: unknown parameter %q (known: endpoint, region, tls, create-bucket)", raw, k)
		}
	}
	o.TLS = !isLoopback(o.Endpoint)
	if tls != "" {
		b, err := strconv.ParseBool(tls)
		if err != nil {
			return Location{}, fmt.Errorf("checkpoint: location %q: tls=%q: want true or false", raw, tls)
		}
		o.TLS = b
	}
	return Location{S3: o}, nil
}

func isLoopback(endpoint string) bool {
	host := endpoint
	if h, _, err := net.SplitHostPort(endpoint); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func redact(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// String is the location as a URL or directory, without credentials.
func (l Location) String() string {
	if l.S3 == nil {
		return l.Dir
	}
	s := "s3://" + l.S3.Bucket
	if l.S3.Prefix != "" {
		s += "/" + l.S3.Prefix
	}
	return s + "?endpoint=" + l.S3.Endpoint
}

// Open opens the store at l with the given explicit credentials.
func Open(ctx context.Context, l Location, c Credentials) (Store, error) {
	if l.S3 == nil {
		return NewLocalStore(l.Dir)
	}
	o := *l.S3
	o.AccessKey, o.SecretKey, o.SessionToken = c.AccessKey, c.SecretKey, c.SessionToken
	return NewS3Store(ctx, o)
}

// ErrNoLocation: a store's directory or bucket does not exist.
var ErrNoLocation = errors.New("checkpoint: no such location")

// OpenExisting opens the store at raw without creating anything: a
// directory or bucket that does not exist is an error wrapping
// ErrNoLocation. Tools that only read or delete open stores so.
func OpenExisting(ctx context.Context, raw string, c Credentials) (Store, error) {
	l, err := ParseLocation(raw)
	if err != nil {
		return nil, err
	}
	if l.S3 != nil {
		l.S3.CreateBucket = false
		return Open(ctx, l, c)
	}
	st, err := os.Stat(l.Dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%w: directory %s does not exist", ErrNoLocation, l.Dir)
	case err != nil:
		return nil, fmt.Errorf("checkpoint: directory %s: %w", l.Dir, err)
	case !st.IsDir():
		return nil, fmt.Errorf("checkpoint: %s is not a directory", l.Dir)
	}
	return Open(ctx, l, c)
}

// OpenURL parses raw and opens its store.
func OpenURL(ctx context.Context, raw string, c Credentials) (Store, error) {
	l, err := ParseLocation(raw)
	if err != nil {
		return nil, err
	}
	return Open(ctx, l, c)
}
