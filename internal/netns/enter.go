package netns

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// dir is where `ip netns add` keeps its namespaces' handles.
const dir = "/run/netns"

// Do runs f on an OS thread moved into the host's network namespace: a
// socket f makes belongs to that namespace for its whole life, whichever
// thread uses it later. This is how the test process itself reaches a
// lab address (its own namespace has no route to the lab). The thread is
// moved back before it is unlocked. It must never end instead: a process
// started with Pdeathsig is signalled when the thread that forked it ends,
// and the runtime ends a thread whose goroutine exits locked, which may
// well be one that forked such processes earlier. (Only if it cannot be
// moved back is it left locked, and so ended.)
func (h *Host) Do(f func() error) error { return enter(h.name, f) }

// Listen listens on addr (network "tcp", "tcp4", ...) inside the host's
// namespace.
func (h *Host) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// DialContext connects to addr from inside the host's namespace; its
// signature is net.Dialer.DialContext's, so that it can be an HTTP
// transport's or a gRPC client's dialer.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// enter runs f on an OS thread moved into the named network namespace
// (Do).
func enter(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: network namespace %s: %w", name, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: entering network namespace %s: %w", name, err)
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
