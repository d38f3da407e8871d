// Structural equality and hashing: alpha-equivalence, and programs as long as
// residual programs get (100,000 lets) without deep native recursion.
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir/structural.h"
#include "ir/visitor.h"

namespace pejit {
namespace {

Type F2() { return TensorTy(DType::kF32, {2}); }

// fn (%x) { let %t0 = exp(%x); let %t1 = exp(%t0); ... %t(n-1) }
Func Chain(int n) {
  Var x = MakeVar("x", F2());
  std::vector<Var> vars;
  std::vector<Expr> values;
  Expr prev = x;
  for (int i = 0; i < n; ++i) {
    vars.push_back(MakeVar("t" + std::to_string(i)));
    values.push_back(MakeOpCall("exp", {prev}));
    prev = vars.back();
  }
  Expr body = prev;
  for (int i = n - 1; i >= 0; --i) body = MakeLet(vars[i], values[i], body);
  return MakeFunc({x}, body);
}

TEST(Structural, RenamingBoundVariablesKeepsEquality) {
  Var x = MakeVar("x", F2()), y = MakeVar("y", F2());
  Expr a = MakeFunc({x}, MakeOpCall("neg", {x}));
  Expr b = MakeFunc({y}, MakeOpCall("neg", {y}));
  EXPECT_TRUE(StructuralEqual(a, b));
  EXPECT_EQ(StructuralHash(a), StructuralHash(b));
  // A free variable is equal only to itself.
  EXPECT_FALSE(StructuralEqual(MakeOpCall("neg", {x}), MakeOpCall("neg", {y})));
  EXPECT_FALSE(StructuralEqual(a, MakeFunc({y}, MakeOpCall("exp", {y}))));
}

TEST(Structural, AHundredThousandLetsCompareHashCloneAndFree) {
  Func a = Chain(100000);
  Func b = CloneFunc(a);
  EXPECT_NE(a, b);
  EXPECT_TRUE(StructuralEqual(a, b));
  EXPECT_EQ(StructuralHash(a), StructuralHash(b));
  EXPECT_FALSE(StructuralEqual(a, Chain(99999)));
  EXPECT_EQ(ReferencedGlobals(a->body).size(), 0u);
}

TEST(Structural, ASharedSubtreeHashesLikeItsCopy) {
  // The same let-expression used twice binds its variable twice.
  Var v = MakeVar("v", F2()), x = MakeVar("x", F2());
  Expr shared = MakeLet(v, MakeOpCall("exp", {x}), v);
  Expr twice = MakeFunc({x}, MakeTuple({shared, shared}));
  Func copy = CloneFunc(std::static_pointer_cast<const FuncNode>(twice));
  EXPECT_TRUE(StructuralEqual(twice, copy));
  EXPECT_EQ(StructuralHash(twice), StructuralHash(copy));
}

}  // namespace
}  // namespace pejit
