// Package status is a job's live status: a Model fed by the job's events
// and by its workers' metrics, whose Snapshot the launcher serves as a web
// page (Server: the ring and its generations, every worker, excluded
// stragglers, the loss curve, checkpoints, the last events), publishes in
// the job's etcd for `phalanx status` elsewhere, and prints as a table
// (WriteTable).
package status

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/phalanx-rt/phalanx/events"
)

// Snapshot is a job's status at one moment: what the page, the table and
// `phalanx status --json` show.
type Snapshot struct {
	Job     string    `json:"job"`
	Model   string    `json:"model,omitempty"`
	Steps   int64     `json:"steps,omitempty"` // the job's total
	State   string    `json:"state"`           // starting, training, stopping, stopped, done, failed
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
	// Source says where the snapshot was made: "launcher", or "etcd"
	// (the generation record alone: no launcher publishes this job's).
	Source string `json:"source"`

	Generation  uint64  `json:"generation"`
	World       int     `json:"world"`
	Step        int64   `json:"step"`
	Loss        float64 `json:"loss"`
	SamplesPerS float64 `json:"samples_per_s"`

	Ring        []Member     `json:"ring"`
	Generations []Generation `json:"generations"`
	Workers     []Worker     `json:"workers"`
	Excluded    []Excluded   `json:"excluded"`
	Curve       []Point      `json:"curve"`
	Marks       []Mark       `json:"marks"`
	Checkpoints []Checkpoint `json:"checkpoints"`
	Events      []Event      `json:"events"`
}

// Member is a rank of the current ring.
type Member struct {
	Rank   int    `json:"rank"`
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Worker int    `json:"worker"` // its launch index (-1: started elsewhere)
}

// Generation is one ring the coordinator decided, and who changed.
type Generation struct {
	Number     uint64    `json:"generation"`
	World      int       `json:"world"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
	Step       int64     `json:"step"` // the job's step when it was decided
	Lost       []int     `json:"lost,omitempty"`
	Left       []int     `json:"left,omitempty"`
	Excluded   []int     `json:"excluded,omitempty"`
	Joined     []int     `json:"joined,omitempty"`
	Readmitted []int     `json:"readmitted,omitempty"`
}

// Worker is one process of the job as the launcher knows it.
type Worker struct {
	Index       int       `json:"worker"`
	Pid         int       `json:"pid"`
	Role        string    `json:"role"`
	State       string    `json:"state"` // starting, training, waiting, excluded, lost, left, exited
	Rank        int       `json:"rank"`  // in the current ring (-1: none)
	Step        int64     `json:"step"`
	SamplesPerS float64   `json:"samples_per_s"`
	LastSeen    time.Time `json:"last_seen"` // its last sign of life: a scrape answered, a report
	Metrics     string    `json:"metrics,omitempty"`
	Exit        string    `json:"exit,omitempty"`
}

// Excluded is a straggler out of the ring.
type Excluded struct {
	ID     string    `json:"id"`
	Pid    int       `json:"pid"`
	Rank   int       `json:"rank"` // in the ring it left
	LateIn int       `json:"late_in"`
	Window int       `json:"window"`
	Step   int64     `json:"step"`
	At     time.Time `json:"at"`
}

// Point is a step's training loss.
type Point struct {
	Step       int64   `json:"step"`
	Loss       float64 `json:"loss"`
	Generation uint64  `json:"generation"`
	T          float64 `json:"t"` // unix seconds
}

// Mark is something that happened at a step, drawn on the loss curve: a
// new generation, a worker lost, left, excluded or readmitted, a
// checkpoint.
type Mark struct {
	Step  int64   `json:"step"`
	T     float64 `json:"t"`
	Kind  string  `json:"kind"` // generation, lost, left, excluded, readmitted, checkpoint, restart
	Label string  `json:"label"`
}

// Checkpoint is one the job saved, failed, restored or skipped.
type Checkpoint struct {
	ID       string    `json:"id"`
	Step     int64     `json:"step"`
	Bytes    int64     `json:"bytes"`
	Seconds  float64   `json:"seconds"`
	URL      string    `json:"url,omitempty"`
	Verified string    `json:"verified"` // how it was verified, or why not
	At       time.Time `json:"at"`
}

// Event is one of the job's last events, in a line.
type Event struct {
	T     time.Time `json:"t"`
	Event string    `json:"event"`
	Text  string    `json:"text"`
}

// Limits of a snapshot's lists: a job that runs for weeks keeps a
// bounded status.
const (
	maxPoints      = 2000
	maxMarks       = 500
	maxEvents      = 40
	maxCheckpoints = 50
	maxGenerations = 100
)

// Model is a job's status, fed by its events (Emit: a Model is an
// events.Sink) and its workers' scrapes (Scraped). Safe for concurrent
// use.
type Model struct {
	now func() time.Time

	mu       sync.Mutex
	snap     Snapshot
	byPid    map[int]int // pid: index in snap.Workers
	version  uint64
	changed  chan struct{} // closed and replaced at every change
	lastRate map[int]rate
}

// rate is a worker's samples counter at a scrape, for its samples/s.
type rate struct {
	samples float64
	at      time.Time
}

// Info is what the launcher knows of a job before its events.
type Info struct {
	Job   string
	Model string
	Steps int64
}

// NewModel is the status of job, on clock now (nil: time.Now).
func NewModel(info Info, now func() time.Time) *Model {
	if now == nil {
		now = time.Now
	}
	t := now()
	return &Model{now: now, byPid: map[int]int{}, changed: make(chan struct{}), lastRate: map[int]rate{},
		snap: Snapshot{Job: info.Job, Model: info.Model, Steps: info.Steps, State: "starting", Started: t, Updated: t, Source: "launcher"}}
}

// Snapshot is the status now; its version grows with every change.
func (m *Model) Snapshot() (Snapshot, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.snap
	s.Ring = slices.Clone(s.Ring)
	s.Generations = slices.Clone(s.Generations)
	s.Workers = slices.Clone(s.Workers)
	s.Excluded = slices.Clone(s.Excluded)
	s.Curve = slices.Clone(s.Curve)
	s.Marks = slices.Clone(s.Marks)
	s.Checkpoints = slices.Clone(s.Checkpoints)
	s.Events = slices.Clone(s.Events)
	return s, m.version
}

// Changed closes at the next change after the version v.
func (m *Model) Changed(v uint64) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.version != v {
		c := make(chan struct{})
		close(c)
		return c
	}
	return m.changed
}

// touch marks a change; m.mu is held.
func (m *Model) touch(t time.Time) {
	m.snap.Updated = t
	m.version++
	close(m.changed)
	m.changed = make(chan struct{})
}

// fields reads an event's fields by key.
type fields []events.Field

func (f fields) get(key string) any {
	for _, x := range f {
		if x.Key == key {
			return x.Value
		}
	}
	return nil
}

func (f fields) num(key string) float64 {
	n, _ := events.Number(f.get(key))
	return n
}

func (f fields) int(key string) int     { return int(f.num(key)) }
func (f fields) int64(key string) int64 { return int64(f.num(key)) }
func (f fields) str(key string) string {
	switch v := f.get(key).(type) {
	case string:
		return v
	case nil:
		return ""
	case error:
		return v.Error()
	default:
		return fmt.Sprint(v)
	}
}

// Emit takes one of the job's events.
func (m *Model) Emit(event string, fs ...events.Field) error {
	f := fields(fs)
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.now()
	s := &m.snap
	switch event {
	case "job_started":
		if j := f.str("job"); j != "" {
			s.Job = j
		}
		if md := f.str("model"); md != "" {
			s.Model = md
		}
	case "worker_started":
		w := Worker{Index: f.int("worker"), Pid: f.int("pid"), Role: f.str("role"), State: "starting", Rank: -1, LastSeen: t}
		m.byPid[w.Pid] = len(s.Workers)
		s.Workers = append(s.Workers, w)
	case "metrics_serving":
		if w := m.workerNamed(f.str("process")); w != nil {
			w.Metrics = f.str("address")
		}
	case "generation":
		m.generation(f, t)
	case "worker_lost", "worker_left", "straggler_excluded", "straggler_readmitted", "worker_joined":
		m.change(event, f, t)
	case "worker_exited":
		if w := m.worker(f.int("pid")); w != nil {
			w.State, w.Exit, w.Rank = "exited", f.str("status"), -1
		}
	case "step", "pipeline_step":
		if event == "pipeline_step" && f.get("loss") == nil {
			break // a stage that is not the last: no loss
		}
		m.step(f, t)
	case "rank_restarted":
		m.mark(Mark{Step: s.Step, Kind: "restart", Label: fmt.Sprintf("rank %d restarted", f.int("rank"))}, t)
	case "checkpoint_saved":
		m.checkpoint(Checkpoint{ID: f.str("checkpoint"), Step: f.int64("step"), Bytes: f.int64("bytes"), Seconds: f.num("seconds"),
			URL: f.str("url"), Verified: fmt.Sprintf("manifest CRC32C %08x", uint32(f.num("manifest_crc32c"))), At: t})
		m.mark(Mark{Step: f.int64("step"), Kind: "checkpoint", Label: fmt.Sprintf("checkpoint of step %d", f.int64("step"))}, t)
	case "checkpoint_failed":
		m.checkpoint(Checkpoint{ID: f.str("checkpoint"), Step: f.int64("step"), Verified: "failed: " + f.str("error"), At: t})
	case "checkpoint_restored":
		m.checkpoint(Checkpoint{ID: "restored", Step: f.int64("step"), Bytes: f.int64("bytes"), URL: f.str("url"),
			Verified: "verified and restored", At: t})
	case "checkpoint_skipped":
		m.checkpoint(Checkpoint{ID: f.str("checkpoint"), Verified: "does not verify: " + f.str("error"), At: t})
	case "stopping":
		s.State = "stopping"
	case "stopped":
		s.State = "stopped"
	case "done":
		s.State = "done"
		s.Step = max(s.Step, f.int64("step"))
	case "worker_failed", "job_failed":
		s.State = "failed"
	}
	m.event(event, f, t)
	m.touch(t)
	return nil
}

func (m *Model) worker(pid int) *Worker {
	if i, ok := m.byPid[pid]; ok {
		return &m.snap.Workers[i]
	}
	return nil
}

// workerNamed is the worker "<role>-<index>".
func (m *Model) workerNamed(name string) *Worker {
	for i := range m.snap.Workers {
		if w := &m.snap.Workers[i]; w.name() == name {
			return w
		}
	}
	return nil
}

// name is the worker's name in the job's metrics: "<role>-<index>".
func (w *Worker) name() string { return fmt.Sprintf("%s-%d", w.Role, w.Index) }

func (m *Model) generation(f fields, t time.Time) {
	s := &m.snap
	g := Generation{Number: uint64(f.num("generation")), World: f.int("world"), Reason: f.str("reason"), At: t, Step: s.Step}
	s.Generation, s.World = g.Number, g.World
	s.Generations = append(s.Generations, g)
	if len(s.Generations) > maxGenerations {
		s.Generations = s.Generations[len(s.Generations)-maxGenerations:]
	}
	s.Ring = s.Ring[:0]
	in := map[int]int{} // worker index: rank
	members, _ := f.get("members").([]map[string]any)
	for _, mem := range members {
		mf := fields{events.F("rank", mem["rank"]), events.F("pid", mem["pid"]), events.F("id", mem["id"])}
		mb := Member{Rank: mf.int("rank"), ID: mf.str("id"), Pid: mf.int("pid"), Worker: -1}
		if w := m.worker(mb.Pid); w != nil {
			mb.Worker = w.Index
			in[w.Index] = mb.Rank
		}
		s.Ring = append(s.Ring, mb)
	}
	for i := range s.Workers {
		w := &s.Workers[i]
		if r, ok := in[w.Index]; ok {
			w.State, w.Rank = "training", r
			continue
		}
		w.Rank = -1
		if w.State == "training" || w.State == "starting" {
			w.State = "waiting"
		}
	}
	if g.World == 0 {
		s.State = "stopped"
	} else if s.State == "starting" {
		s.State = "training"
	}
	m.mark(Mark{Step: s.Step, Kind: "generation", Label: fmt.Sprintf("generation %d: %d ranks", g.Number, g.World)}, t)
}

// change is a membership change of the current generation: the ranks it
// lists, the worker's state, and (but for a join) a mark on the curve.
func (m *Model) change(event string, f fields, t time.Time) {
	s := &m.snap
	g := &Generation{} // none yet: the change is noted nowhere
	if n := len(s.Generations); n > 0 {
		g = &s.Generations[n-1]
	}
	rank, pid := f.int("rank"), f.int("pid")
	w := m.worker(pid)
	who := fmt.Sprintf("rank %d (pid %d)", rank, pid)
	if w != nil {
		who = fmt.Sprintf("worker %d (pid %d)", w.Index, pid)
	}
	var ranks *[]int
	kind, state := "", ""
	switch event {
	case "worker_lost":
		ranks, kind, state = &g.Lost, "lost", "lost"
	case "worker_left":
		ranks, kind, state = &g.Left, "left", "left"
	case "straggler_excluded":
		ranks, kind, state = &g.Excluded, "excluded", "excluded"
		s.Excluded = append(s.Excluded, Excluded{ID: f.str("id"), Pid: pid, Rank: rank, LateIn: f.int("late_in"), Window: f.int("window"),
			Step: f.int64("step"), At: t})
	case "straggler_readmitted":
		ranks, kind = &g.Readmitted, "readmitted"
		id := f.str("id")
		s.Excluded = slices.DeleteFunc(s.Excluded, func(x Excluded) bool { return x.ID == id })
	case "worker_joined":
		ranks = &g.Joined
	}
	*ranks = append(*ranks, rank)
	if w != nil && state != "" {
		w.State = state
	}
	if kind != "" {
		m.mark(Mark{Step: s.Step, Kind: kind, Label: who + " " + kind}, t)
	}
}

func (m *Model) step(f fields, t time.Time) {
	s := &m.snap
	step := f.int64("step")
	if step < s.Step && f.get("generation") != nil && uint64(f.num("generation")) < s.Generation {
		return // a step reported again by an older ring
	}
	s.Step, s.Loss = step, f.num("loss")
	if v := f.num("samples_per_s"); v > 0 {
		s.SamplesPerS = v
	}
	if s.State == "starting" {
		s.State = "training"
	}
	p := Point{Step: step, Loss: s.Loss, Generation: uint64(f.num("generation")), T: unix(t)}
	if n := len(s.Curve); n > 0 && s.Curve[n-1].Step >= step {
		// A step trained again after a rollback: the curve goes on from it.
		i := sort.Search(n, func(i int) bool { return s.Curve[i].Step >= step })
		s.Curve = s.Curve[:i]
	}
	s.Curve = append(s.Curve, p)
	if len(s.Curve) > maxPoints {
		s.Curve = thin(s.Curve)
	}
	for i := range s.Workers {
		if w := &s.Workers[i]; w.State == "training" && w.Metrics == "" {
			w.Step = step // without its own metrics: the ring's step
		}
	}
}

// thin halves the older half of a curve, so that a long job keeps its
// whole history at a coarser grain and its recent steps in full.
func thin(c []Point) []Point {
	half := len(c) / 2
	out := c[:0]
	for i := 0; i < half; i += 2 {
		out = append(out, c[i])
	}
	return append(out, c[half:]...)
}

func (m *Model) mark(k Mark, t time.Time) {
	s := &m.snap
	k.T = unix(t)
	s.Marks = append(s.Marks, k)
	if len(s.Marks) > maxMarks {
		s.Marks = s.Marks[len(s.Marks)-maxMarks:]
	}
}

func (m *Model) checkpoint(c Checkpoint) {
	s := &m.snap
	for i := range s.Checkpoints {
		if x := &s.Checkpoints[i]; x.ID == c.ID && c.ID != "restored" && c.ID != "" {
			if c.Step == 0 {
				c.Step, c.Bytes, c.URL = x.Step, x.Bytes, x.URL
			}
			*x = c
			return
		}
	}
	s.Checkpoints = append(s.Checkpoints, c)
	if len(s.Checkpoints) > maxCheckpoints {
		s.Checkpoints = s.Checkpoints[len(s.Checkpoints)-maxCheckpoints:]
	}
}

func (m *Model) event(event string, f fields, t time.Time) {
	switch event {
	case "step", "pipeline_step": // too frequent for the list of the last
		return
	}
	var b strings.Builder
	for _, x := range f {
		switch x.Key {
		case "members", "fingerprint", "worker_env", "parameters_crc32c_by_rank", "shards", "pushes", "servers":
			continue
		}
		v, err := json.Marshal(x.Value)
		if err != nil {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		s := string(v)
		if len(s) > 120 {
			s = s[:117] + "..."
		}
		fmt.Fprintf(&b, "%s=%s", x.Key, s)
	}
	s := &m.snap
	s.Events = append(s.Events, Event{T: t, Event: event, Text: b.String()})
	if len(s.Events) > maxEvents {
		s.Events = s.Events[len(s.Events)-maxEvents:]
	}
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Trimmed is s with shorter lists, as published in etcd: a record
// rewritten every few seconds stays small.
func (s Snapshot) Trimmed() Snapshot {
	tail := func(n, keep int) int { return max(n-keep, 0) }
	s.Curve = s.Curve[tail(len(s.Curve), 300):]
	s.Marks = s.Marks[tail(len(s.Marks), 50):]
	s.Events = s.Events[tail(len(s.Events), 15):]
	s.Checkpoints = s.Checkpoints[tail(len(s.Checkpoints), 10):]
	s.Generations = s.Generations[tail(len(s.Generations), 20):]
	return s
}
