#include "ir/prelude.h"

#include <algorithm>
#include <functional>
#include <map>

#include "ir/parser.h"
#include "ir/visitor.h"

namespace pejit {

std::string_view PreludeSource() {
  return R"(# The prelude: what every module has when it names it (ir/prelude.h).

type List[T] {
  Nil,
  Cons(T, List[T]),
}

type Option[T] {
  None,
  Some(T),
}

# [f(x) for x in xs]
def @map[A, B](%f: fn(A) -> B, %xs: List[A]) -> List[B] {
  match (%xs) {
    Nil => Nil,
    Cons(%x, %rest) => Cons(%f(%x), @map(%f, %rest)),
  }
}

# f(...f(f(init, x0), x1)..., xn): from the left.
def @fold[A, S](%f: fn(S, A) -> S, %init: S, %xs: List[A]) -> S {
  match (%xs) {
    Nil => %init,
    Cons(%x, %rest) => @fold(%f, %f(%init, %x), %rest),
  }
}

def @length[T](%xs: List[T]) -> Tensor[(), i64] {
  match (%xs) {
    Nil => 0,
    Cons(_, %rest) => add(@length(%rest), 1),
  }
}

# xs reversed, in front of `onto`.
def @reverse_onto[T](%xs: List[T], %onto: List[T]) -> List[T] {
  match (%xs) {
    Nil => %onto,
    Cons(%x, %rest) => @reverse_onto(%rest, Cons(%x, %onto)),
  }
}

def @reverse[T](%xs: List[T]) -> List[T] {
  @reverse_onto(%xs, Nil)
}

def @append[T](%xs: List[T], %ys: List[T]) -> List[T] {
  match (%xs) {
    Nil => %ys,
    Cons(%x, %rest) => Cons(%x, @append(%rest, %ys)),
  }
}

# Pairs of the elements at the same place, as long as the shorter list.
def @zip[A, B](%xs: List[A], %ys: List[B]) -> List[(A, B)] {
  match ((%xs, %ys)) {
    (Cons(%x, %r), Cons(%y, %s)) => Cons((%x, %y), @zip(%r, %s)),
    _ => Nil,
  }
}
)";
}

namespace {

void AdtNamesOf(const Type& t, std::set<std::string>& out) {
  if (!t) return;
  switch (t->kind) {
    case TypeKind::kAdt:
      out.insert(AsAdt(t)->name);
      for (const Type& a : AsAdt(t)->args) AdtNamesOf(a, out);
      return;
    case TypeKind::kTuple:
      for (const Type& f : AsTuple(t)->fields) AdtNamesOf(f, out);
      return;
    case TypeKind::kFunc:
      for (const Type& p : AsFunc(t)->params) AdtNamesOf(p, out);
      AdtNamesOf(AsFunc(t)->ret, out);
      return;
    case TypeKind::kTensor:
    case TypeKind::kVar: return;
  }
}

void AdtNamesOf(const Pattern& p, std::set<std::string>& out) {
  if (p->adt) out.insert(p->adt->name);
  if (p->var) AdtNamesOf(p->var->annotation, out);
  for (const Pattern& f : p->fields) AdtNamesOf(f, out);
}

// The ADTs a definition names: in its annotations, constructors and patterns.
std::set<std::string> AdtNamesOf(const Func& f) {
  std::set<std::string> out;
  for (const Var& p : f->params) AdtNamesOf(p->annotation, out);
  AdtNamesOf(f->ret_type, out);
  PostOrderVisit(f->body, [&](const Expr& e) {
    if (auto* let = As<LetNode>(e)) AdtNamesOf(let->var->annotation, out);
    if (auto* fn = As<FuncNode>(e)) {
      for (const Var& p : fn->params) AdtNamesOf(p->annotation, out);
      AdtNamesOf(fn->ret_type, out);
    }
    if (auto* ctor = As<CtorNode>(e)) out.insert(ctor->adt->name);
    if (auto* match = As<MatchNode>(e)) {
      for (const Clause& c : match->clauses) AdtNamesOf(c.pattern, out);
    }
  });
  return out;
}

}  // namespace

Prelude::Prelude() {
  ParsedProgram p = ParseProgram(PreludeSource(), kPreludeFile);
  types_ = std::move(p.types);
  defs_ = std::move(p.defs);
}

const Prelude& Prelude::Shared() {
  static const Prelude prelude;
  return prelude;
}

TypeDefPtr Prelude::FindType(const std::string& name) const {
  for (const TypeDefPtr& t : types_) {
    if (t->name == name || t->FindCtor(name) >= 0) return t;
  }
  return nullptr;
}

std::vector<std::string> Prelude::DefinitionNames() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : defs_) out.push_back(name);
  return out;
}

std::vector<std::string> Prelude::ConstructorNames() const {
  std::vector<std::string> out;
  for (const TypeDefPtr& t : types_) {
    for (const CtorDef& c : t->ctors) out.push_back(c.name);
  }
  return out;
}

Prelude::Pull Prelude::For(const std::vector<std::pair<std::string, Func>>& defs,
                           const std::set<std::string>& defined_globals,
                           const std::function<TypeDefPtr(const std::string&)>& own_type,
                           const std::set<std::string>& used_types) const {
  std::map<std::string, const Func*> prelude_defs;
  for (const auto& [name, f] : defs_) prelude_defs[name] = &f;
  // A prelude type the module has already taken is this very type; one the
  // module defines itself under the same name is another.
  auto clashes = [&](const std::string& type) {
    TypeDefPtr own = own_type(type);
    return own && own != FindType(type);
  };

  Pull pull;
  std::set<std::string> pulled, types = used_types;
  std::vector<std::string> wanted;
  for (const auto& [name, f] : defs) {
    for (const std::string& g : ReferencedGlobals(f->body)) wanted.push_back(g);
  }
  while (!wanted.empty()) {
    std::string g = std::move(wanted.back());
    wanted.pop_back();
    auto it = prelude_defs.find(g);
    if (it == prelude_defs.end() || defined_globals.count(g) || pulled.count(g)) continue;
    std::set<std::string> needs = AdtNamesOf(*it->second);
    if (std::any_of(needs.begin(), needs.end(), clashes)) continue;  // over another type of that name: unknown here
    pulled.insert(g);
    pull.defs.emplace_back(g, *it->second);
    types.insert(needs.begin(), needs.end());
    for (const std::string& callee : ReferencedGlobals((*it->second)->body)) wanted.push_back(callee);
  }
  for (const TypeDefPtr& t : types_) {
    if (types.count(t->name) && !own_type(t->name)) pull.types.push_back(t);
  }
  return pull;
}

}  // namespace pejit
