// Program values as JSON against the argument types of a program (tensors of
// each dtype and of fixed and open shapes, tuples, recursive ADTs). An input
// is refused with std::invalid_argument naming the path to the problem, or
// accepted; an accepted value prints (ValueToJsonText) as JSON that reads
// back to the same text: numbers exact, NaN and infinities included.
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "fuzz/harness.h"
#include "ir/json.h"
#include "ir/module.h"

namespace {

constexpr const char* kProgram = R"(
type List[T] { Nil, Cons(T, List[T]) }
type Tree { Leaf(Tensor[(), i64]), Node(Tensor[(), i64], List[Tree]) }
def @f(%a: Tensor[(?, 2), f32], %b: (Tensor[(), i64], List[Tree]), %c: Tensor[(?,), f64],
       %d: (Tensor[(3,), i64], Tensor[(), bool])) -> Tensor[(?, 2), f32] {
  %a
}
)";

const pejit::ModuleSnapshot& Program() {
  static const pejit::Snapshot snapshot = [] {
    pejit::Module m;
    m.AddSource(kProgram, "fuzz_program.pj");
    return m.snapshot();
  }();
  return *snapshot;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const pejit::ModuleSnapshot& program = Program();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(pejit::fuzz::Text(data, size));
  } catch (const nlohmann::json::exception&) {  // not JSON, or a number past double's range
    return 0;
  }
  const auto& params = program.Get("f").func->params;
  auto types = [&](const std::string& n) { return program.FindType(n); };
  // Each parameter's type takes the whole input, and an array's elements in turn.
  for (size_t i = 0; i < params.size(); ++i) {
    const nlohmann::json* candidates[2] = {&json, json.is_array() && json.size() > i ? &json[i] : nullptr};
    for (const nlohmann::json* candidate : candidates) {
      if (!candidate) continue;
      pejit::Value value;
      try {
        value = pejit::ValueFromJson(*candidate, params[i]->annotation, types, "args[" + std::to_string(i) + "]");
      } catch (const std::invalid_argument& e) {
        if (std::string(e.what()).rfind("args[" + std::to_string(i) + "]", 0) != 0) {
          pejit::fuzz::Finding(std::string("an error without the argument's path: ") + e.what());
        }
        continue;
      }
      const std::string text = pejit::ValueToJsonText(value);
      nlohmann::json reread = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (reread.is_discarded()) pejit::fuzz::Finding("a printed value is not JSON: " + text);
      std::string again;
      try {
        again = pejit::ValueToJsonText(pejit::ValueFromJson(reread, params[i]->annotation, types, "printed"));
      } catch (const std::invalid_argument& e) {
        pejit::fuzz::Finding(std::string("a printed value is refused: ") + e.what() + "\n" + text);
      }
      if (again != text) pejit::fuzz::Finding("a value does not read back the same:\n" + text + "\n" + again);
    }
  }
  return 0;
}
