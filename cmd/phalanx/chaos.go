package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/chaos"
)

// errInvariants is the chaos command's error when a run broke an
// invariant (exit status 1; the reports say which).
var errInvariants = errors.New("an invariant failed")

// chaosCmd is phalanx chaos: seeded fault schedules against real jobs.
func chaosCmd(reg *phalanx.Registry, stdout, stderr io.Writer) *cobra.Command {
	list := &cobra.Command{Use: "list", Short: "the built-in scenarios and their faults", Args: noArgs,
		RunE: func(*cobra.Command, []string) error { return chaosList(stdout) }}
	return group("chaos", "seeded fault schedules against real jobs, invariants checked, reports",
		"Runs seeded fault schedules against real jobs, checks the invariants and reports.", "subcommand", stderr,
		chaosRun(reg, stdout), list, chaosSoak(reg, stdout))
}

func chaosList(stdout io.Writer) error {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tworkers\tsteps\tfaults\tdescription")
	for _, s := range chaos.Builtin() {
		var kinds []string
		for _, f := range s.Faults {
			kinds = append(kinds, f.Kind)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", s.Name, s.Job.Workers, s.Job.Steps, strings.Join(kinds, ","), s.Description)
	}
	tw.Flush()
	fmt.Fprintln(stdout, "\nfault kinds:")
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	kinds := chaos.DefaultKinds()
	for _, n := range kinds.Names() {
		fmt.Fprintf(tw, "  %s\t%s\n", n, kinds[n].Doc)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\nthe CI set: %s\n", strings.Join(chaos.CISet(), " "))
	return nil
}

// chaosFlags are the flags run and soak share.
type chaosFlags struct {
	report string
	dir    string
	html   bool
}

func (c *chaosFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.report, "report", "", "write one JSON report per run (and an HTML page with --html) into this directory")
	fs.StringVar(&c.dir, "dir", "", "where runs keep their checkpoints and job logs (default: temporary; a failed run's is kept)")
	fs.BoolVar(&c.html, "html", true, "with --report, also write each run's HTML page")
}

func chaosRun(reg *phalanx.Registry, stdout io.Writer) *cobra.Command {
	cmd := leaf("run [flags] SCENARIO...", "run scenarios (a built-in name, a .json or .yaml file, or ci) against real jobs",
		"Runs each SCENARIO (a built-in name, see phalanx chaos list; a .json or .yaml file; or ci for\n"+
			"the CI set) against real jobs, checks the invariants and prints a table.")
	cmd.Args, cmd.ValidArgsFunction = cobra.ArbitraryArgs, completeScenarios
	fs := cmd.Flags()
	seed := fs.Uint64("seed", 1, "the first run's seed: the same seed gives the same fault schedule")
	runs := fs.Int("runs", 1, "runs of each scenario, with seeds seed, seed+1, ...")
	var cf chaosFlags
	cf.register(fs)
	return withRun(cmd, func(ctx context.Context, names []string) error {
		if len(names) == 0 {
			return usagef("chaos run: name at least one scenario (phalanx chaos list shows the built-in ones)")
		}
		if *runs < 1 {
			return usagef("chaos run: --runs %d: want at least 1", *runs)
		}
		var scs []chaos.Scenario
		for _, a := range names {
			switch {
			case a == "ci":
				for _, n := range chaos.CISet() {
					s, _ := chaos.Lookup(n)
					scs = append(scs, s)
				}
			case strings.HasSuffix(a, ".json") || strings.HasSuffix(a, ".yaml") || strings.HasSuffix(a, ".yml"):
				s, err := chaos.LoadScenario(a)
				if err != nil {
					return usagef("chaos run: %v", err)
				}
				scs = append(scs, s)
			default:
				s, err := chaos.Lookup(a)
				if err != nil {
					return usagef("chaos run: %v", err)
				}
				scs = append(scs, s)
			}
		}
		kinds := chaos.DefaultKinds()
		for i := range scs {
			if err := scs[i].Validate(kinds); err != nil {
				return err
			}
		}
		r := &chaos.Runner{Registry: reg, Kinds: kinds, Dir: cf.dir, Output: stdout}
		var reports []*chaos.Report
		for _, s := range scs {
			for k := range *runs {
				rep, err := r.Run(ctx, s, *seed+uint64(k))
				if err != nil {
					return err
				}
				reports = append(reports, rep)
				if err := cf.write(rep, stdout); err != nil {
					return err
				}
			}
		}
		return summarize(stdout, reports)
	})
}

func (c *chaosFlags) write(rep *chaos.Report, stdout io.Writer) error {
	if c.report == "" {
		return nil
	}
	path, err := rep.WriteJSON(c.report)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "chaos: report %s\n", path)
	if !c.html {
		return nil
	}
	hp := strings.TrimSuffix(path, ".json") + ".html"
	f, err := os.OpenFile(hp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: the HTML page: %w", err)
	}
	err = chaos.WriteHTML(f, rep)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		fmt.Fprintf(stdout, "chaos: page %s\n", filepath.Clean(hp))
	}
	return err
}

func summarize(stdout io.Writer, reports []*chaos.Report) error {
	fmt.Fprintln(stdout)
	chaos.WriteSummary(stdout, reports)
	if med, p99, mx, n := chaos.RecoveryStats(reports); n > 0 {
		fmt.Fprintf(stdout, "recovery over %d faults: median %.2fs, p99 %.2fs, max %.2fs\n", n, med, p99, mx)
	}
	passed := 0
	for _, r := range reports {
		if r.Passed {
			passed++
		}
	}
	fmt.Fprintf(stdout, "survived: %d/%d runs, %d faults injected\n", passed, len(reports), chaos.FaultCount(reports))
	if passed != len(reports) {
		return errInvariants
	}
	return nil
}

func chaosSoak(reg *phalanx.Registry, stdout io.Writer) *cobra.Command {
	cmd := leaf("soak", "random faults against one long job",
		"Runs jobs back to back for --duration, injecting faults drawn at random (seeded), and checks\n"+
			"every job's invariants.")
	fs := cmd.Flags()
	var sc chaos.SoakConfig
	fs.DurationVar(&sc.Duration, "duration", 10*time.Minute, "how long to soak")
	fs.DurationVar(&sc.MeanInterval, "interval", 20*time.Second, "mean time between faults")
	fs.Uint64Var(&sc.Seed, "seed", 1, "seed of the fault draws")
	fs.IntVar(&sc.Workers, "workers", 4, "workers per job")
	kinds := fs.String("faults", "", "comma-separated fault kinds to draw from (default sigkill,sigstop,sigterm,garbage-frames)")
	var cf chaosFlags
	cf.register(fs)
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		if *kinds != "" {
			sc.Kinds = strings.Split(*kinds, ",")
		}
		r := &chaos.Runner{Registry: reg, Dir: cf.dir, Output: stdout}
		start := time.Now()
		reports, err := r.Soak(ctx, sc)
		for _, rep := range reports {
			if werr := cf.write(rep, stdout); werr != nil && err == nil {
				err = werr
			}
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "soak: %s, %d jobs, %d faults\n", time.Since(start).Round(time.Second), len(reports), chaos.FaultCount(reports))
		return summarize(stdout, reports)
	})
}
