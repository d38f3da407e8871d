// ListOps data, and the Tree-LSTM model of examples/treelstm: it runs, its
// residual agrees with it, and its gradients agree with finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ops/eager.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

using listops::Expr;

Expr Op(int token, std::vector<Expr> args) { return Expr{token, std::move(args)}; }
Expr D(int digit) { return Expr{digit, {}}; }

TEST(ListOps, EvaluatesEachOperator) {
  EXPECT_EQ(listops::Evaluate(Op(listops::kMax, {D(2), D(9), Op(listops::kMin, {D(4), D(7)}), D(1)})), 9);
  EXPECT_EQ(listops::Evaluate(Op(listops::kMin, {D(5), D(3), D(8)})), 3);
  EXPECT_EQ(listops::Evaluate(Op(listops::kMed, {D(1), D(8), D(4)})), 4);
  EXPECT_EQ(listops::Evaluate(Op(listops::kMed, {D(1), D(8), D(4), D(7)})), 5);  // (4 + 7) / 2 rounded down
  EXPECT_EQ(listops::Evaluate(Op(listops::kSm, {D(9), D(8), D(5)})), 2);
}

TEST(ListOps, PrintsAndParsesTheTokenForm) {
  Expr e = Op(listops::kMax, {D(2), D(9), Op(listops::kMin, {D(4), D(7)}), D(1)});
  EXPECT_EQ(listops::ToString(e), "[MAX 2 9 [MIN 4 7 ] 1 ]");
  EXPECT_EQ(listops::ToString(listops::Parse("[MAX 2 9 [MIN 4 7 ] 1 ]")), "[MAX 2 9 [MIN 4 7 ] 1 ]");
  // Parentheses of the binarized release are ignored.
  EXPECT_EQ(listops::ToString(listops::Parse("( ( [SM 1 ) 2 ] )")), "[SM 1 2 ]");
  EXPECT_THROW(listops::Parse("[MAX 2 9"), std::invalid_argument);
  EXPECT_THROW(listops::Parse("[MAX 2 [FOO 3 ] ]"), std::invalid_argument);
  // Refused, not recursed into until the stack runs out.
  std::string deep;
  for (int i = 0; i < listops::kMaxParseDepth + 1; ++i) deep += "[MAX 1 ";
  for (int i = 0; i < listops::kMaxParseDepth + 1; ++i) deep += "] ";
  EXPECT_THROW(listops::Parse(deep), std::invalid_argument);
  EXPECT_EQ(treelstm::CountNodes(e), 7);
  EXPECT_EQ(treelstm::Height(e), 2);
}

TEST(ListOps, SplitsAreDeterministicDistinctAndFollowTheRules) {
  listops::Splits a = listops::GenerateSplits(7, 300, 50, 50);
  listops::Splits b = listops::GenerateSplits(7, 300, 50, 50);
  std::set<std::string> seen;
  std::set<int> labels;
  for (const auto* split : {&a.train, &a.dev, &a.test}) {
    for (const auto& ex : *split) {
      EXPECT_TRUE(seen.insert(listops::ToString(ex.tree)).second) << "duplicate " << listops::ToString(ex.tree);
      EXPECT_EQ(ex.label, listops::Evaluate(ex.tree));
      EXPECT_GE(ex.tree.children.size(), 2u);  // the root is an operator with 2-5 arguments
      EXPECT_LE(ex.tree.children.size(), 5u);
      EXPECT_LE(treelstm::Height(ex.tree), 10);
      labels.insert(ex.label);
    }
  }
  EXPECT_EQ(listops::ToString(a.train[17].tree), listops::ToString(b.train[17].tree));
  EXPECT_GE(labels.size(), 8u);
}

TEST(ListOps, AnExpressionOfMoreNodesThanTheBoundIsRefusedWhileParsing) {
  std::string wide = "[SM";
  for (int i = 0; i < treelstm::kMaxTreeNodes; ++i) wide += " 1";
  wide += " ]";
  try {
    listops::Parse(wide);
    ADD_FAILURE() << "parsed " << treelstm::kMaxTreeNodes + 1 << " nodes";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "expressions of more than 100000 operators and digits are refused");
  }
}

TEST(ListOps, FilesWithBadLinesLoadTheRestAndNameTheLine) {
  std::string path = testing::TempDir() + "/listops.tsv";
  {
    std::ofstream f(path);
    f << "4\t[SM [MAX 2 9 ] [MIN 4 7 ] 1 ]\n"
      << "x\t[MAX 1 2 ]\n"
      << "3\t[MAX 1 2\n"
      << "\n"
      << "2\t( [MIN 2 5 ] )\n"
      << "5\t[MAX 1 2 ]\n"
      << "2\t( ( [MAX 1 2 ] )\n"
      << "2\t[MAX 1 2 ] )\n";
  }
  listops::FileReport r = listops::ReadFile(path);
  ASSERT_EQ(r.examples.size(), 2u);
  EXPECT_EQ(r.examples[0].label, 4);
  EXPECT_EQ(listops::ToString(r.examples[1].tree), "[MIN 2 5 ]");
  ASSERT_EQ(r.errors.size(), 5u);
  EXPECT_EQ(r.errors[0], path + ":2: bad label 'x' (expected 0-9)");
  EXPECT_EQ(r.errors[1], path + ":3: missing ']' for [MAX");
  EXPECT_EQ(r.errors[2], path + ":6: label 5 is not the expression's value 2");
  EXPECT_EQ(r.errors[3], path + ":7: 1 '(' never closed");
  EXPECT_EQ(r.errors[4], path + ":8: ')' without its '(' at token 5");
  EXPECT_THROW(listops::ReadFile(path, /*strict=*/true), std::runtime_error);

  std::string lra = testing::TempDir() + "/lra.tsv";
  {
    std::ofstream f(lra);
    f << "Source\tTarget\n[MED 1 8 4 ]\t4\n";
  }
  r = listops::ReadFile(lra);
  ASSERT_EQ(r.examples.size(), 1u);
  EXPECT_EQ(r.examples[0].label, 4);
}

class TreeLstmModel : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(treelstm::ModelSource(), "treelstm.pj"); }
  Module module_;
  Interpreter interp_;
};

TEST_F(TreeLstmModel, ResidualOfAMinibatchAgreesWithTheInterpreter) {
  Snapshot s = module_.snapshot();
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(3, 6, *s);
  Rng rng(1);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 8, 6, 10});
  std::vector<Value> args = {b.trees, b.labels, params};
  Value loss = interp_.Call(*s, "loss", args);
  EXPECT_NEAR(loss.tensor().item(), std::log(10.0), 0.5);  // about uniform at first

  Residual r = PartialEvaluate(*s, "loss", args);
  std::vector<Value> leaves;
  for (const Tensor& t : Flatten(args)) leaves.emplace_back(t);
  EXPECT_TRUE(ValueEqual(interp_.Call(*r.ToModule(), "main", leaves), loss));
  EXPECT_TRUE(r.functions.empty());
  Value classes = interp_.Call(*s, "infer", {b.trees, params});
  EXPECT_EQ(classes.tensor().shape(), (Shape{6}));
}

// The f32 model's tape gradients against central differences of the same
// model in f64 (its text with f32 replaced by f64).
TEST_F(TreeLstmModel, GradientsMatchFiniteDifferences) {
  Module m64;
  m64.AddSource(std::regex_replace(std::string(treelstm::ModelSource()), std::regex("f32"), "f64"), "treelstm64.pj");
  listops::Expr e = Op(listops::kSm, {D(3), Op(listops::kMax, {D(1), D(4), D(2)}), D(7)});
  listops::Example ex{e, listops::Evaluate(e)};
  Snapshot s32 = module_.snapshot(), s64 = m64.snapshot();
  treelstm::Batch b = treelstm::MakeBatch({&ex, &ex}, *s32);
  Rng rng(2);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 4, 3, 10});
  auto vg = interp_.CallWithGrad(*s32, "loss", {b.trees, b.labels, params}, {2});

  std::vector<Value> p64;
  for (const Value& t : params.fields()) p64.emplace_back(CallOp("cast", {t.tensor()}, {{"dtype", DType::kF64}}));
  treelstm::Batch b64 = treelstm::MakeBatch({&ex, &ex}, *s64);
  auto loss64 = [&] { return interp_.Call(*s64, "loss", {b64.trees, b64.labels, Value::Tuple(p64)}).tensor().item(); };
  const double h = 1e-6;
  int checked = 0;
  for (size_t k = 0; k < p64.size(); ++k) {
    Tensor param = p64[k].tensor();
    // Every element (unused embedding rows must get a zero gradient).
    for (int64_t i = 0; i < param.numel(); ++i) {
      double* x = param.data<double>() + i;
      double saved = *x;
      *x = saved + h;
      double up = loss64();
      *x = saved - h;
      double down = loss64();
      *x = saved;
      double numeric = (up - down) / (2 * h);
      double analytic = vg.grads[0].fields()[k].tensor().ElementAsDouble(i);
      EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << "param " << k << " element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 14 * 4 + 9 * 4 + 9 * 3 + 9 + 3 * 4 + 3 * 3 + 3 + 10 * 3 + 10);  // every parameter
}

}  // namespace
}  // namespace pejit
