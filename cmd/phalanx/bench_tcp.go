package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

type tcpResult struct {
	Op      string  `json:"op"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	GBps    float64 `json:"GBps"`
}

// benchTCP streams bytes through one loopback TCP connection: the ceiling a
// data plane on this machine is measured against.
func benchTCP(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench tcp",
		"Measures the raw single-stream TCP throughput of 127.0.0.1 on this machine (one sender and one\n"+
			"receiver goroutine, 4 MiB writes): the reference line for the data plane's figures.", stderr)
	dur := fs.Duration("duration", 3*time.Second, "how long to stream")
	chunk := fs.String("write", "4MiB", "size of each write")
	jsonOut := fs.Bool("json", false, "print one JSON object and nothing else")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	wsize, err := parseSize(*chunk)
	if err != nil || wsize <= 0 {
		return usagef("--write %q: want a positive size", *chunk)
	}
	if *dur <= 0 {
		return usagef("--duration must be positive")
	}
	r, err := rawTCP(ctx, *dur, wsize)
	if err != nil {
		return err
	}
	if *jsonOut {
		return json.NewEncoder(stdout).Encode(r)
	}
	fmt.Fprintf(stdout, "# loopback TCP, one stream: %.3f GB/s (%d bytes in %.2f s)\n", r.GBps, r.Bytes, r.Seconds)
	return nil
}

// rawTCP streams wsize-byte writes through one loopback connection for dur.
func rawTCP(ctx context.Context, dur time.Duration, wsize int) (tcpResult, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return tcpResult{}, err
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, wsize)
		deadline := time.Now().Add(dur)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		return tcpResult{}, err
	}
	defer c.Close()
	buf := make([]byte, wsize)
	var total int64
	start := time.Now()
	for {
		n, err := c.Read(buf)
		total += int64(n)
		if err != nil {
			break
		}
	}
	secs := time.Since(start).Seconds()
	return tcpResult{Op: "tcp", Bytes: total, Seconds: secs, GBps: float64(total) / secs / 1e9}, nil
}
