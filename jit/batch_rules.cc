#include "jit/batch_rules.h"

#include <algorithm>
#include <numeric>

#include "jit/executable.h"
#include "ops/op.h"

namespace pejit {

BatchRule BatchRuleOf(const OpCallNode& call) {
  // Rules that read the operand's shape (axes resolved against it, rows
  // counted) apply where it is known.
  if (call.op->batch == BatchRule::kShapeAttrs || call.op->batch == BatchRule::kRowLoss) {
    return TensorTypeOf(call.args[0]).IsFullyKnown() ? call.op->batch : BatchRule::kNone;
  }
  if (call.op->batch != BatchRule::kGemm) return call.op->batch;
  const AttrValue* transpose_a = call.attrs.Find("transpose_a");
  bool plain = TensorTypeOf(call.args[0]).rank() == 2 && !(transpose_a && std::get<bool>(*transpose_a));
  return plain ? BatchRule::kGemm : BatchRule::kNone;
}

bool IsHeavy(BatchRule rule) {
  return rule == BatchRule::kGemm || rule == BatchRule::kGather || rule == BatchRule::kReduce || rule == BatchRule::kLastAxis;
}

bool MustShare(BatchRule rule, size_t position) {
  switch (rule) {
    case BatchRule::kGemm: return position > 0;   // weights and bias
    case BatchRule::kGather: return position == 0;  // the table
    case BatchRule::kLastAxis: return position > 0;  // per-feature parameters
    default: return false;
  }
}

bool MustStack(BatchRule rule, size_t position) {
  switch (rule) {
    case BatchRule::kElementwise:
    case BatchRule::kShapeAttrs: return false;  // a stack's operands: any
    case BatchRule::kGather: return position == 1;
    default: return position == 0;
  }
}

Var StraightEmitter::Op(std::string_view op, std::vector<Expr> args, const Attrs& attrs, const SourceLoc& loc) {
  const OpDef& def = LookupOp(op);
  Attrs normalized = NormalizeAttrs(def, attrs);
  std::vector<TensorType> in;
  in.reserve(args.size());
  for (const Expr& a : args) in.push_back(TensorTypeOf(a));
  std::vector<TensorType> out = InferTypes(def, in, normalized);
  Type type;
  if (out.size() == 1) {
    type = TensorTy(out[0]);
  } else {
    std::vector<Type> fields;
    for (const TensorType& t : out) fields.push_back(TensorTy(t));
    type = TupleTy(std::move(fields));
  }
  Var var = Fresh(std::move(type));
  bindings_.push_back({var, std::make_shared<OpCallNode>(&def, std::move(args), std::move(normalized), loc)});
  return var;
}

Var StraightEmitter::Proj(const Expr& tuple, int index, const SourceLoc& loc) {
  const TupleTypeNode* t = AsTuple(tuple->kind == ExprKind::kVar ? static_cast<const VarNode&>(*tuple).annotation
                                                                   : tuple->checked_type);
  Var field = Fresh(t ? t->fields.at(index) : nullptr);
  bindings_.push_back({field, MakeProj(tuple, index, loc)});
  return field;
}

Shape Prepend(int64_t n, const Shape& shape) {
  Shape out{n};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

namespace {

// `k` instances of a loss over (B, C) scores and (B,) labels: one call over
// the k * B rows with a loss per row, then (unless the call kept its rows)
// each instance's mean over its own B rows.
Var EmitRowLoss(StraightEmitter& out, const OpCallNode& call, std::vector<Expr> args, const std::vector<bool>& stacked,
                int64_t k) {
  const SourceLoc& loc = call.loc;
  const Shape scores = TensorTypeOf(call.args[0]).shape;
  const int64_t rows = scores.at(0);  // known: BatchRuleOf
  for (size_t p = 0; p < args.size(); ++p) {
    const Shape member = TensorTypeOf(call.args[p]).shape;
    Expr stack = stacked[p] ? args[p] : out.Op("broadcast_to", {args[p]}, {{"shape", Prepend(k, member)}}, loc);
    Shape flat = member;
    flat[0] *= k;
    args[p] = out.Op("reshape", {stack}, {{"shape", flat}}, loc);
  }
  Attrs attrs = call.attrs;
  const bool mean = attrs.GetBool("mean");
  attrs.Set("mean", false);
  Var per_row = out.Op(call.op->name, std::move(args), attrs, loc);
  Var by_instance = out.Op("reshape", {per_row}, {{"shape", Shape{k, rows}}}, loc);
  if (!mean) return by_instance;
  if (rows == 0) {  // the kernel's mean of no rows
    return out.Op("broadcast_to", {MakeConstant(Tensor::ScalarOf(TensorTypeOf(per_row).dtype, 0.0))},
                  {{"shape", Shape{k}}}, loc);
  }
  return out.Op("mean", {by_instance}, {{"axes", std::vector<int64_t>{1}}}, loc);
}

// The attributes of a shape operator over stacked operands: each axis it
// names moves past the stack axis (negative ones resolved first, against
// the member's rank or, where the operator inserts an axis, the result's),
// and a list with an entry per axis gains one for the stack.
Attrs StackedShapeAttrs(const OpCallNode& call) {
  const std::string& op = call.op->name;
  const Shape member = TensorTypeOf(call.args[0]).shape;
  const int64_t rank = static_cast<int64_t>(member.size());
  auto moved = [&](int64_t axis, int64_t of_rank) {
    if (axis < -of_rank || axis >= of_rank) throw JitFailure("batch: " + op + " of an axis out of range");
    return (axis < 0 ? axis + of_rank : axis) + 1;
  };
  Attrs attrs = call.attrs;
  if (op == "transpose") {
    std::vector<int64_t> perm = attrs.GetInts("perm"), stacked{0};
    if (perm.empty()) {  // the axes reversed
      for (int64_t a = rank; a-- > 0;) perm.push_back(a);
    }
    for (int64_t a : perm) stacked.push_back(moved(a, rank));
    attrs.Set("perm", stacked);
  } else if (op == "squeeze") {
    std::vector<int64_t> axes = attrs.GetInts("axes"), stacked;
    if (axes.empty()) {  // every unit axis of the member, not the stack's
      for (int64_t a = 0; a < rank; ++a) {
        if (member[a] == 1) axes.push_back(a);
      }
    }
    for (int64_t a : axes) stacked.push_back(moved(a, rank));
    attrs.Set("axes", stacked);
  } else if (op == "slice") {
    std::vector<int64_t> axes;
    for (int64_t a : attrs.GetInts("axes")) axes.push_back(moved(a, rank));
    attrs.Set("axes", axes);
  } else if (op == "expand_dims" || op == "stack") {
    attrs.Set("axis", moved(attrs.GetInt("axis"), rank + 1));
  } else if (op == "pad") {
    for (const char* name : {"before", "after"}) {
      std::vector<int64_t> widths = attrs.GetInts(name);
      widths.insert(widths.begin(), 0);
      attrs.Set(name, widths);
    }
  } else {
    throw JitFailure("batch: no stacked attributes for " + op);
  }
  return attrs;
}

// broadcast_to or sum_to of stacked operands: the target shape gains the
// stack axis, and the operand's own axes are aligned to the target's (the
// operator aligns trailing axes, which would pair the stack axis with one
// of the target's) with unit axes after the stack axis.
Var EmitStackedToShape(StraightEmitter& out, const OpCallNode& call, Expr x, int64_t k) {
  const SourceLoc& loc = call.loc;
  const Shape member = TensorTypeOf(call.args[0]).shape;
  const std::vector<int64_t> target = call.attrs.GetInts("shape");
  auto aligned = [&](const Shape& shape, size_t rank) {  // unit axes first, to `rank`
    Shape s(rank - shape.size(), 1);
    s.insert(s.end(), shape.begin(), shape.end());
    return Prepend(k, s);
  };
  if (call.op->name == "broadcast_to") {
    if (member.size() < target.size()) x = out.Op("reshape", {x}, {{"shape", aligned(member, target.size())}}, loc);
    return out.Op("broadcast_to", {x}, {{"shape", Prepend(k, target)}}, loc);
  }
  // sum_to: the operand's extra leading axes are summed, not the stack's.
  Var summed = out.Op("sum_to", {x}, {{"shape", aligned(target, member.size())}}, loc);
  if (member.size() == target.size()) return summed;
  return out.Op("reshape", {summed}, {{"shape", Prepend(k, target)}}, loc);
}

}  // namespace

std::vector<Var> EmitStackedOp(StraightEmitter& out, const OpCallNode& call, BatchRule rule, std::vector<Expr> args,
                               const std::vector<bool>& stacked, int64_t k) {
  const std::string& op = call.op->name;
  const SourceLoc& loc = call.loc;
  auto member_type = [&](size_t p) { return TensorTypeOf(call.args[p]); };
  auto shifted = [&](int64_t axis, int rank) { return (axis < 0 ? axis + rank : axis) + 1; };
  Attrs attrs = call.attrs;
  switch (rule) {
    case BatchRule::kElementwise: {
      std::vector<TensorType> in;
      for (const Expr& a : call.args) in.push_back(TensorTypeOf(a));
      int rank = InferTypes(*call.op, in, call.attrs)[0].rank();
      for (size_t p = 0; p < args.size(); ++p) {
        if (!stacked[p] || member_type(p).rank() == rank) continue;
        Shape s = member_type(p).shape;  // align to the result's rank, then stack
        s.insert(s.begin(), rank - s.size(), 1);
        args[p] = out.Op("reshape", {args[p]}, {{"shape", Prepend(k, s)}}, loc);
      }
      break;
    }
    case BatchRule::kGemm: {
      Shape x = member_type(0).shape;
      args[0] = out.Op("reshape", {args[0]}, {{"shape", Shape{k * x[0], x[1]}}}, loc);
      Var flat = out.Op(op, std::move(args), attrs, loc);
      Shape y = TensorTypeOf(flat).shape;
      return {out.Op("reshape", {flat}, {{"shape", Shape{k, x[0], y[1]}}}, loc)};
    }
    case BatchRule::kGather:
    case BatchRule::kLastAxis:
    case BatchRule::kLeading: break;  // the stacked axis is not the one worked along
    case BatchRule::kRowLoss: return {EmitRowLoss(out, call, std::move(args), stacked, k)};
    case BatchRule::kShapeAttrs:
      if (op == "broadcast_to" || op == "sum_to") return {EmitStackedToShape(out, call, args[0], k)};
      for (size_t p = 0; p < args.size(); ++p) {  // a stack's shared operands take part per instance
        if (!stacked[p]) args[p] = out.Op("broadcast_to", {args[p]}, {{"shape", Prepend(k, member_type(p).shape)}}, loc);
      }
      attrs = StackedShapeAttrs(call);
      break;
    case BatchRule::kReshape: attrs.Set("shape", Prepend(k, attrs.GetInts("shape"))); break;
    case BatchRule::kAxis:
      // Every operand of a concat takes part per instance: shared ones are
      // broadcast to the instances.
      for (size_t p = 0; p < args.size(); ++p) {
        if (!stacked[p]) args[p] = out.Op("broadcast_to", {args[p]}, {{"shape", Prepend(k, member_type(p).shape)}}, loc);
      }
      attrs.Set("axis", shifted(attrs.GetInt("axis"), member_type(0).rank()));
      break;
    case BatchRule::kReduce: {
      std::vector<int64_t> axes = attrs.GetInts("axes");
      const int rank = member_type(0).rank();
      if (rank == 0) {
        // A reduction of scalars: over a unit axis of their stack (`axes`
        // empty would reduce the stack itself).
        args[0] = out.Op("reshape", {args[0]}, {{"shape", Shape{k, 1}}}, loc);
        axes = {0};
      } else if (axes.empty()) {
        axes.resize(rank);
        std::iota(axes.begin(), axes.end(), 0);
      }
      for (int64_t& a : axes) a = shifted(a, std::max(rank, 1));
      attrs.Set("axes", axes);
      break;
    }
    case BatchRule::kNone: throw JitFailure("batch: no batching rule for " + op);
  }
  Var result = out.Op(op, std::move(args), attrs, loc);
  const TupleTypeNode* tuple = AsTuple(result->annotation);
  if (!tuple) return {result};
  std::vector<Var> fields;
  for (size_t o = 0; o < tuple->fields.size(); ++o) fields.push_back(out.Proj(result, static_cast<int>(o), loc));
  return fields;
}

}  // namespace pejit
