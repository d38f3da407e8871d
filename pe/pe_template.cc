#include <algorithm>
#include <unordered_set>

#include "pe/template_builder.h"

namespace pejit::pe_detail {
namespace {

// Whether a template can hold `e` (what PE emits), and the variables it uses
// from outside, in order of first use.
bool FreeVarsOfResidual(const Expr& e, std::vector<const VarNode*>& free) {
  std::unordered_set<const ExprNode*> bound, seen;
  bool ok = true;
  PostOrderVisit(e, [&](const Expr& n) {
    switch (n->kind) {
      case ExprKind::kLet: bound.insert(NodeOf<LetNode>(n).var.get()); break;
      case ExprKind::kVar: case ExprKind::kConstant: case ExprKind::kOpCall: case ExprKind::kIf:
      case ExprKind::kTuple: case ExprKind::kProj: case ExprKind::kCtor: break;
      default: ok = false;
    }
  });
  PostOrderVisit(e, [&](const Expr& n) {
    if (n->kind == ExprKind::kVar && !bound.count(n.get()) && seen.insert(n.get()).second) {
      free.push_back(&NodeOf<VarNode>(n));
    }
  });
  return ok;
}

// The template of a finished, context-free unfolding. Build() is false
// when something in it cannot be stood for (a variable from outside, a
// function value).
class TemplateBuilder {
 public:
  TemplateBuilder(const Recording& rec, const RecordingContext& context, PeTemplate& t)
      : context_(context), rec_(rec), t_(t) {}

  bool Build(const PVal* result) {
    t_.helper = rec_.helper;
    const Scope& scope = context_.scope;
    size_t lets = scope.lets.size() - rec_.lets_mark;
    slot_of_.Reserve(rec_.nodes.size() + rec_.consts.size() + lets);
    for (size_t k = 0; k < rec_.nodes.size(); ++k) {
      const PVal* p = rec_.nodes[k];
      if (p->kind != PVal::Kind::kDynamic) continue;
      int32_t& slot = slot_of_.At(HashPtr(p->atom.get()));
      if (slot < 0) {
        slot = slots_++;
        t_.param_nodes.push_back(static_cast<int32_t>(k));
      }
    }
    for (const auto& [tensor, var] : rec_.consts) {
      slot_of_.At(HashPtr(var.get())) = slots_++;
      t_.consts.push_back(StaticIndex(tensor));
    }
    t_.lets.reserve(lets);
    t_.operands.reserve(3 * lets);
    for (size_t i = rec_.lets_mark; i < scope.lets.size(); ++i) {
      if (!AddLet(scope.lets[i].first, scope.lets[i].second)) return false;
    }
    t_.result = Convert(result, 0);
    if (t_.result < 0 || !AddCalls(result)) return false;

    for (size_t i = 0; i < rec_.probes.size(); ++i) {
      uint32_t first = rec_.probes[i].second;
      uint32_t end = i + 1 < rec_.probes.size() ? rec_.probes[i + 1].second
                                                : static_cast<uint32_t>(rec_.probe_args.size());
      t_.probes.push_back({Name(*rec_.probes[i].first), static_cast<uint32_t>(t_.ids.size()), end - first});
      t_.ids.insert(t_.ids.end(), rec_.probe_args.begin() + first, rec_.probe_args.begin() + end);
    }
    t_.unfold_keys = rec_.unfold_keys;
    std::sort(t_.unfold_keys.begin(), t_.unfold_keys.end());
    t_.unfold_keys.erase(std::unique(t_.unfold_keys.begin(), t_.unfold_keys.end()), t_.unfold_keys.end());
    for (const std::string* g : rec_.unfolded) t_.unfolded.push_back(Name(*g));
    std::sort(t_.unfolded.begin(), t_.unfolded.end());
    t_.unfolded.erase(std::unique(t_.unfolded.begin(), t_.unfolded.end()), t_.unfolded.end());
    const PeStats& now = context_.stats;
    t_.unfoldings = now.unfoldings - rec_.unfoldings;
    t_.residual_ops = now.residual_ops - rec_.residual_ops;
    t_.folded_ops = now.folded_ops - rec_.folded_ops;
    t_.shared_calls = now.shared_calls - rec_.shared_calls;
    t_.stack_bytes = rec_.stack_deepest - rec_.stack_start;
    return true;
  }

 private:
  const RecordingContext& context_;
  const Recording& rec_;
  PeTemplate& t_;
  IndexTable slot_of_;    // a variable → its slot
  int32_t slots_ = 0;
  IndexTable static_of_;  // a buffer → its statics entry
  IndexTable value_of_;   // a PVal → its value
  IndexTable name_of_;    // a global's name (by address) → its index in names
  IndexTable visible_;    // PVals the caller can reach after the call
  IndexTable site_heads_;  // a site's hash → its newest site, chained by site_next_
  std::vector<int32_t> site_next_;
  std::vector<const PVal*> stack_;

  int32_t Name(const std::string& name) {
    int32_t& index = name_of_.At(HashPtr(&name));
    if (index < 0) {
      index = static_cast<int32_t>(t_.names.size());
      t_.names.push_back(name);
    }
    return index;
  }

  int32_t StaticIndex(const Tensor& v) {
    int32_t index = static_of_.Get(HashPtr(v.raw_data()));
    if (index >= 0) return index;
    index = static_cast<int32_t>(t_.statics.size());
    static_of_.At(HashPtr(v.raw_data())) = index;
    PeTemplate::Static st;
    st.arg_node = rec_.static_buffer.Get(HashPtr(v.raw_data()));
    if (st.arg_node < 0) {
      st.value = v;
      st.fresh = rec_.fresh.Get(HashPtr(v.raw_data())) >= 0;
    }
    t_.statics.push_back(std::move(st));
    return index;
  }

  int32_t SiteOf(const VarNode& var, const OpCallNode* op) {
    static const Attrs kNoAttrs;
    static const SourceLoc kNoLoc;
    const Attrs& attrs = op ? op->attrs : kNoAttrs;
    const SourceLoc& loc = op ? op->loc : kNoLoc;
    uint64_t key = Mix(Mix(HashPtr(var.annotation.get()), std::hash<std::string>{}(var.name)), HashPtr(op ? op->op : nullptr));
    key = Mix(Mix(key, HashPtr(&attrs.items())), Mix(HashPtr(loc.file.get()), Mix(loc.line, loc.col)));
    int32_t& head = site_heads_.At(key);
    for (int32_t i = head; i >= 0; i = site_next_[i]) {
      const PeTemplate::Site& s = t_.sites[i];
      if (s.name == var.name && s.type == var.annotation && s.op == (op ? op->op : nullptr) && s.attrs == attrs &&
          s.loc.file == loc.file && s.loc.line == loc.line && s.loc.col == loc.col) {
        return i;
      }
    }
    int32_t index = static_cast<int32_t>(t_.sites.size());
    t_.sites.push_back({var.name, var.annotation, op ? op->op : nullptr, attrs, loc});
    site_next_.push_back(head);
    head = index;
    return index;
  }

  bool AddLet(const Var& var, const Expr& value) {
    PeTemplate::Let let;
    const OpCallNode* site_op = nullptr;
    let.first = static_cast<uint32_t>(t_.operands.size());
    bool simple = false;
    if (value->kind == ExprKind::kOpCall) {
      const OpCallNode& op = NodeOf<OpCallNode>(value);
      simple = true;
      for (const Expr& a : op.args) {
        if (a->kind == ExprKind::kVar) {
          int32_t slot = slot_of_.Get(HashPtr(a.get()));
          if (slot < 0) return false;
          t_.operands.push_back(slot);
        } else if (a->kind == ExprKind::kConstant) {
          t_.operands.push_back(~static_cast<int32_t>(t_.literals.size()));
          t_.literals.push_back(a);
        } else {
          simple = false;
          t_.operands.resize(let.first);
          break;
        }
      }
      if (simple) {
        let.kind = PeTemplate::Let::Kind::kOp;
        site_op = &op;
      }
    } else if (value->kind == ExprKind::kProj && NodeOf<ProjNode>(value).tuple->kind == ExprKind::kVar) {
      int32_t slot = slot_of_.Get(HashPtr(NodeOf<ProjNode>(value).tuple.get()));
      if (slot < 0) return false;
      simple = true;
      let.kind = PeTemplate::Let::Kind::kProj;
      t_.operands.push_back(slot);
      let.index = NodeOf<ProjNode>(value).index;
    }
    if (simple) {
      let.count = static_cast<uint32_t>(t_.operands.size()) - let.first;
    } else {
      std::vector<const VarNode*> free;
      if (!FreeVarsOfResidual(value, free)) return false;
      let.first = static_cast<uint32_t>(t_.free.size());
      for (const VarNode* v : free) {
        int32_t slot = slot_of_.Get(HashPtr(v));
        if (slot < 0) return false;
        t_.free.push_back({v, slot});
      }
      let.count = static_cast<uint32_t>(free.size());
      let.kind = PeTemplate::Let::Kind::kExpr;
      let.index = static_cast<int32_t>(t_.exprs.size());
      t_.exprs.push_back(value);
    }
    let.site = SiteOf(*var, site_op);
    slot_of_.At(HashPtr(var.get())) = slots_++;
    t_.lets.push_back(std::move(let));
    return true;
  }

  // The value `p` stands for; its fields first. -1: not representable.
  int32_t Convert(const PVal* p, int depth) {
    int32_t known = value_of_.Get(HashPtr(p));
    if (known >= 0) return known;
    if (depth > 1000) return -1;
    PeTemplate::Val v;
    int32_t node = rec_.node_index.Get(HashPtr(p));
    if (node >= 0) {
      v.kind = PeTemplate::Val::Kind::kArg;
      v.index = node;
    } else {
      switch (p->kind) {
        case PVal::Kind::kDynamic:
          v.kind = PeTemplate::Val::Kind::kDynamic;
          v.index = slot_of_.Get(HashPtr(p->atom.get()));
          if (v.index < 0) return -1;
          v.type = p->type->type;
          break;
        case PVal::Kind::kStatic:
          v.kind = PeTemplate::Val::Kind::kStatic;
          v.index = StaticIndex(*p->value);
          break;
        case PVal::Kind::kTuple:
        case PVal::Kind::kAdt: {
          v.kind = p->kind == PVal::Kind::kTuple ? PeTemplate::Val::Kind::kTuple : PeTemplate::Val::Kind::kAdt;
          if (p->kind == PVal::Kind::kAdt) {
            v.adt = context_.adt_of(p->adt);
            v.tag = p->tag;
          }
          SmallVec<int32_t> fields;
          for (const PVal* f : p->Fields()) {
            int32_t field = Convert(f, depth + 1);
            if (field < 0) return -1;
            fields.push_back(field);
          }
          v.first = static_cast<uint32_t>(t_.fields.size());
          v.count = static_cast<uint32_t>(fields.size());
          t_.fields.insert(t_.fields.end(), fields.begin(), fields.end());
          break;
        }
        case PVal::Kind::kClosure:
        case PVal::Kind::kGlobal:
        case PVal::Kind::kChoice: return -1;
      }
    }
    int32_t index = static_cast<int32_t>(t_.values.size());
    t_.values.push_back(std::move(v));
    value_of_.At(HashPtr(p)) = index;
    return index;
  }

  // Marks `root` and everything in it reachable.
  void Show(const PVal* root) {
    stack_.push_back(root);
    while (!stack_.empty()) {
      const PVal* p = stack_.back();
      stack_.pop_back();
      int32_t& seen = visible_.At(HashPtr(p));
      if (seen >= 0) continue;
      seen = 1;
      if (p->kind == PVal::Kind::kTuple || p->kind == PVal::Kind::kAdt || p->kind == PVal::Kind::kClosure) {
        for (const PVal* f : p->Fields()) stack_.push_back(f);
      }
    }
  }

  // The calls answered inside whose entries the caller can still reach:
  // on values it can reach (the arguments', the result's, and those of
  // such calls' results).
  bool AddCalls(const PVal* result) {
    const std::vector<CallEntry>& calls = context_.calls;
    for (const PVal* node : rec_.nodes) visible_.At(HashPtr(node)) = 1;
    Show(result);
    std::vector<bool> exposed(calls.size() - rec_.calls_mark, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = rec_.calls_mark; i < calls.size(); ++i) {
        if (exposed[i - rec_.calls_mark]) continue;
        const CallEntry& c = calls[i];
        bool reachable = true;
        for (uint32_t k = 0; reachable && k < c.size; ++k) reachable = visible_.Get(HashPtr(c.ids[k])) >= 0;
        if (!reachable) continue;
        exposed[i - rec_.calls_mark] = true;
        Show(c.result);
        changed = true;
      }
    }
    for (size_t i = rec_.calls_mark; i < calls.size(); ++i) {
      if (!exposed[i - rec_.calls_mark]) continue;
      const CallEntry& c = calls[i];
      if (!c.global) return false;
      PeTemplate::Call call{Name(*c.global), 0, c.size, Convert(c.result, 0)};
      if (call.result < 0) return false;
      SmallVec<int32_t> ids;
      for (uint32_t k = 0; k < c.size; ++k) {
        int32_t id = Convert(c.ids[k], 0);
        if (id < 0) return false;
        ids.push_back(id);
      }
      call.first = static_cast<uint32_t>(t_.ids.size());
      t_.ids.insert(t_.ids.end(), ids.begin(), ids.end());
      t_.calls.push_back(call);
    }
    return true;
  }
};

}  // namespace

bool BuildTemplate(const Recording& rec, const RecordingContext& context, const PVal* result, PeTemplate& t) {
  return TemplateBuilder(rec, context, t).Build(result);
}

}  // namespace pejit::pe_detail
