// Package coordinator is Phalanx's membership authority on etcd: workers
// register under a lease; one coordinator at a time, chosen by etcd election,
// decides generations (who trains, in which ring order, from which step) and
// writes each in a transaction fenced by its leadership and the previous
// record's revision, so a deposed coordinator cannot write. It also runs an
// embedded single-member etcd server for single-host jobs. The decision itself
// (Decide) is a pure function; the rest is I/O around it.
package coordinator
