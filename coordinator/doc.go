// Package coordinator is Phalanx's membership authority on etcd: workers
// register under a lease; one coordinator at a time, chosen by etcd election,
// decides generations (who trains, in which ring order, from which step) and
// writes each in a transaction fenced by its leadership and the previous
// record's revision, so a deposed coordinator cannot write. It also runs an
// embedded single-member etcd server for single-host jobs. The decisions are
// pure: Decide, from members to the next ring, and the clocks around it (the
// join window, the first ring's wait, the minimum-workers timeout), which take
// the time as an input and give the next wake-up; the rest is I/O around them.
//
// A Job (NewJob: an etcd client and the job's Keys) is the handle every
// caller holds: each read and write of a job's records below is one of its
// methods, and New builds the job's coordinator from it. It is not a
// connection of its own: Dial or Connect makes the client, its caller
// closes it.
//
// Every etcd key of a job is this package's (Keys, under /phalanx/<job>/):
//   - membership: workers/<id> (registrations under a lease), election,
//     generation, reports/ (loss reports), leaving/ (departures), done,
//     stop (a whole-job stop request), final-checkpoint (the claim of the
//     survivor that writes it), config (the job hash every worker shares);
//   - stragglers (hybrid): progress (the ring's pace), exclusions/<id> (a
//     straggler on probation, with the record of its exclusion), feeds/<id>
//     (a readmitted straggler's request for the ring's parameters);
//   - parameter servers: ps/job (the job record), ps/servers/<id>, ps/election
//     and ps/shardmap (the elected writer's map of primaries and backups),
//     ps/workers/<id>, and ps/shares/{claim,seen,done}/<share> (who trains
//     which share of the data, and which are finished).
package coordinator
