package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

var (
	// ErrNotRoot means the process cannot create network namespaces.
	ErrNotRoot = errors.New("netns: needs root to create network namespaces")
	// ErrNoIP means iproute2's ip command is not on PATH.
	ErrNoIP = errors.New("netns: iproute2's ip command not found (run scripts/install-netns-deps)")
)

// verdict is what Require does with a test.
type verdict int

const (
	run verdict = iota
	skip
	fail
)

// decide is Require's rule: run when labs can be built; otherwise skip, or
// fail when running under CI (CI=true), where a skip would hide lost coverage.
func decide(euid int, ipErr error, ci string) (verdict, error) {
	var err error
	switch {
	case euid != 0:
		err = ErrNotRoot
	case ipErr != nil:
		err = fmt.Errorf("%w: %v", ErrNoIP, ipErr)
	default:
		return run, nil
	}
	if ci == "true" {
		return fail, err
	}
	return skip, err
}

// Check reports whether this process can build labs: nil, or an error
// wrapping ErrNotRoot or ErrNoIP.
func Check() error {
	_, ipErr := exec.LookPath("ip")
	_, err := decide(os.Geteuid(), ipErr, "")
	return err
}

// Require skips t loudly unless this process can build labs (root and ip),
// and fails it instead when CI=true.
func Require(t testing.TB) {
	t.Helper()
	_, ipErr := exec.LookPath("ip")
	switch v, err := decide(os.Geteuid(), ipErr, os.Getenv("CI")); v {
	case fail:
		t.Fatalf("%v (CI=true: this test must run)", err)
	case skip:
		t.Skipf("SKIPPING: %v; skipping %s (run as root to cover it)", err, t.Name())
	}
}
