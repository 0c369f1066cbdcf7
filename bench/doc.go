// Package bench measures Phalanx on this machine: allreduce over the data
// plane (nccl-tests style), raw loopback TCP as the reference line, sparse
// push+pull through the parameter server, and checkpoint save, stall and
// restore against plain minio-go. `phalanx bench` is a thin shell over it.
//
// It is not a test harness and nothing in training depends on it; the shell
// and Python scripts beside it run reference measurements (PyTorch/Gloo) and
// read the JSON lines these benchmarks print.
package bench
