package ring

import (
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/job"
)

// TestJobHash: what each process sets for itself (etcd endpoints and how
// long to wait for them, membership timing, injected faults) leaves the job
// hash unchanged, so a worker started by hand with its own is not refused;
// a training setting changes it.
func TestJobHash(t *testing.T) {
	base := job.DefaultConfig()
	base.Model = "mlp"
	tests := []struct {
		name string
		edit func(c *job.Config)
		same bool
	}{
		{"etcd endpoints", func(c *job.Config) { c.Etcd = []string{"http://10.0.0.5:2379"} }, true},
		{"etcd dial timeout", func(c *job.Config) { c.EtcdDialTimeout = time.Hour }, true},
		{"lease TTL", func(c *job.Config) { c.LeaseTTL = time.Minute }, true},
		{"unreachable", func(c *job.Config) { c.Unreachable = time.Hour }, true},
		{"injected faults", func(c *job.Config) { c.Faults.FailWorker = 2 }, true},
		{"the batch", func(c *job.Config) { c.Batch++ }, false},
		{"the model", func(c *job.Config) { c.Model = "conv" }, false},
	}
	for _, tc := range tests {
		c := base
		tc.edit(&c)
		if same := jobHash(&c) == jobHash(&base); same != tc.same {
			t.Errorf("%s changed: the job hash unchanged %v, want %v", tc.name, same, tc.same)
		}
	}
}
