package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain runs this test binary as a killed writer when
// PHALANX_TEST_KILLED_WRITER is set (see killedS3Writer).
func TestMain(m *testing.M) {
	if os.Getenv("PHALANX_TEST_KILLED_WRITER") != "" {
		os.Exit(killedWriterMain())
	}
	os.Exit(m.Run())
}

// halfWrittenObject is the object a writer was putting when it died; its
// content, larger than one multipart part, is what a complete Put stores.
const halfWrittenObject = "step-000000000002/shard-0000"

func halfWrittenData() []byte {
	return bytes.Repeat([]byte("half-written"), (s3PartSize+s3PartSize/2)/12)
}

// killedWriterMain puts halfWrittenObject to the S3 store the environment
// names, and announces "parts stored" on stdout once every part is
// uploaded, just before the upload would be completed; there it waits to
// be killed.
func killedWriterMain() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st, err := NewS3Store(ctx, S3Options{Endpoint: os.Getenv("PHALANX_TEST_S3_ENDPOINT"), Bucket: "phalanx",
		Prefix: os.Getenv("PHALANX_TEST_S3_PREFIX"), AccessKey: os.Getenv("PHALANX_TEST_S3_ACCESS"),
		SecretKey: os.Getenv("PHALANX_TEST_S3_SECRET"), CreateBucket: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st.beforeComplete = func(string) {
		fmt.Println("parts stored")
		<-ctx.Done() // killed here
	}
	if err := st.Put(ctx, halfWrittenObject, halfWrittenData()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("completed") // the test fails: the writer was to be killed first
	return 0
}

// killedS3Writer runs a writer process against the MinIO server at endpoint
// (store prefix prefix) and SIGKILLs it once its upload's parts are stored and
// before the upload is completed: what a writer killed mid-Put leaves.
func killedS3Writer(t *testing.T, endpoint, access, secret, prefix string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "PHALANX_TEST_KILLED_WRITER=1", "PHALANX_TEST_S3_ENDPOINT="+endpoint,
		"PHALANX_TEST_S3_PREFIX="+prefix, "PHALANX_TEST_S3_ACCESS="+access, "PHALANX_TEST_S3_SECRET="+secret)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	select {
	case l := <-line:
		if l != "parts stored" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the writer (pid %d) said %q, want \"parts stored\"", cmd.Process.Pid, l)
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the writer (pid %d) did not store its parts within 2 minutes", cmd.Process.Pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("the killed writer exited 0")
	}
}

// TestHalfWrittenObject: what a writer killed in the middle of a Put leaves
// — the local store's synced-but-unlinked temporary file, cut short; an S3
// multipart upload whose parts are stored but which was never completed —
// is not an object: List does not show it, ReadAt finds nothing, the
// objects saved before are whole, and a Put of the same name afterwards
// stores the object complete.
func TestHalfWrittenObject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	data := halfWrittenData()
	for _, tc := range []struct {
		name string
		// open returns a store holding one saved object, "step-000000000001/manifest",
		// and a writer's half-written halfWrittenObject; proof describes the
		// half-written remains, failing the test if there are none.
		open func(t *testing.T) (s Store, proof func() string)
	}{
		{"local-temporary-file", func(t *testing.T) (Store, func() string) {
			dir := t.TempDir()
			s, err := NewLocalStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Put(ctx, "step-000000000001/manifest", []byte("saved before")); err != nil {
				t.Fatal(err)
			}
			// What Put leaves when killed between writing its temporary file
			// and linking it into place: the name Put gives it, cut short.
			tmp := filepath.Join(dir, filepath.FromSlash(filepath.Dir(halfWrittenObject)),
				tmpPrefix+filepath.Base(halfWrittenObject)+"-0123456789ab")
			if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(tmp, data[:len(data)/3], 0o644); err != nil {
				t.Fatal(err)
			}
			return s, func() string {
				fi, err := os.Stat(tmp)
				if err != nil {
					t.Fatalf("the half-written file is gone: %v", err)
				}
				return fmt.Sprintf("temporary file %s of %d bytes", filepath.Base(tmp), fi.Size())
			}
		}},
		{"minio-uncompleted-upload", func(t *testing.T) (Store, func() string) {
			srv := startMinio(t)
			prefix := "halfwritten"
			st, err := NewS3Store(ctx, S3Options{Endpoint: srv.Endpoint, Bucket: "phalanx", Prefix: prefix,
				AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, CreateBucket: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Put(ctx, "step-000000000001/manifest", []byte("saved before")); err != nil {
				t.Fatal(err)
			}
			killedS3Writer(t, srv.Endpoint, srv.AccessKey, srv.SecretKey, prefix)
			return st, func() string {
				var uploads []string
				for u := range st.cli.ListIncompleteUploads(ctx, "phalanx", st.key(halfWrittenObject), true) {
					if u.Err != nil {
						t.Fatal(u.Err)
					}
					uploads = append(uploads, u.Key)
				}
				if len(uploads) != 1 {
					t.Fatalf("uncompleted uploads %v, want the killed writer's one", uploads)
				}
				return "uncompleted multipart upload of " + uploads[0]
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, proof := tc.open(t)
			t.Logf("the killed writer left: %s", proof())
			objs, err := s.List(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != 1 || objs[0].Name != "step-000000000001/manifest" || objs[0].Size != int64(len("saved before")) {
				t.Fatalf("List shows %+v, want only the object saved before", objs)
			}
			if objs, err := s.List(ctx, "step-000000000002/"); err != nil || len(objs) != 0 {
				t.Fatalf("List of the half-written object's prefix: %+v, %v; want nothing", objs, err)
			}
			if err := s.ReadAt(ctx, halfWrittenObject, make([]byte, 16), 0); !errors.Is(err, ErrNotFound) {
				t.Fatalf("ReadAt of the half-written object: %v, want ErrNotFound", err)
			}
			saved := make([]byte, len("saved before"))
			if err := s.ReadAt(ctx, "step-000000000001/manifest", saved, 0); err != nil || string(saved) != "saved before" {
				t.Fatalf("the object saved before reads %q, %v", saved, err)
			}
			// The writer's next attempt is not blocked by what the dead one left.
			if err := s.Put(ctx, halfWrittenObject, data); err != nil {
				t.Fatalf("Put after the killed writer: %v", err)
			}
			got := make([]byte, len(data))
			if err := s.ReadAt(ctx, halfWrittenObject, got, 0); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the object put again: %v (equal to the data: %v)", err, bytes.Equal(got, data))
			}
			if objs, err := s.List(ctx, ""); err != nil || len(objs) != 2 {
				t.Fatalf("List after the second Put: %+v, %v; want the two objects", objs, err)
			}
		})
	}
}
