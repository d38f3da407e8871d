#include "ir/expr.h"

#include "support/spelling.h"

namespace pejit {

namespace {
// Let bodies being freed by this thread's outermost ~LetNode (see there).
thread_local std::vector<Expr>* t_let_graveyard = nullptr;
}  // namespace

LetNode::~LetNode() {
  if (t_let_graveyard) {
    t_let_graveyard->push_back(std::move(body));
    return;
  }
  // Releasing a body may free a let, whose destructor queues its own body
  // here: the chain is freed in a loop, however long.
  std::vector<Expr> pending;
  pending.push_back(std::move(body));
  t_let_graveyard = &pending;
  while (!pending.empty()) {
    Expr next = std::move(pending.back());
    pending.pop_back();
    next.reset();
  }
  t_let_graveyard = nullptr;
}

Var MakeVar(std::string name, Type annotation, SourceLoc loc) {
  return std::make_shared<VarNode>(std::move(name), std::move(annotation), std::move(loc));
}
Expr MakeConstant(Tensor value, SourceLoc loc) { return std::make_shared<ConstantNode>(std::move(value), std::move(loc)); }
Expr MakeLiteral(Tensor value, std::vector<Tensor> retypes, SourceLoc loc) {
  return std::make_shared<ConstantNode>(std::move(value), std::move(loc), std::move(retypes));
}
Expr MakeOpCall(std::string_view op, std::vector<Expr> args, const Attrs& attrs, SourceLoc loc) {
  const OpDef& def = LookupOp(op);
  return std::make_shared<OpCallNode>(&def, std::move(args), NormalizeAttrs(def, attrs), std::move(loc));
}
Expr MakeCall(Expr callee, std::vector<Expr> args, SourceLoc loc) {
  return std::make_shared<CallNode>(std::move(callee), std::move(args), std::move(loc));
}
Expr MakeLet(Var var, Expr value, Expr body, SourceLoc loc) {
  return std::make_shared<LetNode>(std::move(var), std::move(value), std::move(body), std::move(loc));
}
Expr MakeIf(Expr cond, Expr then_branch, Expr else_branch, SourceLoc loc) {
  return std::make_shared<IfNode>(std::move(cond), std::move(then_branch), std::move(else_branch), std::move(loc));
}
Expr MakeTuple(std::vector<Expr> fields, SourceLoc loc) { return std::make_shared<TupleNode>(std::move(fields), std::move(loc)); }
Expr MakeProj(Expr tuple, int index, SourceLoc loc) { return std::make_shared<ProjNode>(std::move(tuple), index, std::move(loc)); }
Expr MakeField(Expr record, std::string field, SourceLoc loc) {
  return std::make_shared<ProjNode>(std::move(record), -1, std::move(loc), std::move(field));
}
Func MakeFunc(std::vector<Var> params, Expr body, Type ret_type, SourceLoc loc, std::vector<std::string> type_params) {
  return std::make_shared<FuncNode>(std::move(params), std::move(ret_type), std::move(body), std::move(loc),
                                    std::move(type_params));
}
Expr MakeGlobal(std::string name, SourceLoc loc) { return std::make_shared<GlobalNode>(std::move(name), std::move(loc)); }

namespace {

int CtorTag(const TypeDef& adt, const std::string& ctor, const SourceLoc& loc) {
  int tag = adt.FindCtor(ctor);
  if (tag < 0) {
    std::vector<std::string> names;
    for (const auto& c : adt.ctors) names.push_back(c.name);
    throw IrError(loc, "type " + adt.name + " has no constructor '" + ctor + "'" + DidYouMean(ctor, names));
  }
  return tag;
}

}  // namespace

Expr MakeCtor(TypeDefPtr adt, const std::string& ctor, std::vector<Expr> args, SourceLoc loc) {
  int tag = CtorTag(*adt, ctor, loc);
  return std::make_shared<CtorNode>(std::move(adt), tag, std::move(args), std::move(loc));
}
Expr MakeMatch(Expr scrutinee, std::vector<Clause> clauses, SourceLoc loc) {
  return std::make_shared<MatchNode>(std::move(scrutinee), std::move(clauses), std::move(loc));
}
Pattern WildcardPattern(SourceLoc loc) {
  auto p = std::make_shared<PatternNode>();
  p->kind = PatternKind::kWildcard;
  p->loc = std::move(loc);
  return p;
}
Pattern VarPattern(Var var) {
  auto p = std::make_shared<PatternNode>();
  p->kind = PatternKind::kVar;
  p->loc = var->loc;
  p->var = std::move(var);
  return p;
}
Pattern CtorPattern(TypeDefPtr adt, const std::string& ctor, std::vector<Pattern> fields, SourceLoc loc) {
  auto p = std::make_shared<PatternNode>();
  p->kind = PatternKind::kCtor;
  p->tag = CtorTag(*adt, ctor, loc);
  p->adt = std::move(adt);
  p->fields = std::move(fields);
  p->loc = std::move(loc);
  return p;
}

}  // namespace pejit
