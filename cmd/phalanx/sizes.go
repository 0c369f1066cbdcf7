package main

import (
	"fmt"
	"strconv"
	"strings"
)

// parseSize reads "4096", "4KiB", "16MiB", "1GiB" (also "K", "M", "G").
func parseSize(s string) (int, error) {
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

func parseSizes(list string, elem int) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := parseSize(s)
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
