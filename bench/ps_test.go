package bench

import (
	"strings"
	"testing"
	"time"
)

func TestBenchPS(t *testing.T) {
	cases := []PSConfig{
		{Workers: 1, Shards: 1, Keys: 64, Dim: 8, KeySpace: 10_000, Duration: 200 * time.Millisecond},
		{Workers: 2, Shards: 3, Replicas: 1, Keys: 128, Dim: 16, KeySpace: 10_000, Duration: 200 * time.Millisecond},
	}
	for _, cfg := range cases {
		r, err := PS(testContext(t), cfg)
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		if r.Op != "ps" || r.Workers != cfg.Workers || r.Shards != cfg.Shards || r.Replicas != cfg.Replicas || r.Requests < 1 || r.MedianReq <= 0 {
			t.Errorf("%+v: %+v", cfg, r)
		}
		// Every pair pulls and pushes Keys rows of Dim float32s.
		if want := r.Requests * 2 * int64(cfg.Keys*cfg.Dim) * 4; r.RowBytes != want {
			t.Errorf("%d pairs moved %d row bytes, want %d", r.Requests, r.RowBytes, want)
		}
		if r.RawGBps <= 0 || r.Ratio != r.GBps/r.RawGBps {
			t.Errorf("ratio %v of %v and raw %v", r.Ratio, r.GBps, r.RawGBps)
		}
	}
}

func TestBenchPSConfigErrors(t *testing.T) {
	good := PSConfig{Workers: 1, Shards: 2, Keys: 4, Dim: 4, KeySpace: 100, Duration: time.Second}
	cases := []struct {
		name string
		edit func(c *PSConfig)
		want string
	}{
		{"no workers", func(c *PSConfig) { c.Workers = 0 }, "0 workers"},
		{"replicas as many as shards", func(c *PSConfig) { c.Replicas = 2 }, "replicas below shards"},
		{"more keys than the key space", func(c *PSConfig) { c.Keys = 101 }, "101 keys of 100"},
		{"dim", func(c *PSConfig) { c.Dim = 0 }, "dim 0"},
		{"duration", func(c *PSConfig) { c.Duration = 0 }, "duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.edit(&cfg)
			if _, err := PS(testContext(t), cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}
