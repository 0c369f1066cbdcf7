package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// teeLines shows a process's log on a terminal, for people (a launch at
// --log-level debug): each of zap's JSON lines as
// "[worker-2] 15:04:05.000 INFO  logger: message  key=value ...", keys
// sorted, any other line as "[worker-2] line". Lines go out whole, and one
// at a time across every process sharing mu.
type teeLines struct {
	name string
	w    io.Writer
	mu   *sync.Mutex
	buf  []byte
}

func (t *teeLines) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			break
		}
		if _, err := io.WriteString(t.w, renderLogLine(t.name, t.buf[:i])); err != nil {
			return len(p), err
		}
		t.buf = t.buf[:copy(t.buf, t.buf[i+1:])]
	}
	return len(p), nil
}

// renderLogLine is one log line for a person, prefixed with its process.
func renderLogLine(name string, line []byte) string {
	var rec map[string]any
	if json.Unmarshal(line, &rec) != nil || rec["msg"] == nil {
		return fmt.Sprintf("[%s] %s\n", name, line)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] ", name)
	if ts, ok := rec["ts"].(float64); ok {
		sec, frac := math.Modf(ts)
		b.WriteString(time.Unix(int64(sec), int64(frac*1e9)).UTC().Format("15:04:05.000 "))
	}
	fmt.Fprintf(&b, "%-5s ", strings.ToUpper(fmt.Sprint(rec["level"])))
	if l, ok := rec["logger"].(string); ok && l != "" {
		b.WriteString(l + ": ")
	}
	fmt.Fprint(&b, rec["msg"])
	for _, k := range slices.Sorted(maps.Keys(rec)) {
		switch k {
		case "ts", "level", "msg", "logger", "caller", "stacktrace":
			continue
		}
		v, ok := rec[k].(string)
		if !ok {
			j, _ := json.Marshal(rec[k])
			v = string(j)
		}
		fmt.Fprintf(&b, "  %s=%s", k, v)
	}
	b.WriteByte('\n')
	return b.String()
}
