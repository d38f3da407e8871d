// A trace file's lines through the reader: refused with std::runtime_error
// naming file:line, or events that print as JSON lines which read back to
// the same lines.
#include <sstream>
#include <stdexcept>
#include <string>

#include "fuzz/harness.h"
#include "scheduler/trace_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string(pejit::fuzz::Text(data, size))};
  std::vector<pejit::Event> events;
  try {
    events = pejit::ReadTrace(in, "fuzz.jsonl");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("fuzz.jsonl:", 0) != 0) pejit::fuzz::Finding(std::string("an error without file:line: ") + e.what());
    return 0;
  }
  for (const pejit::Event& event : events) {
    const std::string line = pejit::EventToJson(event);
    std::string again;
    try {
      again = pejit::EventToJson(pejit::EventFromJson(line));
    } catch (const std::invalid_argument& e) {
      pejit::fuzz::Finding(std::string("a printed event is refused: ") + e.what() + "\n" + line);
    }
    if (again != line) pejit::fuzz::Finding("an event does not read back the same:\n" + line + "\n" + again);
  }
  pejit::ChromeTrace(events);
  return 0;
}
