// \file Checkpoints of a training run: the parameters, the optimizer's state,
// the epochs done and a description of the run, in one file written
// atomically.
//
// The file is a one-line JSON header (format, version, epoch, `meta`, the
// optimizer's kind and step count, and the name and shape of every tensor)
// followed by the tensors' f32 values, in the header's order, in the
// machine's byte order (little-endian on x86-64).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "ir/value.h"
#include "train/optimizer.h"

namespace pejit {

struct Checkpoint {
  int64_t epoch = 0;                            // epochs completed
  nlohmann::json meta = nlohmann::json::object();  // what the run was, for the caller to check on resume
  std::vector<Tensor> params;                   // ParameterLeaves of the parameters
  OptimizerState optimizer;
};

// Writes `path` + ".tmp", flushes it to disk and renames it onto `path`, so
// that an interrupted save leaves the previous checkpoint, never a torn one.
// Throws std::runtime_error naming the path.
void SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Throws std::runtime_error naming the path and the problem: not a
// checkpoint, another version, truncated, trailing bytes.
Checkpoint LoadCheckpoint(const std::string& path);

// Copies saved tensors into a parameter structure's, in place. Throws
// std::invalid_argument when their number or shapes differ, before copying.
void RestoreParameters(const Value& params, const std::vector<Tensor>& saved);

}  // namespace pejit
