// One line of a ListOps file (label, tab, expression) through the reader's
// checks: refused with std::invalid_argument, or an expression within the
// bounds whose printed form parses back to itself.
#include <stdexcept>
#include <string>

#include "examples/treelstm/listops.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(pejit::fuzz::Text(data, size));
  pejit::listops::Expr e;
  try {
    e = pejit::listops::Parse(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  if (pejit::treelstm::CountNodes(e) > pejit::treelstm::kMaxTreeNodes) pejit::fuzz::Finding("more nodes than the bound");
  const int value = pejit::listops::Evaluate(e);
  if (value < 0 || value >= pejit::listops::kClasses) pejit::fuzz::Finding("a value outside 0-9: " + std::to_string(value));
  const std::string printed = pejit::listops::ToString(e);
  if (pejit::listops::ToString(pejit::listops::Parse(printed)) != printed) {
    pejit::fuzz::Finding("the printed expression parses to another: " + printed);
  }
  return 0;
}
