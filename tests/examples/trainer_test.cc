// The Tree-LSTM training run (examples/treelstm/trainer.h): compiled steps
// train exactly like the interpreter, a checkpointed and resumed run is the
// uninterrupted run, and bad checkpoints or data are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/trainer.h"
#include "tests/examples/small_run.h"
#include "train/checkpoint.h"

namespace pejit {
namespace {

using treelstm::RunOptions;
using testing_support::FlatParameters;
using testing_support::SmallRun;
using treelstm::Trainer;

EngineOptions WithPolicy(Policy policy) {
  EngineOptions e;
  e.policy = policy;
  e.workers = 1;
  return e;
}

std::string TempPath(const std::string& name) { return testing::TempDir() + "/" + name; }

TEST(Trainer, CompiledStepsTrainLikeTheInterpreter) {
  RunOptions o = SmallRun(5);
  Trainer interpreted(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter()));
  Trainer compiled(o, treelstm::LoadDataset(o), WithPolicy(Policy::Sync()));
  for (int epoch = 0; epoch < 2; ++epoch) {
    treelstm::EpochResult a = interpreted.TrainEpoch(), b = compiled.TrainEpoch();
    EXPECT_EQ(a.compiled_steps, 0);
    EXPECT_EQ(b.compiled_steps, b.steps) << "policy sync runs every step compiled";
    // How soon a run leaves the interpreter, from the epoch's first step:
    // the first step under sync, never under the interpreter.
    EXPECT_EQ(a.first_compiled_ms, -1);
    EXPECT_EQ(b.first_compiled_ms, 0);
    ASSERT_EQ(a.losses.size(), 3u);
    ASSERT_EQ(b.losses.size(), 3u);
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4) << "epoch " << epoch << " step " << i;
    }
  }
  std::vector<float> pa = FlatParameters(interpreted.params()), pb = FlatParameters(compiled.params());
  ASSERT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(pa[i] - pb[i])));
  EXPECT_LT(worst, 1e-4);
  // Training moved the parameters (the comparison is not between two idle runs).
  EXPECT_NE(pa, FlatParameters(Trainer(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter())).params()));
}

// Each step prefetches the minibatch `lookahead` steps ahead as next (past
// the epoch's end, the next epoch's: the same minibatches), so that the
// workers compile it before the loop gets there.
TEST(Trainer, PrefetchesTheMinibatchesAheadOfEachStep) {
  RunOptions o = SmallRun(5);  // 3 steps
  o.lookahead = 2;
  auto events = std::make_shared<RecordingSink>();
  EngineOptions e = WithPolicy(Policy::Eager());
  e.events = events;
  Trainer trainer(o, treelstm::LoadDataset(o), e);
  trainer.TrainEpoch();
  std::vector<std::string> calls, prefetches;  // signatures, in order
  std::vector<size_t> call_at, prefetch_at;    // positions in the event stream
  std::vector<Event> all = events->events();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].entry != "loss") continue;
    if (all[i].kind == EventKind::kCall) {
      calls.push_back(all[i].signature);
      call_at.push_back(i);
    } else if (all[i].kind == EventKind::kPrefetch) {
      EXPECT_EQ(all[i].Text("priority"), "next");
      prefetches.push_back(all[i].signature);
      prefetch_at.push_back(i);
    }
  }
  ASSERT_EQ(calls.size(), 3u);
  ASSERT_EQ(prefetches.size(), 4u) << "steps 1 and 2, then the next epoch's 0 and 1";
  for (size_t j = 0; j < prefetches.size(); ++j) EXPECT_EQ(prefetches[j], calls[(j + 1) % 3]) << "prefetch " << j;
  for (size_t step = 0; step < 3; ++step) {
    EXPECT_LT(prefetch_at[step + 1], call_at[step]) << "step " << step + 2 << " was not prefetched before step " << step;
  }
}

// Three epochs straight, against one epoch, a checkpoint, and two more
// epochs in a new trainer resumed from it: the same losses and parameters,
// bit for bit (policy interpreter is deterministic). With reshuffled
// minibatches and Adam, whose state includes its step count.
TEST(Trainer, ResumingACheckpointContinuesTheRunExactly) {
  for (const char* kind : {"adagrad", "adam"}) {
    SCOPED_TRACE(kind);
    RunOptions o = SmallRun(5);
    o.reshuffle = true;
    o.optimizer.kind = kind;
    o.optimizer.learning_rate = 0.02;
    Trainer straight(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter()));
    std::vector<double> losses;
    for (int e = 0; e < 3; ++e) losses.push_back(straight.TrainEpoch().loss);

    std::string path = TempPath(std::string("resume_") + kind + ".ckpt");
    {
      Trainer first(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter()));
      EXPECT_EQ(first.TrainEpoch().loss, losses[0]);
      first.Save(path);
    }
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    Trainer resumed(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter()));
    resumed.Resume(path);
    EXPECT_EQ(resumed.epoch(), 1);
    EXPECT_EQ(resumed.TrainEpoch().loss, losses[1]);
    EXPECT_EQ(resumed.TrainEpoch().loss, losses[2]);
    EXPECT_EQ(FlatParameters(resumed.params()), FlatParameters(straight.params()));
    EXPECT_EQ(resumed.DevAccuracy(), straight.DevAccuracy());
  }
}

TEST(Trainer, ACheckpointOfAnotherRunIsRefusedByName) {
  RunOptions o = SmallRun(5);
  std::string path = TempPath("other.ckpt");
  Trainer(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter())).Save(path);
  RunOptions wider = o;
  wider.hidden = 16;
  Trainer t(wider, treelstm::LoadDataset(wider), WithPolicy(Policy::Interpreter()));
  std::vector<float> before = FlatParameters(t.params());
  try {
    t.Resume(path);
    ADD_FAILURE() << "resumed a checkpoint of hidden size 8 into hidden size 16";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": written by a run with hidden 8, this run has 16 (resume with the options of the saved run)");
  }
  EXPECT_EQ(FlatParameters(t.params()), before);  // untouched
  EXPECT_EQ(t.epoch(), 0);
}

// Not only the model's sizes: the training trees (another file of as many
// trees) and every optimizer setting must be the saved run's.
TEST(Trainer, ResumingWithOtherDataOrOptimizerSettingsIsRefusedByName) {
  auto file = [](const std::string& name, int seed) {
    std::string path = TempPath(name);
    std::ofstream out(path);
    for (const auto& e : listops::GenerateSplits(static_cast<uint64_t>(seed), 16, 0, 0).train) {
      out << e.label << "\t" << listops::ToString(e.tree) << "\n";
    }
    return path;
  };
  RunOptions o = SmallRun(5);
  o.train_file = file("resume_data_a.tsv", 1);
  std::string path = TempPath("settings.ckpt");
  Trainer(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter())).Save(path);
  struct Variant {
    const char* key;
    std::function<void(RunOptions&)> change;
    std::string saved, now;
  };
  std::vector<Variant> variants = {
      {"learning_rate", [](RunOptions& r) { r.optimizer.learning_rate = 0.5; }, "0.05", "0.5"},
      {"clip_norm", [](RunOptions& r) { r.optimizer.clip_norm = 1; }, "0.0", "1.0"},
      {"weight_decay", [](RunOptions& r) { r.optimizer.weight_decay = 1e-4; }, "0.0", "0.0001"},
  };
  for (const Variant& v : variants) {
    RunOptions other = o;
    v.change(other);
    Trainer t(other, treelstm::LoadDataset(other), WithPolicy(Policy::Interpreter()));
    try {
      t.Resume(path);
      ADD_FAILURE() << "resumed with another " << v.key;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), path + ": written by a run with " + v.key + " " + v.saved + ", this run has " +
                                           v.now + " (resume with the options of the saved run)");
    }
  }
  RunOptions other_data = o;
  other_data.train_file = file("resume_data_b.tsv", 2);
  Trainer t(other_data, treelstm::LoadDataset(other_data), WithPolicy(Policy::Interpreter()));
  try {
    t.Resume(path);
    ADD_FAILURE() << "resumed on another training file of as many trees";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": written by a run with train_data \"", 0), 0u) << e.what();
  }
}

// A step whose loss is NaN stops the run, names the step, and changes
// nothing: not the parameters, not the epoch count, not the checkpoint on
// disk (which a diverged state cannot overwrite).
TEST(Trainer, ANonFiniteLossStopsTrainingAndKeepsTheLastCheckpoint) {
  RunOptions o = SmallRun(5);
  Trainer t(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter()));
  std::string path = TempPath("before_divergence.ckpt");
  t.Save(path);
  std::ifstream in(path, std::ios::binary);
  const std::string saved((std::istreambuf_iterator<char>(in)), {});
  std::vector<Tensor> leaves = ParameterLeaves(t.params());
  leaves.back().data<float>()[0] = std::nanf("");  // the output bias: every tree's loss
  std::vector<float> before = FlatParameters(t.params());
  try {
    t.TrainEpoch();
    ADD_FAILURE() << "trained on a NaN loss";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "epoch 0, step 1 of 3: the loss is nan; training stops with the parameters before "
                                     "this step and the last checkpoint saved is kept (try a smaller --lr, or --clip)");
  }
  std::vector<float> after = FlatParameters(t.params());
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0);
  EXPECT_EQ(t.epoch(), 0);
  EXPECT_THROW(t.Save(path), std::runtime_error);
  std::ifstream again(path, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(again)), {}), saved);
}

// A loss that explodes while staying finite (1e20 here) is a run diverging
// as surely as NaN: warned of once, naming the step and the factor, or with
// stop_on_blowup the run stops there as on NaN.
TEST(Trainer, ALossThatExplodesWithoutNaNIsWarnedOfOnceOrStopsTheRun) {
  for (bool stop : {false, true}) {
    SCOPED_TRACE(stop ? "stop_on_blowup" : "warn");
    RunOptions o = SmallRun(5);
    o.stop_on_blowup = stop;
    Trainer t(o, treelstm::LoadDataset(o), WithPolicy(Policy::Interpreter()));
    for (int epoch = 0; epoch < 3; ++epoch) EXPECT_TRUE(t.TrainEpoch().warnings.empty());  // 9 steps: the baseline
    Tensor bias = ParameterLeaves(t.params()).back();  // the output bias: a class every tree is far from but one
    for (int64_t c = 0; c < bias.numel(); ++c) bias.data<float>()[c] = c == 0 ? 1e20f : 0.0f;
    if (!stop) {
      treelstm::EpochResult r = t.TrainEpoch();
      ASSERT_EQ(r.warnings.size(), 1u);
      EXPECT_EQ(r.warnings[0].rfind("epoch 3, step 1: the loss is ", 0), 0u) << r.warnings[0];
      EXPECT_NE(r.warnings[0].find("its first steps' (") , std::string::npos) << r.warnings[0];
      EXPECT_NE(r.warnings[0].find("the run is diverging"), std::string::npos) << r.warnings[0];
      EXPECT_TRUE(t.TrainEpoch().warnings.empty()) << "warned once";
    } else {
      try {
        t.TrainEpoch();
        ADD_FAILURE() << "trained on";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("epoch 3, step 1 of 3: the loss is"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("the run is diverging; training stops"), std::string::npos) << e.what();
      }
      EXPECT_EQ(t.epoch(), 3);
    }
  }
}

TEST(LoadDataset, NamesWhatIsMissing) {
  RunOptions sst;
  sst.data = "sst";
  try {
    treelstm::LoadDataset(sst);
    ADD_FAILURE() << "SST without a file loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "--data sst needs --train FILE (SST bracketed trees)");
  }
  sst.train_file = TempPath("all_bad.txt");
  std::ofstream(sst.train_file) << "(3 (2 oops)\n";
  try {
    treelstm::LoadDataset(sst);
    ADD_FAILURE() << "a file without one good line loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "no training examples");
  }
  sst.strict = true;
  EXPECT_THROW(treelstm::LoadDataset(sst), std::runtime_error);
}

// 2^31 - 1 generated expressions would take terabytes: refused at once, with
// the options' names, rather than after an hour of generating.
TEST(LoadDataset, AGeneratedSetNoMachineCanHoldIsRefusedBeforeGenerating) {
  RunOptions o;
  o.listops_train = std::numeric_limits<int>::max();
  o.listops_dev = 5;
  try {
    treelstm::LoadDataset(o);
    ADD_FAILURE() << "generated 2^31 expressions";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--listops-train-size 2147483647 and --listops-dev-size 5: generating them "
                                          "takes about 4398.0 GB, more than this machine's ", 0),
              0u)
        << e.what();
  }
}

TEST(LoadDataset, SstSampleFilesShareTheTrainingVocabulary) {
  RunOptions o;
  o.data = "sst";
  o.train_file = "examples/treelstm/testdata/sst_sample_train.txt";
  o.dev_file = "examples/treelstm/testdata/sst_sample_dev.txt";
  treelstm::Dataset d = treelstm::LoadDataset(o);
  EXPECT_EQ(d.classes, 5);
  EXPECT_EQ(d.train.size(), 38u);
  EXPECT_EQ(d.dev.size(), 10u);
  EXPECT_TRUE(d.warnings.empty());
  // "new" and "actor" appear only in the dev sample: <unk> (id 1).
  int unknown = 0;
  std::function<void(const treelstm::TokenTree&)> count = [&](const treelstm::TokenTree& t) {
    if (t.children.empty()) unknown += t.token == 1;
    for (const auto& c : t.children) count(c);
  };
  for (const auto& e : d.dev) count(e.tree);
  EXPECT_GE(unknown, 2);
  for (const auto& e : d.train) {
    std::function<void(const treelstm::TokenTree&)> in_range = [&](const treelstm::TokenTree& t) {
      EXPECT_LT(t.token, d.vocabulary);
      for (const auto& c : t.children) in_range(c);
    };
    in_range(e.tree);
  }
  // And it trains: a few epochs on the sample lower the loss.
  o.batch = 10;
  o.embed = 8;
  o.hidden = 8;
  Trainer t(o, std::move(d), WithPolicy(Policy::Interpreter()));
  double first = t.TrainEpoch().loss, last = first;
  for (int e = 0; e < 4; ++e) last = t.TrainEpoch().loss;
  EXPECT_LT(last, first);
}

}  // namespace
}  // namespace pejit
