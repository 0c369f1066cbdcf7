package phalanx_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/kindtest"
	"github.com/phalanx-rt/phalanx/internal/testmodel"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// TestMain makes the test binary a worker when a test's Launch re-executes
// it.
func TestMain(m *testing.M) {
	phalanx.Main(registry())
	os.Exit(m.Run())
}

// registry is the test binary's models: the regression, and barriers of a
// third job kind, plugged in here alone (TestThirdKind).
func registry() *phalanx.Registry {
	return kindtest.Registry(phalanx.NewRegistry(regressionSpec()))
}

func regressionSpec() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name: "regression",
		Options: []phalanx.Option{{Name: "features", Default: "4", Usage: "inputs"}, {Name: "nan_at", Default: "0", Usage: "the step whose loss and gradient are NaN (0: none)"},
			{Name: "say", Usage: "a line the model writes to stderr as it is built"}},
		Check: func(o phalanx.Options) error {
			f, err := o.Int("features")
			if err == nil && f < 1 {
				err = fmt.Errorf("option features %d: want at least 1", f)
			}
			return err
		},
		New: func(o phalanx.Options, seed uint64) (phalanx.Task, error) {
			f, err := o.Int("features")
			if err != nil {
				return phalanx.Task{}, err
			}
			nanAt, err := o.Int("nan_at")
			if err != nil {
				return phalanx.Task{}, err
			}
			if say := o.String("say"); say != "" {
				fmt.Fprintln(os.Stderr, say)
			}
			m := testmodel.NewRegression(f)
			m.NaNAt = nanAt
			return phalanx.Task{Model: m, Train: testmodel.NewRows(2000, f, seed), Test: testmodel.NewRows(200, f, seed+1)}, nil
		},
	}
}

func smallJob() phalanx.LaunchConfig {
	lc := phalanx.DefaultLaunchConfig()
	lc.Registry, lc.Model, lc.Workers = registry(), "regression", 2
	lc.Steps, lc.Batch, lc.Schedule.Base = 150, 64, 0.1
	return lc
}

// ExampleLaunch trains a model of this program's own on two worker
// processes of the program itself.
func ExampleLaunch() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := phalanx.Launch(ctx, smallJob())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d steps on %d workers; parameters identical: %v; fit within 0.01: %v\n",
		res.Step, res.World, res.ParametersIdentical, res.Loss < 0.01)
	// Output: 150 steps on 2 workers; parameters identical: true; fit within 0.01: true
}

// ExampleConfig_Validate: a bad setting is named with its value.
func ExampleConfig_Validate() {
	cfg := phalanx.DefaultConfig()
	cfg.Model = "regression"
	cfg.Sync.Mode, cfg.Sync.Quorum = "hybrid", 1.5
	err := cfg.Validate()
	var ce *phalanx.ConfigError
	fmt.Println(errors.As(err, &ce), ce.Field)
	// Output: true Sync
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*phalanx.Config)
		field string
	}{
		{"defaults", func(*phalanx.Config) {}, ""},
		{"no model", func(c *phalanx.Config) { c.Model = "" }, "Model"},
		{"no steps", func(c *phalanx.Config) { c.Steps = 0 }, "Steps"},
		{"no batch", func(c *phalanx.Config) { c.Batch = 0 }, "Batch"},
		{"job with a slash", func(c *phalanx.Config) { c.Job = "a/b" }, "Job"},
		{"negative clip", func(c *phalanx.Config) { c.ClipNorm = -1 }, "ClipNorm"},
		{"unknown optimizer", func(c *phalanx.Config) { c.Optimizer.Kind = "lion" }, "Optimizer.Kind"},
		{"unknown schedule", func(c *phalanx.Config) { c.Schedule.Kind = "exp" }, "Schedule"},
		{"asp ring", func(c *phalanx.Config) { c.Sync.Mode = "asp" }, "Sync.Mode"},
		{"bad exclusion", func(c *phalanx.Config) { c.Sync.Mode, c.Sync.ExcludeAfter = "hybrid", 20 }, "Sync.ExcludeAfter"},
		{"bad stale", func(c *phalanx.Config) { c.Sync.Mode, c.Sync.Stale = "hybrid", "keep" }, "Sync.Stale"},
		{"lease under a second", func(c *phalanx.Config) { c.LeaseTTL = 100e6 }, "LeaseTTL"},
		{"period without a store", func(c *phalanx.Config) { c.Checkpoint.EverySteps = 5 }, "Checkpoint.Location"},
		{"bad store", func(c *phalanx.Config) { c.Checkpoint.Location = "s3://" }, "Checkpoint.Location"},
		{"bad rescale", func(c *phalanx.Config) { c.Rescale = "both" }, "Rescale"},
		{"fail step", func(c *phalanx.Config) { c.Faults.FailWorker, c.Faults.FailStep = 1, 0 }, "Faults.FailStep"},
		{"restart window", func(c *phalanx.Config) { c.Restarts.Window = 0 }, "Restarts.Window"},
		{"unknown transport", func(c *phalanx.Config) { c.Transport = "udp" }, "Transport"},
		{"unknown wire dtype", func(c *phalanx.Config) { c.WireDType = "fp8" }, "WireDType"},
		{"feedback without compression", func(c *phalanx.Config) { c.ErrorFeedback = true }, "ErrorFeedback"},
		{"fp16 with feedback", func(c *phalanx.Config) { c.WireDType, c.ErrorFeedback = "fp16", true }, ""},
		{"tcp", func(c *phalanx.Config) { c.Transport = "tcp" }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := phalanx.DefaultConfig()
			c.Model = "regression"
			tc.edit(&c)
			err := c.Validate()
			var ce *phalanx.ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("valid configuration refused: %v", err)
			case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
				t.Fatalf("got %v, want an error naming %s", err, tc.field)
			case tc.field != "" && !strings.Contains(err.Error(), tc.field):
				t.Fatalf("%v does not name %s", err, tc.field)
			}
		})
	}
}

// TestLaunchRefusesBadInput: a bad launch is refused before anything
// starts, with a ConfigError naming the field, its value as set (the
// value, not a description of it) and, in its text, both.
func TestLaunchRefusesBadInput(t *testing.T) {
	file := filepath.Join(t.TempDir(), "checkpoints")
	if err := os.WriteFile(file, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		edit  func(*phalanx.LaunchConfig)
		field string
		value any    // nil: not checked
		text  string // in the error's text
	}{
		{"unknown model", func(lc *phalanx.LaunchConfig) { lc.Model = "gpt" }, "Model", nil, "gpt"},
		{"unknown option", func(lc *phalanx.LaunchConfig) { lc.ModelOptions = map[string]string{"depth": "3"} }, "ModelOptions", nil, "depth"},
		{"option its check refuses", func(lc *phalanx.LaunchConfig) { lc.ModelOptions = map[string]string{"features": "0"} },
			"ModelOptions", phalanx.Options{"features": "0", "nan_at": "0", "say": ""}, "model regression: option features 0: want at least 1"},
		{"no workers", func(lc *phalanx.LaunchConfig) { lc.Workers = 0 }, "Workers", 0, "Workers 0"},
		{"min above max", func(lc *phalanx.LaunchConfig) { lc.MinWorkers, lc.MaxWorkers = 3, 2 }, "MinWorkers", 3, "MinWorkers 3"},
		{"log level", func(lc *phalanx.LaunchConfig) { lc.LogLevel = "loud" }, "LogLevel", "loud", "LogLevel loud"},
		{"checkpoint location is a file", func(lc *phalanx.LaunchConfig) { lc.Checkpoint.Location = file }, "Checkpoint.Location", file, "is a file, not a directory"},
		{"period without a location", func(lc *phalanx.LaunchConfig) { lc.Checkpoint.EverySteps = 5 }, "Checkpoint.Location", "", `Checkpoint.Location "": `},
		{"a TLS CA alone", func(lc *phalanx.LaunchConfig) { lc.TLS.CA = file }, "TLS", phalanx.TLSFiles{CA: file}, "missing the certificate and the key"},
		{"TLS files that are not there", func(lc *phalanx.LaunchConfig) {
			lc.TLS = phalanx.TLSFiles{CA: file + ".ca", Cert: file + ".pem", Key: file + ".key"}
		},
			"TLS", nil, "no such file"},
		{"TLS auto and files", func(lc *phalanx.LaunchConfig) {
			lc.TLSAuto, lc.TLS = true, phalanx.TLSFiles{CA: file + ".ca", Cert: file + ".pem", Key: file + ".key"}
		}, "TLSAuto", true, "name no TLS files with it"},
		{"TLS auto and an external etcd", func(lc *phalanx.LaunchConfig) { lc.TLSAuto, lc.Etcd = true, []string{"127.0.0.1:1"} }, "TLSAuto", true, "external etcd"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lc := smallJob()
			tc.edit(&lc)
			_, err := phalanx.Launch(launchContext(t), lc)
			var ce *phalanx.ConfigError
			switch {
			case !errors.As(err, &ce) || ce.Field != tc.field:
				t.Fatalf("got %v, want a ConfigError naming %s", err, tc.field)
			case tc.value != nil && !reflect.DeepEqual(ce.Value, tc.value):
				t.Fatalf("the error's value is %#v, want %#v", ce.Value, tc.value)
			case !strings.Contains(err.Error(), tc.text):
				t.Fatalf("%q does not say %q", err, tc.text)
			}
		})
	}
}

// TestDefaultModelOptions: the defaults' model options are a map that a
// hook may write to (the README's chaos example does).
func TestDefaultModelOptions(t *testing.T) {
	lc := phalanx.DefaultLaunchConfig()
	lc.ModelOptions["data"] = "/data/train" // panicked on a nil map
	if c := phalanx.DefaultConfig(); len(c.ModelOptions) != 0 {
		t.Fatalf("DefaultConfig shares its ModelOptions: %v after a write to another's", c.ModelOptions)
	}
}

func TestRegistry(t *testing.T) {
	reg := phalanx.NewRegistry(regressionSpec())
	if got := reg.Names(); len(got) != 1 || got[0] != "regression" {
		t.Fatalf("names %v", got)
	}
	spec, err := reg.Lookup("regression")
	if err != nil {
		t.Fatal(err)
	}
	o, err := spec.Resolve(map[string]string{"features": "7"})
	if n, _ := o.Int("features"); err != nil || n != 7 {
		t.Fatalf("resolved %v, %v", o, err)
	}
	if _, err := spec.Resolve(map[string]string{"width": "7"}); err == nil || !strings.Contains(err.Error(), "width") {
		t.Fatalf("an unknown option: %v", err)
	}
	if _, err := reg.Lookup("gpt"); err == nil || !strings.Contains(err.Error(), "regression") {
		t.Fatalf("an unknown model: %v (want the known ones named)", err)
	}
	for name, specs := range map[string][]phalanx.ModelSpec{
		"nameless":   {{New: spec.New}},
		"both kinds": {{Name: "x", New: spec.New, PS: &phalanx.PSModel{}}},
		"twice":      {spec, spec},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: NewRegistry did not panic", name)
				}
			}()
			phalanx.NewRegistry(specs...)
		}()
	}
}

// captured records a job's events for a test.
type captured struct {
	mu     sync.Mutex
	events []string
	onJob  func(endpoints, job string)
}

func (c *captured) Emit(event string, fields ...events.Field) error {
	c.mu.Lock()
	c.events = append(c.events, event)
	c.mu.Unlock()
	if event == "job_started" && c.onJob != nil {
		var ep, job string
		for _, f := range fields {
			switch f.Key {
			case "etcd_endpoints":
				ep = f.Value.(string)
			case "job":
				job = f.Value.(string)
			}
		}
		c.onJob(ep, job)
	}
	return nil
}

// TestStop: Stop, called from outside the job with its etcd and name,
// stops every worker at one step boundary after a final checkpoint; the
// launch ends with a requested *StoppedError, and launching again resumes
// from that checkpoint and finishes.
func TestStop(t *testing.T) {
	dir := t.TempDir()
	lc := smallJob()
	lc.Steps, lc.Checkpoint.Location = 100000, dir
	stopped := make(chan error, 1)
	sink := &captured{onJob: func(ep, job string) {
		go func() {
			stopped <- phalanx.Stop(launchContext(t), phalanx.Access{Etcd: strings.Split(ep, ","), Job: job}, "test")
		}()
	}}
	lc.Events = sink
	_, err := phalanx.Launch(launchContext(t), lc)
	var se *phalanx.StoppedError
	if !errors.As(err, &se) || !se.Requested || se.Step < 1 || se.Step >= lc.Steps {
		t.Fatalf("Launch: %v, want a requested stop before the last step", err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Stop did not return within a minute of the launch's end")
	}
	lc.Steps, lc.Events = se.Step+5, nil
	res, err := phalanx.Launch(launchContext(t), lc)
	if err != nil || res.Step != se.Step+5 {
		t.Fatalf("resumed: %+v, %v; want step %d", res, err, se.Step+5)
	}
}

// planes records the data_plane events of a job.
type planes struct {
	mu   sync.Mutex
	seen []string
}

func (p *planes) Emit(event string, fields ...events.Field) error {
	if event != "data_plane" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range fields {
		if f.Key == "plane" {
			p.seen = append(p.seen, fmt.Sprint(f.Value))
		}
	}
	return nil
}

// TestDataPlanes trains the same job over each transport and gradient wire
// type: the ring runs on the data plane asked for, every rank ends with the
// same parameters, and a 16-bit wire fits as well as float32.
func TestDataPlanes(t *testing.T) {
	cases := []struct {
		transport, wire string
		feedback        bool
		plane           string
	}{
		{"tcp", "float32", false, "tcp"},
		{"shm", "float32", false, "shm"},
		{"auto", "float32", false, "shm"},
		{"auto", "fp16", false, "shm"},
		{"tcp", "bf16", true, "tcp"},
	}
	for _, tc := range cases {
		t.Run(tc.transport+"/"+tc.wire, func(t *testing.T) {
			lc := smallJob()
			lc.Transport, lc.WireDType, lc.ErrorFeedback = phalanx.Transport(tc.transport), phalanx.WireDType(tc.wire), tc.feedback
			p := &planes{}
			lc.Events = p
			res, err := phalanx.Launch(launchContext(t), lc)
			if err != nil {
				t.Fatal(err)
			}
			if !res.ParametersIdentical || res.Loss >= 0.01 || res.Step != lc.Steps {
				t.Fatalf("step %d of %d, identical %v, loss %.5f: want every step, identical parameters, loss < 0.01",
					res.Step, lc.Steps, res.ParametersIdentical, res.Loss)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.seen) == 0 || strings.Fields(p.seen[0])[0] != tc.plane { // then the allreduce algorithms
				t.Fatalf("data planes %v, want %s", p.seen, tc.plane)
			}
		})
	}
}

// launchContext bounds an in-process launch: a job that hangs fails its test
// after five minutes (cancelling a launch stops its job) rather than
// running into go test's timeout.
func launchContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestPassStderr: what a worker's own code writes to stderr reaches the
// launch's Stderr, prefixed with the worker, when asked; not otherwise
// (it is in the log files).
func TestPassStderr(t *testing.T) {
	for _, pass := range []bool{false, true} {
		t.Run(fmt.Sprint("pass ", pass), func(t *testing.T) {
			lc := smallJob()
			lc.Steps = 10
			lc.ModelOptions = phalanx.Options{"say": "the model says hello"}
			var errs jobtest.Buffer
			lc.Stderr, lc.PassStderr = &errs, pass
			if _, err := phalanx.Launch(launchContext(t), lc); err != nil {
				t.Fatal(err)
			}
			for _, w := range []string{"[worker-0] the model says hello", "[worker-1] the model says hello"} {
				if got := strings.Contains(errs.String(), w); got != pass {
					t.Errorf("stderr has %q: %v, want %v; it was:\n%s", w, got, pass, errs.String())
				}
			}
		})
	}
}

// startRunning starts lc's job and returns it once its first ring trains;
// the test's end stops it (after a final checkpoint when it takes them)
// and waits for it.
func startRunning(t *testing.T, lc phalanx.LaunchConfig) *phalanx.Job {
	t.Helper()
	j, err := phalanx.Start(launchContext(t), lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		j.Stop(testwait.Context(t, 2*time.Minute))
		j.Wait()
	})
	testwait.Recv(t, j.Ready(), 2*time.Minute, "the job's first step")
	return j
}

// fieldOf is an event's field by key (nil: none).
func fieldOf(fields []events.Field, key string) any {
	for _, f := range fields {
		if f.Key == key {
			return f.Value
		}
	}
	return nil
}
