package coordinator

import (
	"fmt"
	"strings"
)

// Keys is a job's key layout in etcd, all under /phalanx/<job>/.
type Keys struct{ prefix string }

// KeysFor is the layout of job, whose name must be a non-empty path segment.
func KeysFor(job string) (Keys, error) {
	if job == "" || strings.ContainsAny(job, "/\x00") {
		return Keys{}, fmt.Errorf("coordinator: job name %q: want a non-empty name without '/'", job)
	}
	return Keys{prefix: "/phalanx/" + job + "/"}, nil
}

// Prefix is the job's root.
func (k Keys) Prefix() string { return k.prefix }

// Workers is the prefix of the worker registrations.
func (k Keys) Workers() string { return k.prefix + "workers/" }

// Worker is the registration key of worker id.
func (k Keys) Worker(id string) string { return k.Workers() + id }

// Election is the coordinator election's prefix.
func (k Keys) Election() string { return k.prefix + "election" }

// Generation is the current generation record.
func (k Keys) Generation() string { return k.prefix + "generation" }

// Reports is the prefix of loss reports.
func (k Keys) Reports() string { return k.prefix + "reports/" }

// Report is the key of reporter's report about lost ("" for a broken ring
// without a culprit).
func (k Keys) Report(reporter, lost string) string {
	if lost == "" {
		lost = "-"
	}
	return k.Reports() + lost + "/" + reporter
}

// Status is the job's status as its launcher last published it (JSON of
// status.Snapshot).
func (k Keys) Status() string { return k.prefix + "status" }

// Done is written once the job has finished: the coordinator stops deciding
// and waiting workers exit.
func (k Keys) Done() string { return k.prefix + "done" }

// Exclusions is the prefix of the stragglers kept out of the ring.
func (k Keys) Exclusions() string { return k.prefix + "exclusions/" }

// Exclusion is the key that keeps worker id out of the ring.
func (k Keys) Exclusion(id string) string { return k.Exclusions() + id }

// Progress holds the ring's phalanxpb.Pace (written now and then by rank 0):
// what an excluded worker measures itself against.
func (k Keys) Progress() string { return k.prefix + "progress" }

// Feeds is the prefix of excluded workers' requests for parameters.
func (k Keys) Feeds() string { return k.prefix + "feeds/" }

// Feed is worker id's request for parameters.
func (k Keys) Feed(id string) string { return k.Feeds() + id }

// FinalCheckpoint is claimed (created once) by the one worker that writes
// the final checkpoint of a job the coordinator stopped.
func (k Keys) FinalCheckpoint() string { return k.prefix + "final-checkpoint" }

// Config holds the hash of the job's training configuration, which every
// worker must share.
func (k Keys) Config() string { return k.prefix + "config" }

// PSJob holds a parameter-server job's phalanxpb.PSJob.
func (k Keys) PSJob() string { return k.prefix + "ps/job" }

// PSServers is the prefix of parameter servers' registrations.
func (k Keys) PSServers() string { return k.prefix + "ps/servers/" }

// PSServer is parameter server id's registration (a phalanxpb.PSServer).
func (k Keys) PSServer(id string) string { return k.PSServers() + id }

// ShardMap holds the parameter servers' phalanxpb.ShardMap.
func (k Keys) ShardMap() string { return k.prefix + "ps/shardmap" }

// PSElection is the election of the shard map's writer.
func (k Keys) PSElection() string { return k.prefix + "ps/election" }

// Stop is written to ask every worker of the job to stop at the next step
// boundary after a final checkpoint (a stop requested through the API or
// by the launcher).
func (k Keys) Stop() string { return k.prefix + "stop" }

// Departures is the prefix of the records of workers that left on request.
func (k Keys) Departures() string { return k.prefix + "leaving/" }

// Departure records that worker id left the job on request.
func (k Keys) Departure(id string) string { return k.Departures() + id }
