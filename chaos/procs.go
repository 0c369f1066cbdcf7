package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// shmDir is where the workers' shared-memory transport keeps its files.
const shmDir = "/dev/shm"

// markEnv marks every process of a run's launches, and whatever they
// start, in its environment: what invariant 7 looks for in every process's
// environment at the end, so a descendant that outlived its worker (a
// forgotten helper, a double fork) is found even when nothing recorded its
// pid.
const markEnv = "PHALANX_CHAOS_RUN"

// markCommand wraps a launch's process command so that its processes
// carry the run's mark.
func markCommand(mk func() (*exec.Cmd, error), mark string) func() (*exec.Cmd, error) {
	return func() (*exec.Cmd, error) {
		var cmd *exec.Cmd
		if mk != nil {
			var err error
			if cmd, err = mk(); err != nil {
				return nil, err
			}
		} else {
			exe, err := os.Executable()
			if err != nil {
				return nil, fmt.Errorf("chaos: this program's path, to start workers: %w", err)
			}
			cmd = exec.Command(exe)
		}
		cmd.Env = append(cmd.Env, markEnv+"="+mark)
		return cmd, nil
	}
}

// proc is a process found by markedProcesses.
type proc struct {
	pid  int
	comm string
}

// markedProcesses are the live processes (zombies aside) whose environment
// carries mark, this one excepted.
func markedProcesses(mark string) ([]proc, error) {
	return processesMarked(func(m string) bool { return m == mark })
}

// processesMarked are the live processes (zombies aside) whose environment
// carries a mark that match accepts, this one excepted.
func processesMarked(match func(mark string) bool) ([]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("the processes could not be listed: %w", err)
	}
	key := []byte(markEnv + "=")
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		found := false
		for _, kv := range bytes.Split(env, []byte{0}) {
			if m, ok := bytes.CutPrefix(kv, key); ok && match(string(m)) {
				found = true
			}
		}
		if !found {
			continue
		}
		state, comm := procState(pid)
		if state == 0 {
			continue // dead, its parent has yet to reap it
		}
		out = append(out, proc{pid: pid, comm: comm})
	}
	return out, nil
}

// procState is a process's state and command name, from the states of
// its threads (/proc/<pid>/task/*/stat): 0 when it has none alive (gone,
// or a zombie its parent has yet to reap), 'T' when every live thread is
// stopped, else the first live thread's state letter. A process's own
// stat alone will not do: its main thread may have exited (state Z) while
// the others run.
func procState(pid int) (byte, string) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, ""
	}
	var state byte
	var comm string
	stopped := true
	for _, t := range tasks {
		st, c := statState(filepath.Join(dir, t.Name(), "stat"))
		if st == 0 || st == 'Z' || st == 'X' {
			continue
		}
		if state == 0 {
			state, comm = st, c
		}
		stopped = stopped && (st == 'T' || st == 't')
	}
	if state != 0 && stopped {
		state = 'T'
	}
	return state, comm
}

// statState is the state letter and command name of a stat file (0 when
// it cannot be read).
func statState(path string) (byte, string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, ""
	}
	s := string(b)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open || close+2 >= len(s) {
		return 0, ""
	}
	return s[close+2], s[open+1 : close]
}

// awaitStopped waits, up to bound, until every live thread of pid is
// stopped: kill(2) returns before a SIGSTOP has taken hold, and on a loaded
// machine an etcd member went on for 0.7s after it (a frozen leader
// committing requests meanwhile).
func awaitStopped(pid int, bound time.Duration) error { return awaitState(pid, "stopped", bound) }

// awaitState waits, up to bound, until process pid is "stopped" (every
// live thread) or "dead" (none live).
func awaitState(pid int, want string, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		st, _ := procState(pid)
		if want == "stopped" && st == 'T' || want == "dead" && st == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the signal had no effect: the process is not %s %v later (state %q)", want, bound, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// isMarked reports whether process pid carries mark in its environment.
func isMarked(pid int, mark string) bool {
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return string(kv) == markEnv+"="+mark })
}
