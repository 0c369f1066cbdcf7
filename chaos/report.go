package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is one run of a scenario: its schedule, what each fault did and
// when, every invariant's verdict with its evidence, the recovery times,
// and the run's steps (the HTML page's timeline and loss curve).
type Report struct {
	Scenario    string    `json:"scenario"`
	Description string    `json:"description,omitempty"`
	Seed        uint64    `json:"seed"`
	Started     time.Time `json:"started"`
	DurationS   float64   `json:"duration_s"`
	// Plan is the schedule the seed gave.
	Plan       []Planned      `json:"plan"`
	Faults     []*FaultRecord `json:"faults"`
	Invariants []Verdict      `json:"invariants"`
	Passed     bool           `json:"passed"`
	// Launches: 1, or more when a fault killed the whole job.
	Launches int `json:"launches"`
	// The run's end, and the undisturbed reference's.
	Error          string  `json:"error,omitempty"`
	Step           int64   `json:"step"`
	Accuracy       float64 `json:"accuracy"`
	ParametersCRC  uint32  `json:"parameters_crc32c"`
	RefAccuracy    float64 `json:"reference_accuracy"`
	RefCRC         uint32  `json:"reference_parameters_crc32c"`
	RecoveryMaxS   float64 `json:"recovery_max_s"`
	RecoveryBoundS float64 `json:"recovery_bound_s"`
	// Steps and Generations are the run's timeline, in seconds from its
	// start.
	Steps       []StepPoint `json:"steps"`
	Generations []GenPoint  `json:"generations"`
	// Dir keeps a failed run's checkpoints and job logs.
	Dir string `json:"dir,omitempty"`
	// Events are every event of the run's launches, and RefEvents those
	// of its undisturbed reference, for a caller's own checks (not in the
	// JSON: the timeline above is their summary).
	Events    []Event `json:"-"`
	RefEvents []Event `json:"-"`
}

// FaultRecord is a planned fault and what became of it.
type FaultRecord struct {
	Planned
	Changes    string    `json:"changes"`
	Attempt    int       `json:"launch"`
	Generation int64     `json:"generation"` // the ring's when injected
	AtStep     int64     `json:"at_step"`
	TargetRank int       `json:"target_rank"`
	TargetID   string    `json:"target_id,omitempty"`  // the target worker's id, when it has a rank
	TargetPid  int64     `json:"target_pid,omitempty"` // and its process
	Injected   time.Time `json:"injected"`
	Healed     time.Time `json:"healed"`
	What       string    `json:"what,omitempty"`
	HealWhat   string    `json:"heal_what,omitempty"`
	Error      string    `json:"error,omitempty"`
	// RecoveredAt is the first step of the rebuilt ring (or relaunched
	// job); RecoveryS the time from injection to it.
	RecoveredAt time.Time `json:"recovered"`
	RecoveryS   float64   `json:"recovery_s,omitempty"`

	fault Fault
	env   *Env
}

// Verdict is one invariant's outcome: "pass", "fail", or "n/a" when the
// run gives it nothing to check.
type Verdict struct {
	N        int    `json:"n"`
	Name     string `json:"name"`
	Status   string `json:"status"`
	Evidence string `json:"evidence"`
}

// StepPoint is a step of the run's timeline.
type StepPoint struct {
	T          float64 `json:"t"`
	Step       int64   `json:"step"`
	Loss       float64 `json:"loss"`
	World      int64   `json:"world"`
	Generation int64   `json:"generation"`
	Launch     int     `json:"launch"`
}

// GenPoint is a generation of the run's timeline.
type GenPoint struct {
	T          float64 `json:"t"`
	Generation int64   `json:"generation"`
	World      int64   `json:"world"`
	Reason     string  `json:"reason"`
	DecidedBy  string  `json:"decided_by,omitempty"` // the coordinator that decided it
	Launch     int     `json:"launch"`
}

// WriteJSON writes r as indented JSON to dir/<scenario>-seed<seed>.json
// and returns the path; an existing report is never replaced.
func (r *Report) WriteJSON(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("chaos: the report directory: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-seed%d.json", r.Scenario, r.Seed))
	for i := 2; ; i++ {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if os.IsExist(err) {
			path = filepath.Join(dir, fmt.Sprintf("%s-seed%d-%d.json", r.Scenario, r.Seed, i))
			continue
		}
		if err != nil {
			return "", fmt.Errorf("chaos: writing the report: %w", err)
		}
		_, werr := f.Write(append(b, '\n'))
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		return path, werr
	}
}

// WriteSummary writes a terminal table of reports: one row per run with
// each invariant's verdict (its columns named by number, with a legend under
// the table), then every failure's evidence.
func WriteSummary(w io.Writer, reports []*Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "scenario\tseed\tfaults\trecovery max\t")
	for n := 0; n <= 8; n++ {
		fmt.Fprintf(tw, "%d\t", n)
	}
	fmt.Fprintln(tw, "result")
	for _, r := range reports {
		rec := "-"
		if r.RecoveryMaxS > 0 {
			rec = fmt.Sprintf("%.2fs", r.RecoveryMaxS)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t", r.Scenario, r.Seed, len(r.Faults), rec)
		for n := 0; n <= 8; n++ {
			st := "-"
			for _, v := range r.Invariants {
				if v.N == n {
					st = v.Status
				}
			}
			fmt.Fprintf(tw, "%s\t", st)
		}
		if r.Passed {
			fmt.Fprintln(tw, "PASS")
		} else {
			fmt.Fprintln(tw, "FAIL")
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "invariants:")
	for n, name := range invariantNames {
		fmt.Fprintf(w, "  %d  %s\n", n, name)
	}
	for _, r := range reports {
		for _, v := range r.Invariants {
			if v.Status == "fail" {
				fmt.Fprintf(w, "FAIL %s seed %d, invariant %d (%s): %s\n", r.Scenario, r.Seed, v.N, v.Name, v.Evidence)
			}
		}
		if r.Dir != "" {
			fmt.Fprintf(w, "     %s seed %d: its checkpoints and logs are kept in %s\n", r.Scenario, r.Seed, r.Dir)
		}
	}
}

// RecoveryStats are the median, 99th percentile and maximum of the
// recovery times of reports' faults (seconds), and how many there were.
func RecoveryStats(reports []*Report) (median, p99, maxS float64, n int) {
	var xs []float64
	for _, r := range reports {
		for _, f := range r.Faults {
			if f.RecoveryS > 0 {
				xs = append(xs, f.RecoveryS)
			}
		}
	}
	if len(xs) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(xs)
	at := func(q float64) float64 { return xs[min(len(xs)-1, int(q*float64(len(xs))))] }
	return at(0.5), at(0.99), xs[len(xs)-1], len(xs)
}

// invariantNames are the invariants in the order they are checked.
var invariantNames = [...]string{
	0: "every planned fault was injected (and healed)",
	1: "the job ends as the scenario says",
	2: "every sample of every epoch trained exactly once",
	3: "parameters bitwise identical on every rank",
	4: "final model equals the undisturbed run's",
	5: "every checkpoint verifies, none overwritten",
	6: "no acknowledged parameter-server push lost or applied twice",
	7: "no process, port or shared-memory file left behind",
	8: "recovery time within the scenario's bound",
}

// InvariantName is invariant n's name.
func InvariantName(n int) string {
	if n < 0 || n >= len(invariantNames) {
		return ""
	}
	return invariantNames[n]
}

func verdict(n int, ok bool, format string, a ...any) Verdict {
	st := "pass"
	if !ok {
		st = "fail"
	}
	return Verdict{N: n, Name: invariantNames[n], Status: st, Evidence: fmt.Sprintf(format, a...)}
}

func notApplicable(n int, why string) Verdict {
	return Verdict{N: n, Name: invariantNames[n], Status: "n/a", Evidence: why}
}

func joinLimited(xs []string, n int) string {
	if len(xs) > n {
		return strings.Join(xs[:n], "; ") + fmt.Sprintf("; and %d more", len(xs)-n)
	}
	return strings.Join(xs, "; ")
}
