// Matches some value reaches no clause of (ir/exhaustive.h): reported by
// `pejit check` before anything runs; never a false alarm.
#include <gtest/gtest.h>

#include "ir/exhaustive.h"

namespace pejit {
namespace {

std::vector<std::string> Gaps(const std::string& source) {
  Module m;
  m.AddSource(source, "m.pj");
  std::vector<std::string> out;
  for (const MatchGap& g : NonExhaustiveMatches(*m.snapshot())) out.push_back(g.ToString());
  return out;
}

const char* kTypes = "type T { A, B(Tensor[(), f32]), C }\ntype L { Nil, Cons(Tensor[(), f32], L) }\n";

TEST(NonExhaustiveMatchesTest, NameTheConstructorsNoClauseNames) {
  EXPECT_EQ(Gaps(std::string(kTypes) + "def @f(%t: T) -> Tensor[(), f32] { match (%t) { A => 0f32 } }\n"),
            (std::vector<std::string>{"m.pj:3:36: match in @f has no clause for B, C"}));
}

TEST(NonExhaustiveMatchesTest, AClauseMatchingEverythingOrEveryConstructorCovers) {
  EXPECT_TRUE(Gaps(std::string(kTypes) + "def @f(%t: T) -> Tensor[(), f32] { match (%t) { A => 0f32, _ => 1f32 } }\n").empty());
  EXPECT_TRUE(Gaps(std::string(kTypes) +
                   "def @f(%t: T) -> Tensor[(), f32] { match (%t) { A => 0f32, B(%x) => %x, C => 1f32 } }\n")
                  .empty());
}

TEST(NonExhaustiveMatchesTest, RefutableSubPatternsAreNotReported) {
  // Cons(%x, Nil) alone leaves Cons(%x, Cons(...)) unmatched; the analysis
  // names only constructors no clause names, so it says nothing here.
  EXPECT_TRUE(Gaps(std::string(kTypes) +
                   "def @f(%l: L) -> Tensor[(), f32] { match (%l) { Nil => 0f32, Cons(%x, Nil) => %x } }\n")
                  .empty());
  EXPECT_EQ(Gaps(std::string(kTypes) + "def @f(%l: L) -> Tensor[(), f32] { match (%l) { Cons(%x, Nil) => %x } }\n"),
            (std::vector<std::string>{"m.pj:3:36: match in @f has no clause for Nil"}));
}

}  // namespace
}  // namespace pejit
