#include "ir/program_files.h"

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "ir/json.h"
#include "support/input_file.h"

namespace pejit {

std::string ReadFile(const std::string& path) {
  std::ifstream in = OpenInputFile(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Snapshot LoadProgram(const std::string& path) {
  Module m;
  m.AddSource(ReadFile(path), path);
  return m.snapshot();
}

std::vector<int> ParseIndices(const std::string& list, const std::string& option) {
  std::vector<int> out;
  std::set<int> seen;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::runtime_error(option + ": '" + item + "' is not an argument index");
    }
    // `--wrt 1,1` would ask for one gradient twice; compiled code serves
    // distinct indices only, so the call would run interpreted without a word.
    if (!seen.insert(out.back()).second) {
      throw std::runtime_error(option + ": argument " + item + " is given twice");
    }
  }
  return out;
}

std::vector<int> FloatArguments(const ModuleSnapshot& module, const std::string& entry) {
  std::vector<int> out;
  const auto& params = module.Get(entry).func->params;
  for (size_t i = 0; i < params.size(); ++i) {
    if (module.CanHoldFloat(params[i]->annotation)) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::vector<Value> ArgumentsFromJson(const ModuleSnapshot& module, const std::string& entry,
                                     const nlohmann::json& json, const std::string& where) {
  const Definition& d = module.Get(entry);
  if (!json.is_array()) throw std::runtime_error(where + ": expected a JSON array of arguments");
  if (json.size() != d.func->params.size()) {
    throw std::runtime_error(where + ": @" + entry + " takes " + std::to_string(d.func->params.size()) +
                             " arguments, not " + std::to_string(json.size()));
  }
  std::vector<Value> args;
  auto types = [&](const std::string& n) { return module.FindType(n); };
  for (size_t i = 0; i < json.size(); ++i) {
    args.push_back(ValueFromJson(json[i], d.func->params[i]->annotation, types,
                                 where + ": args[" + std::to_string(i) + "] (%" + d.func->params[i]->name + ")"));
  }
  return args;
}

std::string ResultJson(const Value& value, const std::vector<Value>* grads, const std::vector<int>& wrt) {
  std::string out = "{\"value\":" + ValueToJsonText(value);
  if (grads) {
    out += ",\"grads\":[";
    for (size_t g = 0; g < grads->size(); ++g) out += (g ? "," : "") + ValueToJsonText((*grads)[g]);
    out += "],\"wrt\":" + nlohmann::json(wrt).dump();
  }
  return out + "}";
}

}  // namespace pejit
