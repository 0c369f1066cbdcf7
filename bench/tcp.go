package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// TCPConfig is what the loopback TCP benchmark streams.
type TCPConfig struct {
	Duration   time.Duration // how long to stream
	WriteBytes int           // size of each write
}

// TCPResult is the loopback TCP figure; its JSON form is one line of
// `phalanx bench tcp --json`.
type TCPResult struct {
	Op      string  `json:"op"` // "tcp"
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"GBps"`
}

// LoopbackTCP streams WriteBytes-sized writes from one goroutine to another
// through one 127.0.0.1 connection for Duration: the ceiling a data plane on
// this machine is measured against.
func LoopbackTCP(ctx context.Context, cfg TCPConfig) (TCPResult, error) {
	if cfg.Duration <= 0 || cfg.WriteBytes <= 0 {
		return TCPResult{}, fmt.Errorf("bench: tcp: duration %v and write size %d must be positive", cfg.Duration, cfg.WriteBytes)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return TCPResult{}, fmt.Errorf("bench: tcp: %w", err)
	}
	defer ln.Close()
	stopAccept := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopAccept()
	sent := make(chan error, 1)
	go func() { sent <- stream(ctx, ln, cfg) }()
	c, err := ln.Accept()
	if err != nil {
		return TCPResult{}, fmt.Errorf("bench: tcp: accepting the sender: %w", errors.Join(ctx.Err(), <-sent, err))
	}
	defer c.Close()
	stopRead := context.AfterFunc(ctx, func() { c.Close() })
	defer stopRead()
	// A sender that stalls fails the measurement rather than hang it.
	c.SetReadDeadline(time.Now().Add(cfg.Duration + 30*time.Second))
	buf := make([]byte, cfg.WriteBytes)
	var total int64
	start := time.Now()
	for {
		n, err := c.Read(buf)
		total += int64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return TCPResult{}, fmt.Errorf("bench: tcp: reading: %w", errors.Join(ctx.Err(), err))
		}
	}
	secs := time.Since(start).Seconds()
	if err := <-sent; err != nil {
		return TCPResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return TCPResult{}, fmt.Errorf("bench: tcp: %w", err)
	}
	return TCPResult{Op: "tcp", Bytes: total, Seconds: secs, GBps: float64(total) / secs / 1e9}, nil
}

// stream is LoopbackTCP's sender. Failing to connect closes ln, so that the
// receiver's Accept returns.
func stream(ctx context.Context, ln net.Listener, cfg TCPConfig) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		return fmt.Errorf("bench: tcp: dialing %s: %w", ln.Addr(), err)
	}
	defer c.Close()
	buf := make([]byte, cfg.WriteBytes)
	deadline := time.Now().Add(cfg.Duration)
	c.SetWriteDeadline(deadline.Add(30 * time.Second))
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := c.Write(buf); err != nil {
			return fmt.Errorf("bench: tcp: writing: %w", err)
		}
	}
	return nil
}

// WriteTCP runs LoopbackTCP and prints its figure as `phalanx bench tcp` does.
func WriteTCP(ctx context.Context, cfg TCPConfig, out Output) error {
	r, err := LoopbackTCP(ctx, cfg)
	if err != nil {
		return err
	}
	if out.JSON {
		return json.NewEncoder(out.W).Encode(r)
	}
	_, err = fmt.Fprintf(out.W, "# loopback TCP, one stream: %.3f GB/s (%d bytes in %.2f s)\n", r.GBps, r.Bytes, r.Seconds)
	return err
}
