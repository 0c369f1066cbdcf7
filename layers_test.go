package phalanx_test

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestLayers holds docs/architecture.md's layer table to the imports: every
// package of the module is in it once, and imports only from layers below
// its own.
func TestLayers(t *testing.T) {
	const mod = "github.com/phalanx-rt/phalanx"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	short := func(p string) string {
		if p == mod {
			return "phalanx"
		}
		return strings.TrimPrefix(p, mod+"/")
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imps, _ := strings.Cut(line, "|")
		var ours []string
		for _, i := range strings.Fields(imps) {
			if i == mod || strings.HasPrefix(i, mod+"/") {
				ours = append(ours, short(i))
			}
		}
		imports[short(pkg)] = ours
	}

	f, err := os.Open("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	layer := map[string]int{}
	in, cur := false, -1
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## Layers"):
			in = true
			continue
		case in && strings.HasPrefix(line, "## "):
			in = false
		}
		if !in || !strings.HasPrefix(line, "    ") {
			continue
		}
		fields := strings.Fields(line)
		if n, err := strconv.Atoi(fields[0]); err == nil {
			cur, fields = n, fields[1:]
		}
		for _, w := range fields {
			switch {
			case w == "(root)":
				w = "phalanx"
			case strings.Contains(w, "/"):
				w = strings.TrimSuffix(w, "/")
			default:
				continue // a description's word
			}
			if _, ok := imports[w]; !ok {
				continue
			}
			if l, dup := layer[w]; dup {
				t.Errorf("%s is in layers %d and %d", w, l, cur)
			}
			layer[w] = cur
		}
	}
	for pkg, imps := range imports {
		l, ok := layer[pkg]
		if !ok {
			t.Errorf("%s is in no layer of docs/architecture.md", pkg)
			continue
		}
		for _, i := range imps {
			if layer[i] >= l {
				t.Errorf("%s (layer %d) imports %s (layer %d): not below it", pkg, l, i, layer[i])
			}
		}
	}
}
