// \file Random well-typed programs and their arguments, for differential tests.
//
// GenerateRandomProgram(seed) writes a .pj module, the same text for the same
// seed on every platform, with two entries of the same parameters:
//   @main  returns f32 tensors in a tuple (what value-mode tiers compute);
//   @loss  reduces @main's results to a Tensor[(), f32] (what grad mode differentiates).
// The parameters are trees and lists of recursive ADTs (tensor leaves, some
// holding i64 word ids into an embedding table), weight tensors, optional i64
// indices and an optional static i64 argument.
//
// Programs are well typed by construction: the generator tracks the type of
// every expression it writes, annotates every `let` and every function result
// with it, and Load() has the module's type checker confirm it. They are
// numerically tame: inputs lie in [-1, 1]; recursive results go through tanh
// or sigmoid; exp sees tanh, log and sqrt and div see arguments bounded away
// from 0, pow sees tanh or sigmoid. What they contain, each at random:
//   - elementwise and broadcasting operators, matmul/dense, reductions,
//     softmax, reshape, transpose, concat, stack, slice, chunk, split, pad,
//     take/scatter_add, gather along any axis, one_hot, cross_entropy/nll,
//     argmax, layer_norm, dropout (a constant key), floor_div and mod on
//     integers, zeros/ones, f64 casts;
//   - let sharing (a value used at least twice), tuples and projections;
//   - `if` on static conditions (constants, depth counters, the static
//     argument) and, in a fraction of programs, on dynamic data (also
//     returning pairs, taken apart by tuple patterns), and loops the data
//     ends (residual functions, some not tail-recursive);
//   - `match` on the ADT arguments (nested patterns, wildcards), on local
//     Maybe values and tuples;
//   - structural recursion over the ADT arguments: folds (mutually recursive
//     for rose trees, accumulating scans for lists) and maps that rebuild a
//     tree the folds then consume;
//   - calls to helpers, helpers passed as values, closures, and closures
//     passed to higher-order functions;
//   - results that are other results, views of them, arguments or constants.
// `features` counts them per program.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/module.h"
#include "ir/value.h"

namespace pejit {

struct RandomProgramOptions {
  int max_helpers = 3;          // non-recursive helper functions
  int max_adts = 2;             // families of recursive types (each one argument)
  int body_budget = 6;          // operators and constructs per function body, roughly
  int max_depth = 4;            // expression nesting
  int max_dim = 5;              // largest dimension of most tensors
  double dynamic_if = 0.2;      // share of programs that may branch on dynamic data
};

// A type the generator makes values of.
struct RandomType {
  enum class Kind : uint8_t {
    kF32,        // Tensor[shape, f32], values in [-1, 1]
    kIndex,      // Tensor[shape, i64], values in [0, bound): rows of a table
    kStaticInt,  // Tensor[(), i64] in [0, bound), known at specialization time
    kTuple,
    kAdt,
  };
  Kind kind = Kind::kF32;
  Shape shape;
  int64_t bound = 0;
  bool rows_unknown = false;        // kF32 declared with `?` rows (an embedding table)
  std::vector<RandomType> fields;   // kTuple
  int adt = -1;                     // kAdt: index into RandomProgram::adts
};

struct RandomCtor {
  std::string name;
  std::vector<RandomType> fields;
};

struct RandomAdt {
  std::string type_def;   // the TypeDef's name: "Tree0", "Seq"
  std::string type_text;  // the type as written: "Tree0", "Seq[Tensor[(3,), f32]]"
  std::vector<RandomCtor> ctors;
};

struct RandomProgram {
  uint64_t seed = 0;
  std::string text;
  std::string entry = "main";
  std::string loss = "loss";
  std::vector<RandomType> params;   // of both entries
  std::vector<RandomAdt> adts;
  std::vector<bool> static_args;    // for PartialEvaluate, ComputeSignature, Flatten
  std::vector<int> wrt;             // dynamic parameters holding f32 tensors
  // What the text contains, counted by construct ("dynamic_if", "match",
  // "recursion", "op:matmul", ...): for coverage checks and reports.
  std::map<std::string, int> features;

  // The module, parsed and type-checked. Throws std::runtime_error with the
  // seed, the checker's message and the text when it does not check.
  Snapshot Load() const;
  // Random arguments, deterministic in (seed, input): trees of 1 to
  // `max_nodes` constructors, tensors in [-1, 1]; an f32 argument is
  // sometimes the very tensor of an earlier one of the same type. Inputs with
  // different numbers usually have different skeletons.
  std::vector<Value> Arguments(const ModuleSnapshot& module, uint64_t input, int max_nodes = 7) const;
  // Arguments with the skeleton (and static arguments) of `like` and new
  // random tensors: what the next minibatch of the same shapes looks like.
  std::vector<Value> Refill(const std::vector<Value>& like, uint64_t input) const;
};

RandomProgram GenerateRandomProgram(uint64_t seed, const RandomProgramOptions& options = {});

}  // namespace pejit
