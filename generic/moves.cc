#include "generic/moves.h"

#include <unordered_map>

#include "jit/moves.h"
#include "jit/straight.h"

namespace pejit::generic {

std::optional<SegmentMoves> MovesOf(const Func& program) {
  Straight s;
  try {
    s = Decompose(program);
  } catch (const JitFailure&) {
    return std::nullopt;
  }
  auto* result = As<TupleNode>(s.result);
  if (!result || s.bindings.empty()) return std::nullopt;
  SegmentMoves moves;
  std::unordered_map<const ExprNode*, int> node_of;  // variable -> node
  for (size_t i = 0; i < s.params.size(); ++i) {
    node_of[s.params[i].get()] = static_cast<int>(i);
    moves.nodes.push_back({static_cast<int>(i), {}, {}, AsTensor(s.params[i]->annotation)->type});
  }
  auto operand = [&](const Expr& e) -> int {
    auto it = node_of.find(e.get());
    return it == node_of.end() ? -1 : it->second;
  };
  for (const Binding& b : s.bindings) {
    if (b.value->kind == ExprKind::kVar) {  // an alias
      const int n = operand(b.value);
      if (n < 0) return std::nullopt;
      node_of[b.var.get()] = n;
      continue;
    }
    auto* call = As<OpCallNode>(b.value);
    const TensorTypeNode* t = AsTensor(b.var->annotation);
    if (!call || !t || !t->type.IsFullyKnown()) return std::nullopt;
    const TensorType type = t->type;
    if (call->op->name == "add" && type.dtype == DType::kF32 && call->args.size() == 2) {
      const int x = operand(call->args[0]), y = operand(call->args[1]);
      if (x < 0 || y < 0 || moves.nodes[x].type != type || moves.nodes[y].type != type) return std::nullopt;
      node_of[b.var.get()] = static_cast<int>(moves.nodes.size());
      moves.nodes.push_back({-1, {}, {x, y}, type});
      continue;
    }
    if (call->op->moves == MoveKind::kNone) return std::nullopt;
    const int64_t bytes = NumBytes(type);
    const int first = operand(call->args[0]);
    if (first < 0) return std::nullopt;
    const std::optional<int64_t> view = ViewOffset(*call, type);
    if (view && *view == 0 && NumBytes(moves.nodes[first].type) == bytes) {
      node_of[b.var.get()] = first;  // the same bytes, seen in another shape
      continue;
    }
    MoveNode node;
    node.type = type;
    if (view) {
      node.blocks.push_back({first, *view, 0, bytes});
    } else {
      std::optional<std::vector<CopyBlock>> blocks = CopyBlocks(*call, type);
      if (!blocks) return std::nullopt;
      for (const CopyBlock& c : *blocks) {
        const int source = operand(call->args[static_cast<size_t>(c.input)]);
        if (source < 0) return std::nullopt;  // a constant: the segment computes with it
        node.blocks.push_back({source, c.from, c.to, c.bytes});
      }
    }
    node_of[b.var.get()] = static_cast<int>(moves.nodes.size());
    moves.nodes.push_back(std::move(node));
  }
  for (const Expr& f : result->fields) {
    const int n = operand(f);
    if (n < 0) return std::nullopt;
    moves.outputs.push_back(n);
  }
  return moves;
}

}  // namespace pejit::generic
