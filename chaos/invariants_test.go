package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/sockowner"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// stepEvents are the step events of a ring job of n samples that trained
// steps of batch on worlds[i] ranks at step i+1, as its launcher emits
// them: each step's fingerprint is the sum of its ranks' shards, from the
// sampler the workers use. edit may change a step's shards before they are
// summed (the rank's indices, by rank), and say which ranks took part.
func stepEvents(t *testing.T, n, batch int, seed uint64, worlds []int, edit func(step int, idx [][]int) (parts []int)) []Event {
	t.Helper()
	s, err := worker.NewSampler(n, seed)
	if err != nil {
		t.Fatal(err)
	}
	var pos worker.Position
	var out []Event
	for i, world := range worlds {
		idx := make([][]int, world)
		var next worker.Position
		for r := range world {
			if idx[r], _, next, err = s.Batch(pos, batch, world, r, nil); err != nil {
				t.Fatal(err)
			}
		}
		parts := make([]int, world)
		for r := range parts {
			parts[r] = r
		}
		if edit != nil {
			if p := edit(i+1, idx); p != nil {
				parts = p
			}
		}
		var fp worker.Fingerprint
		for _, r := range parts {
			add(&fp, worker.FingerprintOf(idx[r]))
		}
		out = append(out, Event{Kind: "step", Fields: map[string]any{
			"step": float64(i + 1), "generation": float64(1), "world": float64(world),
			"participants": float64(len(parts)), "stale": float64(world - len(parts)),
			"epoch": float64(next.Epoch), "offset": float64(next.Offset), "fingerprint": []any{fp[0], fp[1], fp[2], fp[3], fp[4]},
		}})
		pos = next
	}
	return out
}

// worldsOf is steps steps on world ranks, then on world2 from step change.
func worldsOf(steps, world, change, world2 int) []int {
	out := make([]int, steps)
	for i := range out {
		out[i] = world
		if i+1 >= change {
			out[i] = world2
		}
	}
	return out
}

// TestSampleCheck: invariant 2 passes a run that trained each step's global
// batch through world changes (one across an epoch boundary), and fails,
// naming the step, rank and sample, one that skipped a sample, trained one
// twice, lost a step, or dropped a late rank's samples without a record.
func TestSampleCheck(t *testing.T) {
	const n, batch, seed = 1000, 64, 9
	c := sampleCheck{samples: n, batch: batch, seed: seed, total: 40} // 16 steps an epoch: 2.5 epochs
	worlds := worldsOf(40, 4, 16, 3)                                  // the change from step 16, the last of epoch 0
	for _, tc := range []struct {
		name   string
		evs    []Event
		status string
		says   string
	}{
		{"every sample once", stepEvents(t, n, batch, seed, worlds, nil), "pass",
			`each of 2 whole epochs trained \(or recorded dropped\) every one of the 1000 indices exactly once; epoch 2 at 512`},
		{"a sample skipped", stepEvents(t, n, batch, seed, worlds, func(step int, idx [][]int) []int {
			if step == 23 {
				idx[1] = idx[1][:len(idx[1])-1]
			}
			return nil
		}), "fail", `^step 23 \(generation 1, world 3, 3 participants\): .*: rank 1's sample \d+ was not trained$`},
		{"a sample trained twice", stepEvents(t, n, batch, seed, worlds, func(step int, idx [][]int) []int {
			if step == 5 {
				idx[3][2] = idx[3][0]
			}
			return nil
		}), "fail", `^step 5 .*: rank 3 trained sample \d+ twice and sample \d+ never$`},
		{"a hybrid step without a late rank, recorded", stepEvents(t, n, batch, seed, worlds, func(step int, idx [][]int) []int {
			if step == 7 {
				return []int{0, 1, 3}
			}
			return nil
		}), "pass", `1 steps recorded stale ranks' samples as dropped`},
		{"a hybrid step that lost more than its late rank", stepEvents(t, n, batch, seed, worlds, func(step int, idx [][]int) []int {
			if step == 7 {
				idx[0] = idx[0][1:]
				return []int{0, 1, 3}
			}
			return nil
		}), "fail", `^step 7 \(generation 1, world 4, 3 participants\): .*not the shards of any 3 of its ranks, so samples were lost beyond the stale ranks' recorded ones`},
		{"a late rank's samples dropped without a record", func() []Event {
			evs := stepEvents(t, n, batch, seed, worlds, func(step int, idx [][]int) []int {
				if step == 30 {
					return []int{0, 2}
				}
				return nil
			})
			evs[29].Fields["participants"], evs[29].Fields["stale"] = float64(3), float64(0)
			return evs
		}(), "fail", `^step 30 \(generation 1, world 3, 3 participants\): .*: 21 samples lost, none recorded as dropped`},
		{"a step never trained", append(stepEvents(t, n, batch, seed, worlds, nil)[:12:12], stepEvents(t, n, batch, seed, worlds, nil)[13:]...), "fail",
			`^39 step events for 40 steps: step 13 never trained$`},
		{"a step trained twice", append(stepEvents(t, n, batch, seed, worlds, nil)[:13:13], stepEvents(t, n, batch, seed, worlds, nil)[12:39]...), "fail",
			`^40 step events for 40 steps|^step event 14 is of step 13$`},
		{"a step ending at the wrong position", func() []Event {
			evs := stepEvents(t, n, batch, seed, worlds, nil)
			evs[9].Fields["offset"] = float64(0)
			return evs
		}(), "fail", `^step 10 ended at sampler position 0/0, want 0/640$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := c.check(tc.evs)
			if v.N != 2 || v.Status != tc.status || !regexp.MustCompile(tc.says).MatchString(v.Evidence) {
				t.Fatalf("invariant %d %s: %s\nwant %s matching %q", v.N, v.Status, v.Evidence, tc.status, tc.says)
			}
		})
	}
}

// TestExplainEpoch: an epoch that dealt one index twice and another never
// is told from one that lost samples, by the fingerprints alone.
func TestExplainEpoch(t *testing.T) {
	const n = 6000
	full := wholeSet(n)
	got := full
	add(&got, worker.FingerprintOf([]int{4711}))
	bad := worker.FingerprintOf([]int{123})
	for k := range got {
		got[k] -= bad[k]
	}
	if s := explainEpoch(got, full); !strings.Contains(s, "one trained twice and one never") {
		t.Errorf("explainEpoch: %q", s)
	}
	short := full
	short[0]--
	if s := explainEpoch(short, full); !strings.Contains(s, "1 samples never trained") {
		t.Errorf("explainEpoch of a short epoch: %q", s)
	}
}

// TestCheckIdentical: invariant 3 fails without a done event, when the
// ranks' parameters differ (naming the rank), and when the flag and the
// gathered checksums disagree.
func TestCheckIdentical(t *testing.T) {
	done := func(same bool, crcs ...float64) []Event {
		var cs []any
		for _, c := range crcs {
			cs = append(cs, c)
		}
		return []Event{{Kind: "done", Fields: map[string]any{"step": float64(150), "world": float64(len(crcs)),
			"parameters_identical": same, "parameters_crc32c_by_rank": cs}}}
	}
	for _, tc := range []struct {
		name   string
		evs    []Event
		status string
		says   string
	}{
		{"identical", done(true, 7, 7, 7), "pass", "parameters_identical=true"},
		{"no done event", nil, "fail", "no done event"},
		{"rank 2 differs", done(false, 7, 7, 8), "fail", "parameters_identical=false: rank 2's parameters have CRC32C 00000008, rank 0's 00000007"},
		{"the flag lies", done(true, 7, 9, 7), "fail", "parameters_identical=true, yet rank 1's parameters have CRC32C 00000009"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := checkIdentical(tc.evs)
			if v.N != 3 || v.Status != tc.status || !strings.Contains(v.Evidence, tc.says) {
				t.Fatalf("%+v: want %s saying %q", v, tc.status, tc.says)
			}
		})
	}
}

// TestCheckSchedule: invariant 0 fails a fault never triggered, never
// healed, failed, or without its effect: a ring fault whose target stayed
// in every later generation, a kill-all followed by no relaunch.
func TestCheckSchedule(t *testing.T) {
	t0 := time.Unix(100, 0)
	gen := func(at float64, ids ...string) Event {
		var ms []any
		for i, id := range ids {
			ms = append(ms, map[string]any{"id": id, "rank": float64(i)})
		}
		return Event{At: t0.Add(time.Duration(at * float64(time.Second))), Kind: "generation", Fields: map[string]any{"members": ms}}
	}
	started := Event{At: t0, Kind: "job_started", Fields: map[string]any{}}
	exited := func(pid int, status string) Event {
		return Event{At: t0.Add(7 * time.Second), Kind: "worker_exited", Fields: map[string]any{"pid": float64(pid), "status": status}}
	}
	kill := func() *FaultRecord {
		return &FaultRecord{Planned: Planned{Index: 0, Kind: "sigkill"}, Changes: "ring", Attempt: 1, TargetRank: 2, TargetID: "w2",
			Injected: t0.Add(5 * time.Second), What: "SIGKILL to rank 2 (pid 42)"}
	}
	for _, tc := range []struct {
		name     string
		f        *FaultRecord
		evs      []Event
		launches int
		status   string
		says     string
	}{
		{"the target left the ring", kill(), []Event{started, gen(1, "w0", "w1", "w2"), gen(6, "w0", "w1")}, 1, "pass", "fault 0 at step 0: SIGKILL to rank 2"},
		{"the target stayed", kill(), []Event{started, gen(1, "w0", "w1", "w2"), gen(6, "w1", "w0", "w2")}, 1, "fail",
			"fault 0 (sigkill) had no effect: its target, rank 2 (worker w2), is in every generation after it"},
		{"only an earlier generation left it out", kill(), []Event{started, gen(1, "w0", "w1"), gen(2, "w0", "w1", "w2")}, 1, "fail", "had no effect"},
		{"never triggered", &FaultRecord{Planned: Planned{Index: 3, Kind: "sigkill", Step: 90}}, nil, 1, "fail", "fault 3 (sigkill): never triggered (step 90)"},
		{"never healed", &FaultRecord{Planned: Planned{Kind: "sigstop", Duration: Duration(time.Second)}, Injected: t0}, nil, 1, "fail", "never healed"},
		{"could not be injected", &FaultRecord{Planned: Planned{Kind: "sigkill"}, Injected: t0, Error: "rank 1 (pid 9) had already exited"}, nil, 1, "fail",
			"fault 0 (sigkill): rank 1 (pid 9) had already exited"},
		{"no relaunch after kill-all", &FaultRecord{Planned: Planned{Kind: "kill-all"}, Changes: "resume", Attempt: 1, Injected: t0, What: "SIGKILL to every worker"}, nil, 1, "fail",
			"fault 0 (kill-all) had no effect: launch 1 was the last"},
		{"killed", func() *FaultRecord { f := kill(); f.TargetPid = 42; return f }(),
			[]Event{started, gen(1, "w0", "w1", "w2"), exited(42, "signal: killed"), gen(6, "w0", "w1")}, 1, "pass", "SIGKILL to rank 2"},
		{"not killed: it ended by itself", func() *FaultRecord { f := kill(); f.TargetPid = 42; return f }(),
			[]Event{started, gen(1, "w0", "w1", "w2"), exited(42, "exit 0")}, 1, "fail",
			`fault 0 (sigkill) had no effect: its target, rank 2 (pid 42), ended with "exit 0", not killed`},
		{"relaunched after kill-all", &FaultRecord{Planned: Planned{Kind: "kill-all"}, Changes: "resume", Attempt: 1, Injected: t0, What: "SIGKILL to every worker"}, nil, 2, "pass", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ru := &run{faults: []*FaultRecord{tc.f}}
			v := ru.checkSchedule(&Outcome{Events: tc.evs, Launches: tc.launches})
			if v.N != 0 || v.Status != tc.status || !strings.Contains(v.Evidence, tc.says) {
				t.Fatalf("%+v: want %s saying %q", v, tc.status, tc.says)
			}
		})
	}
}

// TestRequireApplicable: an invariant with nothing to check fails unless
// the scenario's job and faults (or its own word) excuse it.
func TestRequireApplicable(t *testing.T) {
	kinds := DefaultKinds()
	for _, tc := range []struct {
		name string
		sc   Scenario
		na   []int
	}{
		{"a ring job without checkpoints or ring faults", Scenario{Job: JobSpec{Workers: 2}, Faults: []FaultSpec{{Kind: "sigstop"}}}, []int{5, 6, 8}},
		{"a ring job that loses a rank, with checkpoints", Scenario{Job: JobSpec{Workers: 2, CheckpointEvery: 5}, Faults: []FaultSpec{{Kind: "sigkill"}}}, []int{6}},
		{"a kill-all", Scenario{Job: JobSpec{Workers: 2, CheckpointEvery: 5}, Faults: []FaultSpec{{Kind: "kill-all"}}}, []int{6}},
		{"a ps job without a failover", Scenario{Job: JobSpec{Kind: "ps", Workers: 2}, Faults: []FaultSpec{{Kind: "ps-worker-kill"}}}, []int{3, 5}},
		{"a ps job with a failover", Scenario{Job: JobSpec{Kind: "ps", Workers: 2}, Faults: []FaultSpec{{Kind: "ps-primary-kill"}}}, []int{5}},
		{"a ps job whose acknowledgements are lost", Scenario{Job: JobSpec{Kind: "ps", Workers: 2}, Faults: []FaultSpec{{Kind: "ps-ack-lost"}}}, []int{5}},
		{"declared", Scenario{Job: JobSpec{Workers: 2}, NotApplicable: []int{4}}, []int{4, 5, 6, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			na := tc.sc.inapplicable(kinds)
			for n := range 9 {
				_, got := na[n]
				want := false
				for _, m := range tc.na {
					want = want || m == n
				}
				if got != want {
					t.Errorf("invariant %d inapplicable: %v, want %v", n, got, want)
				}
			}
			vs := make([]Verdict, 9)
			for n := range vs {
				vs[n] = notApplicable(n, "nothing to check")
			}
			requireApplicable(vs, na)
			for _, v := range vs {
				if _, excused := na[v.N]; excused != (v.Status == "n/a") || !excused && !strings.Contains(v.Evidence, "n/a, but the scenario's job and faults make it apply: nothing to check") {
					t.Errorf("invariant %d: %s %q (excused: %v)", v.N, v.Status, v.Evidence, excused)
				}
			}
		})
	}
	bad := Scenario{Name: "x", Job: JobSpec{Workers: 1, Steps: 10}, NotApplicable: []int{2}}
	if err := bad.Validate(kinds); err == nil || !strings.Contains(err.Error(), "not_applicable names invariant 2") {
		t.Errorf("a scenario excusing invariant 2: %v", err)
	}
}

// TestCheckCheckpoints: invariant 5 fails a complete checkpoint that does
// not verify (naming it and the object), one changed after it was saved,
// and one damaged on purpose that still verifies; it passes them intact.
func TestCheckCheckpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type setup struct {
		ru  *run
		ids []string
	}
	newRun := func(t *testing.T) setup {
		store, err := checkpoint.NewLocalStore(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		data := make([]float32, 4096)
		s := setup{ru: &run{store: store, damaged: map[string]bool{}, saved: map[string]uint32{}}}
		saved := func(e checkpoint.Event) {
			if e.Kind == "saved" {
				s.ru.saved[e.ID] = e.ManifestCRC // as the launcher's checkpoint_saved event carries it
			}
		}
		ck, err := checkpoint.New(checkpoint.Config{Store: store, Job: "j", OnEvent: saved},
			[]checkpoint.Tensor{{Name: "w", Shape: []int64{4096}, Role: "parameter", Data: data}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ck.Close(ctx) })
		for step := int64(10); step <= 20; step += 10 {
			for i := range data {
				data[i] = float32(step) + float32(i)
			}
			id, err := ck.SaveAlone(ctx, checkpoint.Progress{Step: step}, 1)
			if err != nil {
				t.Fatal(err)
			}
			s.ids = append(s.ids, id)
		}
		return s
	}
	replace := func(t *testing.T, s setup, name string, edit func([]byte) []byte) {
		objs, err := s.ru.store.List(ctx, name)
		if err != nil || len(objs) != 1 {
			t.Fatalf("%s: %v %v", name, objs, err)
		}
		b := make([]byte, objs[0].Size)
		if err := s.ru.store.ReadAt(ctx, name, b, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.ru.store.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := s.ru.store.Put(ctx, name, edit(b)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		edit   func(t *testing.T, s setup)
		status string
		says   string
	}{
		{"intact", func(*testing.T, setup) {}, "pass", "2 complete checkpoints verify"},
		{"a corrupt object", func(t *testing.T, s setup) {
			replace(t, s, s.ids[0]+"/shard-00000-of-00001", func(b []byte) []byte { b[100] ^= 1; return b })
		}, "fail", "shard-00000-of-00001"},
		{"changed after it was saved", func(t *testing.T, s setup) {
			// A consistent rewrite: the newer checkpoint's data and
			// checksums under the older one's name.
			for _, o := range []string{"shard-00000-of-00001", checkpoint.ManifestName} {
				objs, _ := s.ru.store.List(ctx, s.ids[1]+"/"+o)
				b := make([]byte, objs[0].Size)
				if err := s.ru.store.ReadAt(ctx, s.ids[1]+"/"+o, b, 0); err != nil {
					t.Fatal(err)
				}
				if o == checkpoint.ManifestName {
					m, err := checkpoint.DecodeManifest(s.ids[1], b)
					if err != nil {
						t.Fatal(err)
					}
					m.Id, m.Step = s.ids[0], 10
					b = marshalManifest(t, m)
				}
				replace(t, s, s.ids[0]+"/"+o, func([]byte) []byte { return b })
			}
		}, "fail", "changed after it was saved"},
		{"damaged on purpose, still verifies", func(t *testing.T, s setup) { s.ru.damaged[s.ids[1]] = true }, "fail", "was damaged on purpose and still verifies"},
		{"damaged on purpose and refused", func(t *testing.T, s setup) {
			s.ru.damaged[s.ids[1]] = true
			replace(t, s, s.ids[1]+"/shard-00000-of-00001", func(b []byte) []byte { b[7] ^= 1; return b })
		}, "pass", "damaged on purpose and refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRun(t)
			tc.edit(t, s)
			v := s.ru.checkCheckpoints(ctx)
			if v.N != 5 || v.Status != tc.status || !strings.Contains(v.Evidence, tc.says) {
				t.Fatalf("%+v: want %s saying %q", v, tc.status, tc.says)
			}
			if tc.status == "fail" && !strings.Contains(v.Evidence, "step-") {
				t.Errorf("evidence %q names no checkpoint", v.Evidence)
			}
		})
	}
}

// TestCheckLeftovers: invariant 7 fails for a process of the job still
// running (found by its mark, its pid recorded nowhere), a data-plane port
// that a process of the job's still listens on, a shared-memory file of
// the job, and a directory of shared-memory files it cannot list; a port
// the job freed and another process took since is no leftover.
func TestCheckLeftovers(t *testing.T) {
	const job = "chaos-leftovers-1-1"
	evs := []Event{{Kind: "job_started", Fields: map[string]any{"job": job}}}
	newRun := func(t *testing.T) *run {
		return &run{sc: &Scenario{}, marker: t.TempDir(), shmDir: t.TempDir(), pids: map[int64]bool{}, addrs: map[string]bool{}}
	}
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, ru *run)
		status string
		says   string
	}{
		{"nothing left", func(*testing.T, *run) {}, "pass", "no process of the job's left"},
		{"a marked process", func(t *testing.T, ru *run) {
			cmd := exec.Command("sleep", "60")
			cmd.Env = append(os.Environ(), markEnv+"="+ru.marker)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			environSet(t, cmd.Process.Pid, markEnv+"="+ru.marker)
		}, "fail", "(sleep) of the job's still runs"},
		{"another run's process", func(t *testing.T, ru *run) {
			cmd := exec.Command("sleep", "60")
			cmd.Env = append(os.Environ(), markEnv+"="+ru.marker+"-other")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		}, "pass", "no process of the job's left"},
		{"a recorded worker alive", func(t *testing.T, ru *run) {
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			ru.pids[int64(cmd.Process.Pid)] = true
		}, "fail", "still exists"},
		{"a port of the job's that accepts", func(t *testing.T, ru *run) {
			ru.addrs[listenerProcess(t, markEnv+"="+ru.marker)] = true
		}, "fail", "still accepts connections"},
		{"a recorded worker's port that accepts", func(t *testing.T, ru *run) {
			addr := listenerProcess(t)
			ru.addrs[addr] = true
			pid, err := sockowner.Listener(addr)
			if err != nil || pid == 0 {
				t.Fatalf("sockowner.Listener(%s): %d, %v", addr, pid, err)
			}
			ru.pids[int64(pid)] = true
		}, "fail", "still accepts connections"},
		{"a port another process took since", func(t *testing.T, ru *run) {
			ru.addrs[listenerProcess(t)] = true
		}, "pass", "is another process's now"},
		{"a shared-memory file of the job", func(t *testing.T, ru *run) {
			name := fmt.Sprintf("phalanx-%016x-g3-r1-%016x", collective.JobHash(job), 77)
			if err := os.WriteFile(filepath.Join(ru.shmDir, name), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "fail", "shared-memory file "},
		{"another job's shared-memory file", func(t *testing.T, ru *run) {
			name := fmt.Sprintf("phalanx-%016x-g3-r1-%016x", collective.JobHash(job+"x"), 77)
			if err := os.WriteFile(filepath.Join(ru.shmDir, name), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "pass", "no shared-memory file"},
		{"shared memory not listable", func(t *testing.T, ru *run) { ru.shmDir = filepath.Join(ru.shmDir, "missing") }, "fail", "the shared-memory files could not be listed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ru := newRun(t)
			tc.setup(t, ru)
			v := ru.checkLeftovers(evs)
			if v.N != 7 || v.Status != tc.status || !strings.Contains(v.Evidence, tc.says) {
				t.Fatalf("%+v: want %s saying %q", v, tc.status, tc.says)
			}
		})
	}
}

// listenerProcess starts a process (with env added) that listens on a loopback
// port of its own, and returns the port's address once it listens.
func listenerProcess(t *testing.T, env ...string) string {
	t.Helper()
	cmd := exec.Command("python3", "-c", "import socket, sys, time\n"+
		"s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"+
		"print(s.getsockname()[1], flush=True); time.sleep(60)")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n') // the listener's port: it listens
	if err != nil {
		t.Fatalf("the listening process said nothing: %v", err)
	}
	return "127.0.0.1:" + strings.TrimSpace(line)
}

// TestTookHold: a signal fault checks its signal took hold: a stopped
// process is seen stopped, a killed one dead, and one that got nothing
// (signal 0) fails; a target already gone is refused before the signal.
func TestTookHold(t *testing.T) {
	start := func(t *testing.T) *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	t.Run("stopped", func(t *testing.T) {
		cmd := start(t)
		syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP)
		defer syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
		if err := tookHold(cmd.Process.Pid, syscall.SIGSTOP, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("killed", func(t *testing.T) {
		cmd := start(t)
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		if err := tookHold(cmd.Process.Pid, syscall.SIGKILL, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a zombie is dead", func(t *testing.T) {
		cmd := start(t)
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) // not reaped yet
		if err := tookHold(cmd.Process.Pid, syscall.SIGKILL, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("no signal", func(t *testing.T) {
		cmd := start(t)
		if err := tookHold(cmd.Process.Pid, syscall.SIGSTOP, 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "the process is not stopped") {
			t.Fatalf("tookHold of a running process: %v", err)
		}
	})
	t.Run("gone before", func(t *testing.T) {
		cmd := start(t)
		cmd.Process.Kill()
		cmd.Wait()
		f := &signalFault{sig: syscall.SIGKILL}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := f.Inject(ctx, &Env{Members: []Member{{Pid: int64(cmd.Process.Pid)}}})
		if err == nil || !strings.Contains(err.Error(), "had already exited") {
			t.Fatalf("a signal fault to an exited process: %v", err)
		}
	})
}

// environSet waits until the kernel shows kv in pid's environment: exec.Cmd's
// Start returns once the exec has begun, and /proc/<pid>/environ reads empty
// until the new program's memory is set up (seen once in a full pass).
func environSet(t *testing.T, pid int, kv string) {
	t.Helper()
	testwait.Until(t, 10*time.Second, fmt.Sprintf("/proc/%d/environ to hold %s", pid, kv), func() bool {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		return err == nil && bytes.Contains(env, []byte(kv+"\x00"))
	})
}

func marshalManifest(t *testing.T, m *phalanxpb.Manifest) []byte {
	t.Helper()
	b, err := checkpoint.EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
