package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// openPTY opens a new pseudo-terminal: its master, and its slave to be a
// process's controlling terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening a pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("naming the pseudo-terminal: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the pseudo-terminal's slave: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	go func() { // drain what the terminal echoes (^C)
		buf := make([]byte, 256)
		for {
			if _, err := m.Read(buf); err != nil {
				return
			}
		}
	}()
	return m, s
}

// startInTerminal starts phalanx train with args as the foreground job of a
// terminal of its own: the session leader, the terminal's controlling
// process, as a shell would start it.
func startInTerminal(t *testing.T, args ...string) (*jobtest.Job, *os.File) {
	t.Helper()
	master, slave := openPTY(t)
	cmd := command(t, append(append([]string{"train"}, jobtest.EventsFlag...), args...)...)
	cmd.Stdin = slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	j := jobtest.Start(t, cmd)
	return j, master
}

// ctrlC types Ctrl-C at the terminal: its line discipline sends SIGINT to
// the terminal's foreground process group.
func ctrlC(t *testing.T, master *os.File) {
	t.Helper()
	if _, err := master.Write([]byte{0x03}); err != nil {
		t.Fatalf("typing Ctrl-C: %v", err)
	}
}

// TestCtrlCInATerminal: Ctrl-C at the terminal of a job with checkpoints
// reaches the launcher alone (its workers run in sessions of their own):
// every worker takes a final checkpoint at the step reached, none leaves,
// the launcher names that checkpoint, found complete in the store, and
// exits 3. A second Ctrl-C while the stop waits ends the job at once, every
// worker with it.
func TestCtrlCInATerminal(t *testing.T) {
	t.Run("once: a final checkpoint and exit 3", func(t *testing.T) {
		dir := t.TempDir()
		args := append([]string{"--workers", "2", "--checkpoint", dir}, ckptJobArgs...)
		args = append(args, "--checkpoint-every-steps", "0", "--steps", "100000")
		j, master := startInTerminal(t, args...)
		j.Until(t, "step 15", jobtest.StepIn(2, 15))
		ctrlC(t, master)
		stop := j.Until(t, "the stopped event", jobtest.Kind("stopped"))
		ev, err := j.End()
		if code := launch.ExitStatus(err); code != exitStoppedOnRequest {
			t.Fatalf("launcher exit %v, want status %d", err, exitStoppedOnRequest)
		}
		at := jobtest.Num(stop, "step")
		if saved := ev["checkpoint_saved"]; len(saved) != 1 || jobtest.Num(saved[0], "step") != at {
			t.Fatalf("checkpoints saved %v, want one, at the stop step %d", saved, at)
		}
		for _, e := range ev["worker_exited"] {
			if e["status"] != "exit status 4" {
				t.Errorf("worker %v ended %v, want exit status 4 (stopped with its job): no worker takes the terminal's Ctrl-C for itself", e["worker"], e["status"])
			}
		}
		store, err := checkpoint.NewLocalStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		m := jobtest.NewestComplete(t, store)
		if m.Step != int64(at) {
			t.Fatalf("newest checkpoint of step %d, want the stop step %d", m.Step, at)
		}
		out := j.Out.String()
		if want := fmt.Sprintf("phalanx: stopped at step %d after a final checkpoint (%s); launch the same job again to resume", at, m.Id); !strings.Contains(out, want) {
			t.Fatalf("the launcher did not say %q:\n%s", want, jobtest.LastLines(out, 20))
		}
		// Said once, under one prefix; the workers' exit 4 is how a stopped
		// job's workers end, not news.
		if strings.Count(out, "after a final checkpoint") != 1 || strings.Contains(out, "phalanx: phalanx:") || strings.Contains(out, "exit status 4") {
			t.Fatalf("the stop said more than once, under a doubled prefix, or with the workers' expected exit:\n%s", jobtest.LastLines(out, 20))
		}
	})
	t.Run("twice: the job ends at once", func(t *testing.T) {
		args := append([]string{"--workers", "2", "--checkpoint", t.TempDir()}, ckptJobArgs...)
		args = append(args, "--checkpoint-every-steps", "0", "--steps", "100000")
		j, master := startInTerminal(t, args...)
		j.Until(t, "step 15", jobtest.StepIn(2, 15))
		pids := j.WorkerPids()
		if len(pids) != 2 {
			t.Fatalf("worker pids %v", pids)
		}
		// A frozen worker: the stop the first Ctrl-C asks for cannot
		// finish, so the second finds the launcher waiting for it.
		jobtest.Freeze(t, pids[1])
		ctrlC(t, master)
		j.Until(t, "the stopping event", jobtest.Kind("stopping"))
		ctrlC(t, master)
		_, err := j.End()
		var de *jobtest.DeadlineError
		if errors.As(err, &de) || launch.ExitStatus(err) != 1 {
			t.Fatalf("launcher exit %v, want status 1 at the second Ctrl-C", err)
		}
		for _, pid := range pids {
			testwait.Until(t, jobtest.Deadline(), fmt.Sprintf("worker pid %d to be gone after its launcher ended", pid),
				func() bool { return syscall.Kill(pid, 0) != nil })
		}
	})
}
