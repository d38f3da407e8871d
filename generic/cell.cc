#include "generic/cell.h"

#include <cstring>
#include <optional>
#include <unordered_map>

#include "ir/printer.h"
#include "ir/value.h"
#include "ir/visitor.h"
#include "jit/batch_rules.h"
#include "ops/op.h"

namespace pejit::generic {
namespace {

template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void PutTensor(std::string& out, const TensorType& t, int32_t share) {
  out.push_back('T');
  out.push_back(static_cast<char>(t.dtype));
  out.push_back(static_cast<char>(t.shape.size()));
  for (int64_t d : t.shape) Put(out, d);
  Put(out, share);
}

// Reads what Put*/Encode* wrote.
class Reader {
 public:
  Reader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return pos_ >= bytes_.size(); }
  char Tag() { return bytes_.at(pos_++); }
  template <typename T>
  T Get() {
    T value;
    if (pos_ + sizeof value > bytes_.size()) throw std::logic_error("generic: truncated key");
    std::memcpy(&value, bytes_.data() + pos_, sizeof value);
    pos_ += sizeof value;
    return value;
  }
  std::string String() {
    auto n = static_cast<size_t>(Get<int32_t>());
    if (pos_ + n > bytes_.size()) throw std::logic_error("generic: truncated key");
    std::string s(bytes_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  TensorType TensorTypeAt(int32_t* share) {
    TensorType t;
    t.dtype = static_cast<DType>(Tag());
    int rank = static_cast<unsigned char>(Tag());
    for (int i = 0; i < rank; ++i) t.shape.push_back(Get<int64_t>());
    *share = Get<int32_t>();
    return t;
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

bool ContainsMatch(const Func& f) {
  bool found = false;
  PostOrderVisit(f->body, [&](const Expr& e) { found |= e->kind == ExprKind::kMatch; });
  return found;
}

std::string Where(const SourceLoc& loc) {
  std::string s = loc.ToString();
  return s.empty() ? std::string() : " at " + s;
}

// Stops a build at the first question it has no answer for.
struct Stop {
  Question question;
};

class Builder {
 public:
  Builder(const ModuleSnapshot& module, const std::set<std::string>& cells, const std::vector<Answer>& answers)
      : module_(module), cells_(cells), answers_(answers) {}

  std::variant<Question, Cell> Run(const std::string& key) {
    size_t zero = key.find('\0');
    function_ = key.substr(0, zero);
    const Definition& def = module_.Get(function_);
    Reader args(std::string_view(key).substr(zero + 1));
    for (const Var& p : def.func->params) env_[p.get()] = Decode(args, Source::Kind::kInput);
    ValueTree result;
    try {
      result = Eval(def.func->body);
      CheckResult(result, *def.func, "@" + function_);
    } catch (Stop& stop) {
      return std::move(stop.question);
    }
    return Finish(result);
  }

 private:
  struct OpNode {
    const OpCallNode* call;
    std::vector<int> args;
    int segment;
    std::vector<int> outputs;
  };
  struct ValueInfo {
    TensorType type;
    Source source;     // where it does not come from an op
    int op = -1;       // else the op computing it
    bool data = false; // (not an op's) data from the arguments' structures: Segment::data
  };

  const ModuleSnapshot& module_;
  const std::set<std::string>& cells_;
  const std::vector<Answer>& answers_;
  size_t next_answer_ = 0;
  std::string function_;
  std::unordered_map<const VarNode*, ValueTree> env_;
  std::vector<ValueInfo> values_;
  std::vector<OpNode> ops_;
  std::vector<Tensor> constants_;
  std::vector<CallSite> calls_;
  std::vector<DataOp> data_ops_;
  std::vector<int> call_boundary_;  // the segment each call follows
  int segment_ = 0;
  std::vector<int> segment_guard_{-1};  // per segment: the guard of the branch it is in, or -1
  int guard_ = -1;                      // the branch being evaluated
  std::vector<Guard> guards_;
  std::vector<Select> selects_;
  int structures_ = 0, struct_leaves_ = 0, inputs_ = 0;
  int inline_depth_ = 0;

  int NewValue(TensorType type, Source source) {
    values_.push_back({std::move(type), source, -1});
    return static_cast<int>(values_.size()) - 1;
  }

  ValueTree Decode(Reader& r, Source::Kind leaf_kind, int call = 0, int* leaf = nullptr) {
    ValueTree v;
    char tag = r.Tag();
    if (tag == 'S') {
      v.kind = ValueTree::Kind::kStructure;
      v.value = structures_++;
    } else if (tag == 'F') {  // instance keys only: results and patterns never hold one (TypeOf, EncodeValue)
      v.kind = ValueTree::Kind::kFunction;
      if (r.Tag() == 'G') {
        v.global = r.String();
      } else {
        v.lambda = reinterpret_cast<const FuncNode*>(r.Get<uintptr_t>());
        int n = r.Get<int32_t>();
        for (int i = 0; i < n; ++i) v.fields.push_back(Decode(r, leaf_kind, call, leaf));
      }
    } else if (tag == 'U') {
      v.kind = ValueTree::Kind::kTuple;
      int n = r.Get<int32_t>();
      for (int i = 0; i < n; ++i) v.fields.push_back(Decode(r, leaf_kind, call, leaf));
    } else {
      int32_t share;
      TensorType t = r.TensorTypeAt(&share);
      Source s{leaf_kind};
      const bool data = share == kData;
      switch (leaf_kind) {
        case Source::Kind::kInput:
          if (share >= 0) s = Source{Source::Kind::kRoot, share};
          else s.index = inputs_++;
          break;
        case Source::Kind::kStructLeaf: s.index = struct_leaves_++; break;
        default: s.index = call; s.output = (*leaf)++; break;
      }
      v.value = NewValue(std::move(t), s);
      values_[v.value].data = data;
    }
    return v;
  }

  const Answer& NextAnswer(Question q) {
    if (next_answer_ >= answers_.size()) throw Stop{std::move(q)};
    return answers_[next_answer_++];
  }

  // Whether `v` may have type `t`, as the interpreter checks at run time
  // (interp/interpreter.cc, Fits): a program it stops with an error is
  // refused here rather than compiled into code that answers.
  bool Fits(const ValueTree& v, const Type& t) const {
    if (v.kind == ValueTree::Kind::kBottom) return true;
    switch (t->kind) {
      case TypeKind::kTensor:
        return v.kind == ValueTree::Kind::kTensor && TensorTypeFits(AsTensor(t)->type, values_[v.value].type);
      case TypeKind::kTuple: {
        const auto& fields = AsTuple(t)->fields;
        if (v.kind != ValueTree::Kind::kTuple || v.fields.size() != fields.size()) return false;
        for (size_t i = 0; i < fields.size(); ++i) {
          if (!Fits(v.fields[i], fields[i])) return false;
        }
        return true;
      }
      case TypeKind::kAdt:
        return v.kind == ValueTree::Kind::kStructure ||
               (v.kind == ValueTree::Kind::kBuilt && v.adt->name == AsAdt(t)->name);
      case TypeKind::kFunc: return v.kind == ValueTree::Kind::kFunction;
      case TypeKind::kVar: return true;
    }
    return false;
  }

  // `what`: "@name", or "the function" of a `fn`.
  void CheckResult(const ValueTree& result, const FuncNode& f, const std::string& what) const {
    if (f.ret_type && !Fits(result, f.ret_type)) {
      throw Refusal("generic: the result of " + what + " does not have its declared type " +
                    TypeToString(f.ret_type) + Where(f.loc));
    }
  }

  int TensorOf(const ValueTree& v, const char* what, const SourceLoc& loc) {
    if (v.kind != ValueTree::Kind::kTensor) throw Refusal(std::string("generic: ") + what + " is not a tensor" + Where(loc));
    return v.value;
  }

  ValueTree Eval(const Expr& e) {
    switch (e->kind) {
      case ExprKind::kVar: {
        auto it = env_.find(static_cast<const VarNode*>(e.get()));
        if (it == env_.end()) throw Refusal("generic: variable %" + static_cast<const VarNode&>(*e).name + " is not bound in the cell" + Where(e->loc));
        return it->second;
      }
      case ExprKind::kConstant: {
        const auto& c = static_cast<const ConstantNode&>(*e);
        constants_.push_back(c.value);
        ValueTree v;
        v.value = NewValue(c.value.type(), Source{Source::Kind::kConstant, static_cast<int>(constants_.size()) - 1});
        return v;
      }
      case ExprKind::kOpCall: return EvalOp(static_cast<const OpCallNode&>(*e));
      case ExprKind::kTuple: {
        ValueTree v;
        v.kind = ValueTree::Kind::kTuple;
        for (const Expr& f : static_cast<const TupleNode&>(*e).fields) v.fields.push_back(Eval(f));
        return v;
      }
      case ExprKind::kProj: {
        const auto& p = static_cast<const ProjNode&>(*e);
        ValueTree t = Eval(p.tuple);
        if (t.kind == ValueTree::Kind::kBottom) return t;
        if (t.kind != ValueTree::Kind::kTuple || p.index >= static_cast<int>(t.fields.size())) {
          throw Refusal("generic: projection of a value that is not a tuple" + Where(e->loc));
        }
        return t.fields[p.index];
      }
      case ExprKind::kLet: {
        const LetNode* let = static_cast<const LetNode*>(e.get());
        // A chain of lets is a loop, not a recursion.
        while (true) {
          ValueTree value = Eval(let->value);
          if (let->var->annotation && !Fits(value, let->var->annotation)) {
            throw Refusal("generic: %" + let->var->name + " does not have its annotated type " +
                          TypeToString(let->var->annotation) + Where(let->loc));
          }
          env_[let->var.get()] = std::move(value);
          if (let->body->kind != ExprKind::kLet) return Eval(let->body);
          let = static_cast<const LetNode*>(let->body.get());
        }
      }
      case ExprKind::kCall: return EvalCall(static_cast<const CallNode&>(*e));
      case ExprKind::kMatch: return EvalMatch(static_cast<const MatchNode&>(*e));
      case ExprKind::kIf: return EvalIf(static_cast<const IfNode&>(*e));
      case ExprKind::kCtor: {
        const auto& c = static_cast<const CtorNode&>(*e);
        ValueTree v;
        v.kind = ValueTree::Kind::kBuilt;
        v.adt = c.adt.get();
        v.tag = c.tag;
        for (const Expr& a : c.args) {
          v.fields.push_back(Eval(a));
          Key(v.fields.back(), c.loc);
        }
        return v;
      }
      case ExprKind::kFunc: {
        const auto& f = static_cast<const FuncNode&>(*e);
        ValueTree v;
        v.kind = ValueTree::Kind::kFunction;
        v.lambda = &f;
        for (const VarNode* x : FreeVars(f)) {
          auto it = env_.find(x);
          if (it == env_.end()) throw Refusal("generic: %" + x->name + ", captured by the function" + Where(e->loc) + ", is not bound in the cell");
          v.fields.push_back(it->second);
        }
        return v;
      }
      case ExprKind::kGlobal: {
        const auto& g = static_cast<const GlobalNode&>(*e);
        if (!module_.Find(g.name)) throw Refusal("generic: unknown function @" + g.name + Where(e->loc));
        ValueTree v;
        v.kind = ValueTree::Kind::kFunction;
        v.global = g.name;
        return v;
      }
    }
    throw Refusal("generic: unknown expression");
  }

  static bool HasBottom(const ValueTree& v) {
    if (v.kind == ValueTree::Kind::kBottom) return true;
    for (const ValueTree& f : v.fields) {
      if (HasBottom(f)) return true;
    }
    return false;
  }

  static ValueTree Bottom() {
    ValueTree v;
    v.kind = ValueTree::Kind::kBottom;
    return v;
  }

  ValueTree EvalOp(const OpCallNode& call) {
    OpNode node{&call, {}, 0, {}};
    std::vector<TensorType> types;
    std::vector<ValueTree> operands;
    for (const Expr& a : call.args) operands.push_back(Eval(a));
    for (const ValueTree& a : operands) {
      if (a.kind == ValueTree::Kind::kBottom) return Bottom();
    }
    for (const ValueTree& a : operands) {
      int v = TensorOf(a, "an operand", call.loc);
      node.args.push_back(v);
      types.push_back(values_[v].type);
    }
    node.segment = segment_;  // after the operands: they may have made calls
    std::vector<TensorType> out;
    try {
      out = InferTypes(*call.op, types, call.attrs);
    } catch (const OpError& e) {
      throw Refusal(std::string("generic: ") + e.what() + Where(call.loc));
    }
    if (call.op->moves != MoveKind::kNone && out.size() == 1 && MovesData(node.args)) {
      ValueTree result;
      result.value = NewValue(out[0], Source{Source::Kind::kDataOp, static_cast<int>(data_ops_.size())});
      values_[result.value].data = true;
      data_ops_.push_back({&call, std::move(node.args), std::move(types), out[0]});
      return result;
    }
    int op = static_cast<int>(ops_.size());
    ValueTree result;
    if (out.size() > 1) result.kind = ValueTree::Kind::kTuple;
    for (size_t o = 0; o < out.size(); ++o) {
      int v = NewValue(out[o], Source{Source::Kind::kSegment});
      values_[v].op = op;
      node.outputs.push_back(v);
      if (out.size() > 1) result.fields.emplace_back().value = v;  // a tensor
      else result.value = v;
    }
    ops_.push_back(std::move(node));
    return result;
  }

  // Fills the keys of a built structure's field `v` (and of what it holds).
  void Key(ValueTree& v, const SourceLoc& loc) {
    v.key.clear();
    switch (v.kind) {
      case ValueTree::Kind::kTensor: PutTensor(v.key, values_[v.value].type, IsData(v.value) ? kData : -1); return;
      case ValueTree::Kind::kStructure:
      case ValueTree::Kind::kBuilt: v.key = "S"; return;
      case ValueTree::Kind::kTuple:
        v.key.push_back('U');
        Put(v.key, static_cast<int32_t>(v.fields.size()));
        for (ValueTree& f : v.fields) {
          Key(f, loc);
          v.key += f.key;
        }
        return;
      case ValueTree::Kind::kFunction:
        throw Refusal("generic: a function value inside a structure built" + Where(loc));
      case ValueTree::Kind::kBottom:
        throw Refusal("generic: a structure built" + Where(loc) + " of a recursion's result");
    }
  }

  bool IsData(int v) const { return values_[v].op < 0 && values_[v].data; }

  // Whether operands `args` are data and constants, data among them.
  bool MovesData(const std::vector<int>& args) const {
    bool data = false;
    for (int a : args) {
      if (IsData(a)) {
        data = true;
      } else if (values_[a].op >= 0 || values_[a].source.kind != Source::Kind::kConstant) {
        return false;
      }
    }
    return data;
  }

  void EncodeArg(const ValueTree& v, std::string& out, Question& q) {
    switch (v.kind) {
      case ValueTree::Kind::kTensor: {
        const ValueInfo& info = values_[v.value];
        const bool root = info.op < 0 && info.source.kind == Source::Kind::kRoot;
        PutTensor(out, info.type, root ? info.source.index : IsData(v.value) ? kData : -1);
        break;
      }
      case ValueTree::Kind::kStructure:
        out.push_back('S');
        q.structure_args.push_back(v.value);
        break;
      case ValueTree::Kind::kBuilt:
        out.push_back('S');
        q.structure_args.push_back(-1 - static_cast<int>(q.built.size()));
        q.built.push_back(v);
        break;
      case ValueTree::Kind::kTuple:
        out.push_back('U');
        Put(out, static_cast<int32_t>(v.fields.size()));
        for (const ValueTree& f : v.fields) EncodeArg(f, out, q);
        break;
      case ValueTree::Kind::kBottom: throw std::logic_error("generic: a call with an unknown argument");
      case ValueTree::Kind::kFunction:
        out.push_back('F');
        if (v.lambda) {
          // The `fn` by its node: keys live as long as the GenericProgram,
          // which holds the module snapshot the node belongs to.
          out.push_back('L');
          Put(out, reinterpret_cast<uintptr_t>(v.lambda));
          Put(out, static_cast<int32_t>(v.fields.size()));
          for (const ValueTree& f : v.fields) EncodeArg(f, out, q);
        } else {
          out.push_back('G');
          Put(out, static_cast<int32_t>(v.global.size()));
          out += v.global;
        }
        break;
    }
  }

  // Evaluates `f`'s body here, its captures and parameters bound to `captured`
  // and `args`. What they were bound to before is restored after: a `fn`
  // called where another instance of its own body is being evaluated binds
  // the same variables.
  ValueTree Inline(const FuncNode& f, const std::vector<const VarNode*>& captures, const std::vector<ValueTree>& captured,
                   const std::vector<ValueTree>& args, const std::string& what, const SourceLoc& loc) {
    if (args.size() != f.params.size()) throw Refusal("generic: " + what + " called with " + std::to_string(args.size()) + " arguments" + Where(loc));
    if (++inline_depth_ > 256) throw Refusal("generic: functions inlined more than 256 deep" + Where(loc));
    std::vector<std::pair<const VarNode*, std::optional<ValueTree>>> saved;
    auto bind = [&](const VarNode* var, const ValueTree& v) {
      auto it = env_.find(var);
      saved.emplace_back(var, it == env_.end() ? std::nullopt : std::optional<ValueTree>(it->second));
      env_[var] = v;
    };
    for (size_t i = 0; i < captures.size(); ++i) bind(captures[i], captured.at(i));
    for (size_t i = 0; i < args.size(); ++i) {
      if (f.params[i]->annotation && !Fits(args[i], f.params[i]->annotation)) {
        throw Refusal("generic: argument " + std::to_string(i) + " of " + what + Where(loc) + " does not have its declared type " + TypeToString(f.params[i]->annotation));
      }
      bind(f.params[i].get(), args[i]);
    }
    ValueTree result = Eval(f.body);
    CheckResult(result, f, what);
    for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
      if (it->second) env_[it->first] = std::move(*it->second);
      else env_.erase(it->first);
    }
    --inline_depth_;
    return result;
  }

  ValueTree EvalCall(const CallNode& call) {
    ValueTree callee;  // the function called: a definition by name, or a function value
    if (auto* global = As<GlobalNode>(call.callee)) {
      callee.kind = ValueTree::Kind::kFunction;
      callee.global = global->name;
    } else {
      callee = Eval(call.callee);
      if (callee.kind != ValueTree::Kind::kFunction) throw Refusal("generic: a call of a value that is not a function" + Where(call.loc));
    }
    std::vector<ValueTree> args;
    for (const Expr& a : call.args) args.push_back(Eval(a));
    if (callee.kind == ValueTree::Kind::kBottom) throw Refusal("generic: a call of a recursion's result" + Where(call.loc));
    if (callee.lambda) return Inline(*callee.lambda, FreeVars(*callee.lambda), callee.fields, args, "the function", call.loc);
    const std::string& name = callee.global;
    const Definition* def = module_.Find(name);
    if (!def) throw Refusal("generic: unknown function @" + name + Where(call.loc));
    if (args.size() != def->func->params.size()) throw Refusal("generic: @" + name + " called with " + std::to_string(args.size()) + " arguments" + Where(call.loc));
    if (!cells_.count(name)) return Inline(*def->func, {}, {}, args, "@" + name, call.loc);  // straight-line
    for (const ValueTree& a : args) {
      if (HasBottom(a)) return Bottom();  // a probe's: what it returns is not known either
    }
    Question q;
    q.kind = Question::Kind::kCall;
    q.guarded = guard_ >= 0;
    std::string encoded;
    for (const ValueTree& a : args) EncodeArg(a, encoded, q);
    q.callee_key = InstanceKey(name, encoded);
    const Answer& answer = NextAnswer(q);
    if (answer.bottom) return Bottom();
    int site = static_cast<int>(calls_.size());
    calls_.push_back({std::move(args), guard_});
    call_boundary_.push_back(segment_);
    NextSegment();
    Reader r(answer.types);
    int leaf = 0;
    return Decode(r, Source::Kind::kCall, site, &leaf);
  }

  void NextSegment() {
    ++segment_;
    segment_guard_.push_back(guard_);
  }

  // Each branch in segments of its own, guarded by the condition; the
  // `if`'s value the select of the branches' values.
  ValueTree EvalIf(const IfNode& node) {
    const ValueTree condition = Eval(node.cond);
    // A probe's condition may not be known: both branches are evaluated
    // anyway, and the cell is only asked for its result's type.
    const int cond = condition.kind == ValueTree::Kind::kBottom ? -1 : TensorOf(condition, "the condition of an `if`", node.loc);
    if (cond >= 0) {
      const TensorType& type = values_[cond].type;
      if (type.dtype != DType::kBool || NumElements(type.shape) != 1) {
        throw Refusal("generic: the condition of the `if`" + Where(node.loc) + " is a " + type.ToString() + ", not a bool scalar");
      }
    }
    const int outer = guard_;
    auto branch = [&](const Expr& body, bool when) {
      guards_.push_back({cond, when, outer});
      guard_ = static_cast<int>(guards_.size()) - 1;
      NextSegment();
      return Eval(body);
    };
    ValueTree then = branch(node.then_branch, true);
    ValueTree otherwise = branch(node.else_branch, false);
    guard_ = outer;
    NextSegment();
    return Join(then, otherwise, cond, node.loc);
  }

  ValueTree Join(const ValueTree& then, const ValueTree& otherwise, int cond, const SourceLoc& loc) {
    auto refuse = [&](const std::string& why) {
      return Refusal("generic: the branches of the `if`" + Where(loc) + " " + why);
    };
    if (then.kind == ValueTree::Kind::kBottom) return otherwise;  // the least fixpoint: the other branch's
    if (otherwise.kind == ValueTree::Kind::kBottom) return then;
    auto tensors = [](const ValueTree& v) { return v.kind == ValueTree::Kind::kTensor || v.kind == ValueTree::Kind::kTuple; };
    if (!tensors(then) || !tensors(otherwise)) {
      if (then.kind == ValueTree::Kind::kStructure && otherwise.kind == then.kind && then.value == otherwise.value) return then;
      throw refuse("return structures or functions (the generic tier joins tensors; match on the structure instead)");
    }
    if (then.kind != otherwise.kind) throw refuse("return values of different kinds");
    switch (then.kind) {
      case ValueTree::Kind::kTensor: {
        if (then.value == otherwise.value) return then;
        const TensorType& a = values_[then.value].type;
        const TensorType& b = values_[otherwise.value].type;
        if (!(a == b)) throw refuse("return a " + a.ToString() + " and a " + b.ToString());
        ValueTree v;
        v.value = NewValue(a, Source{Source::Kind::kSelect, static_cast<int>(selects_.size())});
        selects_.push_back({cond, then.value, otherwise.value});
        return v;
      }
      case ValueTree::Kind::kTuple: {
        if (then.fields.size() != otherwise.fields.size()) throw refuse("return tuples of different sizes");
        ValueTree v;
        v.kind = ValueTree::Kind::kTuple;
        for (size_t i = 0; i < then.fields.size(); ++i) v.fields.push_back(Join(then.fields[i], otherwise.fields[i], cond, loc));
        return v;
      }
      default: throw std::logic_error("generic: a join of " + std::to_string(static_cast<int>(then.kind)));
    }
  }

  ValueTree EvalMatch(const MatchNode& match) {
    ValueTree scrutinee = Eval(match.scrutinee);
    if (scrutinee.kind == ValueTree::Kind::kBottom) throw Refusal("generic: a match on a recursion's result" + Where(match.loc));
    if (scrutinee.kind == ValueTree::Kind::kBuilt) {  // built here: its clause is known
      for (const Clause& clause : match.clauses) {
        if (!Takes(clause.pattern, scrutinee, match)) continue;
        BindBuilt(clause.pattern, scrutinee);
        return Eval(clause.body);
      }
      throw Refusal("generic: no clause of the match" + Where(match.loc) + " matches the structure built there");
    }
    if (scrutinee.kind != ValueTree::Kind::kStructure) {
      throw Refusal("generic: a match on a value that is not a structure" + Where(match.loc));
    }
    Question q;
    q.kind = Question::Kind::kMatch;
    q.match = &match;
    q.structure = scrutinee.value;
    const Answer& answer = NextAnswer(q);
    const Clause& clause = match.clauses.at(answer.clause);
    Reader r(answer.types);
    Bind(clause.pattern, r);
    return Eval(clause.body);
  }

  // Whether pattern `p` matches `v`, a part of a structure this cell built.
  // A structure inside it that came from elsewhere is not looked into.
  bool Takes(const Pattern& p, const ValueTree& v, const MatchNode& match) const {
    if (p->kind == PatternKind::kWildcard || p->kind == PatternKind::kVar) return true;
    if (v.kind == ValueTree::Kind::kStructure) {
      throw Refusal("generic: the match" + Where(match.loc) + " looks into a structure inside one built in the cell; "
                    "match on that structure first");
    }
    if (p->kind == PatternKind::kCtor && (v.kind != ValueTree::Kind::kBuilt || v.tag != p->tag || v.adt->name != p->adt->name)) {
      return false;
    }
    if (p->kind == PatternKind::kTuple && v.kind != ValueTree::Kind::kTuple) return false;
    for (size_t i = 0; i < p->fields.size(); ++i) {
      if (!Takes(p->fields[i], v.fields.at(i), match)) return false;
    }
    return true;
  }

  void BindBuilt(const Pattern& p, const ValueTree& v) {
    if (p->kind == PatternKind::kVar) env_[p->var.get()] = v;
    for (size_t i = 0; i < p->fields.size(); ++i) BindBuilt(p->fields[i], v.fields[i]);
  }

  // Binds the pattern's variables in pre-order, as BindPattern (program.cc) does on values.
  void Bind(const Pattern& p, Reader& r) {
    switch (p->kind) {
      case PatternKind::kWildcard: return;
      case PatternKind::kVar: env_[p->var.get()] = Decode(r, Source::Kind::kStructLeaf); return;
      case PatternKind::kCtor:
      case PatternKind::kTuple:
        for (const Pattern& f : p->fields) Bind(f, r);
        return;
    }
  }

  // The type of a result, null when it holds a structure; its encoding in
  // `key` ('T'... per tensor, 'U' n fields..., 'S' per structure).
  Type TypeOf(const ValueTree& v, std::string& key) {
    switch (v.kind) {
      case ValueTree::Kind::kFunction: throw Refusal("generic: @" + function_ + " returns a function value");
      case ValueTree::Kind::kBottom:
        throw Refusal("generic: what @" + function_ + " returns is not known: each of its paths recurses");
      case ValueTree::Kind::kStructure:
      case ValueTree::Kind::kBuilt: key.push_back('S'); return nullptr;
      case ValueTree::Kind::kTensor: PutTensor(key, values_[v.value].type, -1); return TensorTy(values_[v.value].type);
      case ValueTree::Kind::kTuple: break;
    }
    key.push_back('U');
    Put(key, static_cast<int32_t>(v.fields.size()));
    std::vector<Type> fields;
    bool whole = true;
    for (const ValueTree& f : v.fields) {
      fields.push_back(TypeOf(f, key));
      whole &= fields.back() != nullptr;
    }
    return whole ? TupleTy(std::move(fields)) : nullptr;
  }

  void Uses(const ValueTree& v, std::vector<bool>& used_outside) {
    if (v.kind == ValueTree::Kind::kTensor) used_outside[v.value] = true;
    for (const ValueTree& f : v.fields) Uses(f, used_outside);
  }

  Cell Finish(const ValueTree& result) {
    Cell cell;
    cell.result = result;
    cell.result_type = TypeOf(result, cell.result_key);
    cell.constants = constants_;
    cell.calls = calls_;
    cell.data_ops = data_ops_;

    // A value is an output of its segment when something outside reads it.
    const int n = static_cast<int>(values_.size());
    std::vector<bool> outside(n, false);
    for (const OpNode& op : ops_) {
      for (int a : op.args) {
        if (values_[a].op >= 0 && ops_[values_[a].op].segment != op.segment) outside[a] = true;
      }
    }
    for (const CallSite& c : calls_) {
      for (const ValueTree& a : c.args) Uses(a, outside);
    }
    Uses(result, outside);
    for (const Guard& g : guards_) {
      if (g.cond >= 0) outside[g.cond] = true;
    }
    for (const Select& s : selects_) {
      if (s.cond >= 0) outside[s.cond] = outside[s.then] = outside[s.otherwise] = true;  // -1: a probe's
    }
    cell.guards = guards_;
    cell.selects = selects_;

    cell.sources.resize(n);
    for (int v = 0; v < n; ++v) cell.sources[v] = values_[v].source;
    std::vector<int> segment_of(segment_ + 1, -1);  // builder segment -> cell segment
    size_t next_call = 0;
    for (int s = 0; s <= segment_; ++s) {
      std::vector<int> ops;
      for (int o = 0; o < static_cast<int>(ops_.size()); ++o) {
        if (ops_[o].segment == s) ops.push_back(o);
      }
      if (!ops.empty()) {
        segment_of[s] = static_cast<int>(cell.segments.size());
        cell.steps.push_back({false, segment_of[s]});
        cell.segments.push_back(MakeSegment(ops, outside, segment_of[s], cell.sources));
        cell.segments.back().guard = segment_guard_[s];
      }
      for (; next_call < calls_.size() && call_boundary_[next_call] == s; ++next_call) {
        cell.steps.push_back({true, static_cast<int>(next_call)});
      }
    }
    return cell;
  }

  Segment MakeSegment(const std::vector<int>& ops, const std::vector<bool>& outside, int index,
                      std::vector<Source>& sources) {
    Segment seg;
    StraightEmitter out("t");
    std::unordered_map<int, Expr> atoms;
    std::vector<Var> params;
    auto atom = [&](int v) -> Expr {
      auto it = atoms.find(v);
      if (it != atoms.end()) return it->second;
      const ValueInfo& info = values_[v];
      Expr e;
      if (info.op < 0 && info.source.kind == Source::Kind::kConstant) {
        e = MakeConstant(constants_[info.source.index]);
      } else {
        Var p = MakeVar("x" + std::to_string(params.size()), TensorTy(info.type));
        params.push_back(p);
        seg.inputs.push_back(v);
        seg.shared.push_back(info.op < 0 && info.source.kind == Source::Kind::kRoot);
        seg.data.push_back(IsData(v));
        if (seg.shared.back()) seg.share_roots.push_back(info.source.index);
        e = p;
      }
      atoms[v] = e;
      return e;
    };
    for (int o : ops) {
      const OpNode& node = ops_[o];
      std::vector<Expr> args;
      for (int a : node.args) args.push_back(atom(a));
      Var result = out.Op(node.call->op->name, std::move(args), node.call->attrs, node.call->loc);
      if (node.outputs.size() == 1) {
        atoms[node.outputs[0]] = result;
      } else {
        for (size_t i = 0; i < node.outputs.size(); ++i) atoms[node.outputs[i]] = out.Proj(result, static_cast<int>(i), node.call->loc);
      }
      for (int v : node.outputs) {
        if (!outside[v]) continue;
        sources[v] = Source{Source::Kind::kSegment, index, static_cast<int>(seg.outputs.size())};
        seg.outputs.push_back(v);
      }
    }
    std::vector<Expr> results;
    for (int v : seg.outputs) results.push_back(atoms.at(v));
    Straight s;
    s.params = std::move(params);
    s.bindings = std::move(out.bindings());
    s.result = MakeTuple(std::move(results));
    seg.program = Recompose(s);
    return seg;
  }
};

}  // namespace

void EncodeTensor(const TensorType& type, int32_t share, std::string& out) { PutTensor(out, type, share); }

void EncodeValue(const Value& value, std::string& out) {
  switch (value.kind()) {
    case Value::Kind::kTensor: PutTensor(out, value.tensor().type(), kData); return;
    case Value::Kind::kTuple:
      out.push_back('U');
      Put(out, static_cast<int32_t>(value.fields().size()));
      for (const Value& f : value.fields()) EncodeValue(f, out);
      return;
    case Value::Kind::kAdt: out.push_back('S'); return;
    default: throw Refusal("generic: a function value inside an argument");
  }
}

std::string InstanceKey(const std::string& function, const std::string& encoded_args) {
  std::string key = function;
  key.push_back('\0');
  key += encoded_args;
  return key;
}

std::set<std::string> CellFunctions(const ModuleSnapshot& module, const std::string& entry) {
  std::set<std::string> reachable = module.Callees(entry);
  reachable.insert(entry);
  std::set<std::string> roots;  // functions that match or recurse
  for (const std::string& f : reachable) {
    const Definition* def = module.Find(f);
    if (def && (ContainsMatch(def->func) || module.Callees(f).count(f))) roots.insert(f);
  }
  std::set<std::string> cells;
  for (const std::string& f : reachable) {
    if (roots.count(f)) {
      cells.insert(f);
      continue;
    }
    for (const std::string& g : module.Callees(f)) {
      if (roots.count(g)) {
        cells.insert(f);
        break;
      }
    }
  }
  cells.insert(entry);
  return cells;
}

std::variant<Question, Cell> BuildCell(const ModuleSnapshot& module, const std::set<std::string>& cell_functions,
                                       const std::string& key, const std::vector<Answer>& answers) {
  return Builder(module, cell_functions, answers).Run(key);
}

namespace {

std::string Probe(const ModuleSnapshot& module, const std::set<std::string>& cells, const std::string& key,
                  std::set<std::string>& probing, bool* holds_structure) {
  probing.insert(key);
  std::vector<Answer> answers;
  while (true) {
    std::variant<Question, Cell> built = Builder(module, cells, answers).Run(key);
    if (Cell* cell = std::get_if<Cell>(&built)) {
      probing.erase(key);
      *holds_structure = cell->result_type == nullptr;
      return cell->result_key;
    }
    const Question& q = std::get<Question>(built);
    if (q.kind == Question::Kind::kMatch) {
      throw Refusal("generic: a loop the data ends, @" + key.substr(0, key.find('\0')) +
                    ", matches on a structure at " + q.match->loc.ToString());
    }
    Answer answer;
    if (probing.count(q.callee_key) || !q.structure_args.empty()) {
      answer.bottom = true;
    } else {
      bool structure = false;
      answer.types = Probe(module, cells, q.callee_key, probing, &structure);
    }
    answers.push_back(std::move(answer));
  }
}

}  // namespace

std::string ProbeResultKey(const ModuleSnapshot& module, const std::set<std::string>& cell_functions,
                           const std::string& key, bool* holds_structure) {
  std::set<std::string> probing;
  return Probe(module, cell_functions, key, probing, holds_structure);
}

}  // namespace pejit::generic
