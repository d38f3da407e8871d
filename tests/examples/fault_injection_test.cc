// Faults while training (issue 24): background jobs whose partial evaluation
// or compilation throws (std::bad_alloc, a std::runtime_error, an exception
// of no std type), and a disk that fills while a checkpoint or the trace is
// written. Training goes on with the numbers of a run without the faults,
// and no state is lost: the last good checkpoint stays as it was.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>

#include "examples/treelstm/trainer.h"
#include "tests/examples/small_run.h"
#include "train/checkpoint.h"

namespace pejit {
namespace {

using treelstm::RunOptions;
using testing_support::FlatParameters;
using treelstm::Trainer;

// The shared small run, prefetching two minibatches ahead so that jobs are
// queued while others fail.
RunOptions Small() {
  RunOptions o = testing_support::SmallRun(11);
  o.lookahead = 2;
  return o;
}

EngineOptions Engine(Policy policy) {
  EngineOptions e;
  e.policy = policy;
  e.workers = 1;
  e.generic = false;  // every compiled call would come from a job: the jobs are what fails here
  return e;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string TempPath(const std::string& name) { return testing::TempDir() + "/" + name; }

// Under policy sync every call waits for its job; when the job fails the
// call runs on the interpreter, so the run is the interpreter's bit for bit.
TEST(FaultInjection, JobsThatThrowLeaveTrainingOnTheInterpreterWithItsExactNumbers) {
  RunOptions o = Small();
  Trainer reference(o, treelstm::LoadDataset(o), Engine(Policy::Interpreter()));
  std::vector<double> losses;
  for (int e = 0; e < 2; ++e) losses.push_back(reference.TrainEpoch().loss);

  EngineOptions faulty = Engine(Policy::Sync());
  std::atomic<int> jobs{0};
  faulty.before_pe = [&](const CompileInfo&) {
    if (jobs++ % 2 == 0) throw std::bad_alloc();  // PE out of memory
  };
  faulty.compile = [&](const Residual&) -> ExecutablePtr {
    if (jobs++ % 2 == 0) throw 42;  // a hook's exception of no std type
    throw std::runtime_error("LLVM ran out of memory (injected)");
  };
  Trainer t(o, treelstm::LoadDataset(o), faulty);
  for (int e = 0; e < 2; ++e) EXPECT_EQ(t.TrainEpoch().loss, losses[e]) << "epoch " << e;
  EXPECT_EQ(FlatParameters(t.params()), FlatParameters(reference.params()));
  EXPECT_EQ(t.DevAccuracy(), reference.DevAccuracy());
  const EntryStats stats = t.loss().stats();
  EXPECT_GT(stats.failed, 0);
  EXPECT_EQ(stats.compiled, 0);
  EXPECT_EQ(stats.calls_compiled(), 0);
  EXPECT_GE(jobs.load(), 3);  // each kind of fault was thrown
}

// RLIMIT_FSIZE stands in for a full disk: a write past it fails (EFBIG)
// instead of succeeding. The checkpoint save fails by name and leaves the
// previous file; the trace stops (and says so when the engine ends);
// training is unaffected; once there is room the next save works.
TEST(FaultInjection, ADiskThatFillsLosesNoCheckpointAndDoesNotStopTraining) {
  std::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the writer
  RunOptions o = Small();
  Trainer reference(o, treelstm::LoadDataset(o), Engine(Policy::Interpreter()));
  std::vector<double> losses;
  for (int e = 0; e < 2; ++e) losses.push_back(reference.TrainEpoch().loss);

  EngineOptions traced = Engine(Policy::Interpreter());
  traced.trace_file = TempPath("disk_full_trace.jsonl");
  Trainer t(o, treelstm::LoadDataset(o), traced);
  const std::string path = TempPath("disk_full.ckpt");
  EXPECT_EQ(t.TrainEpoch().loss, losses[0]);
  t.Save(path);
  const std::string saved = Contents(path);
  ASSERT_GT(saved.size(), 200u);

  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  rlimit full = before;
  full.rlim_cur = saved.size() / 2;  // the next checkpoint does not fit; the trace is already past it
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &full), 0);
  EXPECT_EQ(t.TrainEpoch().loss, losses[1]);
  std::string error;
  try {
    t.Save(path);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  EXPECT_EQ(error.rfind(path + ".tmp: cannot write: File too large", 0), 0u) << error;
  EXPECT_EQ(Contents(path), saved);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(LoadCheckpoint(path).epoch, 1);

  t.Save(path);  // room again
  EXPECT_EQ(LoadCheckpoint(path).epoch, 2);
  EXPECT_EQ(FlatParameters(t.params()), FlatParameters(reference.params()));
}

}  // namespace
}  // namespace pejit
