package ps

// index maps keys to row numbers: open addressing with linear probing, the
// key and its row side by side so that a lookup costs one cache miss. It
// grows at half full.
type index struct {
	slots []uint64 // pairs: key, row+1 (0: empty)
	mask  uint64   // slot pairs - 1
	n     int
}

func newIndex() *index {
	const initial = 1 << 10
	return &index{slots: make([]uint64, 2*initial), mask: initial - 1}
}

// get returns key's row.
func (x *index) get(k uint64) (uint32, bool) {
	for i := mix(k) & x.mask; ; i = (i + 1) & x.mask {
		s := x.slots[2*i : 2*i+2 : 2*i+2]
		if s[1] == 0 {
			return 0, false
		}
		if s[0] == k {
			return uint32(s[1] - 1), true
		}
	}
}

// put sets key's row (key must not be present).
func (x *index) put(k uint64, row uint32) {
	if 2*(x.n+1) > len(x.slots)/2 {
		x.grow()
	}
	x.insert(k, row)
	x.n++
}

func (x *index) insert(k uint64, row uint32) {
	for i := mix(k) & x.mask; ; i = (i + 1) & x.mask {
		if x.slots[2*i+1] == 0 {
			x.slots[2*i], x.slots[2*i+1] = k, uint64(row)+1
			return
		}
	}
}

func (x *index) grow() {
	old := x.slots
	x.slots = make([]uint64, 2*len(old))
	x.mask = uint64(len(x.slots)/2 - 1)
	for i := 0; i < len(old); i += 2 {
		if old[i+1] != 0 {
			x.insert(old[i], uint32(old[i+1]-1))
		}
	}
}
