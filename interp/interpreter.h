// \file Tier 0: the reference interpreter, with tape autodiff.
//
// Runs any definition of a module on runtime values and gives the answer
// every other tier is checked against. It never recurses on the native stack
// for program recursion: evaluation is a machine with an explicit stack of
// continuation frames, so a tree 100,000 deep evaluates, and a runaway
// recursion stops at `max_frames` with an error naming the limit.
//
// An Interpreter holds no state that calls share but a cache of closures'
// free variables (behind a lock): any number of threads may call it at once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/abi.h"
#include "ir/module.h"
#include "ir/value.h"
#include "support/bounded.h"

namespace pejit {

// A failure while running an entry. what() names the entry, and the source
// location or argument at fault:
//   "@loss: argument 1 (%labels): expected Tensor[(?,), i64], got Tensor[(3,), f32]"
//   "@loss: t.pj:7:12: take: index 12 is out of range for table rows of size 10"
// An error evaluating a program; what() bounded as IrError's.
class EvalError : public std::runtime_error {
 public:
  explicit EvalError(const std::string& message) : std::runtime_error(Bounded(message, 2000)) {}
};

// The checks of a call that every tier makes before running it, so that
// compiled code never serves a call tier 0 refuses, and refuses it in the
// same words.
//
// Throws EvalError unless `args` fit the parameters of `f`, definition
// @entry of `module`: their number, and each one's type (CheckValueType),
// its structures made with the module's constructors or the same ones.
void CheckArguments(const ModuleSnapshot& module, const std::string& entry, const FuncNode& f,
                    const std::vector<Value>& args);
// Why a gradient with respect to arguments `wrt` of `f` cannot be taken, or
// empty when it can: "wrt index 3 is not an argument (it takes 1)", or
// "wrt argument 1 (%k: Tensor[(), i64]) cannot hold a float tensor, so it has
// no gradient" (ModuleSnapshot::CanHoldFloat).
std::string WhyNoGradient(const ModuleSnapshot& module, const FuncNode& f, std::span<const int> wrt);

struct InterpreterOptions {
  // Continuation frames a call may stack up (each level of non-tail
  // recursion uses about three, with its activation ~500 bytes a frame);
  // past it the call fails instead of exhausting memory. The default allows
  // ~600,000 levels in ~1 GB (20,000,000 frames took 10.5 GB and 109 s to
  // fail); tail calls and loops run in constant space and never reach it.
  int64_t max_frames = 2'000'000;
};

class Interpreter {
 public:
  explicit Interpreter(InterpreterOptions options = {});
  ~Interpreter();

  // Runs definition `entry` of `module` on `args` (checked against its
  // parameter types). Throws EvalError.
  Value Call(const ModuleSnapshot& module, const std::string& entry, const std::vector<Value>& args) const;

  using ValueAndGrad = pejit::ValueAndGrad;  // ir/abi.h: every tier answers so
  // Runs `entry` recording a tape, then returns its value (a scalar f32 loss)
  // and the gradients with respect to arguments `wrt` — tensors, or tuples
  // and ADT values of tensors (a parameter tuple), returned in the same
  // structure. Non-float leaves inside such a structure get no gradient
  // (their slot holds the leaf); an argument whose type cannot hold a float
  // tensor (ModuleSnapshot::CanHoldFloat) is an error, and an index named
  // twice gets the same gradient twice.
  ValueAndGrad CallWithGrad(const ModuleSnapshot& module, const std::string& entry, const std::vector<Value>& args,
                            const std::vector<int>& wrt) const;
  // The same for a result of any type (ir/abi.h's ValueAndPullback): the
  // value, and a pullback that keeps the tape and, given a cotangent of the
  // value, replays it once (Tape::Backward seeded with the cotangent).
  ValueAndPullback CallWithPullback(const ModuleSnapshot& module, const std::string& entry,
                                    const std::vector<Value>& args, const std::vector<int>& wrt) const;

  // Applies a function (e.g. a residual program not in any module) to `args`;
  // its globals are resolved in `module`. `what` names it in errors.
  Value Apply(const ModuleSnapshot& module, const Func& f, const std::vector<Value>& args,
              const std::string& what = "function") const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pejit
