package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

// stores returns a local store and a store on a real MinIO server, each
// fresh, for table-driven tests.
func stores(t *testing.T) map[string]Store {
	t.Helper()
	local, err := NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return map[string]Store{"local": local, "minio": minioStore(t, startMinio(t), "ckpt/"+strings.ToLower(t.Name()))}
}

func startMinio(t *testing.T) *miniotest.Server { return miniotest.Start(t) }

func minioStore(t *testing.T, s *miniotest.Server, prefix string) Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := NewS3Store(ctx, S3Options{Endpoint: s.Endpoint, Bucket: "phalanx", Prefix: strings.ReplaceAll(prefix, "/", "-"),
		AccessKey: s.AccessKey, SecretKey: s.SecretKey, CreateBucket: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStoreSemantics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			data := bytes.Repeat([]byte("phalanx!"), 1<<17) // 1 MiB
			if err := s.Put(ctx, "a/one", data); err != nil {
				t.Fatal(err)
			}
			if err := s.Put(ctx, "a/two", []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := s.Put(ctx, "b/three", nil); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 100)
			if err := s.ReadAt(ctx, "a/one", got, 1000); err != nil || !bytes.Equal(got, data[1000:1100]) {
				t.Fatalf("range read: %v", err)
			}
			if err := s.ReadAt(ctx, "a/one", make([]byte, 10), int64(len(data))-5); err == nil {
				t.Fatal("a read past the end succeeded")
			}
			if err := s.ReadAt(ctx, "a/none", got, 0); !errors.Is(err, ErrNotFound) {
				t.Fatalf("missing object: %v, want ErrNotFound", err)
			}
			objs, err := s.List(ctx, "a/")
			if err != nil || len(objs) != 2 || objs[0].Name != "a/one" || objs[0].Size != int64(len(data)) || objs[1].Name != "a/two" {
				t.Fatalf("list a/: %+v %v", objs, err)
			}
			if err := s.Delete(ctx, "a/one"); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, "a/one"); err != nil {
				t.Fatalf("deleting a missing object: %v", err)
			}
			if objs, _ := s.List(ctx, "a/"); len(objs) != 1 {
				t.Fatalf("after delete: %+v", objs)
			}
		})
	}
}

// TestLocalStoreNeverReplaces: an existing object is never overwritten, and
// names of temporary files are refused. (What a killed writer leaves:
// TestHalfWrittenObject.)
func TestLocalStoreNeverReplaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "x/y", []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "x/y", []byte("second")); err == nil {
		t.Fatal("a second put of the same name succeeded")
	}
	got := make([]byte, 5)
	if err := s.ReadAt(ctx, "x/y", got, 0); err != nil || string(got) != "first" {
		t.Fatalf("got %q %v", got, err)
	}
	for _, bad := range []string{"", "/abs", "../up", "a//b", "a/./b", "x/.tmp-y"} {
		if err := s.Put(ctx, bad, nil); err == nil {
			t.Errorf("put %q succeeded", bad)
		}
	}
	objs, _ := s.List(ctx, "")
	if len(objs) != 1 {
		t.Fatalf("list: %+v", objs)
	}
}

func TestParseLocation(t *testing.T) {
	for _, tc := range []struct {
		in      string
		dir     string
		s3      *S3Options
		wantErr string
	}{
		{in: "./ckpt", dir: "./ckpt"},
		{in: "/var/ckpt", dir: "/var/ckpt"},
		{in: "file:///var/ckpt", dir: "/var/ckpt"},
		{in: "s3://bucket/a/b?endpoint=127.0.0.1:9000", s3: &S3Options{Bucket: "bucket", Prefix: "a/b", Endpoint: "127.0.0.1:9000", CreateBucket: true}},
		{in: "s3://bucket?endpoint=minio.example:9000", s3: &S3Options{Bucket: "bucket", Endpoint: "minio.example:9000", TLS: true, CreateBucket: true}},
		{in: "s3://bucket/p/?endpoint=localhost:9000&tls=true&region=eu-west-1&create-bucket=false", s3: &S3Options{Bucket: "bucket", Prefix: "p", Endpoint: "localhost:9000", TLS: true, Region: "eu-west-1"}},
		{in: "s3://bucket/p", s3: &S3Options{Bucket: "bucket", Prefix: "p", Endpoint: "s3.amazonaws.com", TLS: true, CreateBucket: true}},
		{in: "", wantErr: "empty"},
		{in: "gs://bucket/p", wantErr: `scheme "gs"`},
		{in: "s3://Bad_Bucket/p?endpoint=127.0.0.1:9000", wantErr: "bucket"},
		{in: "s3://key:secret@bucket/p", wantErr: "credentials do not belong"},
		{in: "s3://bucket/p?endpiont=x:1", wantErr: `unknown parameter "endpiont"`},
		{in: "s3://bucket/p?tls=maybe", wantErr: "tls"},
		{in: "s3://bucket/a//b", wantErr: "empty component"},
		{in: "file://host/dir", wantErr: "file:///"},
	} {
		l, err := ParseLocation(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want one saying %q", tc.in, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("%q: the error shows the secret: %v", tc.in, err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.s3 == nil && (l.S3 != nil || l.Dir != tc.dir):
			t.Errorf("%q: got %+v, want directory %q", tc.in, l, tc.dir)
		case tc.s3 != nil && (l.S3 == nil || *l.S3 != *tc.s3):
			t.Errorf("%q: got %+v, want %+v", tc.in, l.S3, tc.s3)
		}
	}
}

func TestS3BucketMissingAndNotAllowed(t *testing.T) {
	srv := startMinio(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := NewS3Store(ctx, S3Options{Endpoint: srv.Endpoint, Bucket: "absent", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err == nil || !strings.Contains(err.Error(), "bucket absent does not exist") {
		t.Fatalf("got %v", err)
	}
	_, err = NewS3Store(ctx, S3Options{Endpoint: srv.Endpoint, Bucket: "absent", AccessKey: srv.AccessKey, SecretKey: "wrong", CreateBucket: true, Retries: 1})
	if err == nil || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("bad credentials: got %v (and the secret must never be shown)", err)
	}
	t.Log("bad credentials:", err)
}

// TestS3EndpointMustResolve: an endpoint whose name does not resolve fails
// the store's opening at once, naming the endpoint, as a permanent error
// (no retries), rather than after the bucket lookup's backoff. The names
// are asked of a loopback port where no resolver answers.
func TestS3EndpointMustResolve(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent := pc.LocalAddr().String()
	pc.Close() // nobody answers there: every lookup fails
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", silent)
	}}
	ctx := testContext(t)
	for _, endpoint := range []string{"minio.example:9000", "s3.amazonaws.com"} {
		_, err := NewS3Store(ctx, S3Options{Endpoint: endpoint, Bucket: "b", Resolver: r})
		if err == nil || !strings.Contains(err.Error(), "s3 endpoint "+endpoint+": its name does not resolve") || !isPermanent(err) {
			t.Errorf("endpoint %s: %v, want a permanent error saying its name does not resolve", endpoint, err)
		}
	}
	// An address needs no name: the check passes it (the bucket lookup
	// then meets a closed port).
	if err := resolves(ctx, r, "127.0.0.1:9"); err != nil {
		t.Errorf("an IP endpoint: %v", err)
	}
}
