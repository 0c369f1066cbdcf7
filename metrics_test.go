package phalanx_test

import (
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// served is a GET's status and body.
func served(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricsEvents keeps what a job said of its metrics and membership.
type metricsEvents struct {
	mu      sync.Mutex
	serving map[string]string // process: address
	pids    map[int]int       // worker index: pid
	worlds  []int
	saved   int
	changed chan struct{}
}

func (m *metricsEvents) Emit(event string, fields ...events.Field) error {
	get := func(k string) any { return fieldOf(fields, k) }
	m.mu.Lock()
	defer m.mu.Unlock()
	switch event {
	case "metrics_serving":
		m.serving[get("process").(string)] = get("address").(string)
	case "worker_started":
		m.pids[get("worker").(int)] = get("pid").(int)
	case "generation":
		m.worlds = append(m.worlds, get("world").(int))
	case "checkpoint_saved":
		m.saved++
	}
	select {
	case m.changed <- struct{}{}:
	default:
	}
	return nil
}

func (m *metricsEvents) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		m.mu.Lock()
		ok := cond()
		m.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-m.changed:
		case <-deadline:
			t.Fatalf("waited 2m for %s", what)
		}
	}
}

// TestMetricsDocumented scrapes a live ring job's one endpoint: every
// metric docs/metrics.md lists for the ring is there, and none it serves
// is undocumented; the values follow the job (steps, world size,
// checkpoints, allreduce bytes on every rank), and a worker killed shows
// as lost, the world smaller and its series gone. /healthz and /readyz
// answer on the launcher and on each worker.
func TestMetricsDocumented(t *testing.T) {
	docs := jobtest.DocumentedMetrics(t, "docs/metrics.md")
	lc := smallJob()
	lc.Steps, lc.Metrics = 1000000, "127.0.0.1:0"
	lc.Checkpoint.Location, lc.Checkpoint.EverySteps = t.TempDir(), 20
	ev := &metricsEvents{serving: map[string]string{}, pids: map[int]int{}, changed: make(chan struct{}, 1)}
	lc.Events = ev
	startRunning(t, lc)
	ev.until(t, "the launcher and both workers serving metrics, and a checkpoint", func() bool {
		return len(ev.serving) == 3 && ev.saved > 0
	})
	ev.mu.Lock()
	launcher, w0, w1 := ev.serving["launcher"], ev.serving["worker-0"], ev.serving["worker-1"]
	ev.mu.Unlock()
	if launcher == "" || w0 == "" || w1 == "" {
		t.Fatalf("serving: %v; want launcher, worker-0 and worker-1", ev.serving)
	}
	// Both ranks have stepped once a scrape shows it.
	var fams map[string]*dto.MetricFamily
	testwait.Until(t, time.Minute, "both ranks' steps in the job's metrics", func() bool {
		fams = jobtest.Scrape(t, launcher)
		_, n := jobtest.MetricValue(fams, "phalanx_step", nil)
		return n == 2
	})
	missing, undocumented := jobtest.MetricsMismatch(docs, fams, "ring")
	for _, name := range missing {
		t.Errorf("%s is documented for the ring and not served", name)
	}
	for _, name := range undocumented {
		t.Errorf("%s is served and not in docs/metrics.md", name)
	}
	for _, c := range []struct {
		name string
		want map[string]string
		min  float64
	}{
		{"phalanx_world_size", map[string]string{"worker": "launcher"}, 2},
		{"phalanx_generation", map[string]string{"worker": "launcher"}, 1},
		{"phalanx_checkpoints_saved_total", nil, 1},
		{"phalanx_checkpoint_bytes_total", nil, 1},
		{"phalanx_step", map[string]string{"worker": "worker-0"}, 1},
		{"phalanx_step", map[string]string{"worker": "worker-1"}, 1},
		{"phalanx_samples_total", map[string]string{"worker": "worker-1"}, 32},
		{"phalanx_step_seconds", map[string]string{"worker": "worker-1"}, 1},
		{"phalanx_allreduce_bytes_total", map[string]string{"worker": "worker-0"}, 1},
		{"phalanx_allreduce_bytes_total", map[string]string{"worker": "worker-1"}, 1},
	} {
		if v, n := jobtest.MetricValue(fams, c.name, c.want); n == 0 || v < c.min {
			t.Errorf("%s%v: %v over %d series, want at least %v", c.name, c.want, v, n, c.min)
		}
	}
	for _, addr := range []string{launcher, w0, w1} {
		if code, body := served(t, "http://"+addr+"/healthz"); code != 200 {
			t.Errorf("%s/healthz: %d %q", addr, code, body)
		}
		if code, body := served(t, "http://"+addr+"/readyz"); code != 200 {
			t.Errorf("%s/readyz: %d %q, want ready", addr, code, body)
		}
	}
	if t.Failed() {
		return
	}
	// Worker 1 dies: the job's metrics say so.
	ev.mu.Lock()
	pid := ev.pids[1]
	ev.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev.until(t, "a generation of one worker", func() bool { return len(ev.worlds) > 0 && ev.worlds[len(ev.worlds)-1] == 1 })
	testwait.Until(t, time.Minute, "the lost worker in the job's metrics", func() bool {
		fams = jobtest.Scrape(t, launcher)
		lost, _ := jobtest.MetricValue(fams, "phalanx_workers_lost_total", nil)
		world, _ := jobtest.MetricValue(fams, "phalanx_world_size", map[string]string{"worker": "launcher"})
		_, n := jobtest.MetricValue(fams, "phalanx_step", map[string]string{"worker": "worker-1"})
		return lost == 1 && world == 1 && n == 0
	})
}
