package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary stand in for the phalanx command: as a
// worker its launcher started (they re-execute the running binary), or as
// the command itself when a test starts it as a process.
func TestMain(m *testing.M) {
	reg := examples.Registry()
	phalanx.Main(reg)
	if os.Getenv("PHALANX_TEST_AS_COMMAND") == "1" {
		os.Exit(runMain(reg, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestTrainJob runs a small job end to end on two worker processes and checks
// the progress output and the event log's schema; --events appends, after an
// earlier run's events, which stay.
func TestTrainJob(t *testing.T) {
	evPath := filepath.Join(t.TempDir(), "events.jsonl")
	const earlier = `{"ts":1795000000.000000,"event":"job_started","job":"earlier","etcd_endpoints":"http://127.0.0.1:2379","workers":1,"worker_env":"-"}`
	if err := os.WriteFile(evPath, []byte(earlier+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := runCommand(t, []string{"train", "--workers", "2", "--steps", "6", "--batch", "64",
		"--samples", "512", "--hidden", "16", "--events", evPath}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "step 6/6") || !strings.Contains(out.String(), "done: 6 steps") {
		t.Errorf("progress output:\n%s", out.String())
	}
	f, err := os.Open(evPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		if first && sc.Text() != earlier {
			t.Errorf("the earlier run's event became %q", sc.Text())
		}
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		if ts, ok := e["ts"].(float64); !ok || ts < 1e9 {
			t.Errorf("event without a unix ts: %v", e)
		}
		kind, _ := e["event"].(string)
		counts[kind]++
		want := map[string][]string{
			"job_started":    {"job", "etcd_endpoints", "workers", "worker_env"},
			"worker_started": {"worker", "pid"},
			"generation":     {"generation", "members", "world", "reason"},
			"data_plane":     {"generation", "world", "plane"},
			"step":           {"step", "generation", "world", "loss", "samples_per_s", "epoch", "offset", "fingerprint"},
			"done":           {"step", "accuracy", "loss", "generation", "world"},
			"worker_exited":  {"worker", "pid", "status"},
		}[kind]
		if want == nil {
			t.Errorf("unknown event %v", e)
		}
		for _, k := range want {
			if _, ok := e[k]; !ok {
				t.Errorf("%s event without %q: %v", kind, k, e)
			}
		}
	}
	if counts["job_started"] != 2 || counts["worker_started"] != 2 || counts["step"] != 6 || counts["done"] != 1 || counts["generation"] != 1 || counts["data_plane"] != 1 || counts["worker_exited"] != 2 {
		t.Errorf("event counts %v, want 2 job_started (the earlier run's and this one's), 2 worker_started, 1 generation, 1 data_plane, 6 step, 1 done, 2 worker_exited", counts)
	}
}

// readEvents returns the events of a job's log by kind.
func readEvents(t *testing.T, path string) map[string][]map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]map[string]any{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		kind, _ := e["event"].(string)
		out[kind] = append(out[kind], e)
	}
	return out
}

// TestTrainRankRestart: on real worker processes, a rank whose model code
// panics at step 4 is restarted by its supervisor, and the job ends exactly
// as the same job without the fault: same loss at every step, same held-out
// loss and accuracy.
func TestTrainRankRestart(t *testing.T) {
	dir := t.TempDir()
	job := func(name string, extra ...string) map[string][]map[string]any {
		path := filepath.Join(dir, name)
		args := append([]string{"train", "--workers", "3", "--steps", "8", "--batch", "60", "--samples", "600",
			"--hidden", "16", "--events", path}, extra...)
		var out, errOut bytes.Buffer
		if err := runCommand(t, args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v\n%s\n%s", args, err, out.String(), errOut.String())
		}
		return readEvents(t, path)
	}
	clean := job("clean.jsonl")
	faulty := job("faulty.jsonl", "--fail-at", "2:4")
	if n := len(faulty["rank_restarted"]); n != 1 {
		t.Fatalf("%d rank_restarted events, want 1", n)
	}
	if r := faulty["rank_restarted"][0]; r["rank"] != 2.0 || r["committed_step"] != 3.0 || !strings.Contains(r["reason"].(string), "step 4") {
		t.Errorf("rank_restarted event %v", r)
	}
	if len(clean["step"]) != 8 || len(faulty["step"]) != 8 {
		t.Fatalf("%d and %d step events, want 8", len(clean["step"]), len(faulty["step"]))
	}
	for i := range clean["step"] {
		if clean["step"][i]["loss"] != faulty["step"][i]["loss"] {
			t.Errorf("step %d: loss %v without the fault, %v with", i+1, clean["step"][i]["loss"], faulty["step"][i]["loss"])
		}
	}
	c, f := clean["done"][0], faulty["done"][0]
	if c["loss"] != f["loss"] || c["accuracy"] != f["accuracy"] {
		t.Errorf("done %v without the fault, %v with", c, f)
	}
}

// TestTrainRestartBudget: a rank failing more often than its budget ends
// the job with an error naming the budget, not a hang.
func TestTrainRestartBudget(t *testing.T) {
	var out, errOut bytes.Buffer
	err := runCommand(t, []string{"train", "--workers", "2", "--steps", "6", "--batch", "32", "--samples", "256",
		"--hidden", "8", "--fail-at", "1:2", "--fail-times", "3", "--max-restarts", "2"}, &out, &errOut)
	if err == nil {
		t.Fatalf("the job succeeded:\n%s", out.String())
	}
	if !strings.Contains(err.Error(), "restart budget") || !strings.Contains(err.Error(), "fault injected at step 2") {
		t.Errorf("error %v does not explain the restart budget and the failure", err)
	}
	if strings.Contains(errOut.String(), `"level"`) {
		t.Errorf("library logs on the terminal:\n%s", errOut.String())
	}
}

// TestInjectedStragglerBSP: in BSP mode a rank slowed down (and another
// paused once) by fault injection makes every step wait for it, and changes
// nothing but time: the job's result equals the undisturbed run's exactly,
// and no worker is lost.
//
// That the faults ran is shown by rank 0's own step reports, by lower bounds
// that load cannot break (it only lengthens what is bounded): the step
// before which rank 1 pauses for 1 s cannot end on rank 0 before that second
// has passed; and in BSP every step waits for rank 2, whose model code, slowed
// 200x, sleeps 199x the time it measured itself computing (load included):
// the slowed steps together last at least half of 200 times the fastest
// computation of a step's share seen in the undisturbed run (the half allows
// for rank 0's computation including more than the model's). The model is
// wide enough (--hidden 256) that its computation, not the steps' fixed
// costs, makes that bound several times what the same steps take
// undisturbed. (No event names an injected fault: see the issue 15 report.)
func TestInjectedStragglerBSP(t *testing.T) {
	const slowFrom, slowTo, pauseAt, factor = 5, 15, 20, 200
	args := []string{"--workers", "3", "--steps", "40", "--samples", "4000", "--hidden", "256", "--threads", "1"}
	clean := startJob(t, args...).Finish(t)
	slow := startJob(t, append(args, "--inject-slow", fmt.Sprintf("rank=2,factor=%d,from=%d,to=%d", factor, slowFrom, slowTo),
		"--inject-pause", fmt.Sprintf("rank=1,at=%d,for=1s", pauseAt))...).Finish(t)
	if len(slow["worker_lost"]) != 0 || len(slow["generation"]) != 1 || len(slow["step"]) != 40 || len(clean["step"]) != 40 {
		t.Fatalf("lost %v, %d generations, %d steps (%d undisturbed)", slow["worker_lost"], len(slow["generation"]), len(slow["step"]), len(clean["step"]))
	}
	a, b := clean["done"][0], slow["done"][0]
	if a["loss"] != b["loss"] || a["accuracy"] != b["accuracy"] || a["parameters_crc32c"] == nil || a["parameters_crc32c"] != b["parameters_crc32c"] {
		t.Fatalf("injected run %v differs from the undisturbed %v", b, a)
	}
	if p := slow["step"][pauseAt-1]; jobtest.Num(p, "step") != pauseAt || p["step_s"].(float64) < 0.9 {
		t.Errorf("step %v took %vs on rank 0: rank 1's 1s pause before step %d did not hold it", p["step"], p["step_s"], pauseAt)
	}
	fastest := math.Inf(1)
	for _, e := range clean["step"] {
		fastest = min(fastest, e["compute_s"].(float64))
	}
	var took float64
	for _, e := range slow["step"][slowFrom-1 : slowTo] {
		if jobtest.Num(e, "step") != pauseAt {
			took += e["step_s"].(float64)
		}
	}
	slowed := slowTo - slowFrom + 1
	if pauseAt >= slowFrom && pauseAt <= slowTo {
		slowed-- // the paused step left out
	}
	bound := float64(slowed*factor) * fastest / 2
	if took < bound {
		t.Errorf("steps %d to %d took %.3fs with rank 2 slowed %dx; its computation alone should take over %.3fs (fastest share %.5fs): the slow-down did not hold the ring",
			slowFrom, slowTo, took, factor, bound, fastest)
	}
	var undisturbed float64
	for _, e := range clean["step"][slowFrom-1 : slowTo] {
		if jobtest.Num(e, "step") != pauseAt {
			undisturbed += e["step_s"].(float64)
		}
	}
	t.Logf("steps %d-%d: %.3fs with rank 2 slowed %dx, %.3fs undisturbed (bound %.3fs; fastest share %.5fs); step %d %.2fs with rank 1 paused 1s",
		slowFrom, slowTo, took, factor, undisturbed, bound, fastest, pauseAt, slow["step"][pauseAt-1]["step_s"])
}

// TestLogsKept: a job without --job-dir keeps every process's log in
// $TMPDIR/phalanx-logs/JOB, names it in its first line, and leaves nothing
// else behind (its etcd data goes), whether it succeeds or fails; a failed
// job says where its logs are. At --log-level debug the logs also reach the
// terminal a line each, for people, prefixed with their process.
func TestLogsKept(t *testing.T) {
	t.Setenv("PHALANX_TEST_AS_COMMAND", "1") // the launcher's workers re-execute this binary
	job := []string{"--workers", "2", "--steps", "6", "--batch", "32", "--samples", "256", "--hidden", "8"}
	for _, c := range []struct {
		name   string
		args   []string
		failed bool
	}{
		{"succeeds", nil, false},
		{"fails", []string{"--fail-at", "1:2", "--fail-times", "3", "--max-restarts", "0"}, true},
		{"debug", []string{"--log-level", "debug"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			name := "logs-" + c.name
			var out, errOut bytes.Buffer
			err := runCommand(t, append(append([]string{"train", "--job", name}, job...), c.args...), &out, &errOut)
			if (err != nil) != c.failed {
				t.Fatalf("job: %v (want failed %v)\n%s%s", err, c.failed, out.String(), errOut.String())
			}
			dir := filepath.Join(tmp, "phalanx-logs", name)
			if first, _, _ := strings.Cut(out.String(), "\n"); first != "logs: "+dir {
				t.Errorf("first line %q, want it to name %s", first, dir)
			}
			for _, f := range []string{"launcher.log", "worker-0.log", "worker-1.log"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("log kept: %v", err)
				}
			}
			if left, _ := os.ReadDir(tmp); len(left) != 1 || left[0].Name() != "phalanx-logs" {
				t.Errorf("left in $TMPDIR: %v, want only phalanx-logs", left)
			}
			if said := strings.Contains(out.String(), "the job's logs are in "+dir); said != c.failed {
				t.Errorf("said where the logs are: %v, want %v\n%s", said, c.failed, out.String())
			}
			if c.name != "debug" {
				return
			}
			for _, p := range []string{"[launcher] ", "[worker-0] ", "[worker-1] "} {
				if !strings.Contains(errOut.String(), "\n"+p) {
					t.Errorf("no debug line from %s on the terminal:\n%s", p, jobtest.LastLines(errOut.String(), 10))
				}
			}
			for _, l := range strings.Split(strings.TrimSpace(errOut.String()), "\n") {
				if !strings.HasPrefix(l, "[") {
					t.Fatalf("a terminal log line without its process: %q", l)
				}
			}
		})
	}
}
