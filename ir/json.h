// \file Program values as JSON (docs/language.md, "Program values as JSON").
//
//   tensor:    {"dtype": "f32", "shape": [2], "data": [1, 2]}
//   ADT value: {"ctor": "Node", "fields": [...]}
//   tuple:     [v0, v1, ...]
#pragma once

#include <nlohmann/json.hpp>

#include "ir/type.h"
#include "ir/value.h"

namespace pejit {

// Converts JSON to a value of type `type`, resolving constructors through the
// ADT types. Throws std::invalid_argument naming the path to the problem,
// e.g. "args[1].fields[0]: expected Tensor[(), i64], got dtype f32".
Value ValueFromJson(const nlohmann::json& json, const Type& type,
                    const std::function<TypeDefPtr(const std::string&)>& type_def, const std::string& path = "value");

nlohmann::json ValueToJson(const Value& value);

}  // namespace pejit
