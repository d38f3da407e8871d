// OpDef::split (ops/op.h): for every operator that divides its work among
// threads, all parts together write every element of the outputs, with the
// whole kernel's values; with the bits of the whole kernel where pejit's own
// code computes them (packed products, splits), with bits that depend only
// on the number of parts where OpenBLAS does (it may order a dot product's
// terms by the shape it is given): never on which thread runs which part.
// OpenBLAS runs on one thread, as in the engine, whose team runs the parts
// (under ThreadSanitizer its own thread pool gave wrong products).
#include <gtest/gtest.h>

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

struct Case {
  std::string op;
  std::vector<Tensor> inputs;
  Attrs attrs;
};

// Outputs of `op` preallocated from its shape rule and filled with a byte
// pattern, so an element no part writes shows up.
std::vector<Tensor> Outputs(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  std::vector<Tensor> outputs;
  for (const TensorType& t : InferTypes(op, types, attrs)) {
    Tensor out = Tensor::Empty(t.dtype, t.shape);
    std::memset(out.raw_data(), 0x7f, out.nbytes());
    outputs.push_back(out);
  }
  return outputs;
}

enum class Bits { kOfTheWhole, kOfThePartsCount };

void ExpectPartsEqualTheWhole(const Case& c, Bits bits) {
  SCOPED_TRACE(c.op + " " + c.attrs.ToString());
  SetBlasThreads(1);
  const OpDef& op = LookupOp(c.op);
  ASSERT_TRUE(op.split.kernel && op.split.max_parts);
  Attrs attrs = NormalizeAttrs(op, c.attrs);
  std::vector<Tensor> whole = Outputs(op, c.inputs, attrs);
  op.kernel(c.inputs, whole, attrs);
  std::vector<TensorType> in_types, out_types;
  for (const Tensor& t : c.inputs) in_types.push_back(t.type());
  for (const Tensor& t : whole) out_types.push_back(t.type());
  const int64_t most = op.split.max_parts(in_types, out_types, attrs);
  ASSERT_GT(most, 1) << "these operands should divide";
  for (int64_t parts : {int64_t{2}, int64_t{3}, std::min<int64_t>(most, 8), most + 3}) {
    std::vector<Tensor> split = Outputs(op, c.inputs, attrs), again = Outputs(op, c.inputs, attrs);
    // In reverse order: no part may rely on another having run.
    for (int64_t p = parts; p-- > 0;) op.split.kernel(c.inputs, split, attrs, p, parts);
    for (int64_t p = 0; p < parts; ++p) op.split.kernel(c.inputs, again, attrs, p, parts);
    for (size_t i = 0; i < whole.size(); ++i) {
      const bool same = std::memcmp(whole[i].raw_data(), split[i].raw_data(), whole[i].nbytes()) == 0;
      if (bits == Bits::kOfTheWhole) {
        EXPECT_TRUE(same) << parts << " parts, output " << i;
      } else {
        EXPECT_TRUE(AllClose(split[i], whole[i], 1e-5, 1e-5)) << parts << " parts, output " << i;
      }
      EXPECT_EQ(std::memcmp(again[i].raw_data(), split[i].raw_data(), whole[i].nbytes()), 0)
          << parts << " parts in another order, output " << i;
    }
  }
}

Tensor Normal(Rng& rng, Shape shape) { return RandomNormal(rng, std::move(shape), 0, 1); }

Tensor Packed(Rng& rng, int64_t k, int64_t n) {
  Tensor b = Normal(rng, {k, n});
  Tensor packed = Tensor::Empty(DType::kF32, PackedShape(k, n));
  PackGemmRhs(false, k, n, b.data<float>(), n, packed.data<float>());
  return packed;
}

TEST(KernelSplit, ProductsSplitByRowsOrPanelsGiveTheWholeProductsBits) {
  Rng rng(1);
  std::vector<Case> blas, packed;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [m, k, n] : {std::tuple{100, 64, 48}, std::tuple{7, 300, 130}}) {
        Tensor a = Normal(rng, ta ? Shape{k, m} : Shape{m, k}), b = Normal(rng, tb ? Shape{n, k} : Shape{k, n});
        blas.push_back({"matmul", {a, b}, Attrs{{"transpose_a", ta}, {"transpose_b", tb}}});
      }
    }
  }
  blas.push_back({"matmul", {Normal(rng, {5, 20, 30}), Normal(rng, {5, 30, 10})}, {}});
  blas.push_back({"dense", {Normal(rng, {77, 40}), Normal(rng, {24, 40}), Normal(rng, {24})}, {}});
  for (auto [m, k, n] : {std::tuple{90, 64, 40}, std::tuple{9, 64, 100}}) {
    packed.push_back({"packed_matmul", {Normal(rng, {m, k}), Packed(rng, k, n)}, Attrs{{"n", int64_t{n}}}});
    packed.push_back({"packed_dense", {Normal(rng, {m, k}), Packed(rng, k, n), Normal(rng, {n})}, {}});
  }
  for (const Case& c : blas) ExpectPartsEqualTheWhole(c, Bits::kOfThePartsCount);
  for (const Case& c : packed) ExpectPartsEqualTheWhole(c, Bits::kOfTheWhole);
}

TEST(KernelSplit, SplitsAlongAnInnerAxisDivideByRows) {
  Rng rng(2);
  Tensor x = Normal(rng, {37, 1, 384});
  ExpectPartsEqualTheWhole({"chunk", {x}, Attrs{{"chunks", int64_t{3}}, {"axis", int64_t{-1}}}}, Bits::kOfTheWhole);
  ExpectPartsEqualTheWhole({"split", {x}, Attrs{{"axis", int64_t{2}}, {"sizes", std::vector<int64_t>{100, 284}}}},
                           Bits::kOfTheWhole);
}

TEST(KernelSplit, AlongTheLeadingAxisNothingDivides) {
  const OpDef& chunk = LookupOp("chunk");
  Attrs attrs = NormalizeAttrs(chunk, Attrs{{"chunks", int64_t{2}}, {"axis", int64_t{0}}});
  std::vector<TensorType> in = {{DType::kF32, {8, 4}}}, out = {{DType::kF32, {4, 4}}, {DType::kF32, {4, 4}}};
  EXPECT_EQ(chunk.split.max_parts(in, out, attrs), 1);
}

}  // namespace
}  // namespace pejit
