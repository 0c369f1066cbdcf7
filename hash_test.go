package phalanx

import (
	"testing"
	"time"
)

// TestJobHash: what each process sets for itself (etcd endpoints and how
// long to wait for them, membership timing, injected faults) leaves the job
// hash unchanged, so a worker started by hand with its own is not refused;
// a training setting changes it.
func TestJobHash(t *testing.T) {
	base := DefaultConfig()
	base.Model = "mlp"
	tests := []struct {
		name string
		edit func(c *Config)
		same bool
	}{
		{"etcd endpoints", func(c *Config) { c.Etcd = []string{"http://10.0.0.5:2379"} }, true},
		{"etcd dial timeout", func(c *Config) { c.EtcdDialTimeout = time.Hour }, true},
		{"lease TTL", func(c *Config) { c.LeaseTTL = time.Minute }, true},
		{"unreachable", func(c *Config) { c.Unreachable = time.Hour }, true},
		{"injected faults", func(c *Config) { c.Faults.FailWorker = 2 }, true},
		{"the batch", func(c *Config) { c.Batch++ }, false},
		{"the model", func(c *Config) { c.Model = "conv" }, false},
	}
	for _, tc := range tests {
		c := base
		tc.edit(&c)
		if same := c.jobHash() == base.jobHash(); same != tc.same {
			t.Errorf("%s changed: the job hash unchanged %v, want %v", tc.name, same, tc.same)
		}
	}
}
