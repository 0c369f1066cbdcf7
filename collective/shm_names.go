package collective

import (
	"fmt"
	"strconv"
	"strings"
)

// ShmSegmentOf says whether name is one of job's shared-memory segment
// files, as the shared-memory transport names them: a rank segment
// (phalanx-<job hash>-g<gen>-r<rank>-<nonce>) or a pair segment
// (phalanx-<job hash>-g<gen>-p<lo>-<hi>-<nonce>) of any generation.
func ShmSegmentOf(name, job string) bool {
	rest, ok := strings.CutPrefix(name, fmt.Sprintf("phalanx-%016x-g", JobHash(job)))
	if !ok {
		return false
	}
	f := strings.Split(rest, "-")
	num := func(s string) bool { _, err := strconv.ParseUint(s, 10, 64); return err == nil }
	nonce := func(s string) bool { _, err := strconv.ParseUint(s, 16, 64); return err == nil && len(s) == 16 }
	switch {
	case len(f) == 3 && strings.HasPrefix(f[1], "r"):
		return num(f[0]) && num(f[1][1:]) && nonce(f[2])
	case len(f) == 4 && strings.HasPrefix(f[1], "p"):
		return num(f[0]) && num(f[1][1:]) && num(f[2]) && nonce(f[3])
	}
	return false
}
