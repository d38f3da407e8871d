// \file GEMM against a right operand packed once and read many times.
//
// A compiled Tree-LSTM step multiplies each weight matrix by every tree
// level's rows: dozens of products with a few to a few hundred rows each.
// OpenBLAS re-packs the weight (and the rows) at every call, which at these
// sizes costs as much as the arithmetic. Here the weight is packed once per
// step into panels of kPackedPanel columns, and a micro-kernel reads the left
// operand's rows where they lie: 12×16 with AVX-512 where the CPU has it,
// else 6×16 with AVX2/FMA. The two sum each element in the same order with
// the same fused multiply-adds, so their results agree bit for bit.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace pejit {

inline constexpr int64_t kPackedPanel = 16;  // columns per panel

// Whether this CPU has a micro-kernel's instructions (AVX2 and FMA at
// least). The functions below work everywhere; without them they run a plain
// loop, so the compiler only packs where this is true.
bool PackedGemmFast();

// The micro-kernels, for tests and benchmarks to compare; GemmPacked uses
// the best this CPU has.
enum class GemmIsa { kPlain, kAvx2, kAvx512 };
GemmIsa BestGemmIsa();
bool GemmIsaSupported(GemmIsa isa);
const char* GemmIsaName(GemmIsa isa);

// The packed form of a k×n right operand: (panels, k, kPackedPanel) with
// panels = ceil(n / kPackedPanel), columns past n zero.
Shape PackedShape(int64_t k, int64_t n);

// Packs op(B), k×n: B is stored k×n (transpose false) or n×k (transpose
// true), rows ldb apart.
void PackGemmRhs(bool transpose, int64_t k, int64_t n, const float* b, int64_t ldb, float* packed);
// Packs rows [first, first + rows) of a k×n operand B stored k×n (`b` at row
// `first`, rows ldb apart) where they go in the packed form of all k rows:
// operands stacked along k pack piece by piece, never stacked first.
void PackGemmRhsRows(int64_t k, int64_t first, int64_t rows, int64_t n, const float* b, int64_t ldb, float* packed);

// Row-major C[m×n] = A[m×k]·op(B) (+ C when accumulate), op(B) packed by
// PackGemmRhs; A's and C's rows lda and ldc apart.
void GemmPacked(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                int64_t ldc, bool accumulate);
// The same with a given micro-kernel (the best supported one where this CPU
// lacks `isa`).
void GemmPackedWith(GemmIsa isa, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed,
                    float* c, int64_t ldc, bool accumulate);

}  // namespace pejit
