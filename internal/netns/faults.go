package netns

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// ErrNoNetem means the kernel has no sch_netem, so delay and loss cannot be
// injected (a rate cap alone still works, through tbf).
var ErrNoNetem = errors.New("netns: the kernel has no netem qdisc (sch_netem)")

// Shape is a slow or lossy link. The zero Shape is a clean link.
type Shape struct {
	Delay time.Duration // added to each direction
	Rate  int64         // bytes per second in each direction; 0 is unlimited
	Loss  float64       // percent of packets dropped in each direction
}

// LinkDown takes host i's switch port down: host i is cut off from every
// other host (a partition) until LinkUp. Its own address and loopback stay.
func (l *Lab) LinkDown(ctx context.Context, i int) error {
	return l.run(ctx, "-n", l.sw, "link", "set", l.hosts[i].port(), "down")
}

// LinkUp reconnects host i after LinkDown.
func (l *Lab) LinkUp(ctx context.Context, i int) error {
	return l.run(ctx, "-n", l.sw, "link", "set", l.hosts[i].port(), "up")
}

// Shape applies s to both directions of host i's link, replacing any earlier
// shape; the zero Shape removes it. Delay or loss need netem (ErrNoNetem when
// the kernel lacks it); a rate cap alone uses tbf.
func (l *Lab) Shape(ctx context.Context, i int, s Shape) error {
	tc, err := exec.LookPath("tc")
	if err != nil {
		return fmt.Errorf("netns: shaping host %d: tc not found: %w", i, err)
	}
	h := l.hosts[i]
	ends := [][2]string{{h.name, hostLink}, {l.sw, h.port()}}
	for _, e := range ends {
		err := shapeDev(ctx, tc, e[0], e[1], s)
		if errors.Is(err, ErrNoNetem) {
			return fmt.Errorf("%w: shaping host %d with %+v", ErrNoNetem, i, s)
		}
		if err != nil {
			return fmt.Errorf("netns: shaping host %d: %w", i, err)
		}
	}
	return nil
}

func shapeDev(ctx context.Context, tc, ns, dev string, s Shape) error {
	if s == (Shape{}) {
		err := runCmd(ctx, tc, "-n", ns, "qdisc", "del", "dev", dev, "root")
		if err != nil && (strings.Contains(err.Error(), "handle of zero") || strings.Contains(err.Error(), "No such file")) {
			return nil // nothing to remove
		}
		return err
	}
	args := []string{"-n", ns, "qdisc", "replace", "dev", dev, "root"}
	args = append(args, qdiscArgs(s)...)
	err := runCmd(ctx, tc, args...)
	if err != nil && strings.Contains(err.Error(), "qdisc kind is unknown") {
		return ErrNoNetem
	}
	return err
}

// qdiscArgs is the qdisc for s: netem when it delays or drops, else tbf.
func qdiscArgs(s Shape) []string {
	rate := strconv.FormatInt(s.Rate*8, 10) + "bit"
	if s.Delay == 0 && s.Loss == 0 {
		// The bucket holds at least 10 ms of traffic and a few full-size
		// segments, so a cap does not turn into loss on bursts.
		burst := max(s.Rate/100, 64<<10)
		return []string{"tbf", "rate", rate, "burst", strconv.FormatInt(burst, 10), "latency", "100ms"}
	}
	a := []string{"netem"}
	if s.Delay > 0 {
		a = append(a, "delay", strconv.FormatInt(s.Delay.Microseconds(), 10)+"us")
	}
	if s.Rate > 0 {
		a = append(a, "rate", rate)
	}
	if s.Loss > 0 {
		a = append(a, "loss", strconv.FormatFloat(s.Loss, 'f', -1, 64)+"%")
	}
	return a
}
