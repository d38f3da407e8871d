#include "jit/tiered.h"

#include <stdexcept>

#include "jit/native_executable.h"

namespace pejit {

TieredExecutable::TieredExecutable(ExecutablePtr baseline)
    : result_type_(baseline ? baseline->result_type() : Type()), code_(std::move(baseline)) {
  if (!code_) throw std::invalid_argument("a tiered executable needs baseline code");
}

ExecutablePtr TieredExecutable::current() const {
  std::lock_guard lock(mu_);
  return code_;
}

void TieredExecutable::Replace(ExecutablePtr native) {
  if (!native) throw std::invalid_argument("no code to replace the baseline code with");
  std::lock_guard lock(mu_);
  code_.swap(native);
}

ExecutablePtr BaselineFirst(const Func& program, std::function<ExecutablePtr()> native, std::vector<TierUp>& tier_ups) {
  auto exec = std::make_shared<TieredExecutable>(LowerToKernelPlan(program));
  tier_ups.push_back({exec, std::move(native)});
  return exec;
}

}  // namespace pejit
