package collective

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// planeOf is the first word of a DataPlane text: the plane itself.
func planeOf(dataPlane string) string {
	plane, _, _ := strings.Cut(dataPlane, " ")
	return plane
}

// TestChooseAllReduce: the choice table, size × dtype × what the group's
// connections allow × what is asked for and the options → algorithm.
func TestChooseAllReduce(t *testing.T) {
	const small = 64 << 10
	links, shm, hier := allreducePaths{}, allreducePaths{singleCopy: true}, allreducePaths{hierarchical: true}
	def := Options{SmallBytes: small}
	with := func(a Algorithm) Options { return Options{SmallBytes: small, Algorithm: a} }
	cases := []struct {
		name  string
		ask   Algorithm
		bytes int
		dt    DType
		paths allreducePaths
		opts  Options
		want  Algorithm
		err   string // part of the error when the choice is refused
	}{
		// Left to the group, over links: recursive doubling up to SmallBytes, the ring above.
		{"links/empty", AlgoAuto, 0, Float32, links, def, AlgoRecursiveDoubling, ""},
		{"links/4KiB", AlgoAuto, 4 << 10, Float32, links, def, AlgoRecursiveDoubling, ""},
		{"links/at-threshold", AlgoAuto, small, Float64, links, def, AlgoRecursiveDoubling, ""},
		{"links/above-threshold", AlgoAuto, small + 1, Float32, links, def, AlgoRing, ""},
		{"links/16MiB", AlgoAuto, 16 << 20, Float64, links, def, AlgoRing, ""},
		{"links/float16-small", AlgoAuto, 4 << 10, Float16, links, def, AlgoRecursiveDoubling, ""},
		{"links/bfloat16-large", AlgoAuto, 1 << 20, BFloat16, links, def, AlgoRing, ""},
		{"links/threshold-1KiB", AlgoAuto, 4 << 10, Float32, links, Options{SmallBytes: 1 << 10}, AlgoRing, ""},
		// The options' algorithm, and the caller's over it.
		{"links/options-ring-small", AlgoAuto, 4 << 10, Float32, links, with(AlgoRing), AlgoRing, ""},
		{"links/options-rd-large", AlgoAuto, 16 << 20, Float32, links, with(AlgoRecursiveDoubling), AlgoRecursiveDoubling, ""},
		{"links/asked-ring-small", AlgoRing, 4 << 10, Float32, links, def, AlgoRing, ""},
		{"links/asked-rd-large", AlgoRecursiveDoubling, 16 << 20, Float32, links, def, AlgoRecursiveDoubling, ""},
		{"links/asked-over-options", AlgoRing, 4 << 10, Float32, links, with(AlgoRecursiveDoubling), AlgoRing, ""},
		// Shared memory of one host: single-copy for float32 and float64, whatever was asked.
		{"shm/float32-small", AlgoAuto, 4 << 10, Float32, shm, def, AlgoSingleCopy, ""},
		{"shm/float64-large", AlgoAuto, 16 << 20, Float64, shm, def, AlgoSingleCopy, ""},
		{"shm/asked-ring", AlgoRing, 4 << 10, Float32, shm, def, AlgoSingleCopy, ""},
		{"shm/asked-rd", AlgoRecursiveDoubling, 16 << 20, Float64, shm, def, AlgoSingleCopy, ""},
		{"shm/options-ring", AlgoAuto, 1 << 20, Float32, shm, with(AlgoRing), AlgoSingleCopy, ""},
		{"shm/asked-single-copy", AlgoSingleCopy, 4 << 10, Float32, shm, def, AlgoSingleCopy, ""},
		{"shm/float16-small", AlgoAuto, 4 << 10, Float16, shm, def, AlgoRecursiveDoubling, ""},
		{"shm/bfloat16-large", AlgoAuto, 1 << 20, BFloat16, shm, def, AlgoRing, ""},
		{"shm/float16-asked-ring", AlgoRing, 4 << 10, Float16, shm, def, AlgoRing, ""},
		// Hosts of several ranks each: hierarchical where the ring would run.
		{"hier/small", AlgoAuto, 4 << 10, Float32, hier, def, AlgoRecursiveDoubling, ""},
		{"hier/large", AlgoAuto, 1 << 20, Float32, hier, def, AlgoHierarchical, ""},
		{"hier/float16-large", AlgoAuto, 1 << 20, Float16, hier, def, AlgoHierarchical, ""},
		{"hier/asked-ring-small", AlgoRing, 4 << 10, Float32, hier, def, AlgoHierarchical, ""},
		{"hier/asked-rd-large", AlgoRecursiveDoubling, 1 << 20, Float32, hier, def, AlgoRecursiveDoubling, ""},
		{"hier/options-ring-small", AlgoAuto, 4 << 10, Float64, hier, with(AlgoRing), AlgoHierarchical, ""},
		{"hier/asked-hierarchical-small", AlgoHierarchical, 4 << 10, Float32, hier, def, AlgoHierarchical, ""},
		// Refusals.
		{"links/asked-single-copy", AlgoSingleCopy, 4 << 10, Float32, links, def, 0, "every peer on shared memory"},
		{"hier/asked-single-copy", AlgoSingleCopy, 4 << 10, Float32, hier, def, 0, "every peer on shared memory"},
		{"shm/asked-single-copy-float16", AlgoSingleCopy, 4 << 10, Float16, shm, def, 0, "not float16"},
		{"links/asked-hierarchical", AlgoHierarchical, 1 << 20, Float32, links, def, 0, "several hosts"},
		{"shm/options-hierarchical", AlgoAuto, 1 << 20, Float32, shm, with(AlgoHierarchical), 0, "several hosts"},
		{"links/unknown", Algorithm(9), 4 << 10, Float32, links, def, 0, "unknown algorithm algorithm(9)"},
		{"links/options-unknown", AlgoAuto, 4 << 10, Float32, links, with(Algorithm(200)), 0, "unknown algorithm algorithm(200)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseAllReduce(tc.ask, tc.bytes, tc.dt, tc.paths, tc.opts)
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("%s of %d %s bytes on %+v, options %s up to %d: %s, %v; want an error mentioning %q",
					tc.ask, tc.bytes, tc.dt, tc.paths, tc.opts.Algorithm, tc.opts.SmallBytes, got, err, tc.err)
			case tc.err == "" && (err != nil || got != tc.want):
				t.Fatalf("%s of %d %s bytes on %+v, options %s up to %d: %s, %v; want %s",
					tc.ask, tc.bytes, tc.dt, tc.paths, tc.opts.Algorithm, tc.opts.SmallBytes, got, err, tc.want)
			}
		})
	}
}

// TestAlgorithmNames: every algorithm's name parses back to it; the wire
// ids are the ones peers of this protocol version send.
func TestAlgorithmNames(t *testing.T) {
	ids := map[Algorithm]uint8{AlgoRing: 1, AlgoRecursiveDoubling: 2, AlgoSingleCopy: 3, AlgoHierarchical: 4}
	for a := AlgoAuto; a <= lastAlgorithm; a++ {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
		if id, ok := ids[a]; a.onWire() != ok || (ok && uint8(a) != id) {
			t.Errorf("%s: wire id %d (on the wire: %v), want %d (%v)", a, uint8(a), a.onWire(), id, ok)
		}
	}
	if a, err := ParseAlgorithm("tree"); err != nil || a != AlgoRecursiveDoubling {
		t.Errorf("tree: %v, %v", a, err)
	}
	if _, err := ParseAlgorithm("butterfly"); err == nil || !strings.Contains(err.Error(), "hierarchical") {
		t.Errorf("butterfly: %v, want an error listing the algorithms", err)
	}
}

// TestAllReduceRunsWhatItNames: over each transport the package tests use,
// an allreduce reports (LastAlgorithm) and names in its frame headers, or
// in its shared-memory slab descriptors, the algorithm chosen; and that
// algorithm is the one that moved the data: each leaves its own count of
// frames on each link (the single-copy allreduce none).
func TestAllReduceRunsWhatItNames(t *testing.T) {
	const world, count = 4, 1000 // 4000 float32 bytes: above SmallBytes 1024, below the default 64 KiB
	small := Options{SmallBytes: 1 << 10}
	inproc := func(o Options) func(t *testing.T) []*Group {
		return func(t *testing.T) []*Group { return inprocGroups(t, world, 1, o) }
	}
	joined := func(kind TransportKind, hosts []string, o Options) func(t *testing.T) []*Group {
		return func(t *testing.T) []*Group {
			return newShmRanks(t, world, kind, t.TempDir()).join(t, "ran", 1, []int{0, 1, 2, 3}, hosts, o)
		}
	}
	twoHosts := []string{"a", "a", "b", "b"}
	cases := []struct {
		name string
		join func(t *testing.T) []*Group
		dt   DType
		ask  Algorithm
		want Algorithm
	}{
		{"inproc/auto-small", inproc(Options{}), Float32, AlgoAuto, AlgoRecursiveDoubling},
		{"inproc/auto-large", inproc(small), Float32, AlgoAuto, AlgoRing},
		{"inproc/asked-ring", inproc(Options{}), Float16, AlgoRing, AlgoRing},
		{"tcp/auto-large", joined(TransportTCP, nil, small), Float64, AlgoAuto, AlgoRing},
		{"tcp/asked-rd", joined(TransportTCP, nil, small), Float32, AlgoRecursiveDoubling, AlgoRecursiveDoubling},
		{"shm/auto-small", joined(TransportShm, nil, Options{}), Float32, AlgoAuto, AlgoSingleCopy},
		{"shm/asked-ring", joined(TransportShm, nil, small), Float64, AlgoRing, AlgoSingleCopy},
		{"shm/float16-small", joined(TransportShm, nil, Options{}), Float16, AlgoAuto, AlgoRecursiveDoubling},
		{"shm/bfloat16-large", joined(TransportShm, nil, small), BFloat16, AlgoAuto, AlgoRing},
		{"hier/auto-large", joined(TransportAuto, twoHosts, small), Float32, AlgoAuto, AlgoHierarchical},
		{"hier/float16-large", joined(TransportAuto, twoHosts, small), Float16, AlgoAuto, AlgoHierarchical},
		{"hier/auto-small", joined(TransportAuto, twoHosts, Options{}), Float32, AlgoAuto, AlgoRecursiveDoubling},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			groups := tc.join(t)
			ctx := testContext(t)
			bufs := make([]Buffer, world)
			for r := range bufs {
				bufs[r] = filled(tc.dt, count, float32(r+1))
			}
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error { return g.AllReduceWith(ctx, bufs[r], Sum, tc.ask) }))
			want := filled(tc.dt, count, world*(world+1)/2)
			for r, g := range groups {
				if !bytes.Equal(bufs[r].b, want.b) {
					t.Fatalf("rank %d: the allreduce's result is not the sum", r)
				}
				if got := g.LastAlgorithm(); got != tc.want {
					t.Errorf("rank %d: LastAlgorithm %s, want %s", r, got, tc.want)
				}
				named := argAlgorithm(g.cur.arg) // what every data frame's header carried
				if tc.want == AlgoSingleCopy {
					d, err := decodeOpDesc(g.fast.descOf(r, g.fast.step))
					if err != nil {
						t.Fatalf("rank %d: its slab descriptor: %v", r, err)
					}
					named = argAlgorithm(d.arg)
				}
				if named != tc.want {
					t.Errorf("rank %d: the allreduce's frames name %s, want %s", r, named, tc.want)
				}
				if got, want := framesSent(g), wantFrames(tc.want, r, world); !slices.Equal(got, want) {
					t.Errorf("rank %d: frames sent to each rank %v, the pattern of %s is %v", r, got, tc.want, want)
				}
			}
		})
	}
}

// filled is a buffer of n elements of dt, each v.
func filled(dt DType, n int, v float32) Buffer {
	x := make([]float32, n)
	for i := range x {
		x[i] = v
	}
	switch dt {
	case Float64:
		y := make([]float64, n)
		for i := range y {
			y[i] = float64(v)
		}
		return Float64s(y)
	case Float16:
		y := make([]uint16, n)
		ToFloat16(y, x)
		return Float16s(y)
	case BFloat16:
		y := make([]uint16, n)
		ToBFloat16(y, x)
		return BFloat16s(y)
	}
	return Float32s(x)
}

// framesSent is how many data frames g's latest operation sent to each rank.
func framesSent(g *Group) []int {
	out := make([]int, g.world)
	for j, l := range g.links {
		if l != nil {
			out[j] = int(l.sendIdx)
		}
	}
	return out
}

// wantFrames is the frames rank r of a world of 4 sends to each rank in one
// allreduce of a few thousand bytes (one segment a chunk), by algorithm; for
// the hierarchical one the hosts are {0, 1} and {2, 3}.
func wantFrames(a Algorithm, r, world int) []int {
	out := make([]int, world)
	switch a {
	case AlgoRing: // 2(N−1) steps, each to the right neighbour
		out[(r+1)%world] = 2 * (world - 1)
	case AlgoRecursiveDoubling: // a power of two: one whole vector to each butterfly partner
		for mask := 1; mask < world; mask <<= 1 {
			out[r^mask] = 1
		}
	case AlgoHierarchical: // rings of two: the host's other rank, the other host's rank of the same place
		out[r^1], out[r^2] = 2, 2
	case AlgoSingleCopy: // through the segments only
	}
	return out
}

// TestAllReduceRefusesWhatCannotRun: an algorithm the group cannot run,
// asked for, is an argument error on the rank: nothing is sent, the group
// stays usable and LastAlgorithm unchanged.
func TestAllReduceRefusesWhatCannotRun(t *testing.T) {
	groups := inprocGroups(t, 2, 1, Options{})
	ctx := testContext(t)
	for _, a := range []Algorithm{AlgoSingleCopy, AlgoHierarchical, Algorithm(9)} {
		for r, g := range groups {
			err := g.AllReduceWith(ctx, Float32s(make([]float32, 8)), Sum, a)
			if err == nil || !strings.Contains(err.Error(), "collective allreduce: ") {
				t.Fatalf("rank %d asking for %s: %v, want the allreduce refused", r, a, err)
			}
			if got := g.LastAlgorithm(); got != AlgoAuto {
				t.Fatalf("rank %d: LastAlgorithm %s after a refused allreduce, want auto (none ran)", r, got)
			}
		}
	}
	mustAll(t, onEveryRank(groups, func(_ int, g *Group) error { return g.AllReduce(ctx, Float32s(make([]float32, 8)), Sum) }))
	for r, g := range groups {
		if got := g.LastAlgorithm(); got != AlgoRecursiveDoubling {
			t.Errorf("rank %d: LastAlgorithm %s, want rd", r, got)
		}
	}
}

// TestDataPlaneNamesAlgorithms: DataPlane's first word is the plane, as
// before; the rest names the algorithms the group chooses.
func TestDataPlaneNamesAlgorithms(t *testing.T) {
	cases := []struct {
		name string
		join func(t *testing.T) []*Group
		want string
	}{
		{"local", func(t *testing.T) []*Group { return inprocGroups(t, 1, 1, Options{}) }, "local"},
		{"inproc", func(t *testing.T) []*Group { return inprocGroups(t, 3, 1, Options{}) },
			"tcp (allreduce: rd up to 64 KiB, ring above)"},
		{"inproc-ring", func(t *testing.T) []*Group { return inprocGroups(t, 3, 1, Options{Algorithm: AlgoRing}) },
			"tcp (allreduce: ring)"},
		{"inproc-hierarchical", func(t *testing.T) []*Group { return inprocGroups(t, 2, 1, Options{Algorithm: AlgoHierarchical}) },
			"tcp (allreduce: none, the hierarchical allreduce needs several hosts of as many ranks each, on shared memory inside each)"},
		{"tcp-threshold", func(t *testing.T) []*Group {
			return newShmRanks(t, 2, TransportTCP, t.TempDir()).join(t, "plane", 1, []int{0, 1}, nil, Options{SmallBytes: 1000})
		}, "tcp (allreduce: rd up to 1000 B, ring above)"},
		{"shm", func(t *testing.T) []*Group {
			return newShmRanks(t, 3, TransportShm, t.TempDir()).join(t, "plane", 1, []int{0, 1, 2}, nil, Options{})
		}, "shm (allreduce: float32 and float64 single-copy; other dtypes rd up to 64 KiB, ring above)"},
		{"hierarchical", func(t *testing.T) []*Group {
			return newShmRanks(t, 4, TransportAuto, t.TempDir()).join(t, "plane", 1, []int{0, 1, 2, 3}, []string{"a", "a", "b", "b"}, Options{SmallBytes: 1 << 20})
		}, "hierarchical (allreduce: rd up to 1 MiB, hierarchical above)"},
		{"shm+tcp", func(t *testing.T) []*Group {
			return newShmRanks(t, 3, TransportAuto, t.TempDir()).join(t, "plane", 1, []int{0, 1, 2}, []string{"a", "a", "b"}, Options{})
		}, "shm+tcp (allreduce: rd up to 64 KiB, ring above)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.join(t)[0]
			if got := g.DataPlane(); got != tc.want {
				t.Errorf("DataPlane %q, want %q", got, tc.want)
			}
		})
	}
}
