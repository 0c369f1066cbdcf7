//go:build cgo && openblas

package nn

import (
	"os"
	"strings"
	"testing"
)

// blasAllocates: OpenBLAS, one thread, allocates nothing in Go.
const blasAllocates = false

func TestOpenBLASOneThreadPerRank(t *testing.T) {
	name := BLAS()
	if !strings.HasPrefix(name, "openblas ") {
		t.Fatalf("BLAS() = %q in the openblas build", name)
	}
	if !threadsFromEnv(os.Getenv) && !strings.Contains(name, ", 1 thread ") {
		t.Errorf("BLAS() = %q: want one thread when the environment sets none", name)
	}
}

func TestThreadsFromEnv(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OPENBLAS_NUM_THREADS": "2"}, true},
		{map[string]string{"OMP_NUM_THREADS": " 1 "}, true},
		{map[string]string{"GOTO_NUM_THREADS": "4"}, true},
		{map[string]string{"OPENBLAS_NUM_THREADS": "0"}, false},
		{map[string]string{"OPENBLAS_NUM_THREADS": "many"}, false},
	}
	for _, tc := range cases {
		if got := threadsFromEnv(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("threadsFromEnv(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}
