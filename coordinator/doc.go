// Package coordinator is Phalanx's membership authority on etcd: workers
// register under a lease; one coordinator at a time, chosen by etcd election,
// decides generations (who trains, in which ring order, from which step) and
// writes each in a transaction fenced by its leadership and the previous
// record's revision, so a deposed coordinator cannot write. It also runs an
// embedded single-member etcd server for single-host jobs. The decisions are
// pure: Decide, from members to the next ring, and the clocks around it (the
// join window, the first ring's wait, the minimum-workers timeout), which take
// the time as an input and give the next wake-up; the rest is I/O around them.
package coordinator
