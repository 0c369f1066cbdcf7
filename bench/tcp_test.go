package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBenchLoopbackTCP: the benchmark streams for its duration and ends by
// itself (under a context that would end it a minute later, as an error).
func TestBenchLoopbackTCP(t *testing.T) {
	cfg := TCPConfig{Duration: 200 * time.Millisecond, WriteBytes: 64 << 10}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := LoopbackTCP(ctx, cfg)
	if err != nil {
		t.Fatalf("streaming for %v did not end by itself: %v", cfg.Duration, err)
	}
	if r.Op != "tcp" || r.Bytes < int64(cfg.WriteBytes) || r.Seconds < cfg.Duration.Seconds()*0.9 || r.GBps <= 0 {
		t.Errorf("%+v", r)
	}
}

func TestBenchLoopbackTCPErrors(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		cfg  TCPConfig
		want error
	}{
		{"cancelled", cancelled, TCPConfig{Duration: time.Hour, WriteBytes: 4096}, context.Canceled},
		{"no duration", testContext(t), TCPConfig{WriteBytes: 4096}, nil},
		{"no write size", testContext(t), TCPConfig{Duration: time.Second}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoopbackTCP(tc.ctx, tc.cfg)
			if err == nil || !strings.HasPrefix(err.Error(), "bench: tcp") || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("got %v, want a bench: tcp error wrapping %v", err, tc.want)
			}
		})
	}
}
