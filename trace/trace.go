// Package trace writes timelines of a job in Chrome's trace event format,
// which Perfetto and chrome://tracing open. Each process records its
// spans (a Recorder: forward and backward, each collective operation,
// the optimizer step, checkpoint snapshots and uploads, hybrid waits,
// pipeline instructions) as JSON lines in a file of its own, flushed at
// every step, so a process killed mid-run leaves what it did until then.
// Merge joins the processes' files into one trace, each process a
// "process" of the trace, their clocks aligned on the collective
// operations they shared.
package trace

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Threads of a process's timeline: spans on one thread never overlap.
const (
	ThreadStep       = "step"         // forward/backward, the wait for the reduction, the optimizer
	ThreadHybrid     = "hybrid"       // hybrid steps' waits for their decision (a rank may compute meanwhile)
	ThreadCheckpoint = "checkpoint"   // snapshots and uploads
	ThreadPipeline   = "instructions" // a pipeline stage's schedule
)

// Args are a span's details; zero fields are left out.
type Args struct {
	Step       int64
	Generation uint64
	Seq        uint64 // a collective operation's number in its group
	Bytes      int
	Algorithm  string
	Plane      string
	Rank       int // -1: not set
	Err        string
}

// Recorder writes one process's spans. Its methods are safe for
// concurrent use; a nil *Recorder records nothing.
type Recorder struct {
	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	buf     []byte
	err     error
	process string
}

// Create records the spans of process (its name in the trace, e.g.
// "worker-1") in path, created anew.
func Create(path, process string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return &Recorder{f: f, w: bufio.NewWriterSize(f, 64<<10), process: process}, nil
}

// Span records a span of thread from start to end. It allocates nothing
// once its buffer has grown.
//
// Both ends are the times' wall-clock readings, the clock every process
// of a host shares, never their monotonic ones: time.Now reads the two
// clocks one after the other, and a thread descheduled between the two
// reads gets a monotonic reading later than its wall one, so a length
// taken as end.Sub(start) would end the span early by that much, before
// a peer's operation it waited for had even begun.
func (r *Recorder) Span(thread, name string, start, end time.Time, a Args) {
	if r == nil {
		return
	}
	ts, te := start.UnixMicro(), end.UnixMicro()
	te = max(te, ts)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return
	}
	b := r.buf[:0]
	b = append(b, `{"name":`...)
	b = appendString(b, name)
	b = append(b, `,"thread":`...)
	b = appendString(b, thread)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, `,"dur":`...)
	b = strconv.AppendInt(b, te-ts, 10)
	if a.Step != 0 {
		b = append(b, `,"step":`...)
		b = strconv.AppendInt(b, a.Step, 10)
	}
	if a.Generation != 0 {
		b = append(b, `,"generation":`...)
		b = strconv.AppendUint(b, a.Generation, 10)
	}
	if a.Seq != 0 {
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, a.Seq, 10)
	}
	if a.Bytes != 0 {
		b = append(b, `,"bytes":`...)
		b = strconv.AppendInt(b, int64(a.Bytes), 10)
	}
	if a.Algorithm != "" {
		b = append(b, `,"algorithm":`...)
		b = appendString(b, a.Algorithm)
	}
	if a.Plane != "" {
		b = append(b, `,"plane":`...)
		b = appendString(b, a.Plane)
	}
	if a.Rank >= 0 {
		b = append(b, `,"rank":`...)
		b = strconv.AppendInt(b, int64(a.Rank), 10)
	}
	if a.Err != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, a.Err)
	}
	b = append(b, "}\n"...)
	r.buf = b
	_, r.err = r.w.Write(b)
}

// Flush writes what is buffered: at every step's end, so that a process
// killed later leaves its spans until then.
func (r *Recorder) Flush() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = r.w.Flush()
	}
	return r.err
}

// Close flushes and closes the file.
func (r *Recorder) Close() error {
	if r == nil {
		return nil
	}
	err := r.Flush()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// appendString appends s as a JSON string.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			b = append(b, c)
			i++
			continue
		}
		if c < utf8.RuneSelf {
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			default:
				b = append(b, `\u00`...)
				b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
