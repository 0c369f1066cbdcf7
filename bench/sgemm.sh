#!/usr/bin/env bash
# Compute figure of issue 14: SGEMM GFLOP/s of nn's matrix product in both
# builds against OpenBLAS called directly from C, on the MLP's first-layer
# shapes (784→512, batch 256), one core each, measured in one run.
#   bash bench/sgemm.sh            # prints a Markdown table
# Columns: OpenBLAS from C (cblas_sgemm, gcc -O2, OPENBLAS_NUM_THREADS=1);
# nn in the openblas build (go test -tags openblas, cgo, gonum's netlib
# wrapper); nn in the pure-Go build (CGO_ENABLED=0, gonum). Go runs with
# GOMAXPROCS=1 (-cpu 1): gonum's Sgemm would otherwise spread over every core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-openblas
BENCHTIME="${BENCHTIME:-2s}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/sgemm.c" <<'C'
// The shapes of nn's BenchmarkSGEMM, row-major, alpha 1, beta 0, through
// cblas_sgemm; prints "name GFLOP/s" per shape, the mean over about two
// seconds after a warm-up, as Go's benchmarks do.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *matrix(int n) {
  float *m = malloc(sizeof(float) * n);
  for (int i = 0; i < n; i++) m[i] = (float)rand() / RAND_MAX - 0.5f;
  return m;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2;
  enum { batch = 256, in = 784, out = 512 };
  float *x = matrix(batch * in), *w = matrix(in * out), *dy = matrix(batch * out);
  float *y = matrix(batch * out), *dw = matrix(in * out), *dx = matrix(batch * in);
  struct {
    const char *name;
    enum CBLAS_TRANSPOSE ta, tb;
    int m, n, k;
    const float *a; int lda;
    const float *b; int ldb;
    float *c; int ldc;
  } cases[] = {
    {"forward-256x784x512", CblasNoTrans, CblasNoTrans, batch, out, in, x, in, w, out, y, out},
    {"grad-weights-784x256x512", CblasTrans, CblasNoTrans, in, out, batch, x, in, dy, out, dw, out},
    {"grad-input-256x512x784", CblasNoTrans, CblasTrans, batch, in, out, dy, out, w, out, dx, in},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    __typeof__(cases[0]) *c = &cases[i];
    for (int r = 0; r < 5; r++)
      cblas_sgemm(CblasRowMajor, c->ta, c->tb, c->m, c->n, c->k, 1, c->a, c->lda, c->b, c->ldb, 0, c->c, c->ldc);
    long calls = 0;
    double start = now(), elapsed;
    do {
      cblas_sgemm(CblasRowMajor, c->ta, c->tb, c->m, c->n, c->k, 1, c->a, c->lda, c->b, c->ldb, 0, c->c, c->ldc);
      calls++;
    } while ((elapsed = now() - start) < seconds);
    printf("%s %.2f\n", c->name, 2.0 * c->m * c->n * c->k * calls / elapsed / 1e9);
  }
  return 0;
}
C
gcc -O2 -o "$tmp/sgemm" "$tmp/sgemm.c" -lopenblas
export OPENBLAS_NUM_THREADS=1
"$tmp/sgemm" "${BENCHTIME%s}" > "$tmp/direct"
# "BenchmarkSGEMM/NAME  N  T ns/op  G GFLOP/s" -> "NAME G"
gflops() { awk '$1 ~ /^BenchmarkSGEMM\// { sub(/^BenchmarkSGEMM\//, "", $1); for (i = 2; i < NF; i++) if ($(i+1) == "GFLOP/s") print $1, $i }'; }
CGO_ENABLED=1 go test -tags openblas -count=1 -v -run '^TestBLASNamed$' -bench '^BenchmarkSGEMM$' -benchtime "$BENCHTIME" -cpu 1 ./nn/ | tee "$tmp/openblas.raw" | gflops > "$tmp/openblas"
CGO_ENABLED=0 go test -count=1 -v -run '^TestBLASNamed$' -bench '^BenchmarkSGEMM$' -benchtime "$BENCHTIME" -cpu 1 ./nn/ | tee "$tmp/gonum.raw" | gflops > "$tmp/gonum"
echo "nn, openblas build: $(grep -o 'BLAS: .*' "$tmp/openblas.raw" | head -n 1)"
echo "nn, pure-Go build: $(grep -o 'BLAS: .*' "$tmp/gonum.raw" | head -n 1)"
echo "OpenBLAS from C: $(gcc -O2 -x c -o "$tmp/config" - -lopenblas <<<'char *openblas_get_config(void); int puts(const char *); int main(void) { puts(openblas_get_config()); return 0; }' && "$tmp/config")"
echo
echo "| SGEMM (m×k×n) | OpenBLAS from C | nn, openblas build | ratio to C | nn, pure-Go build | ratio to C |"
echo "|---|---|---|---|---|---|"
join <(sort "$tmp/direct") <(sort "$tmp/openblas") | join - <(sort "$tmp/gonum") |
  awk '{ printf "| %s | %.1f GFLOP/s | %.1f | %.2f | %.1f | %.2f |\n", $1, $2, $3, $3 / $2, $4, $4 / $2 }'
