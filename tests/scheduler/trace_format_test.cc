// The tracing sinks on their own, without an engine: events as JSON lines and
// back, log lines, levels, statistics, the asynchronous file writer, the
// settings from options and environment, and the Chrome trace.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>

#include <cstdlib>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "scheduler/trace_file.h"
#include "scheduler/trace_sinks.h"
#include "scheduler/trace_stats.h"
#include "tests/scheduler/trace_fixtures.h"

namespace pejit {
namespace {

using namespace testing_trace;

Event EventOf(EventKind kind, std::string entry, std::string sig, int64_t start_us, int64_t duration_us,
                std::vector<std::pair<std::string, FieldValue>> fields = {}, uint64_t thread = 1) {
  Event e;
  e.kind = kind;
  e.entry = std::move(entry);
  e.signature = std::move(sig);
  e.thread = thread;
  e.start_us = start_us;
  e.duration_us = duration_us;
  e.fields = std::move(fields);
  return e;
}

void ExpectSameEvent(const Event& a, const Event& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.entry, b.entry);
  EXPECT_EQ(a.signature, b.signature);
  EXPECT_EQ(a.thread, b.thread);
  EXPECT_EQ(a.start_us, b.start_us);
  EXPECT_EQ(a.duration_us, b.duration_us);
  EXPECT_EQ(a.fields, b.fields);
}

// ---- JSON lines -------------------------------------------------------------------------

TEST(TraceJson, AnEventReadsBackAsItWasWrittenWithTheCommonKeysFirst) {
  Event e = EventOf(EventKind::kRefused, "loss", "0c11aa20", 81234567, 35012,
                      {{"job", int64_t{7}}, {"ratio", 0.25}, {"reason", std::string("pe: \"quoted\", ünïcode\n")}},
                      3);
  std::string line = EventToJson(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.rfind(R"({"event":"refused","entry":"loss","signature":"0c11aa20","thread":3,)"
                       R"("start_us":81234567,"duration_us":35012,"job":7,"ratio":0.25,)",
                       0),
            0u)
      << line;
  ExpectSameEvent(EventFromJson(line), e);
}

TEST(TraceJson, BytesThatAreNotUtf8AreReplacedNotThrown) {
  Event e = EventOf(EventKind::kFailed, "loss", "", 0, 0, {{"reason", std::string("bad \xff byte")}});
  EXPECT_EQ(EventFromJson(EventToJson(e)).Text("reason"), "bad \xEF\xBF\xBD byte");  // U+FFFD
}

TEST(TraceJson, AFieldNamedLikeACommonKeyCannotShadowIt) {
  Event e = EventOf(EventKind::kHit, "loss", "3f2a91c0", 5, 0, {{"entry", std::string("other")}});
  Event back = EventFromJson(EventToJson(e));
  EXPECT_EQ(back.entry, "loss");
  EXPECT_EQ(back.Text("field_entry"), "other");
}

TEST(TraceJson, BadLinesNameTheFileTheLineAndTheProblem) {
  auto error_of = [](const std::string& text) {
    std::istringstream in(text);
    try {
      ReadTrace(in, "t.jsonl");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string good = EventToJson(EventOf(EventKind::kHit, "loss", "3f2a91c0", 5, 0, {{"tier", std::string("native")}}));
  EXPECT_EQ(error_of(good + "\n\n" + R"({"event":"nope","entry":"","signature":"","thread":1,"start_us":0,"duration_us":0})"),
            "t.jsonl:3: unknown event \"nope\"");
  EXPECT_EQ(error_of("{not json").rfind("t.jsonl:1: not JSON: ", 0), 0u) << error_of("{not json");
  EXPECT_EQ(error_of(R"({"event":"hit","entry":"loss","signature":"","thread":"one","start_us":0,"duration_us":0})"),
            "t.jsonl:1: \"thread\" must be an integer");
  EXPECT_EQ(error_of(R"({"event":"hit","entry":"loss","signature":"","thread":1,"duration_us":0})"),
            "t.jsonl:1: no \"start_us\"");
  EXPECT_EQ(error_of(R"({"event":"hit","entry":"loss","signature":"","thread":1,"start_us":0,"duration_us":0,)"
                     R"("tier":["native"]})"),
            "t.jsonl:1: field \"tier\" must be a number or a string");
  EXPECT_EQ(error_of("[1, 2]"), "t.jsonl:1: not a JSON object");
  // Issue 24: an end past int64 overflowed the summary's arithmetic.
  EXPECT_EQ(error_of(R"({"event":"hit","entry":"loss","signature":"","thread":1,"start_us":5,)"
                     R"("duration_us":9223372036854775807})"),
            "t.jsonl:1: \"start_us\" + \"duration_us\" is past int64's range");
  EXPECT_EQ(error_of(R"({"event":"hit","entry":"loss","signature":"","thread":18446744073709551615,)"
                     R"("start_us":0,"duration_us":0})"),
            "t.jsonl:1: \"thread\" is past int64's range");
  // The fields a reader interprets have their documented types.
  const std::string common = R"({"event":"swap","entry":"loss","signature":"","thread":1,"start_us":0,"duration_us":0,)";
  EXPECT_EQ(error_of(common + R"("job":1e20})"), "t.jsonl:1: \"job\" must be an integer >= 0");
  EXPECT_EQ(error_of(common + R"("job":-4})"), "t.jsonl:1: \"job\" must be an integer >= 0");
  EXPECT_EQ(error_of(common + R"("tier":3})"), "t.jsonl:1: \"tier\" must be a string");
  EXPECT_EQ(error_of(common + R"("job":4,"tier":"native","ratio":1e20})"), "no error");  // other fields: any number
  EXPECT_THROW(ReadTraceFile("/dev/zero"), std::runtime_error);  // a device: not read forever
  std::istringstream in(good + "\n" + good + "\n");
  EXPECT_EQ(ReadTrace(in, "t.jsonl").size(), 2u);
}

// The summary and the Chrome export read fields only through the reader's
// table of checked fields: one that is not in it, or of the other type, is
// a mistake in pejit, not in the file.
TEST(TraceJson, ReadersInterpretOnlyTheFieldsTheReaderChecks) {
  Event e;
  e.kind = EventKind::kSwap;
  e.fields = {{"job", int64_t{7}}, {"tier", std::string("native")}};
  EXPECT_EQ(CountField(e, "job"), 7);
  EXPECT_EQ(StringField(e, "tier"), "native");
  EXPECT_EQ(CountField(e, "slots"), 0);    // absent
  EXPECT_EQ(StringField(e, "reason"), "");  // absent
  EXPECT_THROW(CountField(e, "ratio"), std::logic_error);
  EXPECT_THROW(CountField(e, "tier"), std::logic_error);
  EXPECT_THROW(StringField(e, "job"), std::logic_error);
}

// ---- Log lines --------------------------------------------------------------------------

TEST(TraceLog, ASwapLineHasTheEntrySignatureTierAndStageTimes) {
  Event swap = EventOf(EventKind::kSwap, "loss", "3f2a91c0", 0, 41000,
                         {{"tier", std::string("native")},
                          {"job", int64_t{7}},
                          {"mode", std::string("grad:2")},
                          {"pe_us", int64_t{4100}},
                          {"passes_us", int64_t{2000}},
                          {"llvm_us", int64_t{31500}},
                          {"kernels", int64_t{23}},
                          {"code_bytes", int64_t{14541}},
                          {"wait_us", int64_t{120}}});
  EXPECT_EQ(FormatEvent(swap),
            "swap       loss        sig=3f2a91c0  native  job=7  mode=grad:2  pe=4.1ms  passes=2.0ms  llvm=31.5ms  "
            "kernels=23  code=14.2KiB  wait=0.12ms");
}

TEST(TraceLog, MissAndRefusedLinesSayWhereTheCallWentAndWhy) {
  Event miss = EventOf(EventKind::kMiss, "loss", "77b1e004", 0, 0,
                         {{"state", std::string("pending")}, {"policy", std::string("eager")}, {"queue", int64_t{3}}});
  EXPECT_EQ(FormatEvent(miss), "miss       loss        sig=77b1e004  -> interpreter (pending, queue=3)");
  Event refused = EventOf(EventKind::kRefused, "loss", "0c11aa20", 0, 900,
                            {{"job", int64_t{2}},
                             {"mode", std::string("value")},
                             {"wait_us", int64_t{15}},
                             {"reason", std::string("pe: residual over 3 operators (PeOptions::max_residual_ops)")}});
  EXPECT_EQ(FormatEvent(refused),
            "refused    loss        sig=0c11aa20  job=2  mode=value  wait=15us  "
            "reason=\"pe: residual over 3 operators (PeOptions::max_residual_ops)\"");
  // Entries longer than the column push it; events without a signature keep the columns.
  Event inv = EventOf(EventKind::kInvalidate, "a_long_entry", "", 0, 0,
                        {{"definitions", std::string("@helper")}, {"slots", int64_t{2}}});
  EXPECT_EQ(FormatEvent(inv, 12), "invalidate a_long_entry                definitions=@helper  slots=2");
}

TEST(TraceLog, InfoShowsWhatChangesWhereCallsRunDebugTheJobsTraceEachCall) {
  EXPECT_EQ(LevelOf(EventOf(EventKind::kSwap, "l", "s", 0, 0)), LogLevel::kInfo);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kRefused, "l", "s", 0, 0)), LogLevel::kInfo);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kMiss, "l", "s", 0, 0, {{"state", std::string("new")}})), LogLevel::kInfo);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kMiss, "l", "s", 0, 0, {{"state", std::string("pending")}})),
            LogLevel::kDebug);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kEvict, "l", "s", 0, 0, {{"state", std::string("ready")}})), LogLevel::kInfo);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kEvict, "l", "s", 0, 0, {{"state", std::string("cold")}})), LogLevel::kDebug);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kPe, "l", "s", 0, 0)), LogLevel::kDebug);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kCall, "l", "s", 0, 0)), LogLevel::kTrace);
  EXPECT_EQ(LevelOf(EventOf(EventKind::kHit, "l", "s", 0, 0)), LogLevel::kTrace);

  LogLevel level = LogLevel::kOff;
  EXPECT_TRUE(ParseLogLevel("DEBUG", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  EXPECT_FALSE(ParseLogLevel("verbose", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
}

TEST(TraceLog, BelowTraceCallsAreSummedIntoOneLinePerEntryAndWindow) {
  auto capture = std::make_shared<CaptureSink>();
  auto logger = std::make_shared<spdlog::logger>("calls-test", capture);
  LogSink sink(LogLevel::kInfo, logger, /*call_window_us=*/1'000'000);
  EXPECT_TRUE(sink.Wants(EventKind::kCall));
  EXPECT_FALSE(sink.Wants(EventKind::kPe));
  auto call = [](int64_t start, int64_t dur, const char* tier) {
    return EventOf(EventKind::kCall, "loss", "3f2a91c0", start, dur,
                     {{"tier", std::string(tier)}, {"mode", std::string("grad")}});
  };
  sink.Emit(call(0, 3000, "interpreter"));
  sink.Emit(call(400'000, 1000, "interpreter"));
  sink.Emit(call(800'000, 500, "native"));
  EXPECT_TRUE(capture->lines().empty());
  sink.Emit(call(1'000'000, 700, "native"));  // a second after the window's first call
  ASSERT_EQ(capture->lines().size(), 1u);
  EXPECT_EQ(capture->lines()[0],
            "calls      loss                      interpreter=2 (2.0ms/call)  native=2 (0.60ms/call)  over 1.00s");
  sink.Emit(call(1'500'000, 100, "native"));
  sink.FlushCalls();
  ASSERT_EQ(capture->lines().size(), 2u);
  EXPECT_EQ(capture->lines()[1], "calls      loss                      native=1 (0.10ms/call)  over 0.10ms");

  LogSink each(LogLevel::kTrace, logger);
  each.Emit(call(0, 3000, "interpreter"));
  ASSERT_EQ(capture->lines().size(), 3u);
  EXPECT_EQ(capture->lines()[2], "call       loss        sig=3f2a91c0  interpreter             3.0ms  grad");
}

// Each event is one log call of one whole line: spdlog's sinks write it
// under their lock, so lines from many threads never mix.
TEST(TraceLog, LinesFromManyThreadsDoNotInterleave) {
  std::string path = ScratchPath("log.txt");
  auto logger = std::make_shared<spdlog::logger>(
      "interleave-test", std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/true));
  logger->set_pattern("[%n] %v");
  {
    LogSink sink(LogLevel::kDebug, logger);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&sink, t] {
        for (int i = 0; i < 300; ++i) {
          sink.Emit(EventOf(EventKind::kPe, "entry" + std::to_string(t), "0000000" + std::to_string(t), i, 1500,
                              {{"job", int64_t{i}}, {"residual_ops", int64_t{1000 + i}}}, t + 1));
        }
      });
    }
    for (auto& th : threads) th.join();
    logger->flush();
  }
  std::vector<std::string> lines = ReadLines(path);
  ASSERT_EQ(lines.size(), 8u * 300u);
  std::regex whole(R"(\[interleave-test\] pe +entry([0-7]) +sig=0000000\1  1\.5ms  job=\d+  residual_ops=\d+)");
  for (const std::string& l : lines) EXPECT_TRUE(std::regex_match(l, whole)) << l;
}

// ---- Statistics -------------------------------------------------------------------------

TEST(TraceStats, PercentilesAreNearestRank) {
  Durations d;
  EXPECT_EQ(d.Percentile(0.5), 0);
  for (int i = 100; i >= 1; --i) d.Add(i);
  EXPECT_EQ(d.Percentile(0.5), 50);
  EXPECT_EQ(d.Percentile(0.99), 99);
  EXPECT_EQ(d.Percentile(1.0), 100);
  EXPECT_EQ(d.max(), 100);
  EXPECT_EQ(d.total(), 5050);
}

TEST(TraceStats, TheBlockCountsCallsPerTierSpecializationsStagesAndReasons) {
  TraceStats stats;
  auto add = [&](EventKind k, const char* entry, int64_t start, int64_t dur,
                 std::vector<std::pair<std::string, FieldValue>> fields = {}) {
    stats.Add(EventOf(k, entry, entry[0] ? "3f2a91c0" : "", start, dur, std::move(fields)));
  };
  auto s = [](const char* v) { return FieldValue(std::string(v)); };
  add(EventKind::kStart, "", 0, 0, {{"policy", s("eager")}, {"workers", int64_t{1}}});
  add(EventKind::kMiss, "loss", 10, 0, {{"state", s("new")}});
  add(EventKind::kEnqueue, "loss", 11, 0, {{"job", int64_t{1}}});
  add(EventKind::kCall, "loss", 10, 4000, {{"tier", s("interpreter")}});
  add(EventKind::kPe, "loss", 20, 1000);
  add(EventKind::kCompile, "loss", 1100, 3000);
  add(EventKind::kSwap, "loss", 20, 5000, {{"wait_us", int64_t{9}}});
  add(EventKind::kHit, "loss", 6000, 0);
  add(EventKind::kCall, "loss", 6000, 1000, {{"tier", s("native")}});
  for (int64_t at : {6100, 6200}) {
    add(EventKind::kAdmission, "loss", at, 0, {{"decision", s("postpone")}, {"reason", s("would save 0.2 ms")}});
  }
  add(EventKind::kHit, "loss", 7000, 0);
  add(EventKind::kCall, "loss", 7000, 3000, {{"tier", s("native")}});
  add(EventKind::kEvict, "loss", 8000, 0, {{"reason", s("budget")}, {"state", s("ready")}});
  add(EventKind::kEvict, "loss", 8000, 0, {{"reason", s("tracked-max")}, {"state", s("cold")}});
  add(EventKind::kMiss, "wrap", 9000, 0, {{"state", s("new")}});
  add(EventKind::kCall, "wrap", 9000, 500, {{"tier", s("interpreter")}});
  add(EventKind::kRefused, "wrap", 9100, 200, {{"wait_us", int64_t{3}}, {"reason", s("result: not tensors")}});
  add(EventKind::kInvalidate, "loss", 9500, 0, {{"definitions", s("@helper")}, {"slots", int64_t{2}}});
  add(EventKind::kStop, "", 0, 12000);
  EXPECT_EQ(stats.entries().at("loss").calls("native"), 2);
  EXPECT_EQ(stats.entries().at("loss").evicted, 1);
  EXPECT_EQ(stats.entries().at("wrap").refused, 1);
  EXPECT_EQ(stats.Render(),
            "pejit statistics: policy eager, 1 worker, 12.0ms of events\n"
            "entry  calls      interpreter  residual-interpreter          native  hits  misses\n"
            "loss       3   1 (4.0ms/call)                     0  2 (2.0ms/call)     2       1\n"
            "wrap       1  1 (0.50ms/call)                     0               0     0       1\n"
            "entry  queued  compiled  refused  failed  evicted  invalidated  cancelled  prefetched\n"
            "loss        1         1        0       0        1            2          0           0\n"
            "wrap        0         0        1       0        0            0          0           0\n"
            "stage       count  total    p50    p99    max\n"
            "job             1  5.0ms  5.0ms  5.0ms  5.0ms\n"
            "queue wait      2   12us    3us    9us    9us\n"
            "pe              1  1.0ms  1.0ms  1.0ms  1.0ms\n"
            "compile         1  3.0ms  3.0ms  3.0ms  3.0ms\n"
            "reasons\n"
            "  admission   loss  2  postpone\n"
            "  evict       loss  1  budget\n"
            "  evict       loss  1  tracked-max (cold, not counted)\n"
            "  invalidate  loss  2  @helper\n"
            "  refused     wrap  1  result: not tensors\n");
}

// ---- The trace file ---------------------------------------------------------------------

TEST(TraceFile, EventsFromManyThreadsAreAllWrittenWholeAndFlushOnDemand) {
  std::string path = ScratchPath("events.jsonl");
  auto sink = std::make_unique<JsonLinesSink>(path);
  sink->Emit(EventOf(EventKind::kStart, "", "", 1, 0, {{"policy", std::string("eager")}}));
  sink->Flush();
  EXPECT_EQ(ReadLines(path).size(), 1u);  // on disk before the sink goes
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        sink->Emit(EventOf(EventKind::kCall, "loss", "3f2a91c0", i, 7,
                             {{"tier", std::string("interpreter")}, {"mode", std::string("value")}}, t + 1));
      }
    });
  }
  for (auto& th : threads) th.join();
  sink.reset();
  std::vector<Event> events = ReadTraceFile(path);
  ASSERT_EQ(events.size(), 1u + 4 * 2000);
  std::vector<int> per_thread(5, 0);
  for (const Event& e : events) per_thread[e.thread]++;
  EXPECT_EQ(per_thread, (std::vector<int>{0, 2001, 2000, 2000, 2000}));
}

TEST(TraceFile, AFileThatCannotBeOpenedIsAnErrorNamingIt) {
  try {
    JsonLinesSink sink("/nonexistent-dir/trace.jsonl");
    FAIL() << "opened";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot open the trace file /nonexistent-dir/trace.jsonl: No such file or directory");
  }
}

// ---- Settings -----------------------------------------------------------------------------

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

TEST(TraceSettings, OptionsWinOverTheEnvironmentWhichFillsTheBlanks) {
  ScopedEnv log("PEJIT_LOG", "debug"), trace("PEJIT_TRACE", "/tmp/from-env.jsonl");
  TraceSettings from_env = ResolveTraceSettings("", "");
  EXPECT_EQ(from_env.log, LogLevel::kDebug);
  EXPECT_EQ(from_env.file, "/tmp/from-env.jsonl");
  EXPECT_TRUE(from_env.file_from_environment);
  TraceSettings from_options = ResolveTraceSettings("off", "mine.jsonl");
  EXPECT_EQ(from_options.log, LogLevel::kOff);
  EXPECT_EQ(from_options.file, "mine.jsonl");
  EXPECT_FALSE(from_options.file_from_environment);
}

TEST(TraceSettings, ABadPejitLogIsAWarningAndABadOptionAnError) {
  ScopedEnv log("PEJIT_LOG", "debgu");
  TraceSettings s = ResolveTraceSettings("", "");
  EXPECT_EQ(s.log, LogLevel::kOff);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "PEJIT_LOG='debgu' is not a log level (did you mean 'debug'?); expected off, info, debug or trace; "
            "logging stays off");
  try {
    ResolveTraceSettings("loud", "");
    FAIL() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "EngineOptions::log_level: 'loud' is not a log level; expected off, info, debug or trace");
  }
}

// ---- Fan-out -------------------------------------------------------------------------------

TEST(TraceFanOut, EachSinkGetsWhatItWantsAndOneThrowingStopsNoOther) {
  struct Throwing : EventSink {
    bool Wants(EventKind k) const override { return k == EventKind::kSwap; }
    void Emit(const Event&) override { throw std::runtime_error("disk full (test)"); }
  };
  auto recording = std::make_shared<RecordingSink>();
  FanOutSink fan({std::make_shared<Throwing>(), recording});
  EXPECT_TRUE(fan.Wants(EventKind::kSwap));
  fan.Emit(EventOf(EventKind::kSwap, "loss", "3f2a91c0", 0, 0));
  EXPECT_EQ(recording->Count(EventKind::kSwap), 1);

  FanOutSink only_swaps({std::make_shared<Throwing>()});
  EXPECT_FALSE(only_swaps.Wants(EventKind::kCall));
}

// ---- Chrome trace ----------------------------------------------------------------------------

TEST(TraceChrome, JobsNestTheirStagesAndAnArrowRunsFromEnqueueToSwap) {
  auto s = [](const char* v) { return FieldValue(std::string(v)); };
  std::vector<Event> events = {
      EventOf(EventKind::kCall, "loss", "3f2a91c0", 1000, 500, {{"tier", s("interpreter")}}, 1),
      EventOf(EventKind::kEnqueue, "loss", "3f2a91c0", 1100, 0, {{"job", int64_t{4}}}, 1),
      EventOf(EventKind::kPe, "loss", "3f2a91c0", 1200, 300, {{"job", int64_t{4}}}, 2),
      EventOf(EventKind::kSwap, "loss", "3f2a91c0", 1200, 900, {{"job", int64_t{4}}, {"tier", s("native")}}, 2),
      EventOf(EventKind::kHit, "loss", "3f2a91c0", 2500, 0, {{"tier", s("native")}}, 1),
  };
  nlohmann::json doc = nlohmann::json::parse(ChromeTrace(events));
  std::map<std::string, nlohmann::json> by_name;
  std::map<int, std::string> threads;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") threads[e.at("tid")] = e.at("args").at("name");
    if (e.at("ph") != "M") by_name[e.at("name")] = e;
  }
  EXPECT_EQ(threads, (std::map<int, std::string>{{1, "calls (thread 1)"}, {2, "worker (thread 2)"}}));
  EXPECT_EQ(by_name.at("call interpreter").at("ts"), 0);
  EXPECT_EQ(by_name.at("call interpreter").at("dur"), 500);
  EXPECT_EQ(by_name.at("enqueue").at("bind_id"), "4");
  EXPECT_EQ(by_name.at("enqueue").at("flow_out"), true);
  const auto& job = by_name.at("job loss 3f2a91c0: swap");
  EXPECT_EQ(job.at("bind_id"), "4");
  EXPECT_EQ(job.at("flow_in"), true);
  EXPECT_EQ(job.at("tid"), 2);
  EXPECT_EQ(by_name.at("pe").at("ts"), 200);
  EXPECT_EQ(by_name.at("hit").at("ph"), "i");
  // The job's slice comes before its stage starting at the same time.
  std::vector<std::string> order;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "M") order.push_back(e.at("name"));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"call interpreter", "enqueue", "job loss 3f2a91c0: swap", "pe", "hit"}));
}

}  // namespace
}  // namespace pejit
