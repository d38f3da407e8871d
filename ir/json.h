// \file Program values as JSON (docs/language.md, "Program values as JSON").
//
//   tensor:    {"dtype": "f32", "shape": [2], "data": [1, 2]}
//   ADT value: {"ctor": "Node", "fields": [...]}
//   tuple:     [v0, v1, ...]
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "ir/type.h"
#include "ir/value.h"

namespace pejit {

// Converts JSON to a value of type `type`, resolving constructors through the
// ADT types. Every element is taken exactly or refused: an f32 beyond f32's
// range, an integer beyond i64's. Throws std::invalid_argument naming the
// path to the problem, e.g. "args[1].fields[0]: expected Tensor[(), i64], got
// dtype f32".
Value ValueFromJson(const nlohmann::json& json, const Type& type,
                    const std::function<TypeDefPtr(const std::string&)>& type_def, const std::string& path = "value");

// Compact JSON text of a value, written without native-stack recursion (a
// 100,000-element list prints): i64 exactly, floats in the shortest digits
// that read back to the same value, NaN and infinities as the strings "nan",
// "inf" and "-inf" (which ValueFromJson reads back).
std::string ValueToJsonText(const Value& value);
// The same parsed (nlohmann's own printer recurses: print deep values with
// ValueToJsonText).
nlohmann::json ValueToJson(const Value& value);

}  // namespace pejit
