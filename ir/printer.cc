// Printer of the text format (docs/language.md).
//
// Output is laid out for people reading passes' results: one let binding per
// line, blocks indented by two spaces. Every printed program parses back to a
// structurally equal one, which is what fixes the choices below: variable
// names are made unique where they would collide, constants print with the
// shortest text that reads back to the same bits, and a sub-expression that
// would parse differently in its position is wrapped in parentheses.

#include "ir/printer.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace pejit {
namespace {

std::string Pad(int indent) { return std::string(static_cast<size_t>(indent) * 2, ' '); }

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Names made by code may be empty or hold characters the lexer rejects.
std::string SanitizeName(const std::string& name) {
  std::string s = name.empty() ? "v" : name;
  for (char& c : s) {
    if (!IsNameChar(c)) c = '_';
  }
  if (std::isdigit(static_cast<unsigned char>(s[0]))) s = "_" + s;
  return s;
}

// The shortest decimal text that reads back to exactly `v` (plus inf/nan).
template <typename T>
std::string FloatText(T v) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

std::string ElementText(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return FloatText(t.data<float>()[i]);
    case DType::kF64: return FloatText(t.data<double>()[i]);
    case DType::kI64: return std::to_string(t.data<int64_t>()[i]);
    case DType::kBool: return t.data<bool>()[i] ? "true" : "false";
  }
  return "?";
}

// A scalar as a number literal when one reads back to the same dtype and
// bits: `3` (i64), `1.5` and `2f32` (f32), `0.5f64`, `true`; else the
// general `tensor(dtype, (shape), [data])`.
std::string ConstantText(const Tensor& t) {
  if (!t.defined()) return "<undefined tensor>";
  if (t.rank() == 0) {
    switch (t.dtype()) {
      case DType::kI64: return std::to_string(*t.data<int64_t>());
      case DType::kBool: return *t.data<bool>() ? "true" : "false";
      case DType::kF32: {
        float v = *t.data<float>();
        if (!std::isfinite(v)) break;
        std::string s = FloatText(v);
        return s.find_first_of(".e") == std::string::npos ? s + "f32" : s;
      }
      case DType::kF64: {
        double v = *t.data<double>();
        if (!std::isfinite(v)) break;
        return FloatText(v) + "f64";
      }
    }
  }
  std::string s = "tensor(" + std::string(DTypeName(t.dtype())) + ", " + ShapeToString(t.shape()) + ", [";
  for (int64_t i = 0; i < t.numel(); ++i) s += (i ? ", " : "") + ElementText(t, i);
  return s + "])";
}

// Variables used in `e` outside any binding of them, in order of first use.
class FreeVars {
 public:
  std::vector<const VarNode*> Of(const Expr& e) {
    Visit(e);
    return free_;
  }

 private:
  std::unordered_map<const VarNode*, int> bound_;  // binding depth count
  std::unordered_set<const VarNode*> seen_;
  std::vector<const VarNode*> free_;

  void Bind(const Var& v, int delta) { bound_[v.get()] += delta; }

  void BindPattern(const Pattern& p, int delta) {
    if (p->kind == PatternKind::kVar) Bind(p->var, delta);
    for (const Pattern& f : p->fields) BindPattern(f, delta);
  }

  void VisitAll(const std::vector<Expr>& es) {
    for (const Expr& e : es) Visit(e);
  }

  void Visit(const Expr& e) {
    if (!e) return;
    switch (e->kind) {
      case ExprKind::kVar: {
        auto* v = static_cast<const VarNode*>(e.get());
        if (bound_[v] == 0 && seen_.insert(v).second) free_.push_back(v);
        return;
      }
      case ExprKind::kConstant:
      case ExprKind::kGlobal: return;
      case ExprKind::kOpCall: return VisitAll(As<OpCallNode>(e)->args);
      case ExprKind::kCall:
        Visit(As<CallNode>(e)->callee);
        return VisitAll(As<CallNode>(e)->args);
      case ExprKind::kLet: {
        std::vector<Var> chain;
        Expr cur = e;
        for (; cur->kind == ExprKind::kLet; cur = As<LetNode>(cur)->body) {
          const LetNode* let = As<LetNode>(cur);
          Visit(let->value);
          Bind(let->var, 1);
          chain.push_back(let->var);
        }
        Visit(cur);
        for (const Var& v : chain) Bind(v, -1);
        return;
      }
      case ExprKind::kIf: {
        const IfNode* n = As<IfNode>(e);
        Visit(n->cond);
        Visit(n->then_branch);
        return Visit(n->else_branch);
      }
      case ExprKind::kTuple: return VisitAll(As<TupleNode>(e)->fields);
      case ExprKind::kProj: return Visit(As<ProjNode>(e)->tuple);
      case ExprKind::kFunc: {
        const FuncNode* f = As<FuncNode>(e);
        for (const Var& p : f->params) Bind(p, 1);
        Visit(f->body);
        for (const Var& p : f->params) Bind(p, -1);
        return;
      }
      case ExprKind::kCtor: return VisitAll(As<CtorNode>(e)->args);
      case ExprKind::kMatch: {
        const MatchNode* m = As<MatchNode>(e);
        Visit(m->scrutinee);
        for (const Clause& c : m->clauses) {
          BindPattern(c.pattern, 1);
          Visit(c.body);
          BindPattern(c.pattern, -1);
        }
        return;
      }
    }
  }
};

class Printer {
 public:
  // Free variables keep one name throughout, so no binder may take it.
  void ReserveFree(const Expr& e) {
    for (const VarNode* v : FreeVars().Of(e)) {
      std::string name = FreshName(v, SanitizeName(v->name));
      holder_[name] = v;
      names_[v] = name;
    }
  }

  std::string Function(const std::string& name, const Func& f) {
    constexpr size_t kWidth = 110;  // the project's line length
    size_t mark = undo_.size();
    std::string head = "def @" + name + TypeParamsText(f->type_params) + "(";
    std::vector<std::string> params;
    for (const Var& p : f->params) params.push_back(Param(p));
    std::string ret = f->ret_type ? " -> " + TypeToString(f->ret_type) : "";
    std::string s = head;
    for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + params[i];
    s += ")" + ret;
    if (s.size() + 2 > kWidth) {
      // As in the docs: parameters continue under the first, and the result
      // type gets a line of its own.
      s = head;
      size_t col = head.size();
      for (size_t i = 0; i < params.size(); ++i) {
        std::string piece = params[i] + (i + 1 < params.size() ? "," : ")");
        if (i > 0 && col + 1 + piece.size() > kWidth) {
          s += "\n" + std::string(head.size(), ' ');
          col = head.size();
        } else if (i > 0) {
          s += " ";
          ++col;
        }
        s += piece;
        col += piece.size();
      }
      if (params.empty()) s += ")";
      s += col + ret.size() + 2 > kWidth ? "\n   " + ret : ret;
    }
    s += " " + Block(f->body, 0);
    Unbind(mark);
    return s;
  }

  // `e` as the body of a block: its let-chain one binding per line, each
  // line after the first starting at `indent`.
  std::string Body(const Expr& e, int indent) {
    size_t mark = undo_.size();
    std::string s;
    Expr cur = e;
    for (; cur->kind == ExprKind::kLet; cur = As<LetNode>(cur)->body) {
      const LetNode* let = As<LetNode>(cur);
      std::string value = Print(let->value, indent);
      s += "let " + Bind(let->var);
      if (let->var->annotation) s += ": " + TypeToString(let->var->annotation);
      s += " = " + value + ";\n" + Pad(indent);
    }
    s += Print(cur, indent);
    Unbind(mark);
    return s;
  }

  // `e` where any expression may stand, its lines after the first starting at `indent`.
  std::string Print(const Expr& e, int indent) {
    if (!e) return "<null>";
    switch (e->kind) {
      case ExprKind::kVar: return "%" + NameOf(static_cast<const VarNode*>(e.get()));
      case ExprKind::kConstant: return ConstantText(As<ConstantNode>(e)->value);
      case ExprKind::kOpCall: return OpCall(As<OpCallNode>(e), indent);
      case ExprKind::kCall: {
        const CallNode* n = As<CallNode>(e);
        return Operand(n->callee, indent) + "(" + List(n->args, indent) + ")";
      }
      case ExprKind::kLet: return Block(e, indent);
      case ExprKind::kIf: {
        const IfNode* n = As<IfNode>(e);
        return "if (" + Print(n->cond, indent) + ") " + Block(n->then_branch, indent) + " else " +
               Block(n->else_branch, indent);
      }
      case ExprKind::kTuple: {
        const auto& fields = As<TupleNode>(e)->fields;
        return "(" + List(fields, indent) + (fields.size() == 1 ? ",)" : ")");
      }
      case ExprKind::kProj: {
        const ProjNode* n = As<ProjNode>(e);
        return Operand(n->tuple, indent) + "." + (n->field.empty() ? std::to_string(n->index) : n->field);
      }
      case ExprKind::kFunc: {
        const FuncNode* f = As<FuncNode>(e);
        size_t mark = undo_.size();
        std::string s = "fn " + Params(f->params);
        if (f->ret_type) s += " -> " + TypeToString(f->ret_type);
        s += " " + Block(f->body, indent);
        Unbind(mark);
        return s;
      }
      case ExprKind::kGlobal: return "@" + As<GlobalNode>(e)->name;
      case ExprKind::kCtor: {
        const CtorNode* n = As<CtorNode>(e);
        std::string s = n->ctor_name();
        return n->args.empty() ? s : s + "(" + List(n->args, indent) + ")";
      }
      case ExprKind::kMatch: return Match(As<MatchNode>(e), indent);
    }
    return "<?>";
  }

 private:
  // The printed name of each variable in scope, and which variable holds
  // each printed name; bindings push onto undo_ so leaving a scope restores
  // the outer names.
  std::unordered_map<const VarNode*, std::string> names_;
  std::unordered_map<std::string, const VarNode*> holder_;
  struct Undo {
    const VarNode* var;
    std::string name;
    std::optional<std::string> old_name;   // var's name before this binding
    const VarNode* old_holder;             // who held `name` before
  };
  std::vector<Undo> undo_;

  // `base`, or `base_1`, `base_2`, ... : the first not held by another variable.
  std::string FreshName(const VarNode* v, const std::string& base) const {
    auto free_for_v = [&](const std::string& n) {
      auto it = holder_.find(n);
      return it == holder_.end() || it->second == nullptr || it->second == v;
    };
    if (free_for_v(base)) return base;
    // Resume numbering where this base left off: residual programs name
    // thousands of variables alike, and probing from 1 each time is quadratic.
    int& next = next_suffix_[base];
    for (int k = std::max(next, 1);; ++k) {
      std::string n = base + "_" + std::to_string(k);
      if (free_for_v(n)) {
        next = k + 1;
        return n;
      }
    }
  }
  mutable std::unordered_map<std::string, int> next_suffix_;

  std::string Bind(const Var& var) {
    const VarNode* v = var.get();
    std::string name = FreshName(v, SanitizeName(v->name));
    Undo u{v, name, std::nullopt, nullptr};
    if (auto it = names_.find(v); it != names_.end()) u.old_name = it->second;
    if (auto it = holder_.find(name); it != holder_.end()) u.old_holder = it->second;
    undo_.push_back(std::move(u));
    names_[v] = name;
    holder_[name] = v;
    return "%" + name;
  }

  void Unbind(size_t mark) {
    while (undo_.size() > mark) {
      Undo& u = undo_.back();
      holder_[u.name] = u.old_holder;
      if (u.old_name) {
        names_[u.var] = *u.old_name;
      } else {
        names_.erase(u.var);
      }
      // Its suffix is free again: let the next variable of that base take it.
      if (size_t cut = u.name.rfind('_'); cut != std::string::npos && cut + 1 < u.name.size()) {
        auto it = next_suffix_.find(u.name.substr(0, cut));
        int k = std::atoi(u.name.c_str() + cut + 1);
        if (it != next_suffix_.end() && k > 0 && k < it->second) it->second = k;
      }
      undo_.pop_back();
    }
  }

  std::string NameOf(const VarNode* v) const {
    auto it = names_.find(v);
    return it != names_.end() ? it->second : SanitizeName(v->name);
  }

  std::string Param(const Var& param) {
    std::string s = Bind(param);
    return param->annotation ? s + ": " + TypeToString(param->annotation) : s;
  }

  std::string Params(const std::vector<Var>& params) {
    std::string s = "(";
    for (size_t i = 0; i < params.size(); ++i) s += (i ? ", " : "") + Param(params[i]);
    return s + ")";
  }

  std::string Block(const Expr& e, int indent) {
    return "{\n" + Pad(indent + 1) + Body(e, indent + 1) + "\n" + Pad(indent) + "}";
  }

  std::string List(const std::vector<Expr>& es, int indent) {
    std::string s;
    for (size_t i = 0; i < es.size(); ++i) s += (i ? ", " : "") + Print(es[i], indent);
    return s;
  }

  // A callee or a projected tuple: postfix syntax binds tighter than these.
  std::string Operand(const Expr& e, int indent) {
    switch (e->kind) {
      case ExprKind::kIf:
      case ExprKind::kFunc:
      case ExprKind::kMatch:
      case ExprKind::kConstant:  // `3.0` would lex as one number
      case ExprKind::kCtor:      // `Nil(%x)` would pass %x to the constructor
        return "(" + Print(e, indent) + ")";
      default: return Print(e, indent);
    }
  }

  std::string OpCall(const OpCallNode* n, int indent) {
    std::string s = n->op->name + "(" + List(n->args, indent);
    bool first = n->args.empty();
    auto attr = [&](const std::string& name, const AttrValue& value) {
      s += (first ? "" : ", ") + name + "=" + AttrValueToString(value);
      first = false;
    };
    // In the operator's own order; defaults are left out, the parser fills them in again.
    for (const AttrSpec& spec : n->op->attrs) {
      const AttrValue* value = n->attrs.Find(spec.name);
      if (!value) continue;
      bool is_default = spec.default_value && KindOf(*spec.default_value) == KindOf(*value) &&
                        AttrValueToString(*spec.default_value) == AttrValueToString(*value);
      if (!is_default) attr(spec.name, *value);
    }
    for (const auto& [name, value] : n->attrs.items()) {
      bool in_schema = false;
      for (const AttrSpec& spec : n->op->attrs) in_schema |= spec.name == name;
      if (!in_schema) attr(name, value);
    }
    return s + ")";
  }

  std::string PatternText(const Pattern& p) {
    switch (p->kind) {
      case PatternKind::kWildcard: return "_";
      case PatternKind::kVar: return Bind(p->var);
      case PatternKind::kCtor: {
        std::string s = p->adt->ctors[p->tag].name;
        if (p->fields.empty()) return s;
        return s + "(" + Patterns(p->fields) + ")";
      }
      case PatternKind::kTuple: return "(" + Patterns(p->fields) + (p->fields.size() == 1 ? ",)" : ")");
    }
    return "<?>";
  }

  std::string Patterns(const std::vector<Pattern>& ps) {
    std::string s;
    for (size_t i = 0; i < ps.size(); ++i) s += (i ? ", " : "") + PatternText(ps[i]);
    return s;
  }

  std::string Match(const MatchNode* m, int indent) {
    std::string s = "match (" + Print(m->scrutinee, indent) + ") {\n";
    for (const Clause& c : m->clauses) {
      size_t mark = undo_.size();
      s += Pad(indent + 1) + PatternText(c.pattern) + " => ";
      s += c.body->kind == ExprKind::kLet ? Block(c.body, indent + 1) : Print(c.body, indent + 1);
      s += ",\n";
      Unbind(mark);
    }
    return s + Pad(indent) + "}";
  }
};

}  // namespace

std::string PrintExpr(const Expr& e) {
  if (!e) return "<null>";
  Printer p;
  p.ReserveFree(e);
  return p.Body(e, 0);
}

std::string PrintFunction(const std::string& name, const Func& f) {
  Printer p;
  p.ReserveFree(f);
  return p.Function(name, f);
}

std::string PrintTypeDef(const TypeDef& def) {
  std::string s = "type " + def.name;
  if (!def.params.empty()) {
    s += "[";
    for (size_t i = 0; i < def.params.size(); ++i) s += (i ? ", " : "") + def.params[i];
    s += "]";
  }
  s += " {\n";
  for (const CtorDef& c : def.ctors) {
    s += "  " + c.name;
    if (!c.fields.empty()) {
      s += "(";
      for (size_t i = 0; i < c.fields.size(); ++i) s += (i ? ", " : "") + TypeToString(c.fields[i]);
      s += ")";
    }
    s += ",\n";
  }
  return s + "}";
}

}  // namespace pejit
