package collective

import (
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h); not the _PRIVATE ones, which key on the
// process's own address space.
const (
	futexOpWait = 0
	futexOpWake = 1
)

// futexWait blocks while *w == val, until woken, until the deadline (zero:
// none) or on a spurious wake-up; the caller re-checks its condition. The
// word lives in a MAP_SHARED mapping, so the non-private futex is keyed on the
// page and wakes cross processes.
func futexWait(w *atomic.Uint32, val uint32, deadline time.Time) {
	var tsp *unix.Timespec
	var ts unix.Timespec
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return
		}
		ts = unix.NsecToTimespec(int64(d))
		tsp = &ts
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexOpWait, uintptr(val),
		uintptr(unsafe.Pointer(tsp)), 0, 0)
}

// schedYield gives this thread's core to another runnable thread, if any.
func schedYield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// futexWake wakes up to n waiters blocked on w.
func futexWake(w *atomic.Uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexOpWake, uintptr(n), 0, 0, 0)
}

// bell is a futex doorbell: a counter its owner sleeps on.
type bell struct{ seq *atomic.Uint32 }

// force wakes the owner whether or not it waits (aborts, deadlines, and
// ringers that saw it sleep).
func (b bell) force() {
	b.seq.Add(1)
	futexWake(b.seq, 1)
}

func u64At(mem []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}

func u32At(mem []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// createSegment makes a fresh file of size bytes at path (replacing any stale
// one) and maps it shared.
func createSegment(path string, size int) ([]byte, error) {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("collective: creating shared-memory segment: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("collective: sizing shared-memory segment %s to %d bytes: %w", path, size, err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("collective: mapping shared-memory segment %s: %w", path, err)
	}
	return mem, nil
}

// openSegment maps an existing segment file, which must be size bytes.
func openSegment(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("collective: opening shared-memory segment: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("collective: shared-memory segment %s: %w", path, err)
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("collective: shared-memory segment %s has %d bytes, want %d", path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("collective: mapping shared-memory segment %s: %w", path, err)
	}
	return mem, nil
}

func unmap(mem []byte) {
	if mem != nil {
		unix.Munmap(mem)
	}
}

// publish32 and publish64 store v in w with a full fence, for a store that a
// load of another word follows in the sleep/wake handshakes (a waiter
// publishes "I sleep" then checks the ring; a producer publishes the new head
// then checks whether anyone sleeps). Each side must see the other's store,
// which needs the store ordered before the load. Go's atomic Store gives that
// (XCHG on amd64), except under the race detector: there it is ThreadSanitizer's
// release store, a plain MOV that the CPU may hold in its store buffer past the
// load (golang/go#58020), and both sides could miss each other and sleep
// forever. Swap is a read-modify-write in both builds, so it always fences.
func publish32(w *atomic.Uint32, v uint32) { w.Swap(v) }

func publish64(w *atomic.Uint64, v uint64) { w.Swap(v) }
