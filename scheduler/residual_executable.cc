#include "scheduler/residual_executable.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

#include "ir/visitor.h"
#include "jit/straight.h"

namespace pejit {
namespace {

// About what the IR takes in memory: a node ~64 bytes, an operator call's
// argument a shared pointer, constants their data (once per buffer). Walks
// let-chains with a loop (residuals are long chains), the rest with
// PostOrderVisit.
size_t EstimateBytes(const Residual& r) {
  size_t bytes = 0;
  std::unordered_set<const void*> buffers;
  auto count = [&](const Expr& e) {
    bytes += 64;
    if (e->kind != ExprKind::kConstant) return;
    const Tensor& t = static_cast<const ConstantNode&>(*e).value;
    if (buffers.insert(t.raw_data()).second) bytes += t.nbytes();
  };
  auto visit = [&](const Expr& e) {
    if (e->kind == ExprKind::kVar) return;  // a reference to a node counted where it is bound
    if (e->kind != ExprKind::kOpCall) return PostOrderVisit(e, count);
    bytes += 96;
    for (const Expr& a : static_cast<const OpCallNode&>(*e).args) {
      bytes += 16;
      if (a->kind == ExprKind::kConstant) {
        count(a);
      } else if (a->kind != ExprKind::kVar) {
        PostOrderVisit(a, count);
      }
    }
  };
  auto walk = [&](const Func& f) {
    bytes += 64 * (1 + f->params.size());
    Expr e = f->body;
    while (e->kind == ExprKind::kLet) {
      const auto& let = static_cast<const LetNode&>(*e);
      bytes += 128;  // the let and its variable
      visit(let.value);
      e = let.body;
    }
    visit(e);
  };
  walk(r.main);
  for (const auto& [_, f] : r.functions) walk(f);
  return bytes;
}

}  // namespace

std::shared_ptr<const ResidualExecutable> ResidualExecutable::Create(const Residual& residual,
                                                                     InterpreterOptions options) {
  if (!residual.functions.empty()) {
    throw JitFailure("the residual calls " + std::to_string(residual.functions.size()) +
                     " residual function(s) (a loop on dynamic data, or PE fuel ran out)");
  }
  // Straight-line code calls no globals: it runs on an empty module, and its
  // result type comes from its annotation or its tail. Type-checking the
  // whole residual (ToModule) would cost more than partial evaluation.
  Type ret = residual.main->ret_type;
  if (!ret) {
    Expr tail = residual.main->body;
    while (tail->kind == ExprKind::kLet) tail = static_cast<const LetNode&>(*tail).body;
    ret = AtomType(tail);
  }
  Snapshot globals = std::make_shared<const ModuleSnapshot>();
  if (!ret) {
    globals = residual.ToModule();
    ret = AsFunc(globals->Get("main").type)->ret;
  }
  if (!IsTensorTree(ret)) {
    throw JitFailure("the residual returns " + TypeToString(ret) + ", not tensors nested in tuples");
  }
  return std::shared_ptr<const ResidualExecutable>(
      new ResidualExecutable(residual.main, std::move(globals), ret, EstimateBytes(residual), options));
}

std::vector<Tensor> ResidualExecutable::Run(std::span<const Tensor> inputs) const {
  std::vector<Value> args(inputs.begin(), inputs.end());
  Value result;
  try {
    result = interpreter_.Apply(*globals_, main_, args, "residual");
  } catch (const EvalError& e) {
    // The interpreter checks the parameters first: a mismatch is the caller's error.
    if (args.size() != main_->params.size()) throw std::invalid_argument(e.what());
    for (size_t i = 0; i < args.size(); ++i) {
      try {
        CheckValueType(args[i], main_->params[i]->annotation);
      } catch (const std::invalid_argument&) {
        throw std::invalid_argument(e.what());
      }
    }
    throw;
  }
  return Flatten({result});
}

ExecutablePtr CompileWithResidualInterpreter(const Residual& residual) {
  return ResidualExecutable::Create(residual);
}

}  // namespace pejit
