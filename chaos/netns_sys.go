package chaos

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` keeps its namespaces' handles.
const netnsDir = "/run/netns"

// inNetns runs f on an OS thread moved into the named network namespace: a
// socket f makes belongs to that namespace for its whole life, whichever
// thread uses it later. The thread is moved back before it is unlocked.
// It must never end instead: the launcher starts workers with Pdeathsig
// SIGKILL, which fires when the thread that forked them ends, and the
// runtime ends a thread whose goroutine exits locked, which may well be
// one that forked workers earlier. (Only if it cannot be moved back is it
// left locked, and so ended.)
func inNetns(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("chaos: this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(filepath.Join(netnsDir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("chaos: network namespace %s: %w", name, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("chaos: entering network namespace %s: %w", name, err)
			return
		}
		err = f()
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// listenIn listens on addr inside the named namespace.
func listenIn(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// dialerIn dials addr from inside the named namespace.
func dialerIn(ns, addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var c net.Conn
		err := inNetns(ns, func() (err error) {
			var d net.Dialer
			c, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}
}
