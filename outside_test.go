package phalanx_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEmbeddingFromOutside builds the package documentation's program as a
// module of its own, which requires Phalanx through a replace directive
// and can reach only what Phalanx exports, and runs it: it trains its own
// model on two worker processes of itself and ends with the fit. Nothing an
// embedder needs is internal or in a main package, and the documented
// program is true.
func TestEmbeddingFromOutside(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build a module of its own: %v", err)
	}
	repo, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(repo, "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	program := docProgram(t, string(doc))
	dir := t.TempDir()
	mod := "module example.com/outside\n\ngo 1.26\n\nrequire github.com/phalanx-rt/phalanx v0.0.0\n\nreplace github.com/phalanx-rt/phalanx => " + repo + "\n"
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string][]byte{"go.mod": []byte(mod), "go.sum": sum, "main.go": []byte(program)} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "outside")
	build := exec.Command(goTool, "build", "-o", bin, ".")
	build.Dir = dir
	// Offline: every module comes from this repository's module cache,
	// which must hold the go.mod files of the whole module graph (an
	// outside module reads them; Phalanx's own builds need not): scripts/test
	// fills it with `go list -m all` first.
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the documented program outside the module: %v\n%s\n(a module missing from the cache? `go list -m all` in the repository fetches the graph's go.mod files)", err, out)
	}
	run := exec.Command(bin)
	run.Dir = dir
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the documented program: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`held-out loss ([0-9.]+) on 2 workers; identical: true`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("output %q: want the held-out loss on 2 workers, identical", out)
	}
	if loss, _ := strconv.ParseFloat(m[1], 64); loss > 1e-3 {
		t.Errorf("held-out loss %v: the line was not fitted", loss)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
}

// docProgram is the program in the package documentation: its indented
// block from "package main" on.
func docProgram(t *testing.T, doc string) string {
	t.Helper()
	var b strings.Builder
	in := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case line == "//\tpackage main":
			in = true
		case in && line != "//" && !strings.HasPrefix(line, "//\t"):
			return b.String()
		}
		if in {
			b.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "//"), "\t") + "\n")
		}
	}
	t.Fatal("no program in the package documentation")
	return ""
}
