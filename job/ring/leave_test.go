package ring

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// heldDeparture is a departer whose record is held until the test lets it
// go, the way a slow etcd Put is; it reports whether its context was still
// alive when it was let go.
type heldDeparture struct {
	called  chan struct{}
	release chan struct{}
	err     chan error
}

func (h *heldDeparture) Leave(ctx context.Context, _ string) error {
	close(h.called)
	<-h.release
	err := ctx.Err()
	h.err <- err
	return err
}

// TestLeaveOutlivesTheRun holds the departure's record until the run's own
// context has ended (the leaving flag ends the run at the next step
// boundary, which may come first): the record must still go through, or the
// coordinator names the worker lost by its lease instead of left (run24's
// TestEmbedKillAndLeave).
func TestLeaveOutlivesTheRun(t *testing.T) {
	w := &ringWorker{log: zap.NewNop()}
	w.cfg.LeaseTTL = 5 * time.Second
	h := &heldDeparture{called: make(chan struct{}), release: make(chan struct{}), err: make(chan error, 1)}
	leave, askLeave := context.WithCancelCause(testwait.Context(t, time.Minute))
	run, endRun := context.WithCancel(testwait.Context(t, time.Minute))
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.leaveWhenDone(h, leave, run, func(error) {})
	}()
	askLeave(errors.New("SIGTERM"))
	testwait.Recv(t, h.called, 10*time.Second, "the worker to record its departure after being asked to leave")
	if !w.leaving.Load() {
		t.Fatal("the departure is being recorded, but the leaving flag is not set")
	}
	endRun() // the rounds saw the flag and ended the run
	close(h.release)
	if err := testwait.Recv(t, h.err, 10*time.Second, "the departure's record to finish"); err != nil {
		t.Fatalf("the departure's record was cancelled by the run's end: %v", err)
	}
	testwait.Recv(t, done, 10*time.Second, "leaveWhenDone to return once the run ended")
}
