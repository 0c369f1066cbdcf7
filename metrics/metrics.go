// Package metrics is a Phalanx process's Prometheus metrics
// (docs/metrics.md lists each): a Set of collectors named phalanx_*, with
// the job's and the process's labels, recorded by the training code and
// the launcher, and served with /healthz and /readyz (Serve). A launcher
// serves one endpoint for the whole job: its own Set and its workers',
// scraped and merged (Scraper).
package metrics

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/phalanx-rt/phalanx/collective"
)

// Set is one process's metrics. Its methods are safe for concurrent use,
// and a nil *Set records nothing, so that code without metrics passes nil.
type Set struct {
	reg *prometheus.Registry

	step        *prometheus.GaugeVec
	stepSeconds *prometheus.HistogramVec
	samples     *prometheus.CounterVec
	loss        *prometheus.GaugeVec
	bubble      *prometheus.GaugeVec

	generation prometheus.Gauge
	world      prometheus.Gauge
	restarts   *prometheus.CounterVec
	lost       prometheus.Counter
	left       prometheus.Counter
	excluded   prometheus.Counter
	readmitted prometheus.Counter

	arBytes   *prometheus.CounterVec
	arSeconds *prometheus.CounterVec
	arOps     *prometheus.CounterVec

	ckBytes    prometheus.Counter
	ckSeconds  prometheus.Histogram
	ckFailures prometheus.Counter
	ckSaved    prometheus.Counter

	psPushes    prometheus.Counter
	psPulls     prometheus.Counter
	psFailovers prometheus.Counter

	mu   sync.Mutex
	ar   map[arKey]arSeries
	rank string // the rank label of this process's per-rank series
	// ready says why the process is not ready ("" : it is).
	ready string
}

// Process says which metrics a process has: the launcher has the job's
// (generations, membership changes, checkpoints, failovers), a worker its
// ranks' (steps, collectives), a parameter-server worker its pushes and
// pulls.
type Process int

const (
	Launcher Process = iota
	Worker
	PSWorker
	PSServer
)

// New is the metrics of process worker (the launcher's own: "launcher")
// of job; what is registered depends on the kind of process.
func New(job, worker string, kind Process) *Set {
	reg := prometheus.NewRegistry()
	lab := prometheus.Labels{"job": job, "worker": worker}
	s := &Set{reg: reg, ready: "starting"}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Name: name, Help: help, ConstLabels: lab}
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts(opts(name, help)))
		reg.MustRegister(g)
		return g
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts(opts(name, help)))
		reg.MustRegister(c)
		return c
	}
	gaugeVec := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts(opts(name, help)), labels)
		reg.MustRegister(g)
		return g
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts(opts(name, help)), labels)
		reg.MustRegister(c)
		return c
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	switch kind {
	case Launcher:
		s.generation = gauge("phalanx_generation", "The job's current generation (ring membership epoch).")
		s.world = gauge("phalanx_world_size", "Ranks in the job's current generation.")
		s.restarts = counterVec("phalanx_rank_restarts_total", "Rank actors restarted by their supervisor.", "rank")
		s.lost = counter("phalanx_workers_lost_total", "Workers removed from the ring after dying or becoming unreachable.")
		s.left = counter("phalanx_workers_left_total", "Workers that left the ring on request.")
		s.excluded = counter("phalanx_stragglers_excluded_total", "Stragglers excluded from the ring.")
		s.readmitted = counter("phalanx_stragglers_readmitted_total", "Excluded stragglers readmitted to the ring.")
		s.ckSaved = counter("phalanx_checkpoints_saved_total", "Checkpoints written completely (manifest saved).")
		s.ckBytes = counter("phalanx_checkpoint_bytes_total", "Bytes of the checkpoints saved (shards and manifests).")
		s.ckSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "phalanx_checkpoint_seconds",
			Help: "Time from a checkpoint's snapshot to its manifest.", ConstLabels: lab,
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)})
		reg.MustRegister(s.ckSeconds)
		s.ckFailures = counter("phalanx_checkpoint_failures_total", "Checkpoints given up (an upload failed, the ring changed under it).")
		s.psFailovers = counter("phalanx_ps_failovers_total", "Parameter-server shards whose backup took over from the primary.")
		s.bubble = gaugeVec("phalanx_pipeline_bubble", "A pipeline stage's idle fraction of its last step (replica 0).", "stage")
	case Worker:
		s.step = gaugeVec("phalanx_step", "The last training step this rank finished.", "rank", "stage")
		s.stepSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "phalanx_step_seconds",
			Help: "Wall time of this rank's training steps.", ConstLabels: lab,
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"rank", "stage"})
		reg.MustRegister(s.stepSeconds)
		s.samples = counterVec("phalanx_samples_total", "Samples this rank trained on.", "rank", "stage")
		s.loss = gaugeVec("phalanx_loss", "The training loss of this rank's last step (mean over the global batch).", "rank", "stage")
		s.generation = gauge("phalanx_generation", "The generation this worker trains in.")
		s.world = gauge("phalanx_world_size", "Ranks in this worker's generation.")
		s.arBytes = counterVec("phalanx_allreduce_bytes_total", "Bytes of this rank's buffers all-reduced.", "rank", "algorithm", "transport")
		s.arSeconds = counterVec("phalanx_allreduce_seconds_total", "Time in this rank's allreduce operations.", "rank", "algorithm", "transport")
		s.arOps = counterVec("phalanx_allreduce_operations_total", "This rank's allreduce operations.", "rank", "algorithm", "transport")
	case PSWorker:
		s.step = gaugeVec("phalanx_step", "The last training step this rank finished.", "rank", "stage")
		s.samples = counterVec("phalanx_samples_total", "Samples this rank trained on.", "rank", "stage")
		s.loss = gaugeVec("phalanx_loss", "The training loss of this rank's last step (mean over the global batch).", "rank", "stage")
		s.psPushes = counter("phalanx_ps_pushes_total", "Gradient pushes this worker sent to parameter-server shards.")
		s.psPulls = counter("phalanx_ps_pulls_total", "Parameter pulls this worker made from parameter-server shards.")
	case PSServer:
	}
	return s
}

// Gatherer is the set's registry, for serving or a test.
func (s *Set) Gatherer() prometheus.Gatherer { return s.reg }

// Rank is this process's rank label from now on ("" : none). Series of
// the previous rank stop being reported: a worker's rank changes with
// its generation.
func (s *Set) Rank(rank int) {
	if s == nil {
		return
	}
	r := strconv.Itoa(rank)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r == s.rank {
		return
	}
	old := s.rank
	s.rank = r
	if old == "" {
		return
	}
	for _, v := range []*prometheus.GaugeVec{s.step, s.loss} {
		if v != nil {
			v.DeletePartialMatch(prometheus.Labels{"rank": old})
		}
	}
}

func (s *Set) rankLabel() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rank == "" {
		return "0"
	}
	return s.rank
}

// Step records a finished step of this process's rank (of a pipeline
// stage; -1: not a pipeline): its number, wall time (0: not measured),
// the samples the rank trained and the step's loss (NaN: none here).
func (s *Set) Step(stage int, step int64, d time.Duration, samples int, loss float64) {
	if s == nil || s.step == nil {
		return
	}
	st := ""
	if stage >= 0 {
		st = strconv.Itoa(stage)
	}
	r := s.rankLabel()
	s.step.WithLabelValues(r, st).Set(float64(step))
	if s.stepSeconds != nil && d > 0 {
		s.stepSeconds.WithLabelValues(r, st).Observe(d.Seconds())
	}
	s.samples.WithLabelValues(r, st).Add(float64(samples))
	if !math.IsNaN(loss) {
		s.loss.WithLabelValues(r, st).Set(loss)
	}
}

// Generation records the generation the process is in and its world size.
func (s *Set) Generation(g uint64, world int) {
	if s == nil || s.generation == nil {
		return
	}
	s.generation.Set(float64(g))
	s.world.Set(float64(world))
}

// OpEnded records a finished collective operation (a
// collective.Observer): allreduces' bytes, time and count by algorithm and
// transport. A series is looked up once: recording allocates nothing.
func (s *Set) OpEnded(op *collective.OpRecord) {
	if s == nil || s.arBytes == nil || op.Op != "allreduce" || op.State != "done" {
		return
	}
	s.mu.Lock()
	k := arKey{s.rank, op.Algorithm, op.Plane}
	if k.rank == "" {
		k.rank = "0"
	}
	c, ok := s.ar[k]
	if !ok {
		if s.ar == nil {
			s.ar = map[arKey]arSeries{}
		}
		c = arSeries{s.arBytes.WithLabelValues(k.rank, k.algorithm, k.transport),
			s.arSeconds.WithLabelValues(k.rank, k.algorithm, k.transport), s.arOps.WithLabelValues(k.rank, k.algorithm, k.transport)}
		s.ar[k] = c
	}
	s.mu.Unlock()
	c.bytes.Add(float64(op.Bytes))
	c.seconds.Add(op.End.Sub(op.Start).Seconds())
	c.ops.Inc()
}

// PSPush and PSPull count a parameter-server worker's requests.
func (s *Set) PSPush(n int) {
	if s != nil && s.psPushes != nil {
		s.psPushes.Add(float64(n))
	}
}

// PSPull counts a parameter-server worker's pulls.
func (s *Set) PSPull(n int) {
	if s != nil && s.psPulls != nil {
		s.psPulls.Add(float64(n))
	}
}

// Ready marks the process ready (reason "") or not, saying why; /readyz
// answers it.
func (s *Set) Ready(reason string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.ready = reason
	s.mu.Unlock()
}

// NotReady is why the process is not ready ("" : it is).
func (s *Set) NotReady() string {
	if s == nil {
		return "no metrics"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

// arKey names one allreduce series of this process.
type arKey struct{ rank, algorithm, transport string }

// arSeries are one allreduce series' counters, looked up once.
type arSeries struct{ bytes, seconds, ops prometheus.Counter }
