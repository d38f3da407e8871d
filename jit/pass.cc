#include "jit/pass.h"

#include "ir/printer.h"

namespace pejit {

const std::vector<PassList>& PassLists() {
  static const std::vector<PassList> lists = {
      {"residual", {"batch", "autodiff"}},
      {"control-flow", {"refine-shapes", "batch-branches"}},
      {"segment", {"vectorize", "vjp", "pack-shared-weights"}},
      {"lowering", {"fold-constants", "combine-sums", "pack-gemm", "cse", "dce"}},
  };
  return lists;
}

bool IsPassName(std::string_view name) {
  if (name == "residual") return true;
  for (const PassList& list : PassLists()) {
    for (std::string_view p : list.passes) {
      if (p == name) return true;
    }
  }
  return false;
}

std::string ProgramText(const Func& program) { return PrintFunction("main", program); }

void ShowProgram(const PassInstrument& instrument, std::string_view name, const Func& program) {
  if (!instrument.after) return;
  instrument.after(name, PassProduct{&program, [&] { return ProgramText(program); }}, 0);
}

}  // namespace pejit
