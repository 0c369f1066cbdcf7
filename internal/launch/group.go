package launch

import (
	"bufio"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
)

// Group is the skeleton every launcher shares (a ring job's workers, a
// parameter-server job's servers and workers): it starts children, relays
// each child's stdout lines and then its exit on two channels, signals them,
// and kills and reaps whatever still runs. What a line or an exit means is
// the launcher's business.
type Group struct {
	lines chan Line
	exits chan Exit
	tap   func(Line) bool

	mu    sync.Mutex
	procs []*Proc
	roles []string
	wg    sync.WaitGroup // a reader per child, done once its exit is sent
}

// Line is one line a child printed on stdout.
type Line struct {
	Role  string
	Index int
	Text  []byte
}

// Exit is a child's end: Err is nil for a zero exit status.
type Exit struct {
	Role  string
	Index int
	Pid   int
	Err   error
}

// NewGroup is an empty group.
func NewGroup() *Group {
	return &Group{lines: make(chan Line, 256), exits: make(chan Exit, 64)}
}

// Lines delivers the children's stdout lines; a child's lines all come
// before its exit.
func (g *Group) Lines() <-chan Line { return g.lines }

// Exits delivers the children's exits.
func (g *Group) Exits() <-chan Exit { return g.exits }

// Start starts cmd as child index of role (see Spawn: it dies with this
// process). Its Stdout must be unset.
func (g *Group) Start(cmd *exec.Cmd, role string, index int) (*Proc, error) {
	p, err := Spawn(cmd, index)
	if err != nil {
		return nil, fmt.Errorf("launch: %s %d: %w", role, index, err)
	}
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.roles = append(g.roles, role)
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		sc := bufio.NewScanner(p.Out)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			l := Line{Role: role, Index: index, Text: append([]byte(nil), sc.Bytes()...)}
			if tap := g.tapFunc(); tap != nil && tap(l) {
				continue
			}
			g.lines <- l
		}
		g.exits <- Exit{Role: role, Index: index, Pid: p.Pid(), Err: p.Cmd.Wait()}
	}()
	return p, nil
}

// Tap gives every line to f first, from the children's readers: a line f
// takes (true) is not delivered on Lines.
func (g *Group) Tap(f func(Line) bool) {
	g.mu.Lock()
	g.tap = f
	g.mu.Unlock()
}

func (g *Group) tapFunc() func(Line) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tap
}

// Signal sends sig to every child of role ("" : every child) still running.
func (g *Group) Signal(role string, sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, p := range g.procs {
		if role == "" || g.roles[i] == role {
			p.Signal(sig) // one that already ended answers an error: nothing to do
		}
	}
}

// Kill sends SIGKILL to every child and returns once each is reaped,
// discarding lines and exits meanwhile: no child outlives it.
func (g *Group) Kill() {
	g.Signal("", syscall.SIGKILL)
	reaped := make(chan struct{})
	go func() { g.wg.Wait(); close(reaped) }()
	for {
		select {
		case <-g.lines:
		case <-g.exits:
		case <-reaped:
			return
		}
	}
}

// ExitStatus is a child's exit status, or -1 when it did not exit by
// itself (a signal) or err is not an exit.
func ExitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// Signalled reports whether a child ended by a signal.
func Signalled(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled()
		}
	}
	return false
}
