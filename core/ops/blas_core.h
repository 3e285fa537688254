// Which OpenBLAS kernels this process runs, for `starling info` and the benchmarks' output.
// OpenBLAS's dynamic-architecture builds (Debian's) pick a kernel family per CPU at start-up,
// or the one OPENBLAS_CORETYPE names; the choice moves GEMM-bound training by 1.5x (on a Zen 5
// core the char GPT's step takes 28 ms with the AVX-512 Cooperlake kernels OpenBLAS 0.3.21
// detects, 44 ms with OPENBLAS_CORETYPE=Haswell), so every figure says which ran.
#pragma once

#include <string>

namespace starling::ops {

// OpenBLAS's name for the kernels in use ("Cooperlake", "Haswell", ...), "unknown" for a BLAS
// that does not say, with " (OPENBLAS_CORETYPE=...)" appended when the environment chose them.
std::string blas_core();

}  // namespace starling::ops
