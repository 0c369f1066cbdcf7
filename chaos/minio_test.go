package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

// TestMinIOServiceNeedsBinary: without a MinIO binary a minio scenario
// is refused with a message naming scripts/install-minio.
func TestMinIOServiceNeedsBinary(t *testing.T) {
	t.Setenv("PHALANX_MINIO", "/nonexistent/minio")
	sc, err := Lookup("minio-restart")
	if err != nil {
		t.Fatal(err)
	}
	_, err = minioService(&sc)
	if !errors.Is(err, ErrNoMinIO) || !strings.Contains(err.Error(), "scripts/install-minio") {
		t.Fatalf("minioService: %v, want ErrNoMinIO naming scripts/install-minio", err)
	}
	sc.Job.Store = "dir"
	if s, err := minioService(&sc); s != nil || err != nil {
		t.Fatalf("a dir store: %v, %v; want no service", s, err)
	}
}

// eventLog keeps a launch's events beside the runner's.
type eventLog struct {
	next events.Sink
	mu   sync.Mutex
	all  []Event
}

func (l *eventLog) Emit(kind string, fields ...events.Field) error {
	m := map[string]any{}
	for _, f := range fields {
		b, err := json.Marshal(f.Value)
		if err != nil {
			return err
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		m[f.Key] = v
	}
	l.mu.Lock()
	l.all = append(l.all, Event{At: time.Now(), Kind: kind, Fields: m})
	l.mu.Unlock()
	return l.next.Emit(kind, fields...)
}

// TestMinIOScenarios runs the MinIO scenarios against a real MinIO and
// real workers: every invariant holds (the model bitwise the undisturbed
// one's, every complete checkpoint verifies); the evidence shows MinIO
// taken away and brought back on its port, with a worker's request
// meeting the outage; and the job's events show a checkpoint upload that
// overlapped it (reported failed, or saved only after MinIO came back
// though taken before it went away).
func TestMinIOScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	miniotest.RequireBinary(t)
	log := &eventLog{}
	// One runner: both scenarios share their job, hence one reference run.
	r := &Runner{Registry: examples.Registry(), Dir: jobtest.KeptDir(t), Configure: func(lc *phalanx.LaunchConfig) {
		if strings.HasPrefix(lc.Checkpoint.Location, "s3://") {
			log.next, lc.Events = lc.Events, log
		}
	}}
	for _, tc := range []struct{ name, inject, heal string }{
		{"minio-restart", "SIGKILL to MinIO", "MinIO restarted"},
		{"minio-pause", "SIGSTOP to MinIO", "SIGCONT to MinIO"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := Lookup(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			log.mu.Lock()
			log.all = nil
			log.mu.Unlock()
			rep := runAndCheck(t, r, sc, 1)
			if v := rep.Invariants[5]; v.Status != "pass" {
				t.Errorf("invariant 5: %s, want complete checkpoints that verify", v.Status)
			}
			if !rep.Passed {
				t.Fatalf("the run failed; kept in %s", rep.Dir)
			}
			f := rep.Faults[0]
			t.Logf("fault: %s; healed: %s", f.What, f.HealWhat)
			if !strings.Contains(f.What, tc.inject) || !strings.Contains(f.HealWhat, tc.heal) || f.Healed.IsZero() {
				t.Errorf("evidence %q, healed %q: want %q then %q", f.What, f.HealWhat, tc.inject, tc.heal)
			}
			mf, ok := f.fault.(*minioFault)
			if !ok {
				t.Fatalf("fault %T, want a *minioFault", f.fault)
			}
			if n := mf.workerRequests(); n == 0 {
				t.Errorf("no worker's request met the outage")
			}

			// Events: a checkpoint taken before MinIO came back and saved
			// after, or one reported failed.
			log.mu.Lock()
			evs := log.all
			log.mu.Unlock()
			back := mf.backAt()
			stepSeen := map[int64]time.Time{}
			overlapped := ""
			for _, e := range evs {
				switch e.Kind {
				case "step":
					stepSeen[e.num("step")] = e.At
				case "checkpoint_failed":
					overlapped = fmt.Sprintf("checkpoint of step %d failed: %v", e.num("step"), e.Fields["error"])
				case "checkpoint_saved":
					at, ok := stepSeen[e.num("step")]
					if overlapped == "" && ok && at.Before(back) && e.At.After(back) {
						overlapped = fmt.Sprintf("checkpoint of step %d taken before MinIO was back, saved after (%v)", e.num("step"), e.Fields["url"])
					}
				}
			}
			if overlapped == "" {
				t.Errorf("no checkpoint upload overlapped the outage (%d events)", len(evs))
			}
			t.Logf("overlap: %s", overlapped)
		})
	}
}
