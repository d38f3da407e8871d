// PadSegment (generic/pad.h) alone: run on an instance shorter than the
// extent (its inputs padded with zeros, its mask), a padded program gives
// what the instance's own program gives, and a result of the instance's
// length holds its rows, then zeros. Both programs run as baseline code
// (jit/native_executable.h's kernel plans), so the comparison is the pass's,
// not a compiler's.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "generic/pad.h"
#include "ir/printer.h"
#include "jit/batch_rules.h"
#include "jit/native_executable.h"
#include "jit/straight.h"
#include "tests/generic/segments.h"

namespace pejit::generic {
namespace {

Var Param(const std::string& name, Shape shape, DType dtype = DType::kF32) {
  return MakeVar(name, TensorTy(dtype, std::move(shape)));
}

using testing_segments::Segment;

Tensor Random(std::mt19937& rng, Shape shape) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(NumElements(shape)));
  for (float& x : v) x = unit(rng);
  return Tensor::FromVector<float>(std::move(shape), v);
}

// `t` in the corner of zeros whose axes in `axes` are `extent` long.
Tensor Padded(const Tensor& t, int64_t extent, uint32_t axes) {
  Shape shape = t.shape();
  for (size_t a = 0; a < shape.size(); ++a) {
    if (axes >> a & 1) shape[a] = extent;
  }
  Tensor out = Tensor::Zeros(t.dtype(), shape);
  const int64_t item = static_cast<int64_t>(SizeOf(t.dtype()));
  std::vector<int64_t> index(t.rank(), 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t at = 0, rest = i;
    for (int a = t.rank() - 1; a >= 0; --a) {
      index[a] = rest % t.shape()[a];
      rest /= t.shape()[a];
    }
    for (int a = 0; a < t.rank(); ++a) at = at * shape[a] + index[a];
    std::memcpy(static_cast<char*>(out.raw_data()) + at * item, static_cast<const char*>(t.raw_data()) + i * item,
                item);
  }
  return out;
}

Tensor Mask(int64_t n, int64_t extent) {
  Tensor m = Tensor::Zeros(DType::kBool, {extent});
  std::fill_n(m.data<bool>(), n, true);
  return m;
}

std::vector<Tensor> RunBaseline(const Func& program, const std::vector<Tensor>& in) {
  return LowerToKernelPlan(program)->Run(in);
}

// Row r of `padded` (its first axis the extent) is row r of `own` for the
// instance's rows, zero after them.
void ExpectRowsThenZeros(const Tensor& own, const Tensor& padded) {
  const int64_t row = own.numel() / own.shape()[0];
  for (int64_t i = 0; i < padded.numel(); ++i) {
    const float want = i < own.numel() ? own.data<float>()[i] : 0.0f;
    EXPECT_NEAR(padded.data<float>()[i], want, 1e-6f) << "row " << i / row << ", column " << i % row;
  }
}

TEST(PadSegment, AResultOfTheLengthHoldsTheInstancesRowsThenZeros) {
  // relu(x w + b) is relu(b), not zero, past the length: the pass masks it.
  Var x = Param("x", {3, 4}), w = Param("w", {4, 4}), b = Param("b", {4});
  Func own = Segment({x, w, b}, [&](StraightEmitter& out) -> std::vector<Expr> {
    Var h = out.Op("relu", {out.Op("add", {out.Op("matmul", {x, w}, {}, {}), b}, {}, {})}, {}, {});
    return {h, out.Op("sum", {h}, {{"axes", std::vector<int64_t>{0}}}, {})};
  });
  PaddedSegment padded = PadSegment(own, {{8, true, 1}});
  EXPECT_EQ(padded.lengths, (std::vector<int>{0, -1})) << "the rows have x's length; their sum has none";
  EXPECT_NE(PrintFunction("padded", padded.program).find("where("), std::string::npos);
  std::mt19937 rng(1);
  const Tensor xv = Random(rng, {3, 4}), wv = Random(rng, {4, 4}), bv = Random(rng, {4});
  const std::vector<Tensor> want = RunBaseline(own, {xv, wv, bv});
  const std::vector<Tensor> got = RunBaseline(padded.program, {Padded(xv, 8, 1), wv, bv, Mask(3, 8)});
  ASSERT_EQ(got[0].shape(), (Shape{8, 4}));
  ExpectRowsThenZeros(want[0], got[0]);
  ExpectRowsThenZeros(want[1], got[1]);
}

TEST(PadSegment, AnAdjacencyPadsAlongBothAxesBesideTheNodeStatesItMultiplies) {
  Var adj = Param("adj", {5, 5}), h = Param("h", {5, 4}), w = Param("w", {4, 4});
  Func own = Segment({adj, h, w}, [&](StraightEmitter& out) -> std::vector<Expr> {
    Var m = out.Op("matmul", {out.Op("matmul", {adj, h}, {}, {}), w}, {}, {});
    Var next = out.Op("add", {h, out.Op("tanh", {m}, {}, {})}, {}, {});
    return {next, out.Op("mean", {next}, {{"axes", std::vector<int64_t>{0}}, {"keepdims", true}}, {})};
  });
  PaddedSegment padded = PadSegment(own, {{7, true, 3}, {7, true, 1}});
  EXPECT_EQ(padded.lengths, (std::vector<int>{1, -1})) << "the new states have h's length";
  std::mt19937 rng(2);
  const Tensor av = Random(rng, {5, 5}), hv = Random(rng, {5, 4}), wv = Random(rng, {4, 4});
  const std::vector<Tensor> want = RunBaseline(own, {av, hv, wv});
  const std::vector<Tensor> got =
      RunBaseline(padded.program, {Padded(av, 7, 3), Padded(hv, 7, 1), wv, Mask(5, 7), Mask(5, 7)});
  ExpectRowsThenZeros(want[0], got[0]);
  ExpectRowsThenZeros(want[1], got[1]);  // a mean over the 5 nodes, not the 7 rows
}

TEST(PadSegment, ALossOverRowsReadsTheRowsWithinTheLength) {
  Var x = Param("x", {3, 4}), labels = Param("labels", {3}, DType::kI64), w = Param("w", {4, 4});
  Func own = Segment({x, labels, w}, [&](StraightEmitter& out) -> std::vector<Expr> {
    Var scores = out.Op("matmul", {x, w}, {}, {});
    Var mean = out.Op("cross_entropy", {scores, labels}, {}, {});
    Var rows = out.Op("cross_entropy", {scores, labels}, {{"mean", false}}, {});
    return {mean, out.Op("sum", {rows}, {}, {})};
  });
  PaddedSegment padded = PadSegment(own, {{6, true, 1}, {6, true, 1}});
  std::mt19937 rng(3);
  const Tensor xv = Random(rng, {3, 4}), wv = Random(rng, {4, 4});
  const Tensor lv = Tensor::FromVector<int64_t>({3}, {2, 0, 3});
  const std::vector<Tensor> want = RunBaseline(own, {xv, lv, wv});
  const std::vector<Tensor> got =
      RunBaseline(padded.program, {Padded(xv, 6, 1), Padded(lv, 6, 1), wv, Mask(3, 6), Mask(3, 6)});
  EXPECT_NEAR(got[0].data<float>()[0], want[0].data<float>()[0], 1e-6f) << "the mean of 3 rows' losses";
  EXPECT_NEAR(got[1].data<float>()[0], want[1].data<float>()[0], 1e-5f);
}

TEST(PadSegment, RefusesAResultWithTheLengthPastItsFirstAxisAndAxesOfDifferentLengths) {
  Var x = Param("x", {3, 4});
  Func columns = Segment({x}, [&](StraightEmitter& out) -> std::vector<Expr> {
    return {out.Op("transpose", {out.Op("tanh", {x}, {}, {})}, {}, {})};
  });
  try {
    PadSegment(columns, {{8, true, 1}});
    ADD_FAILURE() << "a result (4, n) padded";
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find("has the per-example length along an axis but its first"),
              std::string::npos)
        << e.what();
  }
  Func rows = Segment({x}, [&](StraightEmitter& out) -> std::vector<Expr> { return {out.Op("tanh", {x}, {}, {})}; });
  try {
    PadSegment(rows, {{8, true, 3}});
    ADD_FAILURE() << "axes of 3 and 4 padded as one length";
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find("pads axes of different lengths"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pejit::generic
