// Package events is a job's event log: membership changes, steps,
// checkpoints, faults and the result, each an event kind with named fields
// (docs/events.md lists them). A Sink receives them; Log, the usual one,
// writes one JSON object per line with "ts" (unix seconds, float) and
// "event", then the fields. The launching process writes it, so one file
// holds the whole job.
package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Sink receives a job's events; an embedder implements it to route them
// elsewhere (a metrics system, a UI). Emit must be safe for concurrent use.
type Sink interface {
	Emit(event string, fields ...Field) error
}

// Log appends events to a writer as JSON lines; it is safe for concurrent
// use.
type Log struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
	buf bytes.Buffer
}

// New writes to w, stamping events with now (time.Now when nil).
func New(w io.Writer, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{w: w, now: now}
}

// Field is one key and value of an event.
type Field struct {
	Key   string
	Value any
}

// F is a Field.
func F(key string, value any) Field { return Field{key, value} }

// Emit writes one event. A nil Log discards it.
func (l *Log) Emit(event string, fields ...Field) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := &l.buf
	b.Reset()
	t := l.now()
	fmt.Fprintf(b, `{"ts":%.6f,"event":%q`, float64(t.UnixNano())/1e9, event)
	for _, f := range fields {
		v, err := json.Marshal(f.Value)
		if err != nil {
			return fmt.Errorf("events: %s.%s: %w", event, f.Key, err)
		}
		fmt.Fprintf(b, `,%q:%s`, f.Key, v)
	}
	b.WriteString("}\n")
	_, err := l.w.Write(b.Bytes())
	return err
}

// Tee passes every event to each of sinks (nil ones skipped), in order;
// its error is the first sink's that failed.
func Tee(sinks ...Sink) Sink {
	var t tee
	for _, s := range sinks {
		if s != nil {
			t = append(t, s)
		}
	}
	return t
}

type tee []Sink

func (t tee) Emit(event string, fields ...Field) error {
	var first error
	for _, s := range t {
		if err := s.Emit(event, fields...); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Number is a numeric field's value as a float64 (false for a value of
// another type): the fields of events emitted in-process keep their Go
// types (int, int64, uint64, float64...).
func Number(v any) (float64, bool) {
	switch v := v.(type) {
	case int:
		return float64(v), true
	case int32:
		return float64(v), true
	case int64:
		return float64(v), true
	case uint32:
		return float64(v), true
	case uint64:
		return float64(v), true
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}
