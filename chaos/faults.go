package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/plant"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Fault is one fault of a run: Inject applies it to the running job, Heal
// undoes what can be undone (a stopped process is continued; a killed one
// stays dead). Each returns what it did, in words: the report's evidence.
type Fault interface {
	Inject(ctx context.Context, env *Env) (string, error)
	Heal(ctx context.Context, env *Env) (string, error)
}

// Kind is a kind of fault a scenario names.
type Kind struct {
	Name string
	Doc  string
	// NeedsRank: the fault acts on one rank (its FaultSpec needs a target).
	NeedsRank bool
	// NeedsCheckpoints: the fault acts on the job's checkpoints.
	NeedsCheckpoints bool
	// Needs names the Service the fault acts on (its scenario's job must
	// ask for it), or "".
	Needs string
	// Changes says what the fault does to the job, which decides the
	// invariants that apply: "ring" (a new generation: recovery is timed,
	// the model is compared within the tolerance), "none" (the job must
	// not notice: the model is compared bitwise), "resume" (the job is
	// killed and launched again from its checkpoints).
	Changes string
	New     func(p Planned) Fault
}

// Kinds are fault kinds by name. A user adds their own to the map that
// DefaultKinds returns.
type Kinds map[string]Kind

// Names lists the kinds, sorted.
func (k Kinds) Names() []string {
	out := make([]string, 0, len(k))
	for n := range k {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// DefaultKinds are the built-in faults.
func DefaultKinds() Kinds {
	ks := []Kind{
		{Name: "sigkill", Doc: "SIGKILL the target worker: the ring closes without it", NeedsRank: true, Changes: "ring",
			New: func(p Planned) Fault { return &signalFault{sig: syscall.SIGKILL} }},
		{Name: "sigterm", Doc: "SIGTERM the target worker: it leaves gracefully", NeedsRank: true, Changes: "ring",
			New: func(p Planned) Fault { return &signalFault{sig: syscall.SIGTERM} }},
		{Name: "sigstop", Doc: "SIGSTOP the target worker for the fault's duration, then SIGCONT: shorter than the lease and the operation timeout, the job waits for it",
			NeedsRank: true, Changes: "none",
			New: func(p Planned) Fault { return &signalFault{sig: syscall.SIGSTOP, heal: syscall.SIGCONT} }},
		{Name: "kill-all", Doc: "SIGKILL every worker at once; the job is launched again with the fault's world size and resumes from its newest checkpoint that verifies",
			NeedsCheckpoints: true, Changes: "resume",
			New: func(p Planned) Fault { return &killAll{world: p.World} }},
		{Name: "flip-checkpoint", Doc: "flip one byte of a data object of the newest complete checkpoint (a resume must refuse it and take the one before)",
			NeedsCheckpoints: true, Changes: "none",
			New: func(p Planned) Fault { return &damageCheckpoint{pick: p.Pick, how: flipData} }},
		{Name: "flip-manifest", Doc: "change one byte of the newest complete checkpoint's manifest (a resume must refuse it by the manifest's own checksum and take the one before)",
			NeedsCheckpoints: true, Changes: "none",
			New: func(p Planned) Fault { return &damageCheckpoint{pick: p.Pick, how: flipManifest} }},
		{Name: "delete-manifest", Doc: "delete the newest complete checkpoint's manifest (a resume must take the one before)",
			NeedsCheckpoints: true, Changes: "none",
			New: func(p Planned) Fault { return &damageCheckpoint{pick: p.Pick, how: deleteManifest} }},
		{Name: "garbage-frames", Doc: "send garbage, truncated, oversized and foreign-job frames to every worker's data-plane port: each connection is refused and the ring trains on",
			Changes: "none",
			New:     func(p Planned) Fault { return &garbageFrames{seed: p.Pick} }},
	}
	ks = append(ks, etcdKinds()...)
	ks = append(ks, minioKinds()...)
	ks = append(ks, netnsKinds()...)
	ks = append(ks, psKinds()...)
	out := Kinds{}
	for _, k := range ks {
		out[k.Name] = k
	}
	return out
}

// signalFault sends a signal to the target rank's process, and heal (if
// any) when healed.
type signalFault struct {
	sig, heal syscall.Signal
	pid       int
}

func (f *signalFault) Inject(_ context.Context, env *Env) (string, error) {
	m, err := env.target()
	if err != nil {
		return "", err
	}
	f.pid = int(m.Pid)
	if st, _ := procState(f.pid); st == 0 {
		// The job's events lag its processes: a trigger too near the end
		// fires after the target is gone, and the fault does nothing.
		return "", fmt.Errorf("rank %d (pid %d) had already exited: the fault came too late to do anything", env.Rank, f.pid)
	}
	sig := f.sig
	if plant.On(plant.FaultNoop) {
		sig = 0 // planted: the fault fires zero times
	}
	if err := syscall.Kill(f.pid, sig); err != nil {
		return "", fmt.Errorf("%v to pid %d: %w", f.sig, f.pid, err)
	}
	if err := tookHold(f.pid, f.sig, 5*time.Second); err != nil {
		return "", fmt.Errorf("%s to rank %d (pid %d): %w", signalName(f.sig), env.Rank, f.pid, err)
	}
	return fmt.Sprintf("%s to rank %d (pid %d)", signalName(f.sig), env.Rank, f.pid), nil
}

// tookHold waits, up to bound, until the process shows the
// effect of sig: stopped for SIGSTOP, dead for SIGKILL. Other signals are
// handled by the process, on its own time: their effect is judged later
// (see leftRing). A natural end also looks dead: invariant 0 reads the
// killed process's exit status too.
func tookHold(pid int, sig syscall.Signal, bound time.Duration) error {
	switch sig {
	case syscall.SIGSTOP:
		return awaitState(pid, "stopped", bound)
	case syscall.SIGKILL:
		return awaitState(pid, "dead", bound)
	}
	return nil
}

func (f *signalFault) Heal(context.Context, *Env) (string, error) {
	if f.heal == 0 || f.pid == 0 {
		return "", nil
	}
	if err := syscall.Kill(f.pid, f.heal); err != nil {
		return "", fmt.Errorf("%v to pid %d: %w", f.heal, f.pid, err)
	}
	return fmt.Sprintf("%s to pid %d", signalName(f.heal), f.pid), nil
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGSTOP:
		return "SIGSTOP"
	case syscall.SIGCONT:
		return "SIGCONT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

// killAll kills every worker; the runner then launches the job again.
type killAll struct{ world int }

func (f *killAll) Inject(_ context.Context, env *Env) (string, error) {
	// Every process the launch started, in the ring or still joining.
	var pids []string
	for _, pid := range env.Started {
		if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return "", fmt.Errorf("SIGKILL to pid %d: %w", pid, err)
		}
		pids = append(pids, fmt.Sprint(pid))
	}
	env.Relaunch(f.world)
	return fmt.Sprintf("SIGKILL to every worker (pids %s); relaunch on %d workers", strings.Join(pids, ", "), env.run.relaunch), nil
}

func (f *killAll) Heal(context.Context, *Env) (string, error) { return "", nil }

// damageCheckpoint flips a byte of a data object or of the manifest of the
// newest complete checkpoint, or deletes its manifest. The runner remembers
// it as damaged on purpose.
type damageCheckpoint struct {
	pick uint64
	how  damage
}

// damage is what damageCheckpoint does.
type damage uint8

const (
	flipData damage = iota
	flipManifest
	deleteManifest
)

func (f *damageCheckpoint) Inject(ctx context.Context, env *Env) (string, error) {
	if env.Store == nil {
		return "", errors.New("the job has no checkpoint store")
	}
	infos, err := checkpoint.List(ctx, env.Store)
	if err != nil {
		return "", err
	}
	var id string
	for _, in := range infos { // newest first
		if in.Complete {
			id = in.ID
			break
		}
	}
	if id == "" {
		return "", errors.New("no complete checkpoint yet")
	}
	var name string
	var size int64
	switch f.how {
	case deleteManifest:
		name := id + "/" + checkpoint.ManifestName
		if err := env.Store.Delete(ctx, name); err != nil {
			return "", fmt.Errorf("deleting %s: %w", name, err)
		}
		env.Damaged(id)
		return fmt.Sprintf("deleted the manifest of %s", id), nil
	case flipManifest:
		name = id + "/" + checkpoint.ManifestName
		objs, err := env.Store.List(ctx, name)
		if err != nil {
			return "", err
		}
		for _, o := range objs {
			if o.Name == name {
				size = o.Size
			}
		}
		if size == 0 {
			return "", fmt.Errorf("%s: %w", name, checkpoint.ErrNotFound)
		}
	default:
		m, err := checkpoint.ReadManifest(ctx, env.Store, id)
		if err != nil {
			return "", err
		}
		if len(m.Objects) == 0 {
			return "", fmt.Errorf("%s has no data objects", id)
		}
		o := m.Objects[f.pick%uint64(len(m.Objects))]
		name, size = id+"/"+o.Name, int64(o.Bytes)
	}
	buf := make([]byte, size)
	if err := env.Store.ReadAt(ctx, name, buf, 0); err != nil {
		return "", err
	}
	at, mask := int((f.pick>>16)%uint64(len(buf))), byte(0x5a)
	if f.how == flipManifest {
		// As a hand edit would: the sampler position one off, every other
		// byte as written. The manifest still parses and validates, and its
		// data still verifies: only its own checksum tells.
		at, mask = positionByte(buf), 0x01
	}
	buf[at] ^= mask
	// Stores never replace an object: tampering is a delete and a put.
	if err := env.Store.Delete(ctx, name); err != nil {
		return "", err
	}
	if err := env.Store.Put(ctx, name, buf); err != nil {
		return "", err
	}
	env.Damaged(id)
	if f.how == flipManifest {
		return fmt.Sprintf("moved the sampler position by one in %s (byte %d of %d), its checksum left as written", name, at, len(buf)), nil
	}
	return fmt.Sprintf("flipped byte %d of %s (%d bytes)", at, name, len(buf)), nil
}

func (f *damageCheckpoint) Heal(context.Context, *Env) (string, error) { return "", nil }

// positionByte is where in a stored manifest its sampler position starts:
// the first byte of the epoch's value, or of the offset's when the epoch is 0
// (not written), where flipping the low bit moves the position by one. It
// is the middle byte when neither is there.
func positionByte(b []byte) int {
	found := map[protowire.Number]int{}
	for at := 0; at < len(b); {
		num, typ, n := protowire.ConsumeTag(b[at:])
		if n < 0 {
			break
		}
		m := protowire.ConsumeFieldValue(num, typ, b[at+n:])
		if m < 0 {
			break
		}
		if typ == protowire.VarintType {
			found[num] = at + n
		}
		at += n + m
	}
	for _, num := range []protowire.Number{5, 6} { // Manifest.epoch, Manifest.offset
		if at, ok := found[num]; ok {
			return at
		}
	}
	return len(b) / 2
}

// garbageFrames connects to every member's data-plane port and sends each
// kind of bad frame on a connection of its own.
type garbageFrames struct{ seed uint64 }

// badFrames are the frames garbageFrames sends: random bytes, a truncated
// handshake, a handshake announcing a body beyond the limit, and a
// well-formed handshake of another job.
func badFrames(seed uint64) (map[string][]byte, error) {
	rng := rand.New(rand.NewPCG(seed, 1))
	garbage := make([]byte, 512)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	hello, err := proto.Marshal(&phalanxpb.Hello{ProtocolVersion: uint32(collective.ProtocolVersion), Job: "chaos-foreign-job",
		Generation: 1, FromRank: 1, ToRank: 0, World: 2})
	if err != nil {
		return nil, err
	}
	head := func(n int) []byte {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint32(b[0:], 0x53484850) // "PHHS", the data plane's handshake magic
		binary.LittleEndian.PutUint16(b[4:], collective.ProtocolVersion)
		binary.LittleEndian.PutUint16(b[6:], uint16(n))
		return b
	}
	return map[string][]byte{
		"garbage":   garbage,
		"truncated": append(head(len(hello)), hello[:len(hello)/2]...),
		"oversized": append(head(0xffff), garbage...),
		"foreign":   append(head(len(hello)), hello...),
	}, nil
}

func (f *garbageFrames) Inject(ctx context.Context, env *Env) (string, error) {
	frames, err := badFrames(f.seed)
	if err != nil {
		return "", err
	}
	names := []string{"foreign", "garbage", "oversized", "truncated"}
	// Every frame on its own connection, all at once: the ring is training
	// meanwhile, and a short job could end before frames sent one by one.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sent []string
	)
	for _, m := range env.Members {
		if m.DataAddr == "" {
			continue
		}
		sent = append(sent, m.DataAddr)
		for _, name := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := sendAndClose(ctx, m.DataAddr, frames[name]); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s frame to %s: %w", name, m.DataAddr, err))
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	if len(sent) == 0 {
		return "", errors.New("no data-plane address in the ring")
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s frames to %s", strings.Join(names, ", "), strings.Join(sent, ", ")), nil
}

func (f *garbageFrames) Heal(context.Context, *Env) (string, error) { return "", nil }

// sendAndClose writes b on a new connection to addr, reads until the peer
// closes it (a worker refuses each of these frames, another job's hello
// included, and closes; 300 ms bound the wait), and closes.
func sendAndClose(ctx context.Context, addr string, b []byte) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Write(b); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		return err
	}
	var buf [256]byte
	for {
		if _, err := c.Read(buf[:]); err != nil {
			return nil // closed by the peer, or it kept silent: either way refused
		}
	}
}
