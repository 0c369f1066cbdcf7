// Package launch starts a group of worker processes on this host and hands
// each the data-plane addresses of all: every child announces the address it
// listens on, and once all have, each receives the full list. It is the
// rendezvous of a single-host job until the coordinator takes over; it is not a
// supervisor and does not restart anything.
package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
)

const (
	addrPrefix  = "phalanx-addr "
	peersPrefix = "phalanx-peers "
)

// Proc is one started child.
type Proc struct {
	Rank int
	Cmd  *exec.Cmd
	Addr string // the data-plane address it announced
	In   io.WriteCloser
	Out  *bufio.Reader // its stdout after the announcement
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Signal sends sig to the child.
func (p *Proc) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// ReadLine returns the child's next stdout line, without its newline.
func (p *Proc) ReadLine() (string, error) {
	s, err := p.Out.ReadString('\n')
	if err != nil {
		return strings.TrimRight(s, "\n"), fmt.Errorf("rank %d (pid %d) stdout: %w", p.Rank, p.Pid(), err)
	}
	return strings.TrimRight(s, "\n"), nil
}

// Start starts n children made by command(rank), waits for every
// announcement, then sends each the peer list. On error every started child is
// killed. The commands' Stdin and Stdout must be unset; Stderr is the caller's.
func Start(ctx context.Context, n int, command func(rank int) *exec.Cmd) ([]*Proc, error) {
	procs := make([]*Proc, 0, n)
	fail := func(err error) ([]*Proc, error) {
		Kill(procs)
		return nil, err
	}
	for r := range n {
		cmd := command(r)
		in, err := cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			return fail(fmt.Errorf("launch: starting rank %d: %w", r, err))
		}
		procs = append(procs, &Proc{Rank: r, Cmd: cmd, In: in, Out: bufio.NewReader(out)})
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line, err := p.ReadLine()
			if err != nil {
				errs[p.Rank] = fmt.Errorf("launch: rank %d exited before announcing its address: %w", p.Rank, err)
				return
			}
			addr, ok := strings.CutPrefix(line, addrPrefix)
			if !ok || addr == "" {
				errs[p.Rank] = fmt.Errorf("launch: rank %d announced %q, want %q<address>", p.Rank, line, addrPrefix)
				return
			}
			p.Addr = addr
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		Kill(procs)
		<-done
		return nil, fmt.Errorf("launch: waiting for addresses: %w", ctx.Err())
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	addrs := make([]string, n)
	for i, p := range procs {
		addrs[i] = p.Addr
	}
	line := peersPrefix + strings.Join(addrs, ",") + "\n"
	for _, p := range procs {
		if _, err := io.WriteString(p.In, line); err != nil {
			return fail(fmt.Errorf("launch: sending peers to rank %d: %w", p.Rank, err))
		}
	}
	return procs, nil
}

// Kill sends SIGKILL to every child still running and reaps it.
func Kill(procs []*Proc) {
	for _, p := range procs {
		if p.Cmd.Process != nil && p.Cmd.ProcessState == nil {
			p.Cmd.Process.Kill()
			p.Cmd.Wait()
		}
	}
}

// Announce is the child's side: it writes its address to w and returns the
// peer list read from r.
func Announce(w io.Writer, r *bufio.Reader, addr string) ([]string, error) {
	if _, err := fmt.Fprintf(w, "%s%s\n", addrPrefix, addr); err != nil {
		return nil, fmt.Errorf("launch: announcing address: %w", err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("launch: reading peer list: %w", err)
	}
	list, ok := strings.CutPrefix(strings.TrimSpace(line), strings.TrimSpace(peersPrefix))
	if !ok {
		return nil, fmt.Errorf("launch: got %q, want a %q line", line, peersPrefix)
	}
	peers := strings.Split(strings.TrimSpace(list), ",")
	for i, p := range peers {
		if p == "" {
			return nil, fmt.Errorf("launch: empty address for rank %d in %q", i, line)
		}
	}
	return peers, nil
}

// ThreadsPerRank is how many OS threads (GOMAXPROCS) each of ranks worker
// processes on this host should run Go code on: want when positive, else the
// host's cores shared evenly, at least one. Oversubscribed cores make every
// idle rank's scheduler spin against the ranks doing work.
func ThreadsPerRank(want, ranks int) int {
	if want > 0 {
		return want
	}
	return max(1, runtime.NumCPU()/max(ranks, 1))
}

// ComputeThreads is ThreadsPerRank for processes that train: when want is
// 0 and their matrix products run in C through cgo (cgoBLAS), one more. A
// goroutine in a long cgo call keeps its P only until the runtime's monitor
// takes it back, which it does after 20 µs when no other P is idle: with
// one P, every matrix product of the backward pass loses it, the monitor
// keeps polling every 20 µs, a bucket's reduction waits for the monitor to
// hand it the P, and the product's goroutine, its call returned, waits for
// the P in turn. The spare P is idle while the products run, so the
// monitor backs off and a bucket's reduction starts as soon as it is ready.
// Measured on two cores, two ranks: context switches per worker from about
// 9,800 to 4,600 a second, and 1.04× and 1.15× the median samples per
// second in two sets of paired runs (the spare P won 6 pairs of 8). A pure-Go
// BLAS computes on its Ps, and a spare one would oversubscribe the cores.
func ComputeThreads(want, ranks int, cgoBLAS bool) int {
	n := ThreadsPerRank(want, ranks)
	if want <= 0 && cgoBLAS {
		n++
	}
	return n
}

// Spawn starts one child whose stdout is read by the caller (Proc.Out) and
// who is killed if this process dies first. Its Stdout must be unset.
//
// The child runs in a session of its own, so a terminal's signals (Ctrl-C
// and Ctrl-\ go to the whole foreground process group, a hang-up to the
// session) reach this process alone, which decides what its children do:
// a job's launcher asks its workers for a final checkpoint and waits for it.
func Spawn(cmd *exec.Cmd, rank int) (*Proc, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("launch: starting worker %d: %w", rank, err)
	}
	return &Proc{Rank: rank, Cmd: cmd, Out: bufio.NewReader(out)}, nil
}
