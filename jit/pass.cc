#include "jit/pass.h"

#include <memory>
#include <mutex>
#include <set>

#include "ir/printer.h"

namespace pejit {

const std::vector<PassList>& PassLists() {
  static const std::vector<PassList> lists = {
      {"residual", {"batch", "autodiff"}},
      {"control-flow", {"refine-shapes", "batch-branches"}},
      {"segment", {"pad", "vectorize", "vjp", "pack-shared-weights"}},
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

PassInstrument PrintAfter(const std::vector<std::string>& passes, std::FILE* out) {
  PassInstrument instrument;
  if (passes.empty()) return instrument;
  auto wanted = std::make_shared<const std::set<std::string, std::less<>>>(passes.begin(), passes.end());
  auto mu = std::make_shared<std::mutex>();
  instrument.after = [wanted, mu, out](std::string_view pass, const PassProduct& product, double ms) {
    if (!wanted->count("all") && !wanted->count(pass)) return;
    char head[96];
    std::snprintf(head, sizeof head, "# after %.*s (%.3f ms)\n", static_cast<int>(pass.size()), pass.data(), ms);
    std::string text = head + product.text() + "\n";
    std::lock_guard lock(*mu);
    std::fputs(text.c_str(), out);
  };
  return instrument;
}

}  // namespace pejit
