package webui

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"strings"
	"testing"
)

// TestVendoredAssets: the embedded uPlot files are the ones
// scripts/vendor-uplot fetched (their SHA-256 in SOURCE, of the pinned
// version), and no script would end a self-contained page's <script>
// early.
func TestVendoredAssets(t *testing.T) {
	src, err := fs.ReadFile(FS(), "SOURCE")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(src)))
	sc.Scan()
	if head := sc.Text(); !strings.HasPrefix(head, "uplot 1.6.32 sha512-") {
		t.Errorf("SOURCE's first line %q: want the pinned uplot 1.6.32 and its integrity", head)
	}
	checked := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			t.Fatalf("SOURCE line %q: want a SHA-256 and a file", sc.Text())
		}
		b, err := fs.ReadFile(FS(), f[1])
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != f[0] {
			t.Errorf("%s is not the file scripts/vendor-uplot fetched: run it again", f[1])
		}
		checked++
	}
	if checked != 3 {
		t.Errorf("SOURCE lists %d files, want uPlot's script, style sheet and licence", checked)
	}
	for _, s := range scripts {
		b, _ := fs.ReadFile(FS(), s)
		if strings.Contains(strings.ToLower(string(b)), "</script") {
			t.Errorf("%s holds </script: Inline would end its tag early", s)
		}
	}
	if in := Inline(); !strings.Contains(in, "phalanxCharts") || !strings.Contains(in, "uPlot") {
		t.Error("Inline lacks the charts or uPlot")
	}
}
