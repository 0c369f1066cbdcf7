// Package testclock is a clock a test moves by hand, for code that takes
// its clock as a func() time.Time. It is for tests only.
package testclock

import (
	"sync"
	"time"
)

// Manual is a clock that stands still until Advance moves it; safe for
// concurrent use.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// New is a clock standing at t.
func New(t time.Time) *Manual { return &Manual{now: t} }

// Now is the clock's time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward.
func (c *Manual) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
