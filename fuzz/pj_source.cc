// .pj text through the parser and the checker. An input is either refused
// with an IrError (whose message names file:line:col) or accepted; what is
// accepted prints as text that is accepted again and prints the same (the
// printer and the parser agree). Anything else, a crash, a hang or another
// exception, is a finding.
#include <string>

#include "fuzz/harness.h"
#include "ir/module.h"
#include "ir/source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pejit::Module module;
  try {
    module.AddSource(pejit::fuzz::Text(data, size), "fuzz.pj");
  } catch (const pejit::IrError& e) {
    const std::string message = e.what();
    if (message.rfind("fuzz.pj:", 0) != 0) pejit::fuzz::Finding("an IrError without its location: " + message);
    return 0;
  }
  const std::string printed = module.snapshot()->Print();
  pejit::Module again;
  try {
    again.AddSource(printed, "printed.pj");
  } catch (const pejit::IrError& e) {
    pejit::fuzz::Finding(std::string("the printed module is refused: ") + e.what() + "\n" + printed);
  }
  const std::string reprinted = again.snapshot()->Print();
  if (reprinted != printed) pejit::fuzz::Finding("printing is not stable:\n" + printed + "\n---\n" + reprinted);
  return 0;
}
