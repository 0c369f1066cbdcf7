package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
)

// The race passes read `go test -v`, not -json: under -json a test binary
// runs with -test.v=test2json, where testing.M.Run sets os.Stderr =
// os.Stdout (go.dev/issue/33419), and the race detector reports that write
// against any goroutine a TestMain started before m.Run that reads
// os.Stderr (embedded etcd's loggers in coordinator and elastic). go test
// prints each package's -v output whole, ending with its result line, so
// each package's text is converted with test2json on its own.

// resultLine is the line go test ends a package's output with.
var resultLine = regexp.MustCompile(`^(ok  |FAIL|\?   )\t([^\t ]+)`)

// Converter turns one package's `go test -v` output into test2json events.
type Converter func(pkg string, text []byte) ([]byte, error)

// Test2JSON converts with `go tool test2json -p pkg`.
func Test2JSON(pkg string, text []byte) ([]byte, error) {
	cmd := exec.Command("go", "tool", "test2json", "-p", pkg)
	cmd.Stdin = bytes.NewReader(text)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool test2json -p %s: %w: %s", pkg, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// ReadText consumes a `go test -v` stream to its end, each package's text
// converted to events by convert. Text after the last package's result line
// (go test's closing FAIL, or a run cut short) is echoed; if tests were
// running there, it is a failure.
func (r *Recorder) ReadText(in io.Reader, convert Converter) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	var chunk bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		chunk.Write(line)
		chunk.WriteByte('\n')
		m := resultLine.FindSubmatch(line)
		if m == nil {
			continue
		}
		pkg := string(m[2])
		events, err := convert(pkg, chunk.Bytes())
		if err != nil {
			return err
		}
		chunk.Reset()
		for l := range bytes.Lines(events) {
			r.line(bytes.TrimSuffix(l, []byte("\n")))
		}
		if p := r.pkgs[pkg]; p == nil || !p.done {
			action := map[string]string{"ok  ": ActionPass, "FAIL": ActionFail, "?   ": ActionSkip}[string(m[1])]
			r.endPackage(pkg, r.pkg(pkg), action, 0)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading go test -v: %w", err)
	}
	if rest := chunk.String(); rest != "" {
		io.WriteString(r.out, rest)
		if strings.Contains(rest, "=== RUN") {
			r.add(Result{Package: "(unknown)", Action: ActionUnfinished,
				Reason: "the stream ended inside a package's output, before its result line"})
		}
	}
	r.finish()
	return nil
}
