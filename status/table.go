package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/phalanx-rt/phalanx/internal/bytesize"
)

// WriteTable prints s as `phalanx status` does: a summary line, then the
// ring, the generations (latest first), the workers, the excluded
// stragglers, the checkpoints and the last events, as tables. now dates
// the heartbeats.
func WriteTable(w io.Writer, s Snapshot, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	steps := ""
	if s.Steps > 0 {
		steps = fmt.Sprintf("/%d", s.Steps)
	}
	model := ""
	if s.Model != "" {
		model = " (" + s.Model + ")"
	}
	fmt.Fprintf(tw, "job %s%s: %s · generation %d · world %d · step %d%s · loss %.4g · %.0f samples/s · updated %s by the %s\n",
		s.Job, model, s.State, s.Generation, s.World, s.Step, steps, s.Loss, s.SamplesPerS, ago(now, s.Updated), s.Source)
	section(tw, "RING", "rank\tworker\tpid\tid")
	for _, m := range s.Ring {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", m.Rank, orDash(m.Worker), m.Pid, m.ID)
	}
	section(tw, "GENERATIONS (latest first)", "gen\tworld\tat step\twhy\tchanges")
	for i := len(s.Generations) - 1; i >= 0; i-- {
		g := s.Generations[i]
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\n", g.Number, g.World, g.Step, g.Reason, changesOf(g))
	}
	section(tw, "WORKERS", "worker\tpid\trole\tstate\trank\tstep\tsamples/s\tlast heartbeat")
	for _, x := range s.Workers {
		state := x.State
		if x.Exit != "" {
			state += " (" + x.Exit + ")"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%.0f\t%s\n", x.Index, x.Pid, x.Role, state, orDash(x.Rank), x.Step, x.SamplesPerS, ago(now, x.LastSeen))
	}
	section(tw, "EXCLUDED STRAGGLERS", "id\tpid\twas rank\tlate\tat step")
	for _, x := range s.Excluded {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d of %d\t%d\n", x.ID, x.Pid, x.Rank, x.LateIn, x.Window, x.Step)
	}
	section(tw, "CHECKPOINTS", "step\tsize\tseconds\tverification\twhere")
	for i := len(s.Checkpoints) - 1; i >= 0; i-- {
		c := s.Checkpoints[i]
		where := c.URL
		if where == "" {
			where = c.ID
		}
		fmt.Fprintf(tw, "%d\t%s\t%.2f\t%s\t%s\n", c.Step, bytesize.Format(c.Bytes), c.Seconds, c.Verified, where)
	}
	section(tw, "LAST EVENTS", "time\tevent\tfields")
	from := max(len(s.Events)-10, 0)
	for _, e := range s.Events[from:] {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", e.T.Format("15:04:05"), e.Event, e.Text)
	}
	return tw.Flush()
}

func section(tw *tabwriter.Writer, title, head string) {
	fmt.Fprintf(tw, "\n%s\n%s\n", title, head)
}

func orDash(i int) string {
	if i < 0 {
		return "-"
	}
	return fmt.Sprint(i)
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t).Round(time.Second)
	if d < time.Second {
		return "now"
	}
	return d.String() + " ago"
}

func changesOf(g Generation) string {
	var out []string
	for _, c := range []struct {
		what  string
		ranks []int
	}{{"lost", g.Lost}, {"left", g.Left}, {"excluded", g.Excluded}, {"joined", g.Joined}, {"readmitted", g.Readmitted}} {
		if len(c.ranks) > 0 {
			out = append(out, fmt.Sprintf("%s rank %s", c.what, strings.Trim(fmt.Sprint(c.ranks), "[]")))
		}
	}
	return strings.Join(out, "; ")
}
