package chaos

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
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

// listenerOwner is the process whose socket listens on addr (an IPv4 or
// IPv6 host:port): the one whose descriptors name the listening socket's
// inode in /proc/net/tcp or tcp6. 0: none this process can see (a port
// another user's process holds, or that nobody holds any more).
func listenerOwner(addr string) (int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	ip := net.ParseIP(host)
	p, err := strconv.ParseUint(port, 10, 16)
	if ip == nil || err != nil {
		return 0, fmt.Errorf("chaos: %q is not an IP address and port", addr)
	}
	inode := ""
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" { // 0A: LISTEN
				continue
			}
			if lip, lport, ok := procNetAddr(f[1]); ok && lport == uint16(p) && (lip.Equal(ip) || lip.IsUnspecified()) {
				inode = f[9]
			}
		}
	}
	if inode == "" || inode == "0" {
		return 0, nil
	}
	want := "socket:[" + inode + "]"
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); err == nil && l == want {
				return pid, nil
			}
		}
	}
	return 0, nil
}

// procNetAddr reads a /proc/net/tcp address: the IP as 32-bit words in
// host (little-endian) order, then the port, in hexadecimal.
func procNetAddr(s string) (net.IP, uint16, bool) {
	h, pt, ok := strings.Cut(s, ":")
	if !ok || (len(h) != 8 && len(h) != 32) {
		return nil, 0, false
	}
	raw, err := hex.DecodeString(h)
	port, perr := strconv.ParseUint(pt, 16, 16)
	if err != nil || perr != nil {
		return nil, 0, false
	}
	for i := 0; i < len(raw); i += 4 { // each word's bytes back in network order
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return net.IP(raw), uint16(port), true
}

// isMarked reports whether process pid carries mark in its environment.
func isMarked(pid int, mark string) bool {
	env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return string(kv) == markEnv+"="+mark })
}
