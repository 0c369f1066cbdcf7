package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/bench"
)

func TestBenchUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench"}, "bench: name the benchmark: allreduce, checkpoint, ps or tcp"},
		{[]string{"bench", "frobnicate"}, "unknown benchmark"},
		{[]string{"bench", "allreduce", "--ranks", "0"}, "--ranks 0"},
		{[]string{"bench", "allreduce", "--sizes", "4KiB,huge"}, `size "huge"`},
		{[]string{"bench", "allreduce", "--sizes", "6"}, "4-byte elements"},
		{[]string{"bench", "allreduce", "--algo", "bogus"}, "unknown algorithm"},
		{[]string{"bench", "allreduce", "--transport", "udp"}, "--transport"},
		{[]string{"bench", "allreduce", "--segment", "8"}, "--segment"},
		{[]string{"bench", "allreduce", "--nope"}, "unknown flag --nope"},
		{[]string{"bench", "allreduce", "--tls", "yes"}, `--tls "yes"`},
		{[]string{"bench", "allreduce", "--tls", "compare", "--transport", "shm"}, "only with --transport tcp"},
		{[]string{"bench", "tcp", "--duration", "-1s"}, "--duration"},
		{[]string{"bench", "tcp", "--write", "0"}, "--write"},
		{[]string{"bench", "checkpoint"}, "--checkpoint"},
		{[]string{"bench", "checkpoint", "--checkpoint", "/tmp/ckpt"}, "s3://"},
		{[]string{"bench", "ps", "--replicas", "2"}, "--replicas below --shards"},
		{[]string{"bench", "ps", "--keys", "10", "--key-space", "5"}, "--keys"},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		err := runCommand(t, tc.args, &out, &errOut)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
	}
}

func TestHelpExplainsFlags(t *testing.T) {
	cases := []struct {
		bench string
		flags []string
	}{
		{"allreduce", []string{"-ranks", "-sizes", "-transport", "-algo", "-tls", "-json"}},
		{"tcp", []string{"-duration", "-write", "-json"}},
		{"checkpoint", []string{"-checkpoint", "-sizes", "-ranks", "-repeat", "-json"}},
		{"ps", []string{"-workers", "-shards", "-replicas", "-keys", "-dim", "-key-space", "-duration", "-json"}},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		err := runCommand(t, []string{"bench", tc.bench, "--help"}, &out, &errOut)
		if err != nil {
			t.Fatalf("bench %s --help: got %v", tc.bench, err)
		}
		for _, f := range tc.flags {
			if !strings.Contains(out.String(), f) {
				t.Errorf("bench %s --help does not explain %s", tc.bench, f)
			}
		}
	}
}

// TestBenchAllReduceJSON runs the benchmark in process and checks the JSON
// form: one object per size, nothing else on stdout.
func TestBenchAllReduceJSON(t *testing.T) {
	lines := benchLines(t, 2, "--transport", "inproc", "--ranks", "3", "--sizes", "4KiB,1MiB", "--iters", "3", "--warmup", "1")
	// The algorithm that ran: recursive doubling up to 64 KiB, the ring above.
	for i, ran := range []string{"rd", "ring"} {
		if field := `"algorithm":"` + ran + `"`; !strings.Contains(lines[i], field) {
			t.Errorf("line %d does not name the algorithm that ran (%s): %s", i, field, lines[i])
		}
	}
	for i, want := range []int{4096, 1 << 20} {
		var r bench.AllReduceResult
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
			t.Fatal(err)
		}
		if r.Op != "allreduce" || r.Ranks != 3 || r.Bytes != want || r.MedianS <= 0 || r.BusBW <= 0 {
			t.Errorf("line %d: %+v", i, r)
		}
		if bw := r.AlgBW * 4 / 3; bw < r.BusBW*0.999 || bw > r.BusBW*1.001 {
			t.Errorf("busbw %v is not algbw·2(N−1)/N = %v", r.BusBW, bw)
		}
	}
}

// TestBenchAllReduceTLSCompare runs --tls compare over rank processes
// (this test binary as the command): every size plaintext and over the
// mutual TLS of an ephemeral CA, each rank given its files by the command.
func TestBenchAllReduceTLSCompare(t *testing.T) {
	t.Setenv("PHALANX_TEST_AS_COMMAND", "1") // the rank processes are this binary
	lines := benchLines(t, 4, "--ranks", "2", "--sizes", "4KiB,1MiB", "--iters", "2", "--warmup", "1", "--tls", "compare")
	for i, l := range lines { // each size plaintext, then over TLS
		var r bench.AllReduceResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if tls := i%2 == 1; r.Bytes != []int{4096, 1 << 20}[i/2] || r.BusBW <= 0 || tls != strings.HasPrefix(r.TLS, "TLS_") || !tls && r.TLS != "" {
			t.Errorf("line %d: %+v, want the %s run's", i, r, map[bool]string{false: "plaintext", true: "TLS"}[tls])
		}
	}
}

// benchLines runs phalanx bench allreduce --json with args and returns
// its n lines.
func benchLines(t *testing.T, n int, args ...string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := runCommand(t, append([]string{"bench", "allreduce", "--json"}, args...), &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != n {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), n, out.String())
	}
	return lines
}
