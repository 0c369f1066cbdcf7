package bench

import (
	"io"
	"slices"
)

// Output is where and how the Write functions print results: aligned text
// for people, or with JSON one object per line and nothing else, which the
// scripts under bench/ read.
type Output struct {
	W    io.Writer
	JSON bool
}

// median is the middle of xs, the mean of the middle two for an even count.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
