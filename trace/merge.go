package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// span is one line of a process's file.
type span struct {
	Name       string `json:"name"`
	Thread     string `json:"thread"`
	TS         int64  `json:"ts"`
	Dur        int64  `json:"dur"`
	Step       int64  `json:"step,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Seq        uint64 `json:"seq,omitempty"`
	Bytes      int    `json:"bytes,omitempty"`
	Algorithm  string `json:"algorithm,omitempty"`
	Plane      string `json:"plane,omitempty"`
	Rank       *int   `json:"rank,omitempty"`
	Err        string `json:"error,omitempty"`
}

// Event is one event of a Chrome trace: a complete span ("X") or a
// metadata record ("M": process and thread names).
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// File is a Chrome trace.
type File struct {
	TraceEvents     []Event `json:"traceEvents"`
	DisplayTimeUnit string  `json:"displayTimeUnit"`
}

// Part is one process's file of spans, and its name in the trace.
type Part struct {
	Process string
	Path    string
}

// Parts are the files of a directory of processes' spans
// (<process>.jsonl), by name.
func Parts(dir string) ([]Part, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	var out []Part
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".jsonl"); ok && !e.IsDir() {
			out = append(out, Part{Process: name, Path: filepath.Join(dir, e.Name())})
		}
	}
	return out, nil
}

// Merge writes the parts' spans as one Chrome trace to w: each part a
// process (pid in the order given, named by its Process and the ranks it
// held), each of its threads a thread. Clocks are aligned on the
// collective operations the processes shared: the same operation (its
// group, generation and number) ends at nearly the same moment on every
// rank, so each process is shifted by the median of its ends' differences
// from the first process's. A line that does not parse (the last one of a
// process killed while writing) is skipped. It returns the shift of each
// process, in microseconds.
func Merge(w io.Writer, parts []Part) (map[string]int64, error) {
	spans := make([][]span, len(parts))
	for i, p := range parts {
		s, err := readPart(p.Path)
		if err != nil {
			return nil, err
		}
		spans[i] = s
	}
	shifts := align(parts, spans)
	var min int64 = -1
	for i := range spans {
		for j := range spans[i] {
			spans[i][j].TS -= shifts[parts[i].Process]
			if ts := spans[i][j].TS; min < 0 || ts < min {
				min = ts
			}
		}
	}
	f := File{DisplayTimeUnit: "ms", TraceEvents: []Event{}}
	for pid, p := range parts {
		threads := map[string]int{}
		var ranks []int
		for _, s := range spans[pid] {
			if _, ok := threads[s.Thread]; !ok {
				threads[s.Thread] = len(threads) + 1
			}
			if s.Rank != nil && !slices.Contains(ranks, *s.Rank) {
				ranks = append(ranks, *s.Rank)
			}
		}
		name := p.Process
		if len(ranks) > 0 {
			name = fmt.Sprintf("%s (rank %s)", p.Process, strings.Trim(strings.ReplaceAll(fmt.Sprint(ranks), " ", ", "), "[]"))
		}
		f.TraceEvents = append(f.TraceEvents, Event{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": name}},
			Event{Name: "process_sort_index", Ph: "M", Pid: pid, Args: map[string]any{"sort_index": pid}})
		names := make([]string, 0, len(threads))
		for t := range threads {
			names = append(names, t)
		}
		sort.Slice(names, func(i, j int) bool { return threads[names[i]] < threads[names[j]] })
		for _, t := range names {
			f.TraceEvents = append(f.TraceEvents, Event{Name: "thread_name", Ph: "M", Pid: pid, Tid: threads[t], Args: map[string]any{"name": t}})
		}
		for _, s := range spans[pid] {
			args := map[string]any{}
			if s.Step != 0 {
				args["step"] = s.Step
			}
			if s.Generation != 0 {
				args["generation"] = s.Generation
			}
			if s.Seq != 0 {
				args["seq"] = s.Seq
			}
			if s.Bytes != 0 {
				args["bytes"] = s.Bytes
			}
			if s.Algorithm != "" {
				args["algorithm"] = s.Algorithm
			}
			if s.Plane != "" {
				args["plane"] = s.Plane
			}
			if s.Rank != nil {
				args["rank"] = *s.Rank
			}
			if s.Err != "" {
				args["error"] = s.Err
			}
			f.TraceEvents = append(f.TraceEvents, Event{Name: s.Name, Cat: s.Thread, Ph: "X", TS: float64(s.TS - min), Dur: float64(s.Dur),
				Pid: pid, Tid: threads[s.Thread], Args: args})
		}
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	return shifts, nil
}

func readPart(path string) ([]span, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	var out []span
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var s span
		if json.Unmarshal(sc.Bytes(), &s) != nil || s.Name == "" || s.Thread == "" || s.Dur < 0 {
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// opKey names one collective operation across processes.
type opKey struct {
	thread string
	gen    uint64
	seq    uint64
}

// symmetric: an operation no rank can finish before every rank entered it,
// for each needs every rank's data (a broadcast's root may finish first,
// its sends buffered).
func symmetric(op string) bool {
	switch op {
	case "allreduce", "allgather", "reduce-scatter", "barrier", "all-to-all":
		return true
	}
	return false
}

// interval is a span's start and end.
type interval struct{ start, end int64 }

// align is each process's clock offset against the first process with
// collective operations. A symmetric operation's spans on two ranks
// intersect (no rank finishes it before every other entered it): each
// bounds the offset, and their bounds together give a range. A range
// holding 0 (one host's clock) gives 0; another gives its middle; an
// empty one (clocks drifting apart during the job) the median of the
// operations' end differences. A process sharing no operation with the
// first is not shifted. A span's two ends are written in whole
// microseconds of the wall clock, each rounded down (Recorder.Span):
// rounding keeps their order, so operations shorter than a microsecond (a
// small allreduce of spinning ranks) still intersect on one clock.
func align(parts []Part, spans [][]span) map[string]int64 {
	shifts := map[string]int64{}
	ops := make([]map[opKey]interval, len(parts))
	for i, ss := range spans {
		ops[i] = map[opKey]interval{}
		for _, s := range ss {
			if s.Seq != 0 && s.Generation != 0 && s.Err == "" && symmetric(s.Name) {
				ops[i][opKey{s.Thread, s.Generation, s.Seq}] = interval{s.TS, s.TS + s.Dur}
			}
		}
	}
	ref := -1
	for i := range parts {
		if len(ops[i]) > 0 {
			ref = i
			break
		}
	}
	for i, p := range parts {
		shifts[p.Process] = 0
		if ref < 0 || i == ref {
			continue
		}
		lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
		var ends []int64
		for k, x := range ops[i] {
			r, ok := ops[ref][k]
			if !ok {
				continue
			}
			lo, hi = max(lo, x.start-r.end), min(hi, x.end-r.start)
			ends = append(ends, x.end-r.end)
		}
		switch {
		case len(ends) == 0:
		case lo <= 0 && 0 <= hi:
		case lo <= hi:
			shifts[p.Process] = lo + (hi-lo)/2
		default:
			slices.Sort(ends)
			shifts[p.Process] = ends[len(ends)/2]
		}
	}
	return shifts
}

// CheckFile checks a Chrome trace's structure: it parses, it has spans,
// every span is closed (a complete span has a duration of zero or more;
// every "B" its "E" on the same thread), and on each thread of each
// process no two spans overlap.
func CheckFile(b []byte) error {
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("trace: not a Chrome trace: %w", err)
	}
	type thread struct{ pid, tid int }
	open := map[thread][]Event{}
	spans := map[thread][]Event{}
	n := 0
	for _, e := range f.TraceEvents {
		th := thread{e.Pid, e.Tid}
		switch e.Ph {
		case "X":
			if e.Dur < 0 {
				return fmt.Errorf("trace: span %q of process %d thread %d has a negative duration", e.Name, e.Pid, e.Tid)
			}
			spans[th] = append(spans[th], e)
			n++
		case "B":
			open[th] = append(open[th], e)
		case "E":
			st := open[th]
			if len(st) == 0 {
				return fmt.Errorf("trace: an end without a beginning on process %d thread %d", e.Pid, e.Tid)
			}
			b := st[len(st)-1]
			open[th] = st[:len(st)-1]
			spans[th] = append(spans[th], Event{Name: b.Name, TS: b.TS, Dur: e.TS - b.TS, Pid: e.Pid, Tid: e.Tid})
			n++
		}
	}
	for th, st := range open {
		if len(st) > 0 {
			return fmt.Errorf("trace: span %q of process %d thread %d never ends", st[0].Name, th.pid, th.tid)
		}
	}
	if n == 0 {
		return errors.New("trace: no spans")
	}
	for th, ss := range spans {
		sort.Slice(ss, func(i, j int) bool { return ss[i].TS < ss[j].TS })
		for i := 1; i < len(ss); i++ {
			if prev := ss[i-1]; prev.TS+prev.Dur > ss[i].TS {
				return fmt.Errorf("trace: on process %d thread %d, %q [%v, +%v] overlaps %q at %v", th.pid, th.tid, prev.Name, prev.TS, prev.Dur, ss[i].Name, ss[i].TS)
			}
		}
	}
	return nil
}
