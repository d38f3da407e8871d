// Throughput of the reference kernels: elementwise ops in bytes/s beside a
// memcpy of the same size (the memory-bandwidth ceiling they should approach),
// and matmul in GFLOP/s at the shapes a small model's layers have.
//
// Kernels are called directly (op.kernel) on outputs allocated before the
// timed loop, so what is measured is the loop, not the allocator or the
// type rule.
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ops/blas.h"
#include "ops/op.h"
#include "ops/packed_gemm.h"
#include "ops/random.h"

namespace pejit {
namespace {

// Single-threaded figures: pejit runs its own parallelism (a oneTBB pool) and
// calls OpenBLAS from inside it with one thread, so that is the configuration
// worth measuring; OpenBLAS's own threads would also make small GEMMs noisy.
void SingleThreaded() { SetBlasThreads(1); }

[[maybe_unused]] const bool kContextAdded = [] {
  benchmark::AddCustomContext("openblas", BlasConfig());
  return true;
}();

// An op ready to run: normalized attributes, inputs, preallocated outputs.
struct PreparedOp {
  PreparedOp(std::string_view name, std::vector<Tensor> in, const Attrs& given = {})
      : op(LookupOp(name)), attrs(NormalizeAttrs(op, given)), inputs(std::move(in)) {
    std::vector<TensorType> types;
    for (const Tensor& t : inputs) types.push_back(t.type());
    for (const TensorType& t : InferTypes(op, types, attrs)) {
      outputs.push_back(Tensor::Zeros(t.dtype, t.shape));
    }
  }

  void Run() {
    op.kernel(inputs, outputs, attrs);
    benchmark::DoNotOptimize(outputs[0].raw_data());
    benchmark::ClobberMemory();
  }

  // Bytes of all inputs and outputs: each tensor read or written once.
  int64_t Bytes() const {
    size_t bytes = 0;
    for (const Tensor& t : inputs) bytes += t.nbytes();
    for (const Tensor& t : outputs) bytes += t.nbytes();
    return static_cast<int64_t>(bytes);
  }

  const OpDef& op;
  Attrs attrs;
  std::vector<Tensor> inputs, outputs;
};

void RunElementwise(benchmark::State& state, PreparedOp& op) {
  for (auto _ : state) op.Run();
  state.SetBytesProcessed(state.iterations() * op.Bytes());
}

// ---- Elementwise, f32; state.range(0) is the element count ----------------------------------------------

void BM_Memcpy(benchmark::State& state) {
  SingleThreaded();
  const int64_t n = state.range(0);
  Tensor src = Tensor::Ones(DType::kF32, {n}), dst = Tensor::Zeros(DType::kF32, {n});
  for (auto _ : state) {
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
    benchmark::DoNotOptimize(dst.raw_data());
    benchmark::ClobberMemory();
  }
  // Read + written, like the elementwise ops.
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * src.nbytes()));
}

void BM_Add(benchmark::State& state) {
  SingleThreaded();
  Rng rng(1);
  const int64_t n = state.range(0);
  PreparedOp op("add", {RandomUniform(rng, {n}, -1, 1), RandomUniform(rng, {n}, -1, 1)});
  RunElementwise(state, op);
}

// (rows, cols) * (cols,): one row vector broadcast over every row. The vector
// stays in cache, so its bytes count once.
void BM_MulBroadcastRows(benchmark::State& state) {
  SingleThreaded();
  Rng rng(1);
  const int64_t n = state.range(0);
  int64_t cols = 1;
  while (cols * cols < n) cols *= 2;
  PreparedOp op("mul", {RandomUniform(rng, {n / cols, cols}, -1, 1), RandomUniform(rng, {cols}, -1, 1)});
  RunElementwise(state, op);
}

void BM_Exp(benchmark::State& state) {
  SingleThreaded();
  Rng rng(1);
  PreparedOp op("exp", {RandomUniform(rng, {state.range(0)}, -4, 4)});
  RunElementwise(state, op);
}

void BM_Sigmoid(benchmark::State& state) {
  SingleThreaded();
  Rng rng(1);
  PreparedOp op("sigmoid", {RandomUniform(rng, {state.range(0)}, -4, 4)});
  RunElementwise(state, op);
}

// 64K elements (256 KiB per f32 tensor: in L2) and 1M (4 MiB: in L3 or memory).
#define PEJIT_ELEMENTWISE_SIZES ->Arg(1 << 16)->Arg(1 << 20)

BENCHMARK(BM_Memcpy) PEJIT_ELEMENTWISE_SIZES;
BENCHMARK(BM_Add) PEJIT_ELEMENTWISE_SIZES;
BENCHMARK(BM_MulBroadcastRows) PEJIT_ELEMENTWISE_SIZES;
BENCHMARK(BM_Exp) PEJIT_ELEMENTWISE_SIZES;
BENCHMARK(BM_Sigmoid) PEJIT_ELEMENTWISE_SIZES;

// ---- GEMM: matmul of (M, K) by (K, N) in f32 -----------------------------------------------------------

void BM_Matmul(benchmark::State& state) {
  SingleThreaded();
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  Rng rng(1);
  PreparedOp op("matmul", {RandomUniform(rng, {m, k}, -1, 1), RandomUniform(rng, {k, n}, -1, 1)});
  for (auto _ : state) op.Run();
  // A multiply and an add per term; in units of 1e9 so the rate reads GFLOP/s.
  const double gflop = 2.0 * static_cast<double>(m * n * k) * 1e-9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflop * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

// One row (batch-1 inference), a small and a medium batch through a 128->512
// layer, and a square 512 product.
BENCHMARK(BM_Matmul)
    ->ArgNames({"M", "K", "N"})
    ->Args({1, 128, 512})
    ->Args({32, 128, 512})
    ->Args({128, 128, 512})
    ->Args({512, 512, 512})
    ->Args({5, 3072, 1024})
    ->Args({25, 3072, 1024})
    ->Args({100, 3072, 1024})
    ->Args({100, 8192, 512});

// ---- Packed GEMM: the micro-kernels side by side ----------------------------------------------------------

// (M, K) rows against a weight packed once, as compiled steps multiply: a
// Tree-LSTM level's few rows through its 128 -> 384 gates, a larger level,
// and the weight gradient's long inner dimension. Arg 3 is the kernel
// (GemmIsa); one the CPU lacks is skipped.
void BM_PackedGemm(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const auto isa = static_cast<GemmIsa>(state.range(3));
  if (!GemmIsaSupported(isa)) {
    state.SkipWithError("this CPU lacks the kernel");
    return;
  }
  state.SetLabel(GemmIsaName(isa));
  Rng rng(1);
  Tensor a = RandomUniform(rng, {m, k}, -1, 1), b = RandomUniform(rng, {k, n}, -1, 1);
  std::vector<float> packed(static_cast<size_t>(NumElements(PackedShape(k, n)))), c(static_cast<size_t>(m * n));
  PackGemmRhs(false, k, n, b.data<float>(), n, packed.data());
  for (auto _ : state) {
    GemmPackedWith(isa, m, n, k, a.data<float>(), k, packed.data(), c.data(), n, false);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  const double gflop = 2.0 * static_cast<double>(m * n * k) * 1e-9;
  state.counters["GFLOP/s"] = benchmark::Counter(gflop * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

void PackedGemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "isa"});
  for (auto [m, k, n] : {std::tuple{4, 128, 384}, {10, 128, 384}, {32, 128, 384}, {256, 64, 384}, {128, 2000, 384},
                         {5, 3072, 1024}, {25, 3072, 1024}, {100, 3072, 1024}, {100, 8192, 512}}) {
    for (GemmIsa isa : {GemmIsa::kAvx2, GemmIsa::kAvx512}) b->Args({m, k, n, static_cast<int64_t>(isa)});
  }
}
BENCHMARK(BM_PackedGemm)->Apply(PackedGemmArgs);

// Packing a weight, as every compiled call does for each weight it
// multiplies by (stored as is, or transposed for the other orientation):
// the Tree-LSTM's 128 x 384 gates and 128 x 128 cell weights.
void BM_PackGemmRhs(benchmark::State& state) {
  const int64_t k = state.range(0), n = state.range(1);
  const bool transpose = state.range(2) != 0;
  Rng rng(1);
  Tensor b = transpose ? RandomUniform(rng, {n, k}, -1, 1) : RandomUniform(rng, {k, n}, -1, 1);
  std::vector<float> packed(static_cast<size_t>(NumElements(PackedShape(k, n))));
  for (auto _ : state) {
    PackGemmRhs(transpose, k, n, b.data<float>(), transpose ? k : n, packed.data());
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * k * n * 4);
}
BENCHMARK(BM_PackGemmRhs)->ArgNames({"K", "N", "transpose"})->ArgsProduct({{128}, {128, 384}, {0, 1}});

}  // namespace
}  // namespace pejit
