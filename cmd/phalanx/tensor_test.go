package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/examples/gpt"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/tp"
	"github.com/phalanx-rt/phalanx/worker"
)

// gptArgs are a small gpt job's flags: 1 MiB of the Go source, a model
// of width 32, one block of 2 heads, windows of 32 characters.
func gptArgs(steps int, more ...string) []string {
	return append([]string{"--example", "gpt", "--steps", fmt.Sprint(steps), "--width", "32", "--depth", "1", "--heads", "2",
		"--context", "32", "--batch", "16", "--corpus-mb", "1", "--eval-windows", "32", "--optimizer", "momentum", "--lr", "1", "--clip", "0.1",
		"--threads", "1"}, more...)
}

// TestTensorParallelMatchesOneRank: the gpt example split across 2
// tensor-parallel ranks, with 1 replica and with 2, reaches the held-out
// loss of the unsplit model on one worker within 2% after the same steps
// (the same samples, the sums in another order), and its first step's
// gradient norm over the ranks is the whole model's (a whole parameter,
// held by every rank, counted once); its done event carries
// the held-out nats per character and perplexity, and the replicas end
// identical.
func TestTensorParallelMatchesOneRank(t *testing.T) {
	const steps = 30
	ref := doneOf(t, startJob(t, gptArgs(steps, "--workers", "1")...).Finish(t))
	want := ref["loss"].(float64)
	norm1 := firstGradNorm(t)
	for _, dp := range []string{"1", "2"} {
		t.Run("dp"+dp, func(t *testing.T) {
			ev := startJob(t, gptArgs(steps, "--dp", dp, "--tp", "2")...).Finish(t)
			seen := false
			for _, e := range ev["pipeline_step"] {
				if jobtest.Num(e, "step") == 1 && e["grad_norm"] != nil {
					seen = true
					if g := e["grad_norm"].(float64); math.Abs(g-norm1) > 1e-4*norm1 {
						t.Errorf("step 1's gradient norm over the ranks %v, the whole model's %v", g, norm1)
					}
				}
			}
			if !seen {
				t.Error("no pipeline_step event of step 1 with a grad_norm")
			}
			d := doneOf(t, ev)
			got, _ := d["loss"].(float64)
			if math.Abs(got-want) > 0.02*want || jobtest.Num(d, "step") != steps || d["parameters_identical"] != true {
				t.Errorf("--dp %s --tp 2: done %v; the unsplit model's held-out loss %.4f", dp, d, want)
			}
			if p, _ := d["perplexity"].(float64); math.Abs(p-math.Exp(got)) > 1e-6*p {
				t.Errorf("perplexity %v for a loss of %v", d["perplexity"], got)
			}
			if n := len(ev["worker_started"]); n != 2*int(dp[0]-'0') {
				t.Errorf("%d workers started for --dp %s --tp 2", n, dp)
			}
		})
	}
	// The staged form (ModelSpec.Impl): the layers cut into 2 pipeline
	// stages, 4 micro-batches of whole windows.
	t.Run("pp2", func(t *testing.T) {
		ev := startJob(t, gptArgs(steps, "--pp", "2", "--micro-batches", "4")...).Finish(t)
		d := doneOf(t, ev)
		got, _ := d["loss"].(float64)
		if math.Abs(got-want) > 0.02*want || jobtest.Num(d, "step") != steps || d["nats_per_char"] != got {
			t.Errorf("--pp 2: done %v; the unsplit model's held-out loss %.4f", d, want)
		}
		stages, normed := map[int]bool{}, false
		for _, e := range ev["pipeline_step"] {
			stages[jobtest.Num(e, "stage")] = true
			if jobtest.Num(e, "step") == 1 && e["grad_norm"] != nil { // the last stage's: the whole model's norm
				normed = true
				if g := e["grad_norm"].(float64); math.Abs(g-norm1) > 1e-4*norm1 {
					t.Errorf("--pp 2: step 1's gradient norm %v, the whole model's %v", g, norm1)
				}
			}
		}
		if len(stages) != 2 || !normed {
			t.Errorf("pipeline_step events of stages %v, want 0 and 1, and a gradient norm at step 1 (seen: %v)", stages, normed)
		}
	})
}

// firstGradNorm is the global norm of the whole model's gradient at
// step 1 of gptArgs' job: its first batch, as the sampler draws it.
func firstGradNorm(t *testing.T) float64 {
	t.Helper()
	spec := gpt.Spec()
	o, err := spec.Resolve(map[string]string{"width": "32", "depth": "1", "heads": "2", "context": "32", "corpus-mb": "1", "eval-windows": "32"})
	if err != nil {
		t.Fatal(err)
	}
	task, err := spec.New(o, 1) // the default --seed
	if err != nil {
		t.Fatal(err)
	}
	s, err := worker.NewSampler(task.Train.Len(), 1)
	if err != nil {
		t.Fatal(err)
	}
	idx, size, _, err := s.Batch(worker.Position{}, 16, 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b worker.Batch
	if err := task.Train.Fill(idx, &b); err != nil {
		t.Fatal(err)
	}
	if _, err := task.Model.Step(&b, 1/float32(size), nil); err != nil {
		t.Fatal(err)
	}
	return nn.GlobalNorm(task.Model.Params())
}

// TestTensorParallelRankKilled: at --dp 2 --tp 2, a tensor-parallel rank
// SIGKILLed takes its replica with it; the other replica goes on with no
// step redone, the replica re-forms from it when the replacement worker
// joins, and the job finishes with identical replicas.
func TestTensorParallelRankKilled(t *testing.T) {
	const steps = 3000 // outlasts the kill and the replacement's start
	j := startJob(t, gptArgs(steps, "--dp", "2", "--tp", "2", "--width", "16", "--context", "16", "--batch", "8")...)
	j.Until(t, "step 10", func(e jobtest.Event) bool { return e["event"] == "pipeline_step" && jobtest.Num(e, "step") >= 10 })
	j.KillWorker(t, 3, syscall.SIGKILL) // replica 1, rank 1
	lost := j.Until(t, "stage_lost", jobtest.Kind("stage_lost"))
	if jobtest.Num(lost, "replica") != 1 || jobtest.Num(lost, "stage") != 1 {
		t.Errorf("stage_lost %v, want replica 1 rank 1", lost)
	}
	j.Until(t, "replica_dropped", func(e jobtest.Event) bool { return e["event"] == "replica_dropped" && jobtest.Num(e, "replica") == 1 })
	formed := j.Until(t, "replica_formed", jobtest.Kind("replica_formed"))
	if jobtest.Num(formed, "replica") != 1 || jobtest.Num(formed, "donor") != 0 {
		t.Errorf("replica_formed %v, want replica 1 from replica 0", formed)
	}
	ev := j.Finish(t)
	d := doneOf(t, ev)
	if jobtest.Num(d, "step") != steps || jobtest.Num(d, "replicas") != 2 || d["parameters_identical"] != true {
		t.Errorf("done %v, want step %d on 2 identical replicas", d, steps)
	}
	last := map[int]int{}
	for _, e := range ev["pipeline_step"] {
		r, s := jobtest.Num(e, "stage"), jobtest.Num(e, "step")
		if s <= last[r] {
			t.Fatalf("rank %d stepped %d after %d: a step redone", r, s, last[r])
		}
		last[r] = s
	}
}

// TestTensorParallelBadInput: a T that does not divide the heads, a mesh
// that does not match the workers, pipeline stages with tensor
// parallelism, and more than one micro-batch are each refused before any
// worker starts, naming the problem.
func TestTensorParallelBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{gptArgs(5, "--tp", "4"), "4 tensor-parallel ranks do not divide the 2 heads"},
		{gptArgs(5, "--tp", "2", "--dp", "2", "--workers", "3"), "needs 4 workers"},
		{gptArgs(5, "--tp", "2", "--pp", "2"), "a 3-D mesh, are not supported yet"},
		{gptArgs(5, "--tp", "2", "--micro-batches", "2"), "want 1"},
	} {
		err := runCommand(t, append([]string{"train"}, c.args...), new(strings.Builder), new(strings.Builder))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error saying %q", c.args[len(c.args)-4:], err, c.want)
		}
	}
}

// TestTensorParallelCheckpointReshards: a checkpoint written by 2
// tensor-parallel ranks resumes into 4, one written by 4 into 2 replicas
// of 2, one of 2 replicas of the unsplit model (--dp 2 --tp 1) into 2
// ranks, and the reverse: each rank rebuilds every logical tensor from the old
// ranks' slices and keeps its own. The resumed jobs start at the
// checkpoint's step and end within 2% of the held-out loss of a job run
// through on 2 ranks (the same samples; sums in other orders). With the
// newest checkpoint's part of rank 1 corrupted by one byte, the resume
// names it (checkpoint_skipped) and takes the one before.
func TestTensorParallelCheckpointReshards(t *testing.T) {
	args := func(steps int, more ...string) []string {
		return gptArgs(steps, append([]string{"--heads", "4", "--schedule", "constant", "--optimizer", "adam", "--lr", "0.01"}, more...)...)
	}
	ref := doneOf(t, startJob(t, args(40, "--tp", "2")...).Finish(t))["loss"].(float64)
	for _, c := range []struct {
		name       string
		from, into []string
	}{
		{"tp2-into-tp4", []string{"--tp", "2"}, []string{"--tp", "4"}},
		{"tp4-into-dp2xtp2", []string{"--tp", "4"}, []string{"--dp", "2", "--tp", "2"}},
		{"dp2xtp1-into-tp2", []string{"--dp", "2", "--tp", "1"}, []string{"--tp", "2"}},
		{"tp2-into-dp2xtp1", []string{"--tp", "2"}, []string{"--dp", "2", "--tp", "1"}},
		{"ring2-into-tp2", []string{"--workers", "2"}, []string{"--tp", "2"}},
		{"tp2-into-ring2", []string{"--tp", "2"}, []string{"--workers", "2"}},
		{"dp2xtp2-into-ring1", []string{"--dp", "2", "--tp", "2"}, []string{"--workers", "1"}},
		{"ring2-into-pp2", []string{"--workers", "2"}, []string{"--pp", "2", "--micro-batches", "2"}},
		{"pp2-into-tp2", []string{"--pp", "2", "--micro-batches", "2"}, []string{"--tp", "2"}},
		{"tp2-into-pp2", []string{"--tp", "2"}, []string{"--pp", "2", "--micro-batches", "2"}},
		{"pp2-into-ring1", []string{"--pp", "2", "--micro-batches", "2"}, []string{"--workers", "1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			startJob(t, args(20, append(c.from, "--checkpoint", dir, "--checkpoint-every-steps", "10")...)...).Finish(t)
			ev := startJob(t, args(40, append(c.into, "--checkpoint", dir)...)...).Finish(t)
			if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != 20 {
				t.Fatalf("checkpoint_restored %v, want one at step 20", r)
			}
			steps := ev["pipeline_step"]
			if slices.Contains(c.into, "--workers") { // a ring
				steps = ev["step"]
			}
			if s := steps; len(s) == 0 || jobtest.Num(s[0], "step") != 21 {
				t.Errorf("the resumed job's first step event %v, want step 21", s[:min(len(s), 1)])
			}
			d := doneOf(t, ev)
			if got := d["loss"].(float64); math.Abs(got-ref) > 0.02*ref || jobtest.Num(d, "step") != 40 {
				t.Errorf("resumed %s: done %v; run through on 2 ranks: held-out loss %.4f", c.name, d, ref)
			}
		})
	}
	t.Run("another-optimizer", func(t *testing.T) {
		for _, c := range []struct {
			name       string
			from, into []string
			want       string
		}{
			{"tp2-into-ring2", []string{"--tp", "2"}, []string{"--workers", "2"}, "holds another model's state"},
			{"ring2-into-tp2", []string{"--workers", "2"}, []string{"--tp", "2"}, "its optimizer keeps slots [adam.m adam.v], this job's [momentum]"},
		} {
			t.Run(c.name, func(t *testing.T) {
				dir := t.TempDir()
				startJob(t, args(10, append(c.from, "--checkpoint", dir, "--checkpoint-every-steps", "10")...)...).Finish(t)
				var out strings.Builder
				err := runCommand(t, append([]string{"train"}, args(20, append(c.into, "--checkpoint", dir, "--optimizer", "momentum")...)...), &out, &out)
				if err == nil || !strings.Contains(err.Error()+out.String(), c.want) {
					t.Errorf("resuming adam's state with momentum: %v, want it refused saying %q; output:\n%s", err, c.want, out.String())
				}
			})
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		dir := t.TempDir()
		startJob(t, args(20, "--tp", "2", "--checkpoint", dir, "--checkpoint-every-steps", "10")...).Finish(t)
		corruptNewestPart(t, dir) // rank 1's part of step 20
		ev := startJob(t, args(40, "--tp", "4", "--checkpoint", dir)...).Finish(t)
		if s := ev["checkpoint_skipped"]; len(s) == 0 || !strings.Contains(fmt.Sprint(s[0]), "step-000000000020") || !strings.Contains(fmt.Sprint(s[0]), "checksum") {
			t.Errorf("checkpoint_skipped %v, want the corrupted one named with its checksum", s)
		}
		if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != 10 {
			t.Fatalf("checkpoint_restored %v, want one at step 10 (the step-20 one is corrupt)", r)
		}
	})
}

// TestTensorParallelMemory: with --max-memory at 60% of what the unsplit
// model's training state needs, one worker is refused before it starts,
// naming the need and the budget; split across 2 ranks the model trains,
// and each rank's own accounting (pipeline_step param_bytes) holds its
// half of every split weight and every whole one.
func TestTensorParallelMemory(t *testing.T) {
	spec := gpt.Spec()
	o, err := spec.Resolve(map[string]string{"width": "32", "depth": "1", "heads": "2", "context": "32", "corpus-mb": "1", "eval-windows": "32"})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := spec.New(o, 1)
	if err != nil {
		t.Fatal(err)
	}
	need, err := job.TrainingBytes(whole.Model.Params(), nn.OptimizerConfig{Kind: "momentum", Momentum: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	budget := need * 6 / 10
	mem := fmt.Sprint(budget)
	err = runCommand(t, append([]string{"train"}, gptArgs(3, "--workers", "1", "--max-memory", mem)...), new(strings.Builder), new(strings.Builder))
	if err == nil || !strings.Contains(err.Error(), bytesize.Format(need)) || !strings.Contains(err.Error(), bytesize.Format(budget)) {
		t.Fatalf("one worker within %s of %s needed: %v", bytesize.Format(budget), bytesize.Format(need), err)
	}
	ev := startJob(t, gptArgs(3, "--tp", "2", "--max-memory", mem)...).Finish(t)
	// Each rank's part: half of each split parameter, every whole one.
	want := map[int]int{}
	for r := range 2 {
		comm, _ := tp.NewCommAt(2, r)
		part, err := spec.Split(o, 1, comm)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range part.Model.(tp.Sliced).Slices() {
			n := s.Len()
			if s.Split() && 2*n != s.At(1, 0).Len() {
				t.Errorf("rank %d holds %d of the %d values of %s", r, n, s.At(1, 0).Len(), s.Local.Name)
			}
			want[r] += 4 * n
		}
	}
	seen := 0
	for _, e := range ev["pipeline_step"] {
		if r := jobtest.Num(e, "stage"); jobtest.Num(e, "param_bytes") != want[r] {
			t.Fatalf("rank %d's param_bytes %v, want %d", r, e["param_bytes"], want[r])
		}
		seen++
	}
	if seen == 0 || want[0] >= 4*paramCount(whole.Model.Params()) {
		t.Errorf("%d step events; rank 0 holds %d bytes of the whole model's %d", seen, want[0], 4*paramCount(whole.Model.Params()))
	}
}

func paramCount(ps []*nn.Param) int {
	n := 0
	for _, p := range ps {
		n += len(p.Value)
	}
	return n
}

// TestTensorParallelRankKilledAlone: --tp 2 with one replica commits each
// rank's state every --commit-every steps and copies it to the next rank.
// SIGKILL rank 1: the launcher's replacement takes rank 1's state from the
// copy in rank 0's memory (stage_restored, source peer; at most
// --commit-every steps redone), and the job finishes.
func TestTensorParallelRankKilledAlone(t *testing.T) {
	const steps, commit = 3000, 4
	j := startJob(t, gptArgs(steps, "--tp", "2", "--width", "16", "--context", "16", "--batch", "8", "--commit-every", fmt.Sprint(commit))...)
	j.Until(t, "step 20", func(e jobtest.Event) bool { return e["event"] == "pipeline_step" && jobtest.Num(e, "step") >= 20 })
	j.KillWorker(t, 1, syscall.SIGKILL)
	r := j.Until(t, "rank 1's stage_restored", func(e jobtest.Event) bool {
		return e["event"] == "stage_restored" && jobtest.Num(e, "stage") == 1
	})
	if r["source"] != "peer" || jobtest.Num(r, "steps_redone") > commit {
		t.Errorf("stage_restored %v, want from the peer with at most %d steps redone", r, commit)
	}
	ev := j.Finish(t)
	if n := len(ev["worker_started"]); n != 3 {
		t.Errorf("%d workers started, want 2 and a replacement", n)
	}
	if d := doneOf(t, ev); jobtest.Num(d, "step") != steps {
		t.Errorf("done %v, want step %d", d, steps)
	}
}

// TestTensorWorkerRefusesCheckpoint: tensor-parallel workers started by
// hand (no launcher to check the store first) against a checkpoint of
// another optimizer's state each fail with the refusal, naming the
// optimizers' slots, after they joined their round's groups (an error
// there once crashed the worker: the round's cleanup ran on the nil
// round it returned).
func TestTensorWorkerRefusesCheckpoint(t *testing.T) {
	dir := t.TempDir()
	startJob(t, gptArgs(10, "--workers", "2", "--optimizer", "adam", "--lr", "0.01", "--checkpoint", dir, "--checkpoint-every-steps", "10")...).Finish(t)
	ctx := testwait.Context(t, 3*time.Minute)
	const name, workers = "tp-refuses", 2
	endpoints := make(chan []string, 1)
	coordDone := make(chan error, 1)
	go func() {
		coordDone <- phalanx.RunCoordinator(ctx, phalanx.CoordinatorConfig{Job: name, JobDir: t.TempDir(), MinWorkers: workers, MaxWorkers: workers,
			Workers: workers, JoinWindow: time.Millisecond, OnEndpoints: func(e []string) { endpoints <- e }})
	}()
	etcd := testwait.Recv(t, endpoints, time.Minute, "the coordinator's embedded etcd to serve")
	results := make(chan error, workers)
	for i := range workers {
		cfg := phalanx.DefaultConfig()
		cfg.Model, cfg.Job, cfg.Etcd, cfg.Index = "gpt", name, etcd, i
		cfg.ModelOptions = map[string]string{"width": "32", "depth": "1", "heads": "2", "context": "32", "corpus-mb": "1", "eval-windows": "32"}
		cfg.Steps, cfg.Batch, cfg.Pipeline.Tensor, cfg.Optimizer.Kind = 20, 16, workers, "momentum"
		cfg.Checkpoint.Location = dir
		go func() {
			_, err := phalanx.RunModel(ctx, cfg, examples.Registry())
			results <- err
		}()
	}
	for i := range workers {
		err := testwait.Recv(t, results, 2*time.Minute, fmt.Sprintf("worker %d of %d to end", i+1, workers))
		if err == nil || !strings.Contains(err.Error(), "its optimizer keeps slots [adam.m adam.v], this job's [momentum]") {
			t.Errorf("a worker resuming adam's state with momentum: %v, want the refusal", err)
		}
	}
}
