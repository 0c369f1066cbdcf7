//go:build cgo && openblas

package nn

/*
#cgo LDFLAGS: -lopenblas
char *openblas_get_config(void);
char *openblas_get_corename(void);
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
*/
import "C"

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/netlib/blas/netlib"
)

// blasImpl is OpenBLAS through gonum's cgo CBLAS wrapper (build tag
// openblas; Debian's libopenblas-dev, see scripts/install-openblas).
type blasImpl = netlib.Implementation

// One OpenBLAS thread per rank: a rank is one process given its share of the
// cores, and a multi-threaded SGEMM in each of N ranks on N cores would
// oversubscribe them. A count set explicitly in the environment (read by
// OpenBLAS itself when it loads) is respected. Single-threaded OpenBLAS is
// also what keeps a product's summation order, and so its bits, the same on
// every rank.
func init() {
	if !threadsFromEnv(os.Getenv) {
		C.openblas_set_num_threads(1)
	}
}

// threadsFromEnv reports whether one of the variables OpenBLAS reads sets
// its thread count.
func threadsFromEnv(getenv func(string) string) bool {
	for _, v := range []string{"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"} {
		if n, err := strconv.Atoi(strings.TrimSpace(getenv(v))); err == nil && n > 0 {
			return true
		}
	}
	return false
}

const blasCgo = true

func blasName() string {
	version := "?"
	if f := strings.Fields(C.GoString(C.openblas_get_config())); len(f) > 1 {
		version = f[1]
	}
	threads := int(C.openblas_get_num_threads())
	unit := "threads"
	if threads == 1 {
		unit = "thread"
	}
	return fmt.Sprintf("openblas %s %s, %d %s (cgo)", version, C.GoString(C.openblas_get_corename()), threads, unit)
}
