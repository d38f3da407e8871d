// \file Checkpoints of a training run: the parameters, the optimizer's state,
// the epochs done and a description of the run, in one file written
// atomically.
//
// The file is a one-line JSON header (format, version, epoch, `meta`, the
// optimizer's kind and step count, and the name and shape of every tensor),
// the tensors' f32 values in the header's order and the machine's byte order
// (little-endian on x86-64), and a last line "fnv1a64 <16 hex digits>\n": the
// checksum of every byte before it, so that a flipped bit anywhere is refused
// rather than trained on. Values are finite: a diverged run's state is
// neither written nor read.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
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
// Throws std::runtime_error naming the path, before writing anything, when a
// value is NaN or infinite or `path` is not a destination
// CheckCheckpointDestination accepts; and when writing fails (the previous
// file is then left as it was).
void SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Throws std::runtime_error naming the path when a checkpoint cannot be
// saved there: an existing path that is a symbolic link, a directory or a
// device (a rename would replace the link, not its target), one of `inputs`
// (files the run reads, such as its training data), or a directory that does
// not exist or cannot be written. For a run to call before its first epoch,
// so that a save that would fail is known before work is lost.
void CheckCheckpointDestination(const std::string& path, const std::vector<std::string>& inputs = {});

// Throws std::runtime_error naming the path and the problem: not a regular
// file, not a checkpoint, another version, truncated, trailing bytes, a
// checksum that does not match, values out of range (an epoch past 2^31 - 1,
// a NaN or infinite tensor value).
Checkpoint LoadCheckpoint(const std::string& path);
// The same for a file's bytes; `name` is what errors start with.
Checkpoint ParseCheckpoint(std::string_view bytes, const std::string& name);

// Copies saved tensors into a parameter structure's, in place. Throws
// std::invalid_argument when their number or shapes differ, before copying.
void RestoreParameters(const Value& params, const std::vector<Tensor>& saved);

}  // namespace pejit
