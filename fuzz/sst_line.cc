// One line of an SST file through the tree parser: refused with
// std::invalid_argument naming a column on the line, or a tree within the
// bounds whose labels are classes and whose leaves have words.
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/treelstm/sst.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = pejit::fuzz::Text(data, size);
  pejit::sst::Tree tree;
  try {
    tree = pejit::sst::Parse(text);
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    if (message.rfind("column ", 0) != 0) pejit::fuzz::Finding("an error without its column: " + message);
    return 0;
  }
  int nodes = 0;
  std::vector<const pejit::sst::Tree*> stack = {&tree};
  while (!stack.empty()) {
    const pejit::sst::Tree* t = stack.back();
    stack.pop_back();
    ++nodes;
    if (t->label < 0 || t->label >= pejit::sst::kClasses) pejit::fuzz::Finding("a label outside 0-4");
    if (t->children.empty() == t->word.empty()) pejit::fuzz::Finding("a node with both a word and children, or neither");
    for (const auto& c : t->children) stack.push_back(&c);
  }
  if (nodes > pejit::treelstm::kMaxTreeNodes) pejit::fuzz::Finding("more nodes than the bound");
  return 0;
}
