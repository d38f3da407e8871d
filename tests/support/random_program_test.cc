// The random program generator keeps its promises: the same seed gives the
// same program and arguments; every program type-checks and runs in the
// interpreter to finite values and gradients; together the programs use
// every construct the differential tests rely on.
#include "tests/support/random_program.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "interp/interpreter.h"
#include "pe/signature.h"

namespace pejit {
namespace {

constexpr int kPrograms = 300;

bool AllFinite(const Value& v) {
  for (const Tensor& t : Flatten({v})) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(t.ElementAsDouble(i))) return false;
    }
  }
  return true;
}

TEST(RandomProgramTest, TheSameSeedGivesTheSameProgramAndArguments) {
  for (uint64_t seed : {0, 1, 17, 299}) {
    RandomProgram a = GenerateRandomProgram(seed), b = GenerateRandomProgram(seed);
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(a.features, b.features);
    EXPECT_EQ(a.static_args, b.static_args);
    EXPECT_EQ(a.wrt, b.wrt);
    Snapshot s = a.Load();
    std::vector<Value> x = a.Arguments(*s, 3), y = b.Arguments(*s, 3);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(ValueEqual(x[i], y[i])) << "seed " << seed << " argument " << i;
  }
  EXPECT_NE(GenerateRandomProgram(1).text, GenerateRandomProgram(2).text);
}

TEST(RandomProgramTest, RefilledArgumentsKeepTheSkeletonAndChangeTheTensors) {
  int changed = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    RandomProgram p = GenerateRandomProgram(seed);
    Snapshot s = p.Load();
    std::vector<Value> args = p.Arguments(*s, 0), again = p.Refill(args, 0);
    EXPECT_EQ(ComputeSignature(args, p.static_args), ComputeSignature(again, p.static_args)) << "seed " << seed;
    std::vector<Tensor> before = Flatten(args, p.static_args), after = Flatten(again, p.static_args);
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) changed += !Equal(before[i], after[i]);
  }
  EXPECT_GT(changed, 100);
}

// Every program checks, and both entries run to finite numbers on two
// inputs: the programs are numerically tame.
TEST(RandomProgramTest, ProgramsTypeCheckAndRunToFiniteValuesAndGradients) {
  Interpreter interp;
  std::map<std::string, int> programs_with;  // feature -> programs using it
  int skeletons = 0;
  for (uint64_t seed = 0; seed < kPrograms; ++seed) {
    RandomProgram p = GenerateRandomProgram(seed);
    Snapshot s;
    ASSERT_NO_THROW(s = p.Load()) << p.text;
    for (const auto& [feature, n] : p.features) programs_with[feature] += n > 0;
    std::vector<Signature> seen;
    for (uint64_t input = 0; input < 2; ++input) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " input " + std::to_string(input) + "\n" + p.text);
      std::vector<Value> args = p.Arguments(*s, input);
      Value out = interp.Call(*s, p.entry, args);
      EXPECT_TRUE(AllFinite(out)) << out.ToString();
      Interpreter::ValueAndGrad g = interp.CallWithGrad(*s, p.loss, args, p.wrt);
      EXPECT_TRUE(AllFinite(g.value));
      for (const Value& grad : g.grads) EXPECT_TRUE(AllFinite(grad));
      Signature sig = ComputeSignature(args, p.static_args);
      skeletons += std::find(seen.begin(), seen.end(), sig) == seen.end();
      seen.push_back(sig);
    }
  }
  std::string report;
  for (const auto& [feature, n] : programs_with) report += "  " + feature + ": " + std::to_string(n) + "\n";
  std::printf("programs using each feature (of %d):\n%s", kPrograms, report.c_str());
  // Most programs get two different skeletons (some have no trees).
  EXPECT_GT(skeletons, kPrograms * 2 * 3 / 4);

  // What the differential tests rely on, in enough programs each.
  for (const char* feature :
       {"let_shared", "tuple", "proj", "static_if:constant", "static_if:depth", "static_if:argument", "dynamic_if",
        "dynamic_if:tuple", "match_adt", "match_local:maybe", "match_local:tuple", "nested_pattern", "wildcard",
        "recursion", "mutual_recursion", "accumulator", "helper_call", "fold_call", "closure", "closure:dynamic_if",
        "static_argument",
        "match_local:dynamic_tuple", "global_value", "higher_order", "tuple_field", "adt_map",
        "result_alias", "result_view", "result_constant",
        "dynamic_indices", "unknown_dim", "weight_tuple", "broadcast_both", "f64", "adt:tree", "adt:list",
        "adt:generic", "adt:tri", "adt:rose"}) {
    EXPECT_GE(programs_with[feature], 8) << feature << "\n" << report;
  }
  for (const char* op : {"matmul", "dense", "sum", "mean", "max", "softmax", "log_softmax", "reshape", "transpose",
                         "concat", "stack", "split", "chunk", "slice", "pad", "expand_dims", "squeeze", "broadcast_to",
                         "take", "scatter_add", "one_hot", "cross_entropy", "nll", "argmax", "where", "exp", "log",
                         "sqrt", "pow", "div", "maximum", "minimum", "relu", "abs", "less_equal", "greater_equal",
                         "not_equal", "logical_and", "logical_or", "logical_not", "min", "logsumexp", "argmin", "norm", "zeros_like",
                         "ones_like", "clip", "gather", "layer_norm", "dropout", "floor_div", "mod", "zeros", "ones"}) {
    EXPECT_GE(programs_with[std::string("op:") + op], 8) << op << "\n" << report;
  }
}

}  // namespace
}  // namespace pejit
