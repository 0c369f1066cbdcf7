// Package netns builds a small lab of Linux network namespaces that tests use
// as separate hosts: N host namespaces, each joined by a veth pair to a bridge
// in a "switch" namespace of the lab's own, with addresses from a private /24,
// loopback up, and no default route, so traffic never leaves the lab. It also
// injects link faults (a link taken down is a partition; tc shaping is a slow
// or lossy link). It is test infrastructure, not a container runtime.
//
// # Needs
//
// Root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip` (and `tc` for
// Shape); scripts/install-netns-deps installs iproute2 on Debian. Require
// skips the test loudly without them, and fails it when CI=true. The root
// namespace is never touched: every link is created inside the lab's
// namespaces.
//
// # Cost
//
// New runs N+4 `ip` processes (one batch per namespace) and Close three: a
// three-host lab costs about 0.4 s to build and close on the 2-core machine
// (BenchmarkLab). Namespace names are "phx-<pid>-<random>-sw" and
// "phx-<pid>-<random>-h<i>", so concurrent test processes never collide; New
// first sweeps away the namespaces of dead pids (a test run killed by SIGKILL
// never ran its cleanup), killing any process left running inside them.
//
// # API
//
//	func Require(t testing.TB)                            // skip (or t.Fatal under CI=true) unless labs can be built
//	func Check() error                                    // nil, or an error wrapping ErrNotRoot / ErrNoIP
//	func Start(t testing.TB, hosts int) *Lab              // Require + New + t.Cleanup(lab.Close)
//	func New(ctx context.Context, hosts int) (*Lab, error)
//	func Sweep(ctx context.Context) ([]string, error)     // deletes stale phx-<deadpid>-* namespaces
//
//	func (l *Lab) Len() int
//	func (l *Lab) Host(i int) *Host                       // 0 <= i < Len()
//	func (l *Lab) Subnet() netip.Prefix                   // e.g. 10.250.x.0/24
//	func (l *Lab) LinkDown(ctx context.Context, i int) error  // cut host i from the switch (partition)
//	func (l *Lab) LinkUp(ctx context.Context, i int) error    // reconnect it
//	func (l *Lab) Shape(ctx context.Context, i int, s Shape) error // both directions of host i's link; zero Shape clears
//	func (l *Lab) Close() error                           // deletes every namespace and link of the lab
//
//	type Shape struct { Delay time.Duration; Rate int64 /* bytes/s, 0 = unlimited */; Loss float64 /* percent */ }
//	var ErrNotRoot, ErrNoIP, ErrNoNetem error             // ErrNoNetem: delay or loss asked, and the kernel lacks sch_netem
//
//	func (h *Host) Index() int
//	func (h *Host) Name() string                          // the namespace's name
//	func (h *Host) Addr() netip.Addr                      // its address on the lab's subnet (10.250.x.(i+1))
//	func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd
//	func (h *Host) Do(f func() error) error               // f on an OS thread inside the namespace
//	func (h *Host) Listen(network, addr string) (net.Listener, error)              // inside it
//	func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) // from inside it
//
// LinkDown takes the switch-side end of host i's veth down: the host keeps its
// address, but nothing reaches it or leaves it, so a connect times out (it is
// not refused) and open connections stall, as in a real partition. Shape with
// only Rate uses tbf; delay or loss need netem, which this machine's
// kernel (6.18) does not have: there Shape returns ErrNoNetem, and a
// slow link needs a user-space proxy instead.
//
// Command returns an unstarted *exec.Cmd running `ip netns exec <ns> name
// args...`: ip enters the namespace and execs the program, so
// cmd.Process.Pid is the program's own pid and can be signalled directly.
// The usual pattern is the test binary re-executing itself (os.Args[0]) with an
// environment variable that selects a child role, talking to the parent over
// stdin/stdout (see internal/launch): the parent, in the root namespace, has
// no route to the lab's addresses. The parent reaches them through a host
// instead: DialContext (an HTTP transport's or a gRPC client's dialer) and
// Listen make sockets that belong to the host's namespace, from a thread
// that Do moves into it and back.
//
// ip netns exec passes the environment through and gives the program a mount
// namespace of its own with /sys remounted; the file system is otherwise the
// parent's. A process still running in a namespace keeps it alive after Close
// (unnamed, and cut off: Close deletes its link first): stop the lab's
// processes before Close, or bind them to the test's context.
package netns
