package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
)

// pattern is n bytes that differ for each seed, so that whose bytes an
// object holds can be told.
func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*7+i>>9)
	}
	return b
}

// readAll reads the whole object name, which must be want's size.
func readAll(t *testing.T, ctx context.Context, s Store, name string, size int) []byte {
	t.Helper()
	objs, err := s.List(ctx, name)
	if err != nil || len(objs) != 1 || objs[0].Size != int64(size) {
		t.Fatalf("list %s: %+v %v, want one object of %d bytes", name, objs, err, size)
	}
	got := make([]byte, size)
	if err := s.ReadAt(ctx, name, got, 0); err != nil {
		t.Fatal(err)
	}
	return got
}

// conditionalSizes are a single-PUT object and one that goes up as a
// multipart upload (two parts).
var conditionalSizes = []struct {
	name string
	size int
}{
	{"small", 1000},
	{"multipart", s3PartSize + 1<<20 + 3},
}

// TestPutNeverReplaces: a second put of an existing name fails, on S3 as on
// a local directory, with an error that wraps fs.ErrExist, names the object
// and is not retried; the first object's bytes are intact.
func TestPutNeverReplaces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for storeName, s := range stores(t) {
		for _, sz := range conditionalSizes {
			t.Run(storeName+"/"+sz.name, func(t *testing.T) {
				name := "twice/" + sz.name
				first := pattern(1, sz.size)
				if err := s.Put(ctx, name, first); err != nil {
					t.Fatal(err)
				}
				retries := 0
				err := Backoff{First: time.Millisecond, Max: time.Millisecond}.do(ctx, func(ctx context.Context) error {
					return s.Put(ctx, name, pattern(2, sz.size))
				}, func(int, error) { retries++ })
				switch {
				case err == nil:
					t.Fatal("a second put of the same name succeeded")
				case !errors.Is(err, fs.ErrExist):
					t.Fatalf("second put: %v, want an error wrapping fs.ErrExist", err)
				case !isPermanent(err) || retries != 0:
					t.Fatalf("second put retried %d times (permanent: %v): %v", retries, isPermanent(err), err)
				case !strings.Contains(err.Error(), name):
					t.Fatalf("the error does not name the object %s: %v", name, err)
				}
				t.Log(err)
				if got := readAll(t, ctx, s, name, sz.size); !bytes.Equal(got, first) {
					t.Fatal("the first object's bytes changed")
				}
			})
		}
	}
}

// TestS3ConcurrentPutsOneWins: several goroutines put one name at once;
// exactly one succeeds, the others get fs.ErrExist, and the object holds
// the winner's bytes.
func TestS3ConcurrentPutsOneWins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := minioStore(t, startMinio(t), "concurrent")
	const writers = 4
	for _, sz := range conditionalSizes {
		t.Run(sz.name, func(t *testing.T) {
			name := "race/" + sz.name
			start := make(chan struct{})
			errs := make([]error, writers)
			var wg sync.WaitGroup
			for i := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = s.Put(ctx, name, pattern(byte(10+i), sz.size))
				}()
			}
			close(start)
			wg.Wait()
			winner := -1
			for i, err := range errs {
				switch {
				case err == nil && winner >= 0:
					t.Fatalf("puts %d and %d of the same name both succeeded", winner, i)
				case err == nil:
					winner = i
				case !errors.Is(err, fs.ErrExist):
					t.Fatalf("put %d: %v, want fs.ErrExist", i, err)
				}
			}
			if winner < 0 {
				t.Fatalf("no put succeeded: %v", errs)
			}
			if got := readAll(t, ctx, s, name, sz.size); !bytes.Equal(got, pattern(byte(10+winner), sz.size)) {
				t.Fatalf("the object does not hold the bytes of put %d, the one that succeeded", winner)
			}
		})
	}
}

// TestS3MultipartRefusedAtCompletion: two multipart puts of one name both
// store their parts before either completes (each waits at the completion
// until both are there), so the existence check at initiation passes for
// both; the condition on the completion still lets exactly one through.
// minio-go's own PutObject (v7.4.1) drops If-None-Match from the
// completion and would let both succeed.
func TestS3MultipartRefusedAtCompletion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := minioStore(t, startMinio(t), "completion").(*S3Store)
	const writers = 2
	arrived, release := make(chan struct{}, writers), make(chan struct{})
	s.beforeComplete = func(string) {
		arrived <- struct{}{}
		<-release
	}
	size := s3PartSize + 5
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Put(ctx, "both/parts", pattern(byte(20+i), size))
		}()
	}
	for range writers {
		select {
		case <-arrived:
		case <-ctx.Done():
			t.Fatalf("the uploads did not both reach their completion: %v", ctx.Err())
		}
	}
	close(release)
	wg.Wait()
	ok := 0
	for i, err := range errs {
		if err == nil {
			ok++
			if got := readAll(t, ctx, s, "both/parts", size); !bytes.Equal(got, pattern(byte(20+i), size)) {
				t.Fatalf("the object does not hold the bytes of put %d, the one that succeeded", i)
			}
		} else if !errors.Is(err, fs.ErrExist) {
			t.Fatalf("put %d: %v, want fs.ErrExist", i, err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d of %d puts succeeded, want exactly one: %v", ok, writers, errs)
	}
	// The loser's parts went with its aborted upload.
	if n := countIncomplete(t, ctx, s); n != 0 {
		t.Fatalf("%d incomplete uploads left behind", n)
	}
}

func countIncomplete(t *testing.T, ctx context.Context, s *S3Store) int {
	t.Helper()
	n := 0
	for u := range s.cli.ListIncompleteUploads(ctx, s.opts.Bucket, s.prefix, true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		n++
	}
	return n
}

// TestS3PutRecognisesItsOwnObject: a refusal caused by the same Put's own
// earlier attempt (its answer lost, the request retried) is told from an
// object someone else wrote by the token each Put stores with its object.
func TestS3PutRecognisesItsOwnObject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := minioStore(t, startMinio(t), "token").(*S3Store)
	for _, sz := range conditionalSizes {
		name := "token/" + sz.name
		if err := s.Put(ctx, name, pattern(3, sz.size)); err != nil {
			t.Fatal(err)
		}
		info, err := s.cli.StatObject(ctx, s.opts.Bucket, s.key(name), minio.StatObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		token := info.Metadata.Get(putTokenHeader)
		if len(token) != 24 {
			t.Fatalf("%s: stored token %q, want 24 hex digits", name, token)
		}
		if !s.putLanded(ctx, s.key(name), token) || s.putLanded(ctx, s.key(name), strings.Repeat("0", 24)) {
			t.Fatalf("%s: putLanded does not tell its own object from another's", name)
		}
	}
}
