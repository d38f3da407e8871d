// bench/compile_stats.h: what the benchmarks report about the background
// compiler, from the engine's events.
#include "bench/compile_stats.h"

#include <gtest/gtest.h>

namespace pejit::bench {
namespace {

Event Make(EventKind kind, const std::string& entry, const std::string& signature, int64_t start_us,
           int64_t duration_us = 0, int64_t code_bytes = -1) {
  Event e;
  e.kind = kind;
  e.entry = entry;
  e.signature = signature;
  e.start_us = start_us;
  e.duration_us = duration_us;
  if (code_bytes >= 0) e.fields.push_back({"code_bytes", code_bytes});
  return e;
}

TEST(CompileStatsSink, WantsOnlyTheEventsItCounts) {
  CompileStatsSink sink;
  EXPECT_TRUE(sink.Wants(EventKind::kMiss));
  EXPECT_TRUE(sink.Wants(EventKind::kPrefetch));
  EXPECT_TRUE(sink.Wants(EventKind::kSwap));
  EXPECT_TRUE(sink.Wants(EventKind::kRefused));
  EXPECT_FALSE(sink.Wants(EventKind::kCall));
  EXPECT_FALSE(sink.Wants(EventKind::kHit));
}

TEST(CompileStatsSink, FirstSightToSwapRunsFromTheEarliestMissOrPrefetchToTheSwapsEnd) {
  CompileStatsSink sink;
  sink.Emit(Make(EventKind::kMiss, "loss", "aaaa", 100));
  sink.Emit(Make(EventKind::kEnqueue, "loss", "aaaa", 100));
  sink.Emit(Make(EventKind::kMiss, "loss", "aaaa", 250));  // a later miss: still pending
  sink.Emit(Make(EventKind::kSwap, "loss", "aaaa", 300, 200, 1000));
  sink.Emit(Make(EventKind::kPrefetch, "infer", "aaaa", 50));  // same hash, other entry
  sink.Emit(Make(EventKind::kSwap, "infer", "aaaa", 1000, 100, 3000));
  nlohmann::json s = sink.Summary();
  EXPECT_EQ(s["specializations"], 2);
  // loss: 100 us to 500 us; infer: 50 us to 1100 us.
  EXPECT_DOUBLE_EQ(s["first_sight_to_swap_ms_p50"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(s["first_sight_to_swap_ms_max"].get<double>(), 1.05);
  // The job spans (dequeue to publish): 0.2 and 0.1 ms; nearest rank.
  EXPECT_DOUBLE_EQ(s["compile_ms_p50"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(s["compile_ms_p99"].get<double>(), 0.2);
  EXPECT_EQ(s["code_bytes_total"], 4000);
  EXPECT_DOUBLE_EQ(s["code_bytes_max"].get<double>(), 3000);
  EXPECT_EQ(s["by_entry"]["loss"], 1);
  EXPECT_EQ(s["by_entry"]["infer"], 1);
}

TEST(CompileStatsSink, ASwapNeverSeenBeforeCountsItsJobSpanAndRefusalsAreCounted) {
  CompileStatsSink sink;
  sink.Emit(Make(EventKind::kSwap, "loss", "bbbb", 700, 40, 10));
  sink.Emit(Make(EventKind::kRefused, "loss", "cccc", 800));
  sink.Emit(Make(EventKind::kFailed, "loss", "dddd", 900));
  nlohmann::json s = sink.Summary();
  EXPECT_EQ(s["specializations"], 1);
  EXPECT_DOUBLE_EQ(s["first_sight_to_swap_ms_p50"].get<double>(), 0.04);
  EXPECT_EQ(s["refused"], 1);
  EXPECT_EQ(s["failed"], 1);
}

TEST(CompileStatsSink, NothingCompiledGivesZeros) {
  nlohmann::json s = CompileStatsSink().Summary();
  EXPECT_EQ(s["specializations"], 0);
  EXPECT_EQ(s["compile_ms_p99"], 0.0);
  EXPECT_EQ(s["code_bytes_total"], 0);
}

TEST(Percentile, IsNearestRank) {
  EXPECT_EQ(Percentile({}, 0.5), 0);
  EXPECT_EQ(Percentile({3, 1, 2, 4}, 0.5), 2);
  EXPECT_EQ(Percentile({3, 1, 2, 4}, 0.75), 3);
  EXPECT_EQ(Percentile({3, 1, 2, 4}, 0.99), 4);
  EXPECT_EQ(Percentile({5}, 0.01), 5);
}

}  // namespace
}  // namespace pejit::bench
