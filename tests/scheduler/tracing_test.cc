// The tracing log of a real engine: the events of one signature come in
// pipeline order, the trace file holds every event with the schema of
// docs/tracing.md and is complete when the engine is gone, the statistics
// the engine logs are what `pejit trace summary` computes from its file,
// the log lines say what the issue's examples say, and a bad PEJIT_LOG is a
// warning.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "scheduler/trace_file.h"
#include "scheduler/trace_stats.h"
#include "tests/scheduler/fixtures.h"
#include "tests/scheduler/trace_fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;
using namespace testing_trace;
using State = CodeStatus::State;

// A run touching most events: native code in value and grad mode, a hit, an
// eviction (one specialization per entry), a loop compiled as native regions
// (@count_down), a refusal, a prefetch and an edit that invalidates.
struct Scenario {
  EntryStats loss, other, count_down, wrap;
  std::string loss_sig;  // of the first tree

  void Run(Engine& engine) {
    engine.module().AddSource(kProgram, "program.pj");
    Snapshot snap = engine.module().snapshot();
    Rng rng(4);
    Value emb = RandomMatrix(rng, 10, 4);
    Entry l = engine.entry("loss"), o = engine.entry("other"), c = engine.entry("count_down"),
          w = engine.entry("wrap");
    std::vector<Value> t3 = {MakeTree(*snap, 3, 0, 10), emb}, t4 = {MakeTree(*snap, 4, 0, 10), emb};
    loss_sig = ComputeSignature(t3).ShortHash();
    l.with_grad({1}).value_and_grad(t3);
    ASSERT_EQ(l.with_grad({1}).wait_ready(t3).state, State::kReady);
    l.with_grad({1}).value_and_grad(t3);  // a hit
    l.with_grad({1}).value_and_grad(t4);
    ASSERT_EQ(l.with_grad({1}).wait_ready(t4).state, State::kReady);  // evicts t3's code (entry-max)
    std::vector<Value> m = {RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)};
    o.call(m);
    ASSERT_EQ(o.wait_ready(m).state, State::kReady);
    o.call(m);
    std::vector<Value> m2 = {RandomMatrix(rng, 4, 3), RandomMatrix(rng, 3, 2)};
    o.prefetch(m2);
    ASSERT_EQ(o.wait_ready(m2).state, State::kReady);
    c.call({I(3), Value(Tensor::Scalar(1))});
    ASSERT_EQ(c.wait_ready({I(3), Value(Tensor::Scalar(1))}).state, State::kReady);
    w.call({Value(Tensor::FromVector<float>({2}, {1, 2}))});
    ASSERT_EQ(w.wait_ready({Value(Tensor::FromVector<float>({2}, {1, 2}))}).state, State::kFailed);
    engine.module().AddSource(kHelperAgain, "edit.pj", /*replace_existing=*/true);
    l.with_grad({1}).value_and_grad(t4);  // a miss on the new definitions
    ASSERT_EQ(l.with_grad({1}).wait_ready(t4).state, State::kReady);
    loss = l.stats();
    other = o.stats();
    count_down = c.stats();
    wrap = w.stats();
  }
};

// Jobs compile natively at once (no baseline code first): the events and
// log lines of LLVM's stages are what these tests read, and a call's job
// that a worker starts before wait_ready asks for it would otherwise tier up
// later instead (engine_test has the tier-up).
EngineOptions ScenarioOptions() {
  return Options(Policy::Eager(), [](EngineOptions& o) {
    o.max_specializations_per_entry = 1;
    o.baseline_first = false;
  });
}

// The fields docs/tracing.md lists per event: "### `name`" then table rows
// "| `field` | type | ...".
std::map<std::string, std::map<std::string, std::string>> DocumentedFields() {
  std::ifstream in("docs/tracing.md");
  EXPECT_TRUE(in) << "docs/tracing.md is not in the test's runfiles";
  std::map<std::string, std::map<std::string, std::string>> fields;
  std::regex section(R"(^### `([a-z-]+)`$)"), row(R"(^\| `([a-z_]+)` \| (integer|string) \|.*)");
  std::string current, line;
  bool schema = false;
  while (std::getline(in, line)) {
    std::smatch m;
    if (line == "## The JSON-lines schema") schema = true;
    if (!schema) continue;
    if (std::regex_match(line, m, section)) {
      current = m[1];
      fields[current];
    } else if (!current.empty() && std::regex_match(line, m, row)) {
      fields[current][m[1]] = m[2];
    }
  }
  return fields;
}

TEST(Tracing, TheEventsOfOneSignatureComeInThePipelinesOrder) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.events = events;
    o.baseline_first = false;  // LLVM's stages in the job (ScenarioOptions)
  }));
  engine.module().AddSource(kProgram, "program.pj");
  Rng rng(2);
  std::vector<Value> args = {MakeTree(*engine.module().snapshot(), 3, 0, 10), RandomMatrix(rng, 10, 4)};
  Entry loss = engine.entry("loss");
  loss.with_grad({1}).value_and_grad(args);
  ASSERT_TRUE(loss.with_grad({1}).wait_ready(args).ready());
  loss.with_grad({1}).value_and_grad(args);

  std::string sig = ComputeSignature(args).ShortHash();
  std::vector<std::string> order;
  std::set<int64_t> jobs;
  for (const Event& e : events->events()) {
    if (e.signature != sig || e.kind == EventKind::kCall) continue;
    if (e.kind == EventKind::kMiss && std::count(order.begin(), order.end(), "miss")) continue;
    order.emplace_back(e.name());
    if (e.Find("job")) jobs.insert(std::get<int64_t>(*e.Find("job")));
  }
  // `batch` comes when the engine batches the residual (jit/batch.h).
  std::vector<std::string> expected = {"miss", "enqueue", "pe", "autodiff", "passes", "codegen", "compile", "swap",
                                       "hit"};
  if (events->Count(EventKind::kBatch) > 0) expected.insert(expected.begin() + 3, "batch");
  EXPECT_EQ(order, expected);
  EXPECT_EQ(jobs.size(), 1u) << "one job, one number, from enqueue to swap";

  // Stages nest in the job's span, passes and codegen inside compile.
  auto span = [&](EventKind k) { return events->Of(k, "loss").at(0); };
  Event swap = span(EventKind::kSwap), compile = span(EventKind::kCompile);
  for (EventKind k : {EventKind::kPe, EventKind::kAutodiff, EventKind::kCompile}) {
    Event e = span(k);
    EXPECT_GE(e.start_us, swap.start_us) << e.name();
    EXPECT_LE(e.start_us + e.duration_us, swap.start_us + swap.duration_us) << e.name();
  }
  for (EventKind k : {EventKind::kPasses, EventKind::kCodegen}) {
    Event e = span(k);
    EXPECT_GE(e.start_us, compile.start_us) << e.name();
    EXPECT_LE(e.start_us + e.duration_us, compile.start_us + compile.duration_us) << e.name();
  }
  EXPECT_EQ(swap.Text("tier"), "native");
  EXPECT_GT(std::get<int64_t>(*swap.Find("kernels")), 0);
  EXPECT_EQ(std::get<int64_t>(*swap.Find("code_bytes")), std::get<int64_t>(*compile.Find("code_bytes")));
  // The swap line sums the stages up: batching's time is the batch event's.
  if (events->Count(EventKind::kBatch) > 0) {
    ASSERT_TRUE(swap.Find("batch_us"));
    EXPECT_EQ(std::get<int64_t>(*swap.Find("batch_us")), span(EventKind::kBatch).duration_us);
  } else {
    EXPECT_FALSE(swap.Find("batch_us"));
  }
}

TEST(Tracing, TheTraceFileHoldsEveryEventWithTheDocumentedSchema) {
  std::string path = ScratchPath("trace.jsonl");
  auto recorded = std::make_shared<RecordingSink>();
  {
    EngineOptions options = ScenarioOptions();
    options.trace_file = path;
    options.events = recorded;
    Engine engine(options);
    Scenario().Run(engine);
  }
  // A second engine on the same file (appending) for the events the first
  // cannot produce: a broken compile hook (failed) and jobs still queued at
  // shutdown (cancel).
  {
    EngineOptions options = Options(Policy::Eager(), [&](EngineOptions& o) {
      o.trace_file = path;
      o.events = recorded;
      o.compile = [](const Residual&) { return ExecutablePtr(); };
      // Every job after the first runs on until shutdown has cancelled those
      // still queued, so that some are (without it, a worker that got the
      // CPU first could finish them all).
      o.before_compile = [jobs = std::make_shared<std::atomic<int>>(0), recorded](const CompileInfo&) {
        if (jobs->fetch_add(1) > 0) Eventually([&] { return recorded->Count(EventKind::kCancel) > 0; });
      };
    });
    Engine engine(options);
    engine.module().AddSource(kProgram, "program.pj");
    Rng rng(1);
    Entry other = engine.entry("other");
    std::vector<Value> first = {RandomMatrix(rng, 1, 3), RandomMatrix(rng, 3, 2)};
    other.call(first);
    ASSERT_EQ(other.wait_ready(first).reason, "compile: the compile hook returned no executable");
    for (int rows = 2; rows < 6; ++rows) other.call({RandomMatrix(rng, rows, 3), RandomMatrix(rng, 3, 2)});
  }

  // One whose job publishes baseline code, native code later (tier-up).
  {
    EngineOptions options = Options(Policy::Eager(), [&](EngineOptions& o) {
      o.trace_file = path;
      o.events = recorded;
    });
    Engine engine(options);
    engine.module().AddSource(kProgram, "program.pj");
    Rng rng(4);
    engine.entry("other").call({RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)});
    engine.drain();
  }

  // Two on a persistent code cache: the first stores what it compiles, the
  // second loads it; then an entry damaged on disk is refused.
  {
    const std::string dir = ScratchPath("code_cache");
    std::filesystem::remove_all(dir);
    auto cached = [&] {
      return Options(Policy::Sync(), [&](EngineOptions& o) {
        o.trace_file = path;
        o.events = recorded;
        o.cache_dir = dir;
      });
    };
    Rng rng(3);
    std::vector<Value> m = {RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)};
    for (int run = 0; run < 3; ++run) {
      if (run == 2) {
        for (const auto& e : std::filesystem::directory_iterator(dir)) {
          if (e.path().extension() == ".pjc") std::ofstream(e.path(), std::ios::app) << "x";  // an entry, not the key
        }
      }
      Engine engine(cached());
      engine.module().AddSource(kProgram, "program.pj");
      engine.entry("other").call(m);
    }
    std::filesystem::remove_all(dir);
  }
  // A third with the generic tier on: a segment's compile, a walk ahead of a
  // prefetched call, and an entry it declines (@count_down matches on nothing).
  {
    EngineOptions options = Options(Policy::Eager(), [&](EngineOptions& o) {
      o.trace_file = path;
      o.events = recorded;
      o.generic = true;
    });
    Engine engine(options);
    engine.module().AddSource(kProgram, "program.pj");
    Snapshot s = engine.module().snapshot();
    Rng rng(2);
    Entry loss = engine.entry("loss");
    std::vector<Value> args = {MakeTree(*s, 5, 0, 4), RandomMatrix(rng, 4, 3)};
    ASSERT_TRUE(Eventually([&] {
      loss.with_grad({1}).value_and_grad(args);
      return loss.stats().generic_native_runs > 0;
    }));
    loss.with_grad({1}).prefetch({MakeTree(*s, 6, 1, 4), args[1]}, Prefetch::kNext);
    ASSERT_TRUE(Eventually([&] { return recorded->Count(EventKind::kGenericInspect) > 0; }));
    engine.entry("count_down").call({I(3), Value(Tensor::Scalar(1))});
  }

  std::map<std::string, std::map<std::string, std::string>> documented = DocumentedFields();
  for (int k = 0; k < kEventKinds; ++k) {
    EXPECT_TRUE(documented.count(std::string(EventName(static_cast<EventKind>(k)))))
        << "docs/tracing.md has no section for " << EventName(static_cast<EventKind>(k));
  }
  const std::vector<std::pair<std::string, std::string>> common = {
      {"event", "string"}, {"entry", "string"},      {"signature", "string"},
      {"thread", "integer"}, {"start_us", "integer"}, {"duration_us", "integer"}};
  std::set<std::string> seen;
  std::vector<std::string> lines = ReadLines(path);
  for (const std::string& line : lines) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
    ASSERT_TRUE(j.is_object()) << line;
    auto it = j.begin();
    for (const auto& [key, type] : common) {
      ASSERT_NE(it, j.end()) << line;
      EXPECT_EQ(it.key(), key) << line;
      EXPECT_EQ(type == "integer" ? it->is_number_integer() : it->is_string(), true) << key << " in " << line;
      ++it;
    }
    std::string name = j["event"];
    seen.insert(name);
    const auto& fields = documented[name];
    for (; it != j.end(); ++it) {
      ASSERT_TRUE(fields.count(it.key())) << "field " << it.key() << " of " << name << " is not documented";
      EXPECT_EQ(fields.at(it.key()) == "integer" ? it->is_number_integer() : it->is_string(), true)
          << it.key() << " in " << line;
    }
  }
  // Every kind but `batch` (only when the engine batches), and nothing else.
  std::set<std::string> all;
  for (int k = 0; k < kEventKinds; ++k) all.insert(std::string(EventName(static_cast<EventKind>(k))));
  seen.erase("batch");
  all.erase("batch");
  EXPECT_EQ(seen, all);

  // The file has exactly the events the program's own sink saw.
  std::vector<std::string> from_file, from_sink;
  for (const Event& e : ReadTraceFile(path)) from_file.push_back(EventToJson(e));
  for (const Event& e : recorded->events()) from_sink.push_back(EventToJson(e));
  std::sort(from_file.begin(), from_file.end());
  std::sort(from_sink.begin(), from_sink.end());
  EXPECT_EQ(from_file, from_sink);
}

TEST(Tracing, TheSummaryOfTheTraceFileIsTheBlockTheEngineLogged) {
  CapturedPejitLog log;
  std::string path = ScratchPath("trace.jsonl");
  Scenario scenario;
  {
    EngineOptions options = ScenarioOptions();
    options.trace_file = path;
    options.log_level = "info";
    Engine engine(options);
    scenario.Run(engine);
  }
  std::vector<std::string> lines = log->lines();
  auto block = std::find_if(lines.begin(), lines.end(), [](const std::string& l) { return l.starts_with("pejit statistics"); });
  ASSERT_NE(block, lines.end());
  std::vector<std::string> logged(block, lines.end());

  TraceStats stats;
  for (const Event& e : ReadTraceFile(path)) stats.Add(e);
  EXPECT_EQ(logged, SplitLines(stats.Render()));

  // And the statistics agree with the engine's own counters.
  for (const auto& [name, s] : std::map<std::string, EntryStats>{
           {"loss", scenario.loss}, {"other", scenario.other}, {"count_down", scenario.count_down}}) {
    const EntryTotals& t = stats.entries().at(name);
    EXPECT_EQ(t.calls("interpreter"), s.calls_interpreter) << name;
    EXPECT_EQ(t.calls("native"), s.calls_native) << name;
    EXPECT_EQ(t.hits, s.hits) << name;
    EXPECT_EQ(t.misses, s.misses) << name;
    EXPECT_EQ(t.compiled, s.compiled) << name;
    EXPECT_EQ(t.refused, s.refused) << name;
    EXPECT_EQ(t.failed, s.failed) << name;
    EXPECT_EQ(t.evicted, s.evicted) << name;
    EXPECT_EQ(t.invalidated, s.invalidated) << name;
    EXPECT_EQ(t.prefetched, s.prefetched) << name;
  }
  EXPECT_EQ(scenario.loss.evicted, 1);
  EXPECT_GE(scenario.loss.invalidated, 1);
  EXPECT_EQ(stats.entries().at("count_down").compiled, 1);
  EXPECT_EQ(stats.entries().at("wrap").refused, 1);
  EXPECT_EQ(stats.stage("job").count(), 6u);  // loss: 2, and 1 after the edit; other: 2; count_down: 1
}

TEST(Tracing, LogLinesOfSwapMissAndRefusedCarryTheirFields) {
  CapturedPejitLog log;
  Scenario scenario;
  {
    EngineOptions options = ScenarioOptions();
    options.log_level = "debug";
    Engine engine(options);
    scenario.Run(engine);
  }
  auto one = [&](const std::string& prefix) {
    std::vector<std::string> found = log->StartingWith(prefix);
    EXPECT_FALSE(found.empty()) << "no line starts with \"" << prefix << "\"";
    return found.empty() ? std::string() : found[0];
  };
  std::string sig = "sig=" + scenario.loss_sig;
  EXPECT_TRUE(std::regex_match(
      one("swap       loss        " + sig),
      std::regex("swap       loss        " + sig +
                 R"(  native  job=\d+  mode=grad:1  pe=\S+  (batch=\S+  )?autodiff=\S+  passes=\S+  llvm=\S+  kernels=\d+  )"
                 R"(code=\S+(KiB|B|MiB)  wait=\S+)")))
      << one("swap       loss");
  EXPECT_EQ(one("miss       loss        " + sig), "miss       loss        " + sig + "  -> interpreter (new, queue=0)");
  std::string refused = one("refused    wrap");
  EXPECT_TRUE(std::regex_match(refused,
                               std::regex(R"(refused    wrap        sig=[0-9a-f]{8}  job=\d+  mode=value  wait=\S+  )"
                                          R"(reason="result: @wrap returns List\[Tensor\[\(2,\), f32\]\]; only )"
                                          R"(results of tensors nested in tuples are compiled")")))
      << refused;
  EXPECT_TRUE(std::regex_match(one("invalidate loss"),
                               std::regex(R"(invalidate loss\s+definitions=@helper  slots=\d+)")))
      << one("invalidate loss");
  EXPECT_TRUE(std::regex_match(one("pe         other"),
                               std::regex(R"(pe         other       sig=[0-9a-f]{8}  \S+  job=\d+  residual_ops=\d+  )"
                                          R"(params=2  unfoldings=\d+)")))
      << one("pe         other");
  // Below trace, calls are summed: no line per call, and `calls` lines at the end.
  EXPECT_TRUE(log->StartingWith("call ").empty());
  EXPECT_TRUE(std::regex_match(one("calls      loss"),
                               std::regex(R"(calls      loss\s+interpreter=3 \(\S+/call\)  native=1 \(\S+/call\)  over \S+)")))
      << one("calls      loss");
}

TEST(Tracing, TheTraceFileIsCompleteOnceTheEngineIsDestroyed) {
  std::string path = ScratchPath("trace.jsonl");
  constexpr int kThreads = 2, kCalls = 1500;
  {
    EngineOptions options = Options(Policy::Interpreter());
    options.trace_file = path;
    Engine engine(options);
    engine.module().AddSource(kProgram, "program.pj");
    Entry scale = engine.entry("scale");
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kCalls; ++i) {
          scale.call({Value(Tensor::FromVector<float>({2}, {1, 2})), Value(Tensor::Scalar(2))});
        }
      });
    }
    for (auto& th : threads) th.join();
  }  // no sleep, no flush: the destructor writes everything out
  std::vector<Event> events = ReadTraceFile(path);
  ASSERT_EQ(events.size(), 3u + kThreads * kCalls);  // start, the edit adding the program, the calls, stop
  EXPECT_EQ(events.front().kind, EventKind::kStart);
  EXPECT_EQ(events.back().kind, EventKind::kStop);
  EXPECT_EQ(std::count_if(events.begin(), events.end(), [](const Event& e) { return e.kind == EventKind::kCall; }),
            kThreads * kCalls);
}

// LLVM is set up on the worker while the first calls run on tier 0, so that
// the first compile a call waits for is only that compile; an engine that
// never compiles leaves it alone.
TEST(Tracing, AWorkerSetsLlvmUpAtTheStartOfAnEngineThatCompiles) {
  for (Policy policy : {Policy::Eager(), Policy::Sync(), Policy::Interpreter()}) {
    auto events = std::make_shared<RecordingSink>();
    Engine engine(Options(policy, [&](EngineOptions& o) { o.events = events; }));
    engine.drain();
    const std::vector<Event> warm_ups = events->Of(EventKind::kWarmUp);
    if (policy.kind == Policy::Kind::kInterpreter) {
      EXPECT_TRUE(warm_ups.empty());
      continue;
    }
    ASSERT_EQ(warm_ups.size(), 1u) << policy.ToString();
    EXPECT_EQ(warm_ups[0].Text("error"), "");
    EXPECT_TRUE(warm_ups[0].Text("state") == "set-up" || warm_ups[0].Text("state") == "ready")
        << warm_ups[0].Text("state");
  }
}

TEST(Tracing, ABadPejitLogIsAWarningNotACrash) {
  CapturedPejitLog log;
  const char* old = std::getenv("PEJIT_LOG");
  std::string saved = old ? old : "";
  setenv("PEJIT_LOG", "debgu", 1);
  {
    Engine engine(Options(Policy::Sync()));
    engine.module().AddSource(kProgram, "program.pj");
    Entry scale = engine.entry("scale");
    Value out = scale.call({Value(Tensor::FromVector<float>({2}, {1, 2})), Value(Tensor::Scalar(2))});
    EXPECT_EQ(out.tensor().data<float>()[1], 4.0f);
  }
  if (saved.empty()) {
    unsetenv("PEJIT_LOG");
  } else {
    setenv("PEJIT_LOG", saved.c_str(), 1);
  }
  EXPECT_EQ(log->lines(),
            (std::vector<std::string>{"warning: PEJIT_LOG='debgu' is not a log level (did you mean 'debug'?); "
                                      "expected off, info, debug or trace; logging stays off"}));

  EngineOptions bad;
  bad.log_level = "loud";
  EXPECT_THROW(Engine{bad}, std::invalid_argument);
  EngineOptions unwritable;
  unwritable.trace_file = "/nonexistent-dir/trace.jsonl";
  try {
    Engine engine(unwritable);
    FAIL() << "an unwritable trace file was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot open the trace file /nonexistent-dir/trace.jsonl: No such file or directory");
  }
}

TEST(Tracing, TheChromeTraceOfARunHasACallsTrackAWorkerTrackAndAnArrowPerJob) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.events = events;
    o.baseline_first = false;  // LLVM's stages in the job (ScenarioOptions)
  }));
  engine.module().AddSource(kProgram, "program.pj");
  Rng rng(8);
  Entry other = engine.entry("other");
  for (int rows = 1; rows <= 3; ++rows) {
    std::vector<Value> args = {RandomMatrix(rng, rows, 3), RandomMatrix(rng, 3, 2)};
    other.call(args);
    ASSERT_TRUE(other.wait_ready(args).ready());
    other.call(args);
  }
  nlohmann::json doc = nlohmann::json::parse(ChromeTrace(events->events()));
  uint64_t me = ThreadNumber();
  std::map<uint64_t, std::string> tracks;
  std::map<std::string, std::set<uint64_t>> threads_of;  // slice name -> threads
  std::map<std::string, int> flow_out, flow_in;          // bind_id -> count
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") {
      if (e.at("name") == "thread_name") tracks[e.at("tid")] = e.at("args").at("name");
      continue;
    }
    std::string name = e.at("name");
    threads_of[name.starts_with("job ") ? "job" : name].insert(e.at("tid").get<uint64_t>());
    if (e.contains("flow_out")) flow_out[e.at("bind_id")]++;
    if (e.contains("flow_in")) flow_in[e.at("bind_id")]++;
  }
  EXPECT_EQ(tracks[me], "calls (thread " + std::to_string(me) + ")");
  // One worker at a time, but not always the same thread (the pool's threads
  // take turns): each job's track is a worker's, and its stages are on it.
  ASSERT_FALSE(threads_of["job"].empty());
  for (uint64_t worker : threads_of["job"]) {
    EXPECT_EQ(tracks[worker], "worker (thread " + std::to_string(worker) + ")");
  }
  EXPECT_EQ(threads_of["call interpreter"], std::set<uint64_t>{me});
  EXPECT_EQ(threads_of["call native"], std::set<uint64_t>{me});
  for (uint64_t t : threads_of["codegen"]) EXPECT_TRUE(threads_of["job"].count(t)) << "codegen off the job tracks";
  EXPECT_FALSE(threads_of["codegen"].empty());
  EXPECT_EQ(flow_out.size(), 3u);
  EXPECT_EQ(flow_out, flow_in);
}

}  // namespace
}  // namespace pejit
