package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the test binary stand in for the phalanx command when a test
// launches workers (they re-execute the running binary).
func TestMain(m *testing.M) {
	if os.Getenv("PHALANX_TEST_AS_COMMAND") == "1" {
		if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString("phalanx: " + err.Error() + "\n")
			os.Exit(exitCode(err))
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTrainJob runs a small job end to end on two worker processes and checks
// the progress output and the event log's schema.
func TestTrainJob(t *testing.T) {
	t.Setenv("PHALANX_TEST_AS_COMMAND", "1")
	evPath := filepath.Join(t.TempDir(), "events.jsonl")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"train", "--workers", "2", "--steps", "6", "--batch", "64",
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
	for sc.Scan() {
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
			"worker_started": {"rank", "pid", "addr"},
			"step":           {"step", "generation", "world", "loss", "samples_per_s"},
			"done":           {"step", "accuracy", "loss"},
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
	if counts["worker_started"] != 2 || counts["step"] != 6 || counts["done"] != 1 {
		t.Errorf("event counts %v, want 2 worker_started, 6 step, 1 done", counts)
	}
}
