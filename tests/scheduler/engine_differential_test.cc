// The engine gives the interpreter's answers on random programs
// (tests/support/random_program.h): with policy sync, Entry::call and
// Entry::value_and_grad run compiled code for every program and input, and
// map its flat results back — values into @main's result tuple, gradients
// into the structure of each argument (trees with f32 leaves included),
// static arguments left out, one tensor passed as two arguments. The tiers
// themselves are checked by tests/jit:differential_test; this is the glue
// around them.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "interp/interpreter.h"
#include "pe/signature.h"
#include "scheduler/engine.h"
#include "scheduler/native_compile.h"
#include "tests/support/random_program.h"

namespace pejit {
namespace {

constexpr int kPrograms = 40;

// Why `got` is not `want` (same structure, tensors to f32 relative 1e-4
// with an absolute floor of 1e-5 of each tensor's scale); empty when it is.
std::string Mismatch(const Value& got, const Value& want) {
  if (got.kind() != want.kind()) return "got " + got.Describe() + ", want " + want.Describe();
  if (!want.is_tensor()) {
    if (got.fields().size() != want.fields().size() || (want.kind() == Value::Kind::kAdt && got.tag() != want.tag())) {
      return "got " + got.Describe() + ", want " + want.Describe();
    }
    for (size_t i = 0; i < want.fields().size(); ++i) {
      std::string why = Mismatch(got.fields()[i], want.fields()[i]);
      if (!why.empty()) return "field " + std::to_string(i) + ": " + why;
    }
    return "";
  }
  const Tensor &g = got.tensor(), &w = want.tensor();
  if (g.type() != w.type()) return "got " + g.type().ToString() + ", want " + w.type().ToString();
  double scale = 1;
  for (int64_t i = 0; i < w.numel(); ++i) scale = std::max(scale, std::abs(w.ElementAsDouble(i)));
  for (int64_t i = 0; i < w.numel(); ++i) {
    double a = g.ElementAsDouble(i), b = w.ElementAsDouble(i);
    if (!(std::abs(a - b) <= 1e-4 * std::abs(b) + 1e-5 * scale)) {
      std::ostringstream out;
      out << "element " << i << ": " << a << " vs " << b;
      return out.str();
    }
  }
  return "";
}

void ExpectTheInterpretersGradients(const ValueAndGrad& got, const ValueAndGrad& want, const std::vector<int>& wrt) {
  EXPECT_EQ(Mismatch(got.value, want.value), "");
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t k = 0; k < want.grads.size(); ++k) {
    EXPECT_EQ(Mismatch(got.grads[k], want.grads[k]), "") << "gradient of argument " << wrt[k];
  }
}

TEST(EngineDifferentialTest, CompiledCallsAndGradientsMatchTheInterpreterInEveryArgumentsStructure) {
  int native_calls = 0, native_grads = 0;
  // One LLVM session for all engines, and the engines kept until the end, so
  // that later programs reuse the fused kernels of earlier ones.
  std::shared_ptr<JitSession> session = JitSession::Create();
  std::vector<std::unique_ptr<Engine>> engines;
  for (uint64_t seed = 0; seed < kPrograms; ++seed) {
    RandomProgram p = GenerateRandomProgram(seed);
    SCOPED_TRACE("random program " + std::to_string(seed) + "\n" + p.text);
    EngineOptions options;
    options.policy = Policy::Sync();
    options.workers = 1;
    options.compile = CompileNative(session);
    options.generic = false;  // the per-minibatch tier's glue; the generic tier's is below
    engines.push_back(std::make_unique<Engine>(std::move(options)));
    Engine& engine = *engines.back();
    engine.module().AddSource(p.text, "random.pj");
    EntryOptions entry_options;
    for (size_t i = 0; i < p.static_args.size(); ++i) {
      if (p.static_args[i]) entry_options.static_argnums.push_back(static_cast<int>(i));
    }
    Entry main = engine.entry(p.entry, entry_options), loss = engine.entry(p.loss, entry_options);
    Snapshot s = engine.module().snapshot();
    Interpreter interp;
    for (uint64_t input = 0; input < 2; ++input) {
      SCOPED_TRACE("input " + std::to_string(input));
      std::vector<Value> args = p.Arguments(*s, input);
      EXPECT_EQ(Mismatch(main.call(args), interp.Call(*s, p.entry, args)), "");
      CodeStatus value_code = main.status(args);
      EXPECT_TRUE(value_code.ready()) << CodeStateName(value_code.state) << ": " << value_code.reason;
      native_calls += value_code.tier == "native";

      ExpectTheInterpretersGradients(loss.with_grad(p.wrt).value_and_grad(args),
                                     interp.CallWithGrad(*s, p.loss, args, p.wrt), p.wrt);
      // Grad mode too: a dynamic if as native regions with their VJPs.
      CodeStatus grad_code = loss.with_grad(p.wrt).status(args);
      EXPECT_EQ(grad_code.tier, "native") << CodeStateName(grad_code.state) << ": " << grad_code.reason;
      native_grads += grad_code.tier == "native";
    }
  }
  std::printf("%d programs, 2 inputs each: %d value calls and %d gradients served by native code\n", kPrograms,
              native_calls, native_grads);
  EXPECT_GE(native_calls, kPrograms * 2 * 3 / 4);
  EXPECT_GE(native_grads, kPrograms * 2 * 3 / 4);
}

// The structure-generic tier in the engine on the same random programs: what
// it serves (values and gradients) is the interpreter's answer; what it
// declines (an `if` on a tensor, a gradient for a tree argument) goes to the
// other tiers, which answer as above.
TEST(EngineDifferentialTest, TheGenericTierGivesTheInterpretersAnswersOnRandomPrograms) {
  int64_t generic_calls = 0, calls = 0;
  for (uint64_t seed = 0; seed < kPrograms; ++seed) {
    RandomProgram p = GenerateRandomProgram(seed);
    SCOPED_TRACE("random program " + std::to_string(seed) + "\n" + p.text);
    EngineOptions options;
    options.policy = Policy::Sync();
    options.workers = 1;
    options.specialize_after_calls = 0;
    Engine engine(std::move(options));
    engine.module().AddSource(p.text, "random.pj");
    Entry main = engine.entry(p.entry), loss = engine.entry(p.loss);
    Snapshot s = engine.module().snapshot();
    Interpreter interp;
    for (uint64_t input = 0; input < 3; ++input) {
      SCOPED_TRACE("input " + std::to_string(input));
      std::vector<Value> args = p.Arguments(*s, input);
      EXPECT_EQ(Mismatch(main.call(args), interp.Call(*s, p.entry, args)), "");
      ExpectTheInterpretersGradients(loss.with_grad(p.wrt).value_and_grad(args),
                                     interp.CallWithGrad(*s, p.loss, args, p.wrt), p.wrt);
    }
    generic_calls += main.stats().calls_generic + loss.stats().calls_generic;
    calls += main.stats().calls() + loss.stats().calls();
  }
  std::printf("%d programs: %lld of %lld calls served by the generic tier\n", kPrograms,
              static_cast<long long>(generic_calls), static_cast<long long>(calls));
  EXPECT_GT(generic_calls, 0);
}

}  // namespace
}  // namespace pejit
