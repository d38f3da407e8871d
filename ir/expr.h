// \file Expressions of the IR, and the C++ builder API that makes them.
//
// Nodes are immutable and shared through `Expr` handles; a variable is known
// by its node's identity, its name is only a hint for printing. The type
// checker records each node's type in `checked_type` once, and gives an
// unsuffixed number the dtype its context needs (ConstantNode::retypes),
// before the definition holding it is published in a Module; nothing else
// writes a node.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/source.h"
#include "ir/type.h"
#include "ops/attrs.h"
#include "ops/op.h"
#include "ops/tensor.h"

namespace pejit {

enum class ExprKind : uint8_t {
  kVar, kConstant, kOpCall, kCall, kLet, kIf, kTuple, kProj, kFunc, kGlobal, kCtor, kMatch,
};

struct ExprNode;
using Expr = std::shared_ptr<const ExprNode>;

struct ExprNode {
  ExprNode(ExprKind k, SourceLoc l) : kind(k), loc(std::move(l)) {}
  virtual ~ExprNode() = default;
  const ExprKind kind;
  const SourceLoc loc;
  mutable Type checked_type;  // set by type checking
};

struct VarNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kVar;
  VarNode(std::string n, Type a, SourceLoc l) : ExprNode(ExprKind::kVar, std::move(l)), name(std::move(n)), annotation(std::move(a)) {}
  std::string name;  // without the '%'
  Type annotation;   // may be null (let without annotation)
};
using Var = std::shared_ptr<const VarNode>;

struct ConstantNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kConstant;
  ConstantNode(Tensor v, SourceLoc l, std::vector<Tensor> r = {})
      : ExprNode(ExprKind::kConstant, std::move(l)), value(std::move(v)), retypes(std::move(r)) {}
  // Mutable for the checker alone, which may replace it by one of `retypes`.
  mutable Tensor value;
  // An unsuffixed number as written (`2`, `0.5`): the same number in the
  // other dtypes that hold it exactly (`2` as f32 and f64, `0.5` as f64),
  // for the checker to take where the context needs one (`mul(%x, 2)` on
  // f32). Empty for any other constant.
  std::vector<Tensor> retypes;
};

struct OpCallNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kOpCall;
  OpCallNode(const OpDef* o, std::vector<Expr> a, Attrs at, SourceLoc l)
      : ExprNode(ExprKind::kOpCall, std::move(l)), op(o), args(std::move(a)), attrs(std::move(at)) {}
  const OpDef* op;
  std::vector<Expr> args;
  Attrs attrs;  // normalized against op's schema
};

struct CallNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kCall;
  CallNode(Expr c, std::vector<Expr> a, SourceLoc l) : ExprNode(ExprKind::kCall, std::move(l)), callee(std::move(c)), args(std::move(a)) {}
  Expr callee;  // a global, a function literal or any expression of function type
  std::vector<Expr> args;
};

struct LetNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kLet;
  LetNode(Var v, Expr val, Expr b, SourceLoc l)
      : ExprNode(ExprKind::kLet, std::move(l)), var(std::move(v)), value(std::move(val)), body(std::move(b)) {}
  // Frees a let-chain with a loop: residual programs are chains of tens of
  // thousands of lets, too deep to free recursively.
  ~LetNode() override;
  Var var;
  Expr value;
  Expr body;
};

struct IfNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kIf;
  IfNode(Expr c, Expr t, Expr e, SourceLoc l)
      : ExprNode(ExprKind::kIf, std::move(l)), cond(std::move(c)), then_branch(std::move(t)), else_branch(std::move(e)) {}
  Expr cond;  // a bool scalar tensor
  Expr then_branch;
  Expr else_branch;
};

struct TupleNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kTuple;
  TupleNode(std::vector<Expr> f, SourceLoc l) : ExprNode(ExprKind::kTuple, std::move(l)), fields(std::move(f)) {}
  std::vector<Expr> fields;
};

// `%t.1`, or `%t.name` of a record: the type checker finds the name's index
// (once, when the module is checked, before anything evaluates it).
struct ProjNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kProj;
  ProjNode(Expr t, int i, SourceLoc l, std::string f = {})
      : ExprNode(ExprKind::kProj, std::move(l)), tuple(std::move(t)), index(i), field(std::move(f)) {}
  Expr tuple;
  mutable int index;  // -1 until a field name is resolved
  std::string field;  // as written; empty for `.1`
};

// A function literal; free variables of the body are captured (a closure).
struct FuncNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kFunc;
  FuncNode(std::vector<Var> p, Type r, Expr b, SourceLoc l, std::vector<std::string> t = {})
      : ExprNode(ExprKind::kFunc, std::move(l)),
        params(std::move(p)),
        ret_type(std::move(r)),
        body(std::move(b)),
        type_params(std::move(t)) {}
  std::vector<Var> params;  // annotated
  Type ret_type;            // may be null: inferred
  Expr body;
  // A generic definition's type parameters (`def @map[A, B](...)`): the
  // annotations name them, and each call instantiates them. Function
  // literals have none.
  std::vector<std::string> type_params;
};
using Func = std::shared_ptr<const FuncNode>;

// A reference to a module definition by name: resolved at each use against
// the module version the call runs on, which is what makes recursion and
// live redefinition work.
struct GlobalNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kGlobal;
  GlobalNode(std::string n, SourceLoc l) : ExprNode(ExprKind::kGlobal, std::move(l)), name(std::move(n)) {}
  std::string name;  // without the '@'
};

struct CtorNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kCtor;
  CtorNode(TypeDefPtr a, int t, std::vector<Expr> f, SourceLoc l)
      : ExprNode(ExprKind::kCtor, std::move(l)), adt(std::move(a)), tag(t), args(std::move(f)) {}
  TypeDefPtr adt;
  int tag;  // index into adt->ctors
  std::vector<Expr> args;
  const std::string& ctor_name() const { return adt->ctors[tag].name; }
};

enum class PatternKind : uint8_t { kWildcard, kVar, kCtor, kTuple };

struct PatternNode;
using Pattern = std::shared_ptr<const PatternNode>;

struct PatternNode {
  PatternKind kind;
  SourceLoc loc;
  Var var;                       // kVar
  TypeDefPtr adt;                // kCtor
  int tag = -1;                  // kCtor
  std::vector<Pattern> fields;   // kCtor, kTuple
};

struct Clause {
  Pattern pattern;
  Expr body;
};

struct MatchNode final : ExprNode {
  static constexpr ExprKind kKind = ExprKind::kMatch;
  MatchNode(Expr s, std::vector<Clause> c, SourceLoc l)
      : ExprNode(ExprKind::kMatch, std::move(l)), scrutinee(std::move(s)), clauses(std::move(c)) {}
  Expr scrutinee;
  std::vector<Clause> clauses;  // tried in order
};

// Downcast of an Expr to the node of its kind; null for another kind (or a
// null Expr). By `kind`, not RTTI: passes call this on every node they visit.
template <typename Node>
const Node* As(const Expr& e) {
  return e && e->kind == Node::kKind ? static_cast<const Node*>(e.get()) : nullptr;
}

// ---- Builder API ------------------------------------------------------------
// For programs made by code. Each takes an optional location; OpCall looks the
// operator up and normalizes its attributes (throws OpError).

Var MakeVar(std::string name, Type annotation = nullptr, SourceLoc loc = {});
Expr MakeConstant(Tensor value, SourceLoc loc = {});
// An unsuffixed number literal: `value` in its default dtype, `retypes` the
// same number in the other dtypes that hold it exactly.
Expr MakeLiteral(Tensor value, std::vector<Tensor> retypes, SourceLoc loc = {});
Expr MakeOpCall(std::string_view op, std::vector<Expr> args, const Attrs& attrs = {}, SourceLoc loc = {});
Expr MakeCall(Expr callee, std::vector<Expr> args, SourceLoc loc = {});
Expr MakeLet(Var var, Expr value, Expr body, SourceLoc loc = {});
Expr MakeIf(Expr cond, Expr then_branch, Expr else_branch, SourceLoc loc = {});
Expr MakeTuple(std::vector<Expr> fields, SourceLoc loc = {});
Expr MakeProj(Expr tuple, int index, SourceLoc loc = {});
Expr MakeField(Expr record, std::string field, SourceLoc loc = {});  // index resolved by the type checker
Func MakeFunc(std::vector<Var> params, Expr body, Type ret_type = nullptr, SourceLoc loc = {},
              std::vector<std::string> type_params = {});
Expr MakeGlobal(std::string name, SourceLoc loc = {});
// Throws IrError when `adt` has no constructor named `ctor`.
Expr MakeCtor(TypeDefPtr adt, const std::string& ctor, std::vector<Expr> args, SourceLoc loc = {});
Expr MakeMatch(Expr scrutinee, std::vector<Clause> clauses, SourceLoc loc = {});
Pattern WildcardPattern(SourceLoc loc = {});
Pattern VarPattern(Var var);
Pattern CtorPattern(TypeDefPtr adt, const std::string& ctor, std::vector<Pattern> fields, SourceLoc loc = {});

}  // namespace pejit
