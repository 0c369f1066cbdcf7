// Package services runs the processes of a job that are no job kind's, as
// the chaos harness starts them: an etcd member and a standby-capable
// coordinator, each a re-execution of the program (which calls
// phalanx.Main, which dispatches them here).
package services

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/job"
)

// EtcdMember is one member of an etcd cluster run as a process of this
// program (EtcdMemberCommand): the embedded server on loopback.
type EtcdMember struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// ClientPort and PeerPort are the member's loopback ports. Give them
	// for a cluster of several members, which name each other's peer ports
	// in InitialCluster (name=http://host:port,...); 0 picks a free port,
	// which suits a single member (its client endpoint follows
	// EtcdMemberServing on the process's stdout).
	ClientPort     int    `json:"client_port"`
	PeerPort       int    `json:"peer_port"`
	InitialCluster string `json:"initial_cluster"`
}

// CoordinatorProcess is a standby-capable coordinator of a job run as a
// process of this program (CoordinatorCommand): RunCoordinator's
// configuration without its logger and callback.
type CoordinatorProcess struct {
	Job               string        `json:"job"`
	Etcd              []string      `json:"etcd"`
	ID                string        `json:"id"`
	MinWorkers        int           `json:"min_workers"`
	MaxWorkers        int           `json:"max_workers"`
	Workers           int           `json:"workers,omitempty"`
	MinWorkersTimeout time.Duration `json:"min_workers_timeout"`
	JoinWindow        time.Duration `json:"join_window"`
	LeaseTTL          time.Duration `json:"lease_ttl"`
}

// EtcdMemberServing starts the line an etcd member process prints on its
// stdout once it serves, followed by its client endpoint.
const EtcdMemberServing = "etcd member serving "

// serviceSpec is what a service process (an etcd member, a coordinator)
// is told beyond job.ProcessSpec.
type serviceSpec struct {
	job.ProcessSpec
	EtcdMember  *EtcdMember         `json:"etcd_member,omitempty"`
	Coordinator *CoordinatorProcess `json:"coordinator,omitempty"`
}

// EtcdMemberCommand is a command of this program (which must call Main
// first thing) that runs m until killed: it prints EtcdMemberServing and
// its client endpoint on stdout once it serves, and logs to stderr at
// logLevel. A SIGTERM closes it cleanly.
func EtcdMemberCommand(m EtcdMember, logLevel string) (*exec.Cmd, error) {
	return serviceCommand(serviceSpec{ProcessSpec: job.ProcessSpec{Role: "etcd-member", LogLevel: logLevel}, EtcdMember: &m})
}

// CoordinatorCommand is a command of this program (which must call Main
// first thing) that runs a coordinator of c.Job against c.Etcd until the
// job is done (exit 0) or it is signalled.
func CoordinatorCommand(c CoordinatorProcess, logLevel string) (*exec.Cmd, error) {
	return serviceCommand(serviceSpec{ProcessSpec: job.ProcessSpec{Role: "coordinator", LogLevel: logLevel}, Coordinator: &c})
}

func serviceCommand(s serviceSpec) (*exec.Cmd, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	cmd, err := job.SelfCommand()
	if err != nil {
		return nil, err
	}
	cmd.Env = append(os.Environ(), job.WorkerEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the harness
	return cmd, nil
}

// Run runs a service process's role from its raw spec.
func Run(ctx context.Context, raw string, log *zap.Logger, stdout io.Writer) error {
	var s serviceSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return fmt.Errorf("phalanx: a service process spec: %w", err)
	}
	switch {
	case s.Role == "etcd-member" && s.EtcdMember != nil:
		m := s.EtcdMember
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: m.Dir, Name: m.Name, Logger: log,
			ClientPort: m.ClientPort, PeerPort: m.PeerPort, InitialCluster: m.InitialCluster, ReadyTimeout: time.Minute})
		if err != nil {
			return err
		}
		defer e.Close()
		fmt.Fprintf(stdout, "%s%s\n", EtcdMemberServing, strings.Join(e.Endpoints(), ","))
		<-ctx.Done()
		return nil
	case s.Role == "coordinator" && s.Coordinator != nil:
		c := s.Coordinator
		return job.RunCoordinator(ctx, job.CoordinatorConfig{Job: c.Job, Etcd: c.Etcd, ID: c.ID, MinWorkers: c.MinWorkers, MaxWorkers: c.MaxWorkers, Workers: c.Workers,
			MinWorkersTimeout: c.MinWorkersTimeout, JoinWindow: c.JoinWindow, LeaseTTL: c.LeaseTTL, Logger: log})
	}
	return fmt.Errorf("phalanx: a %s process without its spec", s.Role)
}
