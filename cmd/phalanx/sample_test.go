package main

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGPTTrainsAndSamples: phalanx train --example gpt on two worker
// processes checkpoints a small GPT on the Go source; its done event
// carries the held-out nats per character and the perplexity (their
// exponential relation holds); phalanx sample continues a prompt from the
// newest checkpoint, the same text for the same seed and another for
// another seed. Then sample refuses a checkpoint of a model that does not
// generate, and a damaged tensor, naming it.
func TestGPTTrainsAndSamples(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "gpt")
	j := startJob(t, "--example", "gpt", "--workers", "2", "--steps", "40", "--width", "32", "--depth", "1", "--heads", "2",
		"--context", "32", "--batch", "16", "--corpus-mb", "1", "--eval-windows", "32", "--optimizer", "adam", "--lr", "0.01",
		"--threads", "1", "--checkpoint", ck, "--checkpoint-every-steps", "20", "--checkpoint-keep", "0")
	ev := j.Finish(t)
	done := ev["done"]
	if len(done) != 1 {
		t.Fatalf("%d done events", len(done))
	}
	nats, ok1 := done[0]["nats_per_char"].(float64)
	ppl, ok2 := done[0]["perplexity"].(float64)
	loss, _ := done[0]["loss"].(float64)
	if base, _ := done[0]["unigram_nats_per_char"].(float64); base < 2 || base > 6 {
		t.Errorf("done event's unigram baseline %v nats per character, want a character entropy", done[0]["unigram_nats_per_char"])
	}
	if !ok1 || !ok2 || nats != loss || nats <= 0 || nats > 5.6 || ppl < 1 || math.Abs(ppl-math.Exp(nats)) > 1e-6*ppl {
		t.Fatalf("done event: nats_per_char %v, perplexity %v, loss %v: %v", done[0]["nats_per_char"], done[0]["perplexity"], loss, done[0])
	}
	sample := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := runCommand(t, append([]string{"sample", "--checkpoint", ck}, args...), &out, &errb)
		if err != nil {
			return "", err
		}
		return strings.TrimSuffix(out.String(), "\n"), nil
	}
	a, err := sample("--prompt", "func (s *T) ", "--tokens", "60", "--seed", "3")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sample("--prompt", "func (s *T) ", "--tokens", "60", "--seed", "3")
	c, _ := sample("--prompt", "func (s *T) ", "--tokens", "60", "--seed", "4")
	if a != b || len(a) != len("func (s *T) ")+60 || !strings.HasPrefix(a, "func (s *T) ") || a == c {
		t.Errorf("samples: %q, %q (same seed), %q (another)", a, b, c)
	}
	t.Logf("sample: %q", a)
	if _, err := sample("--temperature", "-1"); err == nil || !strings.Contains(err.Error(), "--temperature -1") {
		t.Errorf("temperature -1: %v", err)
	}

	// A damaged tensor: the newest checkpoint's shard, one byte flipped.
	ids, _ := filepath.Glob(filepath.Join(ck, "step-*"))
	newest := ids[len(ids)-1]
	shards, _ := filepath.Glob(filepath.Join(newest, "shard-*"))
	var shard string
	for _, s := range shards {
		if !strings.HasSuffix(s, ".idx") {
			shard = s
			break
		}
	}
	raw, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x40
	if err := os.WriteFile(shard, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sample("--name", filepath.Base(newest)); err == nil || !strings.Contains(err.Error(), "CRC32C mismatch") || !strings.Contains(err.Error(), "tensor ") {
		t.Errorf("a damaged shard: %v", err)
	}

	// A checkpoint of the mlp, which does not generate.
	mck := filepath.Join(dir, "mlp")
	startJob(t, "--workers", "1", "--steps", "2", "--samples", "512", "--hidden", "8", "--checkpoint", mck,
		"--checkpoint-every-steps", "2", "--threads", "1").Finish(t)
	if err := runCommand(t, []string{"sample", "--checkpoint", mck}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "model mlp, which does not generate") {
		t.Errorf("an mlp checkpoint: %v", err)
	}
}

// TestSampleFromSplitCheckpoint: phalanx sample reads a checkpoint a
// tensor-parallel job wrote (an index of its ranks' parts), the newest by
// default or the index by name, the same text for the same seed either
// way.
func TestSampleFromSplitCheckpoint(t *testing.T) {
	ck := t.TempDir()
	startJob(t, gptArgs(10, "--tp", "2", "--checkpoint", ck, "--checkpoint-every-steps", "10")...).Finish(t)
	indexes, _ := filepath.Glob(filepath.Join(ck, "pipeline", "index-*"))
	if len(indexes) != 1 {
		t.Fatalf("indexes %v, want the one of step 10", indexes)
	}
	sample := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := runCommand(t, append([]string{"sample", "--checkpoint", ck, "--prompt", "package ", "--tokens", "40", "--seed", "3"}, args...), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(out.String(), "\n")
	}
	a, b := sample(), sample("--name", "pipeline/"+filepath.Base(indexes[0]))
	if a != b || len(a) != len("package ")+40 || !strings.HasPrefix(a, "package ") {
		t.Errorf("samples of the split checkpoint: %q (newest), %q (by name)", a, b)
	}
}
