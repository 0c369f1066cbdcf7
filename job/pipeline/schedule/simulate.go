package schedule

import (
	"fmt"
	"sort"
	"strings"
)

// Cost is the time of a micro-batch's computations on a whole stage: F the
// forward, B the input gradient, W the weight gradient (Backward costs
// B+W). A chunk of an interleaved stage costs 1/Chunks of these. Loads,
// sends, receives, Reduce and OptimizerStep cost 0.
type Cost struct{ F, B, W float64 }

// Sim is the result of Simulate.
type Sim struct {
	Makespan float64   // when the last stage ends its step
	Busy     []float64 // each stage's time computing
	IdleFrac []float64 // each stage's 1 − Busy/Makespan
	Idle     float64   // the mean of IdleFrac
	// Peak is each stage's most in-flight activations: forwards done whose
	// Backward (under ZB-H1, whose B) has not run. A W needs only the
	// inputs of the weight gradient, which are not counted.
	Peak []int
}

type msgKey struct {
	grad   bool
	micro  int
	target int // the receiving virtual stage
}

// Simulate runs every stage's list for c as a discrete-event simulation:
// a stage runs its instructions in order, each taking its cost; a receive
// waits until the matching send has run (sends do not block). It returns
// an error on deadlock, naming the stuck stages and their next
// instructions, or when a transfer does not match (a receive with a wrong
// peer, a send twice, a send never received).
func Simulate(c Config, cost Cost) (Sim, error) {
	if err := c.Validate(); err != nil {
		return Sim{}, err
	}
	p, v := c.Stages, c.chunks()
	lists := make([][]Instr, p)
	for s := range p {
		var err error
		if lists[s], err = Build(c, s); err != nil {
			return Sim{}, err
		}
	}
	return simulate(p, v, lists, cost)
}

func simulate(p, v int, lists [][]Instr, cost Cost) (Sim, error) {
	scale := 1 / float64(v)
	sent := map[msgKey]float64{}
	received := map[msgKey]bool{}
	pc := make([]int, p)
	clock := make([]float64, p)
	busy := make([]float64, p)
	inflight, peak := make([]int, p), make([]int, p)
	for {
		progressed, finished := false, 0
		for s := range p {
			for pc[s] < len(lists[s]) {
				in := lists[s][pc[s]]
				j := in.Chunk*p + s
				var d float64
				switch in.Op {
				case Forward:
					d = cost.F
					inflight[s]++
					peak[s] = max(peak[s], inflight[s])
				case Backward:
					d = cost.B + cost.W
					inflight[s]--
				case BackwardInput:
					d = cost.B
					inflight[s]--
				case BackwardWeight:
					d = cost.W
				case SendAct, SendGrad:
					k := msgKey{in.Op == SendGrad, in.Micro, j + 1}
					if k.grad {
						k.target = j - 1
					}
					if k.target < 0 || k.target >= p*v || k.target%p != in.Peer {
						return Sim{}, fmt.Errorf("schedule: stage %d: %v: peer should be stage %d", s, in, ((k.target%p)+p)%p)
					}
					if _, dup := sent[k]; dup {
						return Sim{}, fmt.Errorf("schedule: stage %d: %v sent twice", s, in)
					}
					sent[k] = clock[s]
				case RecvAct, RecvGrad:
					k := msgKey{in.Op == RecvGrad, in.Micro, j}
					from := j - 1
					if k.grad {
						from = j + 1
					}
					if from < 0 || from >= p*v || from%p != in.Peer {
						return Sim{}, fmt.Errorf("schedule: stage %d: %v: no such sender", s, in)
					}
					t, ok := sent[k]
					if !ok {
						goto blocked
					}
					if received[k] {
						return Sim{}, fmt.Errorf("schedule: stage %d: %v received twice", s, in)
					}
					received[k] = true
					clock[s] = max(clock[s], t)
				}
				if in.Op.compute() {
					d *= scale
					clock[s] += d
					busy[s] += d
				}
				pc[s]++
				progressed = true
			}
		blocked:
			if pc[s] == len(lists[s]) {
				finished++
			}
		}
		if finished == p {
			break
		}
		if !progressed {
			var stuck []string
			for s := range p {
				if pc[s] < len(lists[s]) {
					stuck = append(stuck, fmt.Sprintf("stage %d at %v", s, lists[s][pc[s]]))
				}
			}
			return Sim{}, fmt.Errorf("schedule: deadlock: %s", strings.Join(stuck, ", "))
		}
	}
	var lost []string
	for k := range sent {
		if !received[k] {
			lost = append(lost, fmt.Sprintf("%+v", k))
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		return Sim{}, fmt.Errorf("schedule: sent and never received: %s", strings.Join(lost, ", "))
	}
	sim := Sim{Busy: busy, IdleFrac: make([]float64, p), Peak: peak}
	for _, t := range clock {
		sim.Makespan = max(sim.Makespan, t)
	}
	for s := range p {
		if sim.Makespan > 0 {
			sim.IdleFrac[s] = 1 - busy[s]/sim.Makespan
		}
		sim.Idle += sim.IdleFrac[s] / float64(p)
	}
	return sim, nil
}
