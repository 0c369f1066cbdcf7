package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"bench"}, "allreduce, tcp, checkpoint or ps"},
		{[]string{"bench", "allreduce", "--ranks", "0"}, "--ranks 0"},
		{[]string{"bench", "allreduce", "--sizes", "4KiB,huge"}, `size "huge"`},
		{[]string{"bench", "allreduce", "--sizes", "6"}, "4-byte elements"},
		{[]string{"bench", "allreduce", "--algo", "bogus"}, "unknown algorithm"},
		{[]string{"bench", "allreduce", "--transport", "udp"}, "--transport"},
		{[]string{"bench", "allreduce", "--nope"}, "not defined"},
		{[]string{"bench", "tcp", "--duration", "-1s"}, "--duration"},
		{[]string{"train", "--workers", "0"}, "--workers 0"},
		{[]string{"train", "--example", "gpt"}, "--example"},
		{[]string{"train", "--steps", "0"}, "--steps 0"},
		{[]string{"train", "--lr", "-1"}, "learning rate"},
		{[]string{"train", "--optimizer", "lion"}, "unknown optimizer"},
		{[]string{"train", "--schedule", "exp"}, "unknown schedule"},
		{[]string{"train", "--hidden", "512,x"}, "width"},
		{[]string{"train", "--bucket", "lots"}, "--bucket"},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errOut)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
	}
}

func TestHelpExplainsFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "allreduce", "--help"}, &out, &errOut)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("got %v", err)
	}
	for _, f := range []string{"-ranks", "-sizes", "-transport", "-algo", "-json"} {
		if !strings.Contains(errOut.String(), f) {
			t.Errorf("--help does not explain %s", f)
		}
	}
}

// TestBenchAllReduceJSON runs the benchmark in process and checks the JSON
// form: one object per size, nothing else on stdout.
func TestBenchAllReduceJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "allreduce", "--transport", "inproc", "--ranks", "3",
		"--sizes", "4KiB,1MiB", "--iters", "3", "--warmup", "1", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), out.String())
	}
	for i, want := range []int{4096, 1 << 20} {
		var r allreduceResult
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

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"4096": 4096, "4KiB": 4096, "16MiB": 16 << 20, "1GiB": 1 << 30, "64K": 64 << 10} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}
