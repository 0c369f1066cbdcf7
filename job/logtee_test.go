package job

import (
	"strings"
	"sync"
	"testing"
)

// TestTeeLines: zap's JSON lines reach the terminal rendered for people,
// prefixed with their process, keys sorted; other lines are prefixed as
// they are; a line split across writes goes out whole, once complete.
func TestTeeLines(t *testing.T) {
	var out strings.Builder
	tee := &teeLines{name: "worker-2", w: &out, mu: &sync.Mutex{}}
	for _, chunk := range []string{
		`{"level":"warn","ts":1795573965.7188377,"logger":"collective","msg":"collective group failed","rank":1,"job":"j","error":"peer lost"}` + "\n",
		"panic: half a li", "ne\n",
		`{"level":"info","ts":1795573965.5,"msg":"training","world":4,"ids":["a","b"]}` + "\n",
	} {
		if n, err := tee.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write: %d, %v", n, err)
		}
	}
	want := "[worker-2] 02:32:45.718 WARN  collective: collective group failed  error=peer lost  job=j  rank=1\n" +
		"[worker-2] panic: half a line\n" +
		"[worker-2] 02:32:45.500 INFO  training  ids=[\"a\",\"b\"]  world=4\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}
