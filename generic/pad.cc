#include "generic/pad.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>

#include "ir/type.h"
#include "jit/straight.h"
#include "ops/op.h"

namespace pejit::generic {
namespace {

// Where a value's padding lies, and what it holds there.
struct Pads {
  std::vector<int> dims;  // per axis: the padded parameter whose length it has (its mask), or -1
  bool zero = true;       // zero wherever a padded axis is past its length
  bool finite = true;     // finite there
  bool any() const {
    return std::any_of(dims.begin(), dims.end(), [](int d) { return d >= 0; });
  }
};

// What a reduction along a padded axis must read past the lengths.
enum class Fill { kZero, kLowest, kHighest };

int Axis(int64_t axis, size_t rank) { return static_cast<int>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis); }

[[noreturn]] void Refuse(const std::string& op, const std::string& why) {
  throw Refusal("pad: " + op + " " + why);
}

// Scalar operations that are finite, with finite derivatives, wherever
// their operands are: they may compute on the padding whatever it holds,
// since their results there are never read.
bool Tame(ScalarOp s) {
  switch (s) {
    case ScalarOp::kNeg: case ScalarOp::kAbs: case ScalarOp::kTanh: case ScalarOp::kSigmoid:
    case ScalarOp::kRelu: case ScalarOp::kAdd: case ScalarOp::kSub: case ScalarOp::kMul:
    case ScalarOp::kMaximum: case ScalarOp::kMinimum: case ScalarOp::kLess: case ScalarOp::kLessEqual:
    case ScalarOp::kGreater: case ScalarOp::kGreaterEqual: case ScalarOp::kEqual: case ScalarOp::kNotEqual:
    case ScalarOp::kAnd: case ScalarOp::kOr: case ScalarOp::kNot: case ScalarOp::kWhere: case ScalarOp::kCast:
    case ScalarOp::kCopy: case ScalarOp::kZero: case ScalarOp::kOne: case ScalarOp::kClip:
      return true;
    default:
      return false;
  }
}

class Padder {
 public:
  Padder(const Func& program, const std::vector<PadTo>& pads) : s_(Decompose(program)), to_(pads) {
    to_.resize(s_.params.size());
    masks_.resize(s_.params.size());
    std::vector<Var> appended;
    for (size_t p = 0; p < s_.params.size(); ++p) {
      if (to_[p].extent == 0) continue;
      const Var& old = s_.params[p];
      TensorType t = TensorTypeOf(old);
      if (t.rank() == 0) Refuse("parameter %" + old->name, "is a scalar: it has no length to pad");
      if (to_[p].axes == 0 || to_[p].axes >> t.rank() != 0) {
        Refuse("parameter %" + old->name, "has no axes " + std::to_string(to_[p].axes) + " to pad");
      }
      Pads pads;
      pads.dims.assign(t.rank(), -1);
      const int64_t length = t.shape[0];
      for (int a = 0; a < t.rank(); ++a) {
        if (!(to_[p].axes >> a & 1)) continue;
        if (t.shape[a] != length) Refuse("parameter %" + old->name, "pads axes of different lengths");
        t.shape[a] = to_[p].extent;
        pads.dims[a] = static_cast<int>(p);
      }
      Var v = MakeVar(old->name, TensorTy(t));
      subst_[old.get()] = v;
      pads_[v.get()] = std::move(pads);
      s_.params[p] = v;
      if (to_[p].masked) {
        masks_[p] = MakeVar("mask" + std::to_string(p), TensorTy(DType::kBool, {to_[p].extent}));
        appended.push_back(masks_[p]);
      }
    }
    s_.params.insert(s_.params.end(), appended.begin(), appended.end());
  }

  PaddedSegment Run() {
    std::vector<Binding> bindings = std::move(s_.bindings);
    s_.bindings.clear();
    for (const Binding& b : bindings) Bind(b);
    s_.result = Substitute(s_.result, subst_);
    PaddedSegment out;
    auto* tuple = As<TupleNode>(s_.result);
    if (!tuple) throw std::logic_error("pad: a segment whose result is not a tuple");
    std::vector<Expr> fields;
    for (const Expr& f : tuple->fields) fields.push_back(Result(f, out.lengths));
    s_.result = MakeTuple(std::move(fields));
    out.program = Recompose(s_);
    return out;
  }

 private:
  Expr Sub(const Expr& atom) const { return Substitute(atom, subst_); }

  bool Masks(const Pads& p) const {
    return std::any_of(p.dims.begin(), p.dims.end(), [&](int d) { return d >= 0 && masks_[d]; });
  }

  const Pads* PadsOf(const Expr& atom) const {
    auto it = pads_.find(atom.get());
    return it != pads_.end() && it->second.any() ? &it->second : nullptr;
  }

  // A result of the per-example length: along its first axis only (its
  // readers read an instance's value as its first rows), zeros past it.
  Expr Result(const Expr& field, std::vector<int>& lengths) {
    const Pads* p = PadsOf(field);
    if (!p) {
      lengths.push_back(-1);
      return field;
    }
    for (size_t a = 1; a < p->dims.size(); ++a) {
      if (p->dims[a] >= 0) Refuse("the segment's result", "has the per-example length along an axis but its first");
    }
    if (p->dims[0] < 0) Refuse("the segment's result", "has the per-example length along an axis but its first");
    lengths.push_back(p->dims[0]);
    return Masked(field, Fill::kZero);
  }

  // Binds `op(args)` to a fresh variable and returns it.
  Expr Fresh(const std::string& op, std::vector<Expr> args, const Attrs& attrs = {}) {
    Expr call = MakeOpCall(op, std::move(args), attrs);
    auto* c = As<OpCallNode>(call);
    std::vector<TensorType> in;
    for (const Expr& a : c->args) in.push_back(TensorTypeOf(a));
    std::vector<TensorType> types;
    try {
      types = InferTypes(*c->op, in, c->attrs);
    } catch (const OpError& e) {
      Refuse(op, std::string("does not type at the padded length: ") + e.what());
    }
    Var v = MakeVar("pad" + std::to_string(fresh_++), TensorTy(types[0]));
    s_.bindings.push_back({v, call});
    return v;
  }

  // The mask of a value whose padded axes are `dims`: true where every
  // padded axis is within its length, broadcast along the others; null
  // when none of them is masked.
  Expr MaskOf(const std::vector<int>& dims) {
    Expr cond;
    for (size_t a = 0; a < dims.size(); ++a) {
      if (dims[a] < 0 || !masks_[dims[a]]) continue;
      Expr m = masks_[dims[a]];
      if (dims.size() != 1) {
        std::vector<int64_t> shape(dims.size(), 1);
        shape[a] = to_[dims[a]].extent;
        m = Fresh("reshape", {m}, {{"shape", shape}});
      }
      cond = cond ? Fresh("logical_and", {cond, m}) : m;
    }
    return cond;
  }

  // `atom` reading `fill` past the lengths. `barrier`: a `where` even if it
  // holds that already, so that the backward pass stops there: the
  // cotangent past the lengths is zero whatever the next operation's
  // derivative is there (a sqrt's at zero).
  Expr Masked(const Expr& atom, Fill fill, bool barrier = false) {
    const Pads* p = PadsOf(atom);
    if (!p || !Masks(*p)) return atom;
    if (fill == Fill::kZero && p->zero && !barrier) return atom;
    Expr& cached = masked_cache_[{atom.get(), static_cast<int>(fill)}];
    if (cached) return cached;
    const TensorType t = TensorTypeOf(atom);
    double value = 0;
    if (fill != Fill::kZero) {
      if (!IsFloat(t.dtype)) Refuse("a max or min of integers", "along a per-example axis");
      value = fill == Fill::kLowest ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    }
    Pads pads = *p;
    pads.zero = fill == Fill::kZero;
    pads.finite = fill == Fill::kZero;
    cached = Fresh("where", {MaskOf(p->dims), atom, MakeConstant(Tensor::ScalarOf(t.dtype, value))});
    pads_[cached.get()] = std::move(pads);
    return cached;
  }

  void Bind(const Binding& b) {
    if (auto* call = As<OpCallNode>(b.value)) return Call(b, *call);
    // a tuple of atoms, or a projection of one
    ForEachOperand(b.value, [&](const Expr& a) {
      if (PadsOf(Sub(a))) Refuse("a tuple", "holds a value of the per-example length");
    });
    Expr value = Substitute(b.value, subst_);
    if (value == b.value) {
      s_.bindings.push_back(b);
      return;
    }
    Var v = MakeVar(b.var->name, b.var->annotation);
    subst_[b.var.get()] = v;
    s_.bindings.push_back({v, value});
  }

  void Call(const Binding& b, const OpCallNode& call) {
    std::vector<Expr> args;
    std::vector<const Pads*> ps;
    bool changed = false, any = false;
    for (const Expr& a : call.args) {
      args.push_back(Sub(a));
      changed |= args.back() != a;
      ps.push_back(PadsOf(args.back()));
      any |= ps.back() != nullptr;
    }
    if (!any) {
      if (!changed) {
        s_.bindings.push_back(b);
      } else {
        Emit(b, *call.op, std::move(args), call.attrs, nullptr);
      }
      return;
    }
    const std::string& name = call.op->name;
    if (!AsTensor(b.var->annotation)) Refuse(name, "of a value of the per-example length returns a tuple");
    const TensorType old = TensorTypeOf(b.var);
    Attrs attrs = call.attrs;
    Pads out;
    out.dims.assign(old.rank(), -1);
    const FusionKind fusion = call.op->fusion;
    if (fusion == FusionKind::kElementwise || fusion == FusionKind::kBroadcast) {
      Elementwise(*call.op, args, ps, out);
    } else if (name == "matmul") {
      Matmul(attrs, args, ps, out);
    } else if (name == "dense") {
      if (ps[1] || ps[2]) Refuse(name, "with a weight of the per-example length");
      if (ps[0]->dims[1] >= 0) Refuse(name, "contracting a per-example axis with its weight's");
      if (!ps[0]->finite) args[0] = Masked(args[0], Fill::kZero);
      out.dims[0] = ps[0]->dims[0];
      out.zero = false;
    } else if (name == "sum" || name == "mean" || name == "max" || name == "min" || name == "logsumexp" ||
               name == "norm") {
      if (Reduce(b, *call.op, attrs, args[0], *ps[0], out)) return;
    } else if (name == "softmax" || name == "log_softmax" || name == "argmax" || name == "argmin") {
      AlongAxis(name, attrs, args[0], *ps[0], out);
    } else if (call.op->batch == BatchRule::kRowLoss) {
      if (Loss(b, *call.op, attrs, args, ps, out)) return;
    } else {
      Move(name, attrs, args, ps, old, out);
    }
    Emit(b, *call.op, std::move(args), attrs, &out);
  }

  // Binds the result of `op(args)` to a variable for b's, checking that
  // only its padded axes (`out`) changed size.
  void Emit(const Binding& b, const OpDef& op, std::vector<Expr> args, const Attrs& attrs, const Pads* out) {
    std::vector<TensorType> in;
    for (const Expr& a : args) in.push_back(TensorTypeOf(a));
    std::vector<TensorType> types;
    try {
      types = InferTypes(op, in, attrs);
    } catch (const OpError& e) {
      Refuse(op.name, std::string("does not type at the padded length: ") + e.what());
    }
    Type type;
    if (types.size() == 1) {
      type = TensorTy(types[0]);
    } else {
      std::vector<Type> fields;
      for (const TensorType& t : types) fields.push_back(TensorTy(t));
      type = TupleTy(std::move(fields));
    }
    if (out) {
      const TensorType old = TensorTypeOf(b.var);
      bool same = types[0].dtype == old.dtype && types[0].rank() == old.rank();
      for (int a = 0; same && a < old.rank(); ++a) {
        same = types[0].shape[a] == (out->dims[a] >= 0 ? to_[out->dims[a]].extent : old.shape[a]);
      }
      if (!same) Refuse(op.name, "changes the per-example length's place (" + old.ToString() + ")");
    }
    Var v = MakeVar(b.var->name, type);
    subst_[b.var.get()] = v;
    if (out && out->any()) pads_[v.get()] = *out;
    s_.bindings.push_back({v, MakeOpCall(op.name, std::move(args), attrs, b.value->loc)});
  }

  void Elementwise(const OpDef& op, std::vector<Expr>& args, std::vector<const Pads*>& ps, Pads& out) {
    const ScalarOp s = op.scalar;
    if (s == ScalarOp::kNone) Refuse(op.name, "of a value of the per-example length");
    const bool tame = Tame(s);
    for (size_t i = 0; i < args.size(); ++i) {
      if (!ps[i] || (tame && ps[i]->finite)) continue;
      args[i] = Masked(args[i], Fill::kZero, /*barrier=*/!tame);
      ps[i] = PadsOf(args[i]);
    }
    const int rank = static_cast<int>(out.dims.size());
    for (const Pads* p : ps) {
      if (!p) continue;
      const int shift = rank - static_cast<int>(p->dims.size());
      for (size_t a = 0; a < p->dims.size(); ++a) {
        if (p->dims[a] >= 0 && out.dims[a + shift] < 0) out.dims[a + shift] = p->dims[a];
      }
    }
    // Operand i is zero wherever the result is padded.
    auto covers = [&](size_t i) {
      if (i >= ps.size() || !ps[i] || !ps[i]->zero) return false;
      const int shift = rank - static_cast<int>(ps[i]->dims.size());
      for (int a = 0; a < rank; ++a) {
        if (out.dims[a] >= 0 && (a < shift || ps[i]->dims[a - shift] < 0)) return false;
      }
      return true;
    };
    auto all_cover = [&] {
      for (size_t i = 0; i < args.size(); ++i) {
        if (!covers(i)) return false;
      }
      return true;
    };
    switch (s) {
      case ScalarOp::kMul: case ScalarOp::kAnd:
        out.zero = covers(0) || covers(1);
        break;
      case ScalarOp::kDiv:
        out.zero = covers(0) && !ps[1];
        break;
      case ScalarOp::kAdd: case ScalarOp::kSub: case ScalarOp::kMaximum: case ScalarOp::kMinimum: case ScalarOp::kOr:
        out.zero = all_cover();
        break;
      case ScalarOp::kWhere:
        out.zero = covers(1) && covers(2);
        break;
      case ScalarOp::kNeg: case ScalarOp::kAbs: case ScalarOp::kTanh: case ScalarOp::kRelu: case ScalarOp::kCopy:
      case ScalarOp::kZero: case ScalarOp::kCast:
        out.zero = covers(0);
        break;
      default:
        out.zero = false;
    }
    out.finite = tame || out.zero;
  }

  void Matmul(const Attrs& attrs, std::vector<Expr>& args, std::vector<const Pads*>& ps, Pads& out) {
    const int r = static_cast<int>(TensorTypeOf(args[0]).rank());
    const bool ta = attrs.GetBool("transpose_a"), tb = attrs.GetBool("transpose_b");
    auto dim = [&](int i, int axis) { return ps[i] ? ps[i]->dims[axis] : -1; };
    const int ma = ta ? r - 1 : r - 2, ka = ta ? r - 2 : r - 1, kb = tb ? r - 1 : r - 2, nb = tb ? r - 2 : r - 1;
    if ((dim(0, ka) >= 0) != (dim(1, kb) >= 0)) Refuse("matmul", "contracting a per-example axis with a fixed one");
    const bool contracts = dim(0, ka) >= 0;
    for (int i = 0; i < 2; ++i) {
      if (ps[i] && (contracts || !ps[i]->finite)) {
        args[i] = Masked(args[i], Fill::kZero);
        ps[i] = PadsOf(args[i]);
      }
    }
    int o = 0;
    if (r == 3) {
      if (dim(0, 0) >= 0 || dim(1, 0) >= 0) Refuse("matmul", "batched along a per-example axis");
      ++o;
    }
    out.dims[o] = dim(0, ma);
    out.dims[o + 1] = dim(1, nb);
    out.zero = (out.dims[o] < 0 || ps[0]->zero) && (out.dims[o + 1] < 0 || ps[1]->zero);
  }

  // A reduction over `axes`; true when it bound b's variable itself (a mean
  // along a padded axis: a sum divided by the lengths).
  bool Reduce(const Binding& b, const OpDef& op, const Attrs& attrs, Expr& x, const Pads& p, Pads& out) {
    const std::string& name = op.name;
    const size_t rank = p.dims.size();
    std::vector<bool> reduced(rank, attrs.GetInts("axes").empty());
    for (int64_t a : attrs.GetInts("axes")) reduced[Axis(a, rank)] = true;
    bool along = false;
    for (size_t a = 0; a < rank; ++a) along |= reduced[a] && p.dims[a] >= 0;
    const bool keep = attrs.GetBool("keepdims");
    for (size_t a = 0, o = 0; a < rank; ++a) {
      if (!reduced[a]) out.dims[o++] = p.dims[a];
      else if (keep) ++o;
    }
    if (name == "norm") {  // its derivative at zero is not finite: a barrier, along a padded axis or not
      x = Masked(x, Fill::kZero, /*barrier=*/true);
    }
    if (!along) {  // each padded position reduced on its own
      if (!p.finite) x = Masked(x, Fill::kZero);
      out.zero = name == "sum" && PadsOf(x)->zero;
      out.finite = true;
      return false;
    }
    if (name == "max" || name == "logsumexp") {
      x = Masked(x, Fill::kLowest);
    } else if (name == "min") {
      x = Masked(x, Fill::kHighest);
    } else {  // sum, mean, norm: zeros add nothing; a norm's derivative at zero is not finite
      x = Masked(x, Fill::kZero);
    }
    out.zero = name == "sum" || name == "mean" || name == "norm";
    out.finite = out.zero;
    if (name != "mean" || !Masks(p)) return false;
    // The mean of the values within the lengths: their sum over their count.
    Attrs sum_attrs = attrs;
    Expr sum = Fresh("sum", {x}, sum_attrs);
    pads_[sum.get()] = out;
    const TensorType t = TensorTypeOf(x);
    double fixed = 1;
    Expr count;
    for (size_t a = 0; a < rank; ++a) {
      if (!reduced[a]) continue;
      if (p.dims[a] < 0 || !masks_[p.dims[a]]) {
        fixed *= static_cast<double>(t.shape[a]);
        continue;
      }
      Expr length = Fresh("sum", {Fresh("cast", {masks_[p.dims[a]]}, {{"dtype", t.dtype}})});
      count = count ? Fresh("mul", {count, length}) : length;
    }
    Expr scale = MakeConstant(Tensor::ScalarOf(t.dtype, fixed));
    count = !count ? scale : fixed != 1 ? Fresh("mul", {count, scale}) : count;
    Emit(b, LookupOp("div"), {sum, count}, {}, &out);
    return true;
  }

  // A loss over rows (cross_entropy, nll: scores (rows, classes), i64
  // labels (rows,)) whose rows have the per-example length: each row's loss
  // is its own (a padded label is 0, a class), and a mean reads the rows
  // within the lengths only, their sum over their count. True when it
  // bound b's variable itself.
  bool Loss(const Binding& b, const OpDef& op, const Attrs& attrs, std::vector<Expr>& args,
            std::vector<const Pads*>& ps, Pads& out) {
    if (!ps[0] || !ps[1]) Refuse(op.name, "of scores and labels only one of which has the per-example length");
    if (ps[0]->dims[1] >= 0) Refuse(op.name, "over classes of the per-example length");
    const int row = ps[0]->dims[0];
    if (!ps[0]->finite) args[0] = Masked(args[0], Fill::kZero);
    if (!attrs.GetBool("mean")) {
      out.dims = {row};
      out.zero = false;
      out.finite = true;
      return false;
    }
    if (!masks_[row]) return false;  // every instance at the extent: the mean of its rows
    Attrs each = attrs;
    each.Set("mean", false);
    Expr losses = Fresh(op.name, {args[0], args[1]}, each);
    pads_[losses.get()] = Pads{{row}, false, true};
    Expr sum = Fresh("sum", {Masked(losses, Fill::kZero)});
    const DType dtype = TensorTypeOf(losses).dtype;
    Expr count = Fresh("sum", {Fresh("cast", {masks_[row]}, {{"dtype", dtype}})});
    Emit(b, LookupOp("div"), {sum, count}, {}, &out);
    return true;
  }

  void AlongAxis(const std::string& name, const Attrs& attrs, Expr& x, const Pads& p, Pads& out) {
    const int axis = Axis(attrs.GetInt("axis"), p.dims.size());
    const bool arg = name == "argmax" || name == "argmin";
    if (arg) {
      const bool keep = attrs.GetBool("keepdims");
      for (size_t a = 0, o = 0; a < p.dims.size(); ++a) {
        if (static_cast<int>(a) != axis) out.dims[o++] = p.dims[a];
        else if (keep) ++o;
      }
    } else {
      out.dims = p.dims;
    }
    if (p.dims[axis] < 0) {  // each padded position on its own
      if (!p.finite) x = Masked(x, Fill::kZero);
      out.zero = false;
      out.finite = true;
      return;
    }
    x = Masked(x, name == "argmin" ? Fill::kHighest : Fill::kLowest);
    // A softmax along its only padded axis is zero past the length.
    const bool only = std::count_if(p.dims.begin(), p.dims.end(), [](int d) { return d >= 0; }) == 1;
    out.zero = name == "softmax" && only;
    out.finite = out.zero || arg;
  }

  // Operations that move values: the padded axes move with them.
  void Move(const std::string& name, Attrs& attrs, std::vector<Expr>& args, std::vector<const Pads*>& ps,
            const TensorType& old, Pads& out) {
    if (name == "take") return Take(args, ps, out);
    if (name == "concat" || name == "stack") return Join(name, attrs, ps, old, out);
    if (name == "layer_norm" && (ps[1] || ps[2])) Refuse(name, "with a gamma or beta of the per-example length");
    if (!ps[0]) Refuse(name, "of a value of the per-example length");
    const Pads& p = *ps[0];
    out.zero = p.zero;
    out.finite = p.finite;
    if (name == "transpose") {
      std::vector<int64_t> perm = attrs.GetInts("perm");
      if (perm.empty()) {
        for (size_t a = p.dims.size(); a-- > 0;) perm.push_back(static_cast<int64_t>(a));
      }
      for (size_t a = 0; a < perm.size(); ++a) out.dims[a] = p.dims[Axis(perm[a], perm.size())];
    } else if (name == "reshape" || name == "squeeze" || name == "expand_dims") {
      // Only unit axes come and go: the others keep their order.
      const TensorType in = TensorTypeOf(args[0]);
      std::vector<int> in_axes, out_axes;
      for (size_t a = 0; a < p.dims.size(); ++a) {
        if (p.dims[a] >= 0 || in.shape[a] != 1) in_axes.push_back(static_cast<int>(a));
      }
      for (size_t a = 0; a < old.shape.size(); ++a) {
        if (old.shape[a] != 1) out_axes.push_back(static_cast<int>(a));
      }
      // (An instance of length 1 leaves its padded axis unit, and unfindable.)
      if (in_axes.size() != out_axes.size()) Refuse(name, "merges or splits a per-example axis");
      Shape shape = old.shape;
      for (size_t i = 0; i < in_axes.size(); ++i) {
        const int from = in_axes[i], to = out_axes[i];
        if (p.dims[from] >= 0) {
          out.dims[to] = p.dims[from];
          shape[to] = to_[p.dims[from]].extent;
        } else if (in.shape[from] != old.shape[to]) {
          Refuse(name, "merges or splits a per-example axis");
        }
      }
      if (name == "reshape") attrs.Set("shape", std::vector<int64_t>(shape.begin(), shape.end()));
    } else if (name == "slice") {
      for (int64_t a : attrs.GetInts("axes")) {
        if (p.dims[Axis(a, p.dims.size())] >= 0) Refuse(name, "along a per-example axis");
      }
      out.dims = p.dims;
    } else if (name == "one_hot") {
      for (size_t a = 0; a < p.dims.size(); ++a) out.dims[a] = p.dims[a];
      out.zero = false;
      out.finite = true;
    } else if (name == "layer_norm") {  // along the last axis
      if (p.dims.back() >= 0) Refuse(name, "along a per-example axis");
      if (!p.finite) args[0] = Masked(args[0], Fill::kZero);
      out.dims = p.dims;
      out.zero = false;
      out.finite = true;
    } else {
      Refuse(name, "of a value of the per-example length");
    }
  }

  // take(table, indices): the indices' axes, then the table's but its first.
  void Take(std::vector<Expr>& args, std::vector<const Pads*>& ps, Pads& out) {
    const Pads *table = ps[0], *indices = ps[1];
    const int index_rank = TensorTypeOf(args[1]).rank();
    if (table) {
      for (size_t a = 1; a < table->dims.size(); ++a) out.dims[index_rank + a - 1] = table->dims[a];
    }
    if (indices) {
      for (size_t a = 0; a < indices->dims.size(); ++a) out.dims[a] = indices->dims[a];
    }
    // An index past its length is 0 (padding), which reads row 0: a row of the table.
    out.zero = !indices && table->zero;
    out.finite = !table || table->finite;
  }

  void Join(const std::string& name, const Attrs& attrs, std::vector<const Pads*>& ps, const TensorType& old,
            Pads& out) {
    const Pads* first = ps[0];
    for (const Pads* p : ps) {
      if (!p || !first || p->dims != first->dims) Refuse(name, "of values padded differently");
    }
    const int axis = Axis(attrs.GetInt("axis"), name == "stack" ? old.rank() : first->dims.size());
    if (name == "concat" && first->dims[axis] >= 0) Refuse(name, "along a per-example axis");
    out.dims = first->dims;
    if (name == "stack") out.dims.insert(out.dims.begin() + axis, -1);
    out.zero = std::all_of(ps.begin(), ps.end(), [](const Pads* p) { return p->zero; });
    out.finite = std::all_of(ps.begin(), ps.end(), [](const Pads* p) { return p->finite; });
  }

  Straight s_;
  std::vector<PadTo> to_;    // per parameter
  std::vector<Var> masks_;   // per parameter: its mask, or null
  std::unordered_map<const ExprNode*, Expr> subst_;
  std::unordered_map<const ExprNode*, Pads> pads_;
  std::map<std::pair<const ExprNode*, int>, Expr> masked_cache_;
  int fresh_ = 0;
};

}  // namespace

PaddedSegment PadSegment(const Func& program, const std::vector<PadTo>& pads) {
  return Padder(program, pads).Run();
}

}  // namespace pejit::generic
