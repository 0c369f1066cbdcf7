package chaos

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// scheduler carries out one launch's timetable: the side of the schedule
// that touches the job (Inject, Heal) and stamps the faults' records.
type scheduler struct {
	ctx      context.Context
	ru       *run
	tt       *timetable
	attempt  int
	endpoint string  // the launch's etcd
	started  []int64 // the launch's worker pids
}

// schedule reads a launch's events as they come, feeds them to the
// launch's timetable and does what it says is due, until the events end;
// then it heals what is still in.
func (ru *run) schedule(ctx context.Context, evs <-chan Event, attempt int) {
	s := &scheduler{ctx: ctx, ru: ru, attempt: attempt,
		tt: &timetable{faults: ru.faults, attempt: attempt, ps: ru.sc.Job.Kind == "ps"}}
	var uploads <-chan *uploadHit
	if g := ru.gate(); g != nil {
		uploads = g.Hits()
	}
	var (
		timer *time.Timer
		wakeC <-chan time.Time
	)
	arm := func(wake time.Time) {
		if timer != nil {
			timer.Stop()
		}
		wakeC = nil
		if !wake.IsZero() {
			timer = time.NewTimer(max(wake.Sub(ru.r.now()), 0))
			wakeC = timer.C
		}
	}
	defer arm(time.Time{})
	for {
		select {
		case e, ok := <-evs:
			if !ok {
				for _, f := range s.tt.unhealed() {
					s.heal(f)
				}
				return
			}
			s.observe(e)
			arm(s.act(nil))
		case hit := <-uploads:
			s.tt.holding = true
			arm(s.act(hit))
			s.tt.holding = false
			close(hit.release)
		case <-wakeC:
			arm(s.act(nil))
		}
	}
}

// observe keeps what the run needs of an event and hands it to the
// timetable.
func (s *scheduler) observe(e Event) {
	switch e.Kind {
	case "job_started":
		s.endpoint, _ = e.Fields["etcd_endpoints"].(string)
		s.ru.endpoint = s.endpoint
	case "worker_started":
		s.ru.pids[e.num("pid")] = true
		s.started = append(s.started, e.num("pid"))
	case "checkpoint_saved":
		if id, ok := e.Fields["checkpoint"].(string); ok {
			s.ru.saved[id] = uint32(e.num("manifest_crc32c"))
		}
	}
	s.tt.observe(e)
}

// act fires and heals what the timetable says is due, until nothing is,
// and returns when it is next due to be asked (zero: at the next event).
// hit is the upload held at the gate, for the faults it triggers.
func (s *scheduler) act(hit *uploadHit) time.Time {
	for {
		acts, wake := s.tt.due(s.ru.r.now())
		if len(acts) == 0 {
			return wake
		}
		for _, a := range acts {
			switch {
			case a.heal:
				s.heal(a.fault)
			case a.fault.On == "upload":
				s.fire(a.fault, hit)
			default:
				s.fire(a.fault, nil)
			}
		}
	}
}

// fire injects f into the ring as it is now, stamping its record; hit is
// the held upload that triggered it, if any.
func (s *scheduler) fire(f *FaultRecord, hit *uploadHit) {
	ru, tt := s.ru, s.tt
	env := &Env{Members: ru.ring(s.ctx, s.endpoint, tt.members), Store: ru.store, Started: s.started, run: ru}
	env.Rank = targetRank(f, env.Members)
	if f.On == "upload" {
		ru.gate().fired()
	}
	if f.Uploader {
		env.Rank = -1
		if pid := socketOwner(hit.client, ru.gate().ln.Addr().String(), s.started); pid != 0 {
			for i, m := range env.Members {
				if m.Pid == pid {
					env.Rank = i
				}
			}
		}
		if env.Rank < 0 {
			f.Attempt, f.Generation, f.AtStep, f.Injected = s.attempt, tt.gen, tt.step, ru.r.now()
			f.Error = fmt.Sprintf("%v (%s, from %s)", errNoUploader, hit.object, hit.client)
			ru.r.say("chaos:   fault %d (%s) FAILED to inject: %s", f.Index, f.Kind, f.Error)
			return
		}
	}
	f.Attempt, f.Generation, f.AtStep, f.TargetRank = s.attempt, tt.gen, tt.step, env.Rank
	if m, err := env.target(); err == nil && ru.kinds[f.Kind].NeedsRank {
		f.TargetID, f.TargetPid = m.ID, m.Pid
	}
	fault := ru.kinds[f.Kind].New(f.Planned)
	f.fault, f.env = fault, env
	// Stamped as it is sent: Inject returns only once the fault is seen
	// to hold (a killed process dead), and the job may have closed ranks
	// by then; what came after the fault must not read as before.
	f.Injected = ru.r.now()
	what, err := fault.Inject(s.ctx, env)
	if err != nil {
		f.Error = err.Error()
		ru.r.log().Warn("chaos: a fault could not be injected", zap.String("kind", f.Kind), zap.Error(err))
		ru.r.say("chaos:   fault %d (%s) FAILED to inject: %v", f.Index, f.Kind, err)
		return
	}
	if hit != nil {
		what += fmt.Sprintf(", during the upload of %s (held at the gate)", hit.object)
	}
	f.What = what
	ru.r.say("chaos:   fault %d at step %d: %s", f.Index, tt.step, what)
}

// heal ends f, stamping its record.
func (s *scheduler) heal(f *FaultRecord) {
	what, err := f.fault.Heal(s.ctx, f.env)
	f.Healed = s.ru.r.now()
	if err != nil {
		f.Error = "heal: " + err.Error()
		return
	}
	f.HealWhat = what
	if what != "" {
		s.ru.r.say("chaos:   fault %d healed: %s", f.Index, what)
	}
}
