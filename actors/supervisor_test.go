package actors

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/phalanx-rt/phalanx/internal/testclock"
)

// flaky panics on every "boom" message; its starts are counted outside the
// instance, as a restarted actor's restored state would be.
type flaky struct{ starts chan<- int }

type boom struct{}

func (f *flaky) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		f.starts <- 1
	case *boom:
		panic("boom")
	}
}

func TestSupervisorRestartsWithBackoffThenGivesUp(t *testing.T) {
	sys, err := NewSystem(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	var mu sync.Mutex
	var delays []time.Duration
	gaveUp := make(chan *GiveUpError, 1)
	strategy := &Strategy{
		Budget: Budget{MaxRestarts: 3, Window: time.Hour, Backoff: 10 * time.Millisecond, MaxBackoff: 25 * time.Millisecond},
		AfterFunc: func(d time.Duration, f func()) {
			mu.Lock()
			delays = append(delays, d)
			mu.Unlock()
			f()
		},
		GiveUp: func(e *GiveUpError) { gaveUp <- e },
	}
	starts := make(chan int, 16)
	_, pids, err := StartSupervisor(sys, "sup", strategy, Child{Name: "flaky", Props: actor.PropsFromProducer(func() actor.Actor { return &flaky{starts: starts} })})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-starts:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", what)
		}
	}
	wait("first start")
	for i := range 3 {
		sys.Root.Send(pids[0], &boom{})
		wait("restart " + string(rune('1'+i)))
	}
	sys.Root.Send(pids[0], &boom{})
	select {
	case e := <-gaveUp:
		if e.Failures != 4 || e.Child != pids[0].Id || e.Reason != "boom" {
			t.Errorf("gave up with %+v", e)
		}
		var ge *GiveUpError
		if !errors.As(error(e), &ge) || ge.Error() == "" {
			t.Error("not an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the supervisor did not give up after the budget was spent")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 25 * time.Millisecond}
	if len(delays) != len(want) {
		t.Fatalf("backoffs %v, want %v", delays, want)
	}
	for i := range want {
		if delays[i] != want[i] {
			t.Errorf("backoff %d = %v, want %v", i, delays[i], want[i])
		}
	}
}

// TestSupervisorRestartWindowExpires: failures older than the budget's window
// no longer count. Two failures spend a budget of two restarts; once the
// window has passed on the injected clock, two more are restarted (with the
// backoff starting over), and only a third within the new window makes the
// supervisor give up.
func TestSupervisorRestartWindowExpires(t *testing.T) {
	sys, err := NewSystem(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	const window = time.Minute
	clock := testclock.New(time.Unix(1_000_000, 0))
	var mu sync.Mutex
	var delays []time.Duration
	gaveUp := make(chan *GiveUpError, 1)
	strategy := &Strategy{
		Budget: Budget{MaxRestarts: 2, Window: window, Backoff: 10 * time.Millisecond, MaxBackoff: time.Second},
		Now:    clock.Now,
		AfterFunc: func(d time.Duration, f func()) {
			mu.Lock()
			delays = append(delays, d)
			mu.Unlock()
			f()
		},
		GiveUp: func(e *GiveUpError) { gaveUp <- e },
	}
	starts := make(chan int, 16)
	_, pids, err := StartSupervisor(sys, "sup", strategy, Child{Name: "flaky", Props: actor.PropsFromProducer(func() actor.Actor { return &flaky{starts: starts} })})
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string) {
		t.Helper()
		select {
		case <-starts:
		case e := <-gaveUp:
			t.Fatalf("waiting for %s, the supervisor gave up: %v", what, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10s", what)
		}
	}
	fail := func(what string) {
		t.Helper()
		sys.Root.Send(pids[0], &boom{})
		wait(what)
	}
	wait("first start")
	fail("restart after failure 1")
	clock.Advance(window / 2)
	fail("restart after failure 2")
	clock.Advance(window) // both failures now older than the window
	fail("restart after failure 3, the first of a new window")
	clock.Advance(window / 2)
	fail("restart after failure 4, the second of the new window")
	sys.Root.Send(pids[0], &boom{})
	select {
	case e := <-gaveUp:
		if e.Failures != 3 || e.Window != window {
			t.Errorf("gave up with %+v, want 3 failures within %v", e, window)
		}
	case <-starts:
		t.Fatal("a third failure within the window was restarted; the budget is two")
	case <-time.After(10 * time.Second):
		t.Fatal("the supervisor did not give up on a third failure within the window")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond}
	if fmt.Sprint(delays) != fmt.Sprint(want) {
		t.Errorf("backoffs %v, want %v (starting over in the new window)", delays, want)
	}
}

// TestRemoteSystemAddress: a remote system advertises an address peers
// can dial: the bound one by default, the advertised host with the bound
// port when bound to every interface (IPv6 included: protoactor joins
// host and port with a bare colon); every interface without an address to
// advertise, and a bad port, are refused before anything listens.
func TestRemoteSystemAddress(t *testing.T) {
	tests := []struct {
		name      string
		bind      string
		advertise string
		host      string // the advertised address's host ("": refused)
		err       string
	}{
		{"default", "", "", "127.0.0.1", ""},
		{"every IPv6 interface, advertised", "[::]:0", "::1", "::1", ""},
		{"every IPv4 interface", "0.0.0.0:7011", "", "", "pass --advertise HOST"},
		{"every IPv6 interface", "[::]:0", "", "", "pass --advertise HOST"},
		{"not a port", "127.0.0.1:notaport", "", "", "port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sys, err := NewSystem(Options{Remote: true, Bind: tc.bind, Advertise: tc.advertise})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("bind %s: %v, want an error saying %q", tc.bind, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer sys.Shutdown()
			host, port, err := net.SplitHostPort(sys.Address())
			if err != nil || host != tc.host || port == "0" {
				t.Fatalf("remote system address %q, want host %s and the bound port", sys.Address(), tc.host)
			}
			c, err := net.DialTimeout("tcp", sys.Address(), 5*time.Second)
			if err != nil {
				t.Fatalf("dialing the advertised address: %v", err)
			}
			c.Close()
		})
	}
}
