package schedule

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// configs is every valid config the properties are checked over: P in
// 1..8, m in 1..16, v in 2..4 for interleaved (m a multiple of P).
func configs() []Config {
	var cs []Config
	for p := 1; p <= 8; p++ {
		for m := 1; m <= 16; m++ {
			for _, k := range []Kind{GPipe, OneFOneB, ZBH1} {
				cs = append(cs, Config{Kind: k, Stages: p, Micro: m, Chunks: 1})
			}
			if m%p == 0 {
				for v := 2; v <= 4; v++ {
					cs = append(cs, Config{Kind: Interleaved, Stages: p, Micro: m, Chunks: v})
				}
			}
		}
	}
	return cs
}

func name(c Config) string {
	return fmt.Sprintf("%s/P=%d/m=%d/v=%d", c.Kind, c.Stages, c.Micro, c.Chunks)
}

func build(t *testing.T, c Config) [][]Instr {
	t.Helper()
	lists := make([][]Instr, c.Stages)
	for s := range lists {
		var err error
		if lists[s], err = Build(c, s); err != nil {
			t.Fatalf("%s: Build(stage %d): %v", name(c), s, err)
		}
	}
	return lists
}

type mc struct{ micro, chunk int }

// Each (micro, chunk) runs its forward once, then its backward once (under
// ZB-H1 its B once and then its W once), and the two kinds of backward
// never mix.
func TestForwardBeforeBackwardOnce(t *testing.T) {
	for _, c := range configs() {
		for s, list := range build(t, c) {
			seen := map[mc]map[Op]int{} // op → position
			for pos, in := range list {
				if !in.Op.compute() {
					continue
				}
				key := mc{in.Micro, in.Chunk}
				if seen[key] == nil {
					seen[key] = map[Op]int{}
				}
				if _, dup := seen[key][in.Op]; dup {
					t.Errorf("%s stage %d: %v runs twice", name(c), s, in)
				}
				seen[key][in.Op] = pos
			}
			for i := 0; i < c.Micro; i++ {
				for k := 0; k < c.chunks(); k++ {
					ops := seen[mc{i, k}]
					f, okF := ops[Forward]
					bw, okBW := ops[Backward]
					b, okB := ops[BackwardInput]
					w, okW := ops[BackwardWeight]
					where := fmt.Sprintf("%s stage %d micro %d chunk %d", name(c), s, i, k)
					if !okF {
						t.Errorf("%s: no forward", where)
						continue
					}
					if c.Kind == ZBH1 {
						switch {
						case okBW || !okB || !okW:
							t.Errorf("%s: want one B and one W and no whole backward, got %v", where, ops)
						case !(f < b && b < w):
							t.Errorf("%s: want F < B < W, got positions F %d B %d W %d", where, f, b, w)
						}
						continue
					}
					switch {
					case !okBW || okB || okW:
						t.Errorf("%s: want one whole backward and no B or W, got %v", where, ops)
					case f > bw:
						t.Errorf("%s: backward at %d before forward at %d", where, bw, f)
					}
				}
			}
		}
	}
}

type transfer struct {
	op               Op
	from, to         int // stages
	micro, fromChunk int
	toChunk          int
}

// Activations walk virtual stage j → j+1 and gradients j+1 → j: every
// send is received exactly once by the stage and chunk of the neighbour
// virtual stage, and every receive has its send.
func TestTransfersMatch(t *testing.T) {
	for _, c := range configs() {
		p, v := c.Stages, c.chunks()
		sends := map[transfer]int{}
		recvs := map[transfer]int{}
		for s, list := range build(t, c) {
			for _, in := range list {
				j := in.Chunk*p + s
				switch in.Op {
				case SendAct, SendGrad:
					nj := j + 1
					op := RecvAct
					if in.Op == SendGrad {
						nj, op = j-1, RecvGrad
					}
					if nj < 0 || nj >= p*v {
						t.Errorf("%s stage %d: %v: no virtual stage %d", name(c), s, in, nj)
						continue
					}
					if in.Peer != nj%p {
						t.Errorf("%s stage %d: %v: peer should be %d", name(c), s, in, nj%p)
					}
					sends[transfer{op, s, nj % p, in.Micro, in.Chunk, nj / p}]++
				case RecvAct, RecvGrad:
					pj := j - 1
					if in.Op == RecvGrad {
						pj = j + 1
					}
					if pj < 0 || pj >= p*v {
						t.Errorf("%s stage %d: %v: no virtual stage %d", name(c), s, in, pj)
						continue
					}
					recvs[transfer{in.Op, in.Peer, s, in.Micro, pj / p, in.Chunk}]++
				}
			}
		}
		for tr, n := range sends {
			if n != 1 || recvs[tr] != 1 {
				t.Errorf("%s: %+v sent %d times, received %d times", name(c), tr, n, recvs[tr])
			}
		}
		for tr, n := range recvs {
			if sends[tr] == 0 {
				t.Errorf("%s: %+v received %d times, never sent", name(c), tr, n)
			}
		}
		if p > 1 {
			// Each micro-batch crosses each of the P·v − 1 edges once each way,
			// less the edges inside a stage (none when P > 1).
			if want := 2 * c.Micro * (p*v - 1); len(sends) != want {
				t.Errorf("%s: %d transfers, want %d", name(c), len(sends), want)
			}
		}
	}
}

// The simulation completes; the peak of in-flight activations stays
// within Bound (and is Bound under 1F1B); with unit costs the idle
// fraction is Bubble, and ZB-H1's is below 1F1B's.
func TestSimulate(t *testing.T) {
	for _, c := range configs() {
		sim, err := Simulate(c, Cost{F: 1, B: 1, W: 1})
		if err != nil {
			t.Errorf("%s: %v", name(c), err)
			continue
		}
		for s, peak := range sim.Peak {
			if b := Bound(c, s); peak > b {
				t.Errorf("%s stage %d: peak %d activations, Bound %d", name(c), s, peak, b)
			}
			if c.Kind == OneFOneB {
				if want := min(c.Stages-s, c.Micro); peak != want {
					t.Errorf("%s stage %d: peak %d activations, want min(P−s, m) = %d", name(c), s, peak, want)
				}
			}
		}
		for s, busy := range sim.Busy {
			if want := 3 * float64(c.Micro); math.Abs(busy-want) > 1e-9 {
				t.Errorf("%s stage %d: busy %v, want 3m = %v", name(c), s, busy, want)
			}
		}
		p, m := float64(c.Stages), float64(c.Micro)
		switch c.Kind {
		case ZBH1:
			one := Bubble(Config{Kind: OneFOneB, Stages: c.Stages, Micro: c.Micro, Chunks: 1})
			if c.Stages >= 2 && c.Micro >= c.Stages && !(sim.Idle < one) {
				t.Errorf("%s: idle %v, not below 1F1B's %v", name(c), sim.Idle, one)
			}
			if c.Micro >= c.Stages {
				if want := (p - 1) / (3*m + p - 1); math.Abs(sim.Idle-want) > 1e-9 {
					t.Errorf("%s: idle %v, want (P−1)/(3m+P−1) = %v", name(c), sim.Idle, want)
				}
			}
			if b := Bubble(c); b != sim.Idle {
				t.Errorf("%s: Bubble %v, simulated %v", name(c), b, sim.Idle)
			}
		default:
			if b := Bubble(c); math.Abs(sim.Idle-b) > 1e-9 {
				t.Errorf("%s: idle %v, Bubble %v", name(c), sim.Idle, b)
			}
		}
	}
}

// Any positive costs complete too (the lists' order alone avoids deadlock).
func TestSimulateOtherCosts(t *testing.T) {
	for _, c := range configs() {
		for _, cost := range []Cost{{1, 2, 0.5}, {3, 0.1, 7}} {
			if _, err := Simulate(c, cost); err != nil {
				t.Errorf("%s %+v: %v", name(c), cost, err)
			}
		}
	}
}

func TestSimulateDeadlock(t *testing.T) {
	lists := [][]Instr{
		{{RecvGrad, 0, 0, 1}, {SendAct, 0, 0, 1}},
		{{RecvAct, 0, 0, 0}, {SendGrad, 0, 0, 0}},
	}
	_, err := simulate(2, 1, lists, Cost{1, 1, 1})
	if err == nil || !strings.Contains(err.Error(), "deadlock: stage 0 at RecvGrad(m0,p1), stage 1 at RecvAct(m0,p0)") {
		t.Errorf("err = %v, want the deadlock naming both stages", err)
	}
}

// ZB-H1 keeps the weight-gradient inputs of at most P micro-batches (Bs
// done whose W has not run).
func TestZBH1PendingW(t *testing.T) {
	for _, c := range configs() {
		if c.Kind != ZBH1 {
			continue
		}
		for s, list := range build(t, c) {
			pending, peak := 0, 0
			for _, in := range list {
				switch in.Op {
				case BackwardInput:
					pending++
				case BackwardWeight:
					pending--
				}
				peak = max(peak, pending)
			}
			if peak > c.Stages {
				t.Errorf("%s stage %d: %d Ws pending at once, want ≤ P", name(c), s, peak)
			}
		}
	}
}

// Reduce and then OptimizerStep, once each, after the stage's last backward.
func TestReduceLast(t *testing.T) {
	for _, c := range configs() {
		for s, list := range build(t, c) {
			last, reduce, step, nr, ns := -1, -1, -1, 0, 0
			for pos, in := range list {
				switch in.Op {
				case Backward, BackwardInput, BackwardWeight:
					last = pos
				case Reduce:
					reduce, nr = pos, nr+1
				case OptimizerStep:
					step, ns = pos, ns+1
				}
			}
			if nr != 1 || ns != 1 || !(last < reduce && reduce < step) {
				t.Errorf("%s stage %d: %d Reduce at %d, %d OptimizerStep at %d, last backward at %d", name(c), s, nr, reduce, ns, step, last)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Kind: "pipedream", Stages: 2, Micro: 2}, `Kind: schedule: unknown kind "pipedream" (valid: gpipe, 1f1b, interleaved, zb-h1)`},
		{Config{Kind: GPipe, Stages: 0, Micro: 2}, "Stages = 0"},
		{Config{Kind: OneFOneB, Stages: 2, Micro: 0}, "Micro = 0"},
		{Config{Kind: GPipe, Stages: 2, Micro: 2, Chunks: 2}, "Chunks = 2, want 1 for gpipe"},
		{Config{Kind: ZBH1, Stages: 2, Micro: 2, Chunks: 3}, "Chunks = 3, want 1 for zb-h1"},
		{Config{Kind: Interleaved, Stages: 2, Micro: 4, Chunks: 1}, "Chunks = 1, want ≥ 2"},
		{Config{Kind: Interleaved, Stages: 4, Micro: 6, Chunks: 2}, "Micro = 6, want a multiple of Stages = 4"},
	} {
		err := tc.c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want one containing %q", tc.c, err, tc.want)
		}
		if _, err := Build(tc.c, 0); err == nil {
			t.Errorf("%+v: Build took it", tc.c)
		}
	}
	if err := (Config{Kind: GPipe, Stages: 2, Micro: 2}).Validate(); err != nil {
		t.Errorf("Chunks 0 read as 1: %v", err)
	}
	if _, err := Build(Config{Kind: GPipe, Stages: 2, Micro: 2}, 2); err == nil || !strings.Contains(err.Error(), "stage 2") {
		t.Errorf("stage out of range: err = %v", err)
	}
	if k, err := ParseKind("zb-h1"); k != ZBH1 || err != nil {
		t.Errorf("ParseKind(zb-h1) = %q, %v", k, err)
	}
}

// The shape of 1F1B: stage 0 of two warms up with one forward, then runs
// one forward and one backward in turn, then cools down.
func Example() {
	list, _ := Build(Config{Kind: OneFOneB, Stages: 2, Micro: 4, Chunks: 1}, 0)
	words := make([]string, len(list))
	for i, in := range list {
		words[i] = in.String()
	}
	fmt.Println(strings.Join(words, " "))
	// Output:
	// Load(m0) F(m0) SendAct(m0,p1) Load(m1) F(m1) SendAct(m1,p1) RecvGrad(m0,p1) BW(m0) Load(m2) F(m2) SendAct(m2,p1) RecvGrad(m1,p1) BW(m1) Load(m3) F(m3) SendAct(m3,p1) RecvGrad(m2,p1) BW(m2) RecvGrad(m3,p1) BW(m3) Reduce OptimizerStep
}

// Transfers between a pair of stages are matched in order: for each
// sender, receiver and direction (activations or gradients), the
// micro-batches and chunks the receiver expects come in the order the
// sender sends them, so a link that delivers in order (the data plane's
// point-to-point messages) needs no tags.
func TestTransfersInLinkOrder(t *testing.T) {
	type link struct {
		from, to int
		grad     bool
	}
	for _, c := range configs() {
		lists := build(t, c)
		sent, recvd := map[link][]mc{}, map[link][]mc{}
		for s, list := range lists {
			for _, in := range list {
				switch in.Op {
				case SendAct, SendGrad:
					l := link{s, in.Peer, in.Op == SendGrad}
					// What the receiver will call it: the next (or
					// previous) virtual stage's chunk.
					k := in.Chunk
					if in.Op == SendAct && s == c.Stages-1 {
						k++
					}
					if in.Op == SendGrad && s == 0 {
						k--
					}
					sent[l] = append(sent[l], mc{in.Micro, k})
				case RecvAct, RecvGrad:
					l := link{in.Peer, s, in.Op == RecvGrad}
					recvd[l] = append(recvd[l], mc{in.Micro, in.Chunk})
				}
			}
		}
		for l, want := range sent {
			if got := recvd[l]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: link %d→%d (grad %v) sends %v, receives %v", name(c), l.from, l.to, l.grad, want, got)
			}
		}
		for l, got := range recvd {
			if _, ok := sent[l]; !ok {
				t.Errorf("%s: link %d→%d (grad %v) receives %v, sends nothing", name(c), l.from, l.to, l.grad, got)
			}
		}
	}
}
