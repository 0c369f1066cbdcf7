package bench

import (
	"bytes"
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

// TestBenchCheckpoint runs the benchmark against a real MinIO and checks that
// it prints a row per size and leaves its prefix empty.
func TestBenchCheckpoint(t *testing.T) {
	srv := miniotest.Start(t)
	loc, err := checkpoint.ParseLocation(srv.URL("bench/ckpt"))
	if err != nil {
		t.Fatal(err)
	}
	s3 := *loc.S3
	s3.AccessKey, s3.SecretKey = srv.AccessKey, srv.SecretKey
	cfg := CheckpointConfig{S3: s3, Sizes: []int{64 << 10, 1 << 20}, Ranks: 2, Repeat: 1}
	var out bytes.Buffer
	if err := WriteCheckpoint(testContext(t), cfg, Output{W: &out}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1+len(cfg.Sizes) || !strings.HasPrefix(lines[0], "state") || !strings.HasPrefix(lines[2], "1.0 MiB      2") {
		t.Errorf("table:\n%s", out.String())
	}
	store, err := checkpoint.NewS3Store(testContext(t), s3)
	if err != nil {
		t.Fatal(err)
	}
	if left, err := store.List(testContext(t), ""); err != nil || len(left) > 0 {
		t.Errorf("left behind %v (%v)", left, err)
	}
}

func TestBenchCheckpointConfigErrors(t *testing.T) {
	good := CheckpointConfig{S3: checkpoint.S3Options{Endpoint: "127.0.0.1:1", Bucket: "b"}, Sizes: []int{64}, Ranks: 1, Repeat: 1}
	cases := []struct {
		name string
		edit func(c *CheckpointConfig)
		want string
	}{
		{"no bucket", func(c *CheckpointConfig) { c.S3.Bucket = "" }, "no bucket"},
		{"no sizes", func(c *CheckpointConfig) { c.Sizes = nil }, "no sizes"},
		{"tiny state", func(c *CheckpointConfig) { c.Sizes = []int{16} }, "size 16"},
		{"no repeats", func(c *CheckpointConfig) { c.Repeat = 0 }, "0 repeats"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.edit(&cfg)
			if _, err := Checkpoint(testContext(t), cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}
