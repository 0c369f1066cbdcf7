package chaos

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/checkpoint"
)

// A Service is a server the harness runs beside a job for a run: an etcd
// cluster and coordinators, MinIO, network namespaces. Faults reach the
// run's services through Env.Service.
type Service interface {
	// Name is how faults find it (Kind.Needs).
	Name() string
	// Start starts it for one run, in dir (removed after a passed run).
	Start(ctx context.Context, dir string, log *zap.Logger) error
	// Configure adjusts each launch of the run to use it.
	Configure(lc *phalanx.LaunchConfig)
	// Leftovers says what it left behind after Close (invariant 7).
	Leftovers() []string
	Close() error
}

// A storeService keeps the run's checkpoints (MinIO): the runner's store
// and every launch use its location; its Configure passes the credentials.
type storeService interface {
	CheckpointLocation() (url string, creds checkpoint.Credentials)
}

// services are the services a scenario's job needs, not started yet.
func services(sc *Scenario) ([]Service, error) {
	var out []Service
	for _, mk := range []func(*Scenario) (Service, error){etcdService, minioService, netnsService} {
		s, err := mk(sc)
		if err != nil {
			return nil, err
		}
		if s != nil {
			out = append(out, s)
		}
	}
	if needsUploadGate(sc) {
		for _, s := range out {
			if st, ok := s.(storeService); ok {
				out = append(out, newUploadGate(sc, st)) // after MinIO: it relays to it
				break
			}
		}
	}
	return out, nil
}

// gate is the run's upload gate, or nil.
func (ru *run) gate() *uploadGate {
	for _, s := range ru.services {
		if g, ok := s.(*uploadGate); ok {
			return g
		}
	}
	return nil
}

// Service returns the run's service of that name, or nil.
func (e *Env) Service(name string) Service {
	for _, s := range e.run.services {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// startServices starts the run's services in order; on failure it closes
// those started.
func (ru *run) startServices(ctx context.Context, dir string) error {
	svcs, err := services(ru.sc)
	if err != nil {
		return err
	}
	for _, s := range svcs {
		if err := s.Start(ctx, dir, ru.r.log()); err != nil {
			ru.closeServices()
			return fmt.Errorf("chaos: starting %s: %w", s.Name(), err)
		}
		ru.services = append(ru.services, s)
	}
	return nil
}

// closeServices closes the run's services once, last started first.
func (ru *run) closeServices() {
	if ru.closed {
		return
	}
	ru.closed = true
	for i := len(ru.services) - 1; i >= 0; i-- {
		ru.services[i].Close()
	}
}
