// \file What the `pejit` subcommands read: .pj programs, JSON arguments and
// lists of argument indices, with errors that name the file (and line).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "ir/module.h"
#include "ir/value.h"

namespace pejit {

// The whole file; throws std::runtime_error when it cannot be read.
std::string ReadFile(const std::string& path);

// A module holding `path`'s definitions (throws IrError with file:line:col).
Snapshot LoadProgram(const std::string& path);

// "0,2" -> {0, 2}; throws std::runtime_error naming `option` and the item
// for an item that is not a number or is given twice.
std::vector<int> ParseIndices(const std::string& list, const std::string& option);

// The default of --wrt: the arguments of `entry` whose types can hold a
// float tensor (a structure of integer tokens has no gradient to take).
std::vector<int> FloatArguments(const ModuleSnapshot& module, const std::string& entry);

// The arguments of `entry` from `json`, an array of them; `where` names the
// source in errors ("calls.jsonl:3"), each argument as where: args[i] (%name).
std::vector<Value> ArgumentsFromJson(const ModuleSnapshot& module, const std::string& entry,
                                     const nlohmann::json& json, const std::string& where);

// What `pejit run` prints for a result, one line of JSON: {"value": ...}
// and, with `grads`, "grads" and "wrt" (the argument indices).
std::string ResultJson(const Value& value, const std::vector<Value>* grads = nullptr, const std::vector<int>& wrt = {});

}  // namespace pejit
