#include "ir/exhaustive.h"

#include <algorithm>

#include "ir/visitor.h"

namespace pejit {
namespace {

// Whether `p` matches every value of its type.
bool Irrefutable(const Pattern& p) {
  switch (p->kind) {
    case PatternKind::kWildcard:
    case PatternKind::kVar: return true;
    case PatternKind::kCtor:
      if (!p->adt || p->adt->ctors.size() != 1) return false;
      [[fallthrough]];  // the only constructor: irrefutable as a tuple of its fields
    case PatternKind::kTuple:
      for (const Pattern& f : p->fields) {
        if (!Irrefutable(f)) return false;
      }
      return true;
  }
  return false;
}

}  // namespace

std::string MatchGap::ToString() const {
  std::string names;
  for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
  return loc.ToString() + ": match in @" + definition + " has no clause for " + names;
}

std::vector<MatchGap> NonExhaustiveMatches(const ModuleSnapshot& module) {
  std::vector<MatchGap> gaps;
  for (const auto& entry : module.definitions()) {
    const std::string& name = entry.first;  // a lambda captures it (clang takes no structured binding there)
    const DefinitionPtr& def = entry.second;
    std::vector<MatchGap> here;
    PostOrderVisit(def->func->body, [&](const Expr& e) {
      const auto* match = As<MatchNode>(e);
      if (!match) return;
      TypeDefPtr adt;
      std::vector<bool> named;
      for (const Clause& c : match->clauses) {
        if (Irrefutable(c.pattern)) return;
        if (c.pattern->kind != PatternKind::kCtor || !c.pattern->adt) return;
        if (!adt) {
          adt = c.pattern->adt;
          named.assign(adt->ctors.size(), false);
        }
        if (c.pattern->adt != adt || c.pattern->tag < 0 || static_cast<size_t>(c.pattern->tag) >= named.size()) return;
        named[c.pattern->tag] = true;
      }
      if (!adt) return;
      MatchGap gap{match->loc, name, {}};
      for (size_t i = 0; i < named.size(); ++i) {
        if (!named[i]) gap.missing.push_back(adt->ctors[i].name);
      }
      if (!gap.missing.empty()) here.push_back(std::move(gap));
    });
    // PostOrderVisit sees inner matches first; report in source order.
    std::sort(here.begin(), here.end(), [](const MatchGap& a, const MatchGap& b) {
      return a.loc.line != b.loc.line ? a.loc.line < b.loc.line : a.loc.col < b.loc.col;
    });
    gaps.insert(gaps.end(), here.begin(), here.end());
  }
  return gaps;
}

}  // namespace pejit
