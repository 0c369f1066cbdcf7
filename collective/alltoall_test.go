package collective

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// a2aCuts is the cut list of parts[0..world): prefix sums.
func a2aCuts(parts []int) []int {
	cuts := make([]int, len(parts)+1)
	for i, p := range parts {
		cuts[i+1] = cuts[i] + p
	}
	return cuts
}

// a2aSize is how many elements rank src sends rank dst in the uneven
// pattern: some pairs send nothing.
func a2aSize(src, dst int) int { return (3*src + 5*dst + 1) % 7 }

// TestAllToAll: every rank's part for every other lands where the receiver
// asked for it, with parts of uneven sizes (zero among them), at group
// sizes 1 to 4, over the in-process, TCP and shared-memory transports, and
// the group goes on with the next operation.
func TestAllToAll(t *testing.T) {
	joins := map[string]func(t *testing.T, world int) []*Group{
		"inproc": func(t *testing.T, world int) []*Group { return inprocGroups(t, world, 1, Options{}) },
		"tcp": func(t *testing.T, world int) []*Group {
			return newShmRanks(t, world, TransportTCP, t.TempDir()).join(t, "a2a", 1, seq(world), nil, Options{})
		},
		"shm": func(t *testing.T, world int) []*Group {
			return newShmRanks(t, world, TransportShm, t.TempDir()).join(t, "a2a", 1, seq(world), nil, Options{})
		},
	}
	for _, name := range []string{"inproc", "tcp", "shm"} {
		for world := 1; world <= 4; world++ {
			t.Run(fmt.Sprintf("%s/world%d", name, world), func(t *testing.T) {
				ctx := testContext(t)
				groups := joins[name](t, world)
				outs := make([][]float32, world)
				errs := onEveryRank(groups, func(r int, g *Group) error {
					send, recv := make([]int, world), make([]int, world)
					for p := range world {
						send[p], recv[p] = a2aSize(r, p), a2aSize(p, r)
					}
					sc, rc := a2aCuts(send), a2aCuts(recv)
					in := make([]float32, sc[world])
					for p := range world {
						for i := range send[p] {
							in[sc[p]+i] = float32(1000*r + 100*p + i)
						}
					}
					outs[r] = make([]float32, rc[world])
					if err := g.AllToAll(ctx, Float32s(in), sc, Float32s(outs[r]), rc); err != nil {
						return err
					}
					return g.Barrier(ctx)
				})
				mustAll(t, errs)
				for r := range world {
					at := 0
					for p := range world {
						for i := range a2aSize(p, r) {
							if want := float32(1000*p + 100*r + i); outs[r][at] != want {
								t.Fatalf("rank %d, element %d of rank %d's part: %v, want %v", r, i, p, outs[r][at], want)
							}
							at++
						}
					}
				}
			})
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestAllToAllLarge: parts bigger than a segment, in float64, over TCP.
func TestAllToAllLarge(t *testing.T) {
	const world, n = 3, 200_000 // 1.6 MB a part
	ctx := testContext(t)
	groups := newShmRanks(t, world, TransportTCP, t.TempDir()).join(t, "a2a", 1, seq(world), nil, Options{})
	errs := onEveryRank(groups, func(r int, g *Group) error {
		in, out := make([]float64, world*n), make([]float64, world*n)
		for i := range in {
			in[i] = float64(r*world*n + i)
		}
		cuts := []int{0, n, 2 * n, 3 * n}
		if err := g.AllToAll(ctx, Float64s(in), cuts, Float64s(out), cuts); err != nil {
			return err
		}
		for p := range world {
			for i := 0; i < n; i += 997 {
				if want := float64(p*world*n + r*n + i); out[p*n+i] != want {
					return fmt.Errorf("element %d from rank %d: %v, want %v", i, p, out[p*n+i], want)
				}
			}
		}
		return nil
	})
	mustAll(t, errs)
}

// TestAllToAllDisagreement: a pair that disagrees on its part's size fails
// the group with ErrMismatch naming the peer, on both ends, never a hang.
func TestAllToAllDisagreement(t *testing.T) {
	ctx := testContext(t)
	groups := inprocGroups(t, 3, 1, Options{})
	errs := onEveryRank(groups, func(r int, g *Group) error {
		send, recv := []int{2, 2, 2}, []int{2, 2, 2}
		if r == 1 {
			recv[0] = 3 // expects 3 from rank 0, which sends 2
		}
		in, out := make([]float32, 6), make([]float32, a2aCuts(recv)[3])
		err := g.AllToAll(ctx, Float32s(in), a2aCuts(send), Float32s(out), a2aCuts(recv))
		if err == nil {
			err = g.Barrier(ctx)
		}
		return err
	})
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error", r)
		}
	}
	if err := errs[1]; !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "rank 0") {
		t.Errorf("rank 1: %v, want ErrMismatch naming rank 0", err)
	}
}

// TestAllToAllLocalErrors: cuts that do not fit the buffers, a dtype
// mismatch and a rank's own part of two sizes are refused before anything
// is sent, and the group stays usable.
func TestAllToAllLocalErrors(t *testing.T) {
	ctx := testContext(t)
	g := inprocGroups(t, 1, 1, Options{})[0]
	x, y := make([]float32, 4), make([]float32, 4)
	for _, c := range []struct {
		name     string
		in, out  Buffer
		sc, rc   []int
		contains string
	}{
		{"dtype", Float32s(x), Float64s(make([]float64, 4)), []int{0, 4}, []int{0, 4}, "float64"},
		{"short cuts", Float32s(x), Float32s(y), []int{0}, []int{0, 4}, "input cuts"},
		{"cuts beyond", Float32s(x), Float32s(y), []int{0, 4}, []int{0, 5}, "output cuts"},
		{"own part", Float32s(x), Float32s(y[:3]), []int{0, 4}, []int{0, 3}, "sends itself 4"},
		{"in place", Float32s(x), Float32s(x[2:]), []int{0, 2}, []int{0, 2}, "overlap"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := g.AllToAll(ctx, c.in, c.sc, c.out, c.rc); err == nil || !strings.Contains(err.Error(), c.contains) {
				t.Errorf("%v, want an error containing %q", err, c.contains)
			}
		})
	}
	if err := g.Barrier(ctx); err != nil {
		t.Fatalf("the group after refused calls: %v", err)
	}
	groups := inprocGroups(t, 2, 1, Options{})
	errs := onEveryRank(groups, func(r int, g *Group) error {
		y := make([]float32, 4)
		return g.AllToAll(ctx, Float32s(x), []int{0, 3, 2, 4}, Float32s(y), []int{0, 2, 4})
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "input cuts") {
			t.Errorf("rank %d: %v, want the input cuts refused", r, err)
		}
	}
}

// TestAllToAllPeerLost: a rank whose group is aborted mid-exchange fails
// the others' all-to-all with its failure, not a hang.
func TestAllToAllPeerLost(t *testing.T) {
	ctx := testContext(t)
	groups := inprocGroups(t, 3, 1, Options{})
	errs := onEveryRank(groups, func(r int, g *Group) error {
		if r == 2 {
			g.Abort("rank 2 gives up")
			return nil
		}
		x, y := make([]float32, 6), make([]float32, 6)
		return g.AllToAll(ctx, Float32s(x), []int{0, 2, 4, 6}, Float32s(y), []int{0, 2, 4, 6})
	})
	for r := range 2 {
		if err := errs[r]; !errors.Is(err, ErrAborted) && !errors.Is(err, ErrPeerLost) {
			t.Errorf("rank %d: %v, want the peer's abort", r, err)
		}
	}
}
