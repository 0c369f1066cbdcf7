// Package bytesize reads and writes byte counts the way Phalanx's flags
// and reports show them: 4096, 64KiB, 16MiB, 1GiB.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse reads "4096", "4KiB", "16MiB", "1GiB" (also "K", "M", "G", "B").
func Parse(s string) (int, error) {
	units := []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	num, mult := strings.TrimSpace(s), 1
	for _, u := range units {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = v, u.mult
			break
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a byte count such as 4096, 64KiB or 16MiB", s)
	}
	return n * mult, nil
}

// ParseList reads comma-separated sizes, each a whole number of elem-byte
// elements.
func ParseList(list string, elem int) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := Parse(s)
		if err != nil {
			return nil, err
		}
		if n%elem != 0 {
			return nil, fmt.Errorf("size %q is not a whole number of %d-byte elements", s, elem)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes given")
	}
	return out, nil
}

// Format shows n in B, KiB, MiB or GiB.
func Format(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
