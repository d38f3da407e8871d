// SST bracketed trees: the parser, the file reader (malformed lines name
// file, line and column; the rest loads), the vocabulary, and the model on
// SST's binary trees.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <set>

#include "examples/treelstm/model.h"
#include "examples/treelstm/sst.h"
#include "interp/interpreter.h"

namespace pejit {
namespace {

constexpr const char* kTrainSample = "examples/treelstm/testdata/sst_sample_train.txt";
constexpr const char* kDevSample = "examples/treelstm/testdata/sst_sample_dev.txt";

std::string ErrorOf(const std::string& line) {
  try {
    sst::Parse(line);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(parsed)";
}

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SstParse, ReadsLeavesInnerNodesAndLabels) {
  sst::Tree t = sst::Parse("(3 (2 It) (4 (2 's) (4 (3 a) (4 treat))))");
  EXPECT_EQ(t.label, 3);
  ASSERT_EQ(t.children.size(), 2u);
  EXPECT_EQ(t.children[0].word, "It");
  EXPECT_EQ(t.children[0].label, 2);
  EXPECT_TRUE(t.children[0].children.empty());
  const sst::Tree& right = t.children[1];
  EXPECT_EQ(right.label, 4);
  EXPECT_TRUE(right.word.empty());
  EXPECT_EQ(right.children[0].word, "'s");
  EXPECT_EQ(right.children[1].children[1].word, "treat");
  // A one-word sentence is a leaf at the root; spacing is free.
  sst::Tree leaf = sst::Parse("  ( 4   Wonderful )\t");
  EXPECT_EQ(leaf.word, "Wonderful");
  EXPECT_EQ(leaf.label, 4);
}

TEST(SstParse, ErrorsSayWhatAndWhichColumn) {
  EXPECT_EQ(ErrorOf(""), "column 1: no tree on the line");
  EXPECT_EQ(ErrorOf("2 It"), "column 1: expected '('");
  EXPECT_EQ(ErrorOf("(7 It)"), "column 2: bad label '7' (expected 0-4)");
  EXPECT_EQ(ErrorOf("(x It)"), "column 2: bad label 'x' (expected 0-4)");
  EXPECT_EQ(ErrorOf("( (2 It))"), "column 3: expected a label (0-4) after '('");
  EXPECT_EQ(ErrorOf("(3 (2 It) (2 is)"), "column 17: missing ')' for the node opened at column 1");
  EXPECT_EQ(ErrorOf("(2 It is)"), "column 7: expected ')' after the word 'It' (a leaf has one word)");
  EXPECT_EQ(ErrorOf("(3 (2 It) is)"), "column 11: expected '(' or ')', found 'is'");
  EXPECT_EQ(ErrorOf("(3)"), "column 1: a node without a word or children");
  EXPECT_EQ(ErrorOf("(2 It) (2 is)"), "column 8: text after the tree's closing ')'");
  std::string deep;
  for (int i = 0; i <= sst::kMaxDepth; ++i) deep += "(2 ";
  deep += "(2 x)";
  deep += std::string(sst::kMaxDepth + 1, ')');
  EXPECT_NE(ErrorOf(deep).find("nested deeper than 256 levels"), std::string::npos) << ErrorOf(deep);
}

TEST(SstParse, ATreeOfMoreNodesThanTheBoundIsRefusedWhereItPassesIt) {
  // 1.75 million children once took 17 GB in the model; the bound stops the
  // parser at the node past it.
  std::string wide = "(2";
  for (int i = 0; i < treelstm::kMaxTreeNodes; ++i) wide += " (2 a)";
  wide += ")";
  EXPECT_EQ(ErrorOf(wide), "column " + std::to_string(3 + 6 * (treelstm::kMaxTreeNodes - 1) + 1) +
                               ": trees of more than 100000 nodes are refused");
}

TEST(SstFile, ALineLongerThanTheBoundIsSkippedAndTheNextOneRead) {
  std::string path = WriteFile("sst_long.txt", "(2 " + std::string(treelstm::kMaxLineBytes, 'a') + ")\n(3 fun)\n");
  sst::FileReport r = sst::ReadFile(path);
  ASSERT_EQ(r.trees.size(), 1u);
  EXPECT_EQ(r.trees[0].word, "fun");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0], path + ":1: line longer than 16777216 bytes");
}

TEST(SstFile, TheSampleFilesLoadWhole) {
  sst::FileReport train = sst::ReadFile(kTrainSample), dev = sst::ReadFile(kDevSample);
  EXPECT_TRUE(train.errors.empty()) << train.errors.front();
  EXPECT_TRUE(dev.errors.empty()) << dev.errors.front();
  EXPECT_EQ(train.trees.size(), 38u);
  EXPECT_EQ(dev.trees.size(), 10u);
  EXPECT_EQ(train.trees[0].label, 4);  // "The film is great ."
  // Every class appears in the training sample.
  std::set<int> labels;
  for (const sst::Tree& t : train.trees) labels.insert(t.label);
  EXPECT_EQ(labels, (std::set<int>{0, 1, 2, 3, 4}));
}

TEST(SstFile, MalformedLinesAreSkippedWithFileLineAndColumn) {
  std::string path = WriteFile("sst_bad.txt",
                               "(3 (2 It) (4 fun))\n"
                               "(3 (2 It) (4 fun)\n"
                               "\n"
                               "(9 (2 It) (4 fun))\n"
                               "(1 (1 dull) (2 .))\r\n");
  sst::FileReport r = sst::ReadFile(path);
  ASSERT_EQ(r.trees.size(), 2u);
  EXPECT_EQ(r.trees[1].children[0].word, "dull");  // the \r of a CRLF line is not part of the tree
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0], path + ":2: column 18: missing ')' for the node opened at column 1");
  EXPECT_EQ(r.errors[1], path + ":4: column 2: bad label '9' (expected 0-4)");
  try {
    sst::ReadFile(path, /*strict=*/true);
    ADD_FAILURE() << "strict reading did not stop";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), r.errors[0]);
  }
  EXPECT_THROW(sst::ReadFile(testing::TempDir() + "/no_such_file.txt"), std::runtime_error);
}

TEST(SstVocabulary, TrainingWordsInOrderRareAndUnseenWordsUnknown) {
  std::vector<sst::Tree> trees = {sst::Parse("(3 (2 a) (3 (3 good) (2 film)))"), sst::Parse("(1 (2 a) (1 bad))")};
  sst::Vocabulary all = sst::Vocabulary::Build(trees);
  EXPECT_EQ(all.size(), 6);  // <node>, <unk>, a, good, film, bad
  EXPECT_EQ(all.Word(0), "<node>");
  EXPECT_EQ(all.Word(1), "<unk>");
  EXPECT_EQ(all.Id("a"), 2);
  EXPECT_EQ(all.Id("bad"), 5);
  EXPECT_EQ(all.Id("great"), sst::Vocabulary::kUnknown);

  sst::Vocabulary frequent = sst::Vocabulary::Build(trees, /*min_count=*/2);
  EXPECT_EQ(frequent.size(), 3);
  EXPECT_EQ(frequent.Id("a"), 2);
  EXPECT_EQ(frequent.Id("good"), sst::Vocabulary::kUnknown);

  treelstm::Example e = sst::ToExample(trees[0], all);
  EXPECT_EQ(e.label, 3);
  EXPECT_EQ(e.tree.token, sst::Vocabulary::kNode);
  ASSERT_EQ(e.tree.children.size(), 2u);
  EXPECT_EQ(e.tree.children[0].token, all.Id("a"));
  EXPECT_EQ(e.tree.children[1].token, sst::Vocabulary::kNode);
  EXPECT_EQ(e.tree.children[1].children[1].token, all.Id("film"));
  EXPECT_EQ(treelstm::CountNodes(e.tree), 5);
}

// The Child-Sum cell over SST's binary trees (and a one-word root leaf):
// a minibatch of the sample gets a finite loss near log(5) at first, and
// gradients for the embeddings of exactly the words it contains.
TEST(SstModel, TheTreeLstmTrainsOnSampleTrees) {
  Module module;
  module.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot s = module.snapshot();
  sst::FileReport r = sst::ReadFile(kTrainSample);
  sst::Vocabulary v = sst::Vocabulary::Build(r.trees);
  std::vector<treelstm::Example> examples;
  for (int i : {0, 1, 31}) examples.push_back(sst::ToExample(r.trees[i], v));  // 31: "Wonderful", a root leaf
  ASSERT_TRUE(examples[2].tree.children.empty());
  std::vector<const treelstm::Example*> batch;
  for (const auto& e : examples) batch.push_back(&e);
  treelstm::Batch b = treelstm::MakeBatch(batch, *s);
  Rng rng(4);
  Value params = treelstm::InitParams(rng, {v.size(), 8, 6, sst::kClasses});
  Interpreter interp;
  auto vg = interp.CallWithGrad(*s, "loss", {b.trees, b.labels, params}, {2});
  double loss = vg.value.tensor().item();
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(5.0), 0.5);
  Tensor emb_grad = vg.grads[0].fields()[0].tensor();
  std::set<int> used = {sst::Vocabulary::kNode};
  std::function<void(const treelstm::TokenTree&)> collect = [&](const treelstm::TokenTree& t) {
    if (t.children.empty()) used.insert(t.token);
    for (const auto& c : t.children) collect(c);
  };
  for (const auto& e : examples) collect(e.tree);
  for (int id = 0; id < v.size(); ++id) {
    double norm = 0;
    for (int64_t k = 0; k < 8; ++k) norm += std::abs(emb_grad.ElementAsDouble(id * 8 + k));
    EXPECT_EQ(norm > 0, used.count(id) > 0) << "word " << v.Word(id);
  }
}

}  // namespace
}  // namespace pejit
