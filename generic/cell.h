// \file Cells: what one call of a structurally recursive function computes.
//
// A program over a minibatch's structure (a Tree-LSTM over parse trees, an
// LSTM over word lists) is a recursion whose control flow is the structure.
// The structure-generic tier serves every structure with code compiled once
// by splitting the recursion into *cells*: one cell is one function body
// evaluated for one combination of
//   - the function and its arguments' types (concrete shapes), with, for
//     each tensor argument, whether it is an entry argument passed down
//     unchanged (a parameter, shared by every call) or a per-call value;
//   - the clause each `match` took, with the types of what the pattern bound;
//   - the result type of each call it made to another cell function.
// CellBuilder finds these by abstract interpretation of the body, with
// tensors known only by type: it stops at each match and each call, asking
// the question only a concrete structure answers (the inspector's job,
// generic/program.h), and is run again with one more answer until the body
// is done. Finished, a cell is a list of steps in evaluation order:
// straight-line *segments* of tensor code over one instance (between calls)
// and *calls* to other cells, every tensor it reads named by its Source.
//
// Functions called from a cell that neither match nor reach a match (a
// Tree-LSTM's gate arithmetic) are inlined into the segments. What the tier
// does not serve is refused with a reason naming the construct and its
// location (a function value inside a structure or returned by a cell):
// such programs keep today's tiers.
//
// An `if` on a tensor value (a gate on the state's norm) is the data's
// decision, not the structure's: each of its branches becomes segments of
// their own, *guarded* by the condition (Segment::guard), and the `if`'s
// value a *select* of the two branches' values (Source::kSelect). The
// inspector places both branches; the executor runs a guarded segment's
// instances whose conditions hold, compacted into one batched call (the
// examples that took a branch run it together, and an example never runs a
// branch it did not take), and reads a select through its condition. A call
// inside a branch is guarded too: all that its callee runs is. A guarded
// call that passes no structure is a loop the data ends (adaptive
// computation time's `@ponder` calling itself until its halting sum is
// reached): the inspector unrolls it to a depth (GenericProgram's unroll
// budget), the iterations of every example at one depth run as one batched
// step, and a run that needs an iteration past the depth unrolled asks for a
// deeper unroll and runs again (generic/executor.h, InspectAndExecute). The
// deepest call unrolled is a *frontier*: its result's type, which the walk
// needs to go on, is inferred by ProbeResultKey.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "ir/expr.h"
#include "ir/module.h"
#include "generic/moves.h"
#include "ir/value.h"
#include "ops/tensor.h"
#include "support/refusal.h"

namespace pejit::generic {

// A construct the generic tier does not serve is a Refusal
// (support/refusal.h); what() says which and where.
using pejit::Refusal;

// Where a tensor a cell computes with comes from.
struct Source {
  // kRoot: an entry argument's tensor passed down unchanged (a parameter);
  // the instance key says which, so no call passes it and the inspector
  // resolves it without looking at the caller. kInput: any other tensor
  // argument, numbered among those.
  enum class Kind : uint8_t { kInput, kRoot, kStructLeaf, kSegment, kCall, kConstant, kDataOp, kSelect };
  Kind kind = Kind::kInput;
  int index = 0;   // kInput: per-call tensor input; kRoot: entry tensor leaf; kStructLeaf: tensor bound by a pattern; kSegment: segment; kCall: call site; kConstant: constant; kDataOp: data op; kSelect: select
  int output = 0;  // kSegment: output; kCall: tensor leaf of the callee's result
};

// A value passed or returned: tensors (by value id) in tuples, a structure
// (ADT) value, by its index among the instance's structures, a structure the
// cell built, or a function value. A function value is known at build time:
// a definition named as a value, or a `fn` of the program with what it
// captured (its `fields`, in FreeVars order). A cell that takes one is a cell
// of that function (its identity is part of the instance key, its captures
// are arguments), so a `@fold` over a minibatch with a closure is
// specialized for that closure, and calling it inlines its body.
//
// A structure the cell built (kBuilt: a constructor applied to `fields`) is
// known to its tags where it was built: a match there takes its clause at
// once. Passed to a call or returned, it travels with the walk (the
// inspector's, generic/program.h) as the structures the arguments hold do:
// a `@map` builds its list in cells, and the `@fold` over that list matches
// on what the walk recorded, so `@map` then a sum batches as one recursion.
struct ValueTree {
  // kBottom: only while ProbeResultKey builds a cell, the result of a call
  // not known yet (a recursion's).
  enum class Kind : uint8_t { kTensor, kTuple, kStructure, kFunction, kBuilt, kBottom };
  Kind kind = Kind::kTensor;
  int value = -1;  // kTensor: value id in the cell; kStructure: structure index
  std::vector<ValueTree> fields;  // kTuple, kBuilt: its fields; kFunction: what the `fn` captured
  const FuncNode* lambda = nullptr;  // kFunction: a `fn` of the program...
  std::string global;                // ... or a definition's name
  const TypeDef* adt = nullptr;      // kBuilt: the constructor's type...
  int tag = -1;                      // ... and its index there
  // Inside a kBuilt: this value's encoded type (EncodeValue's bytes), what
  // a pattern that binds it answers.
  std::string key;
};

struct Segment {
  Func program;               // over one instance: parameters `inputs`, result a tuple of `outputs`
  std::vector<int> inputs;    // value ids
  std::vector<bool> shared;   // per input: the same entry-argument tensor for every instance
  // Per input: data, a tensor of the arguments' structures (a token, a
  // sentence matrix) or one passed down from there, which no gradient
  // reaches (the tier serves no gradient of a structure argument): the
  // segment's backward does not differentiate for it.
  std::vector<bool> data;
  std::vector<int> share_roots;  // for those, which: the entry's tensor leaf index
  std::vector<int> row_inputs;   // the others (filled by GenericProgram): what an instance's slots hold
  std::vector<int> outputs;   // value ids
  int code = -1;              // its run id: program and shared tensors (GenericProgram's numbering)
  // Filled by GenericProgram: a program that only moves its inputs' bytes
  // or adds whole values (generic/moves.h) is not run; its outputs are
  // places made of its inputs'.
  std::optional<SegmentMoves> moves;
  int guard = -1;             // a branch's segment: it runs where Cell::guards[guard] holds
};

// A segment inside a branch of an `if` on a tensor runs where the `if`'s
// condition (a bool scalar, value `cond`) is `when`, and where the guard of
// the branch around it (`parent`, or none: -1) holds.
struct Guard {
  int cond = -1;
  bool when = true;
  int parent = -1;
};

// The value of an `if` on a tensor (one tensor of it): `then` where `cond`
// holds, else `otherwise` (value ids).
struct Select {
  int cond = -1, then = -1, otherwise = -1;
};

struct CallSite {
  std::vector<ValueTree> args;
  int guard = -1;  // a call inside a branch: Cell::guards[guard]
};

// An operator that only moves bytes (ops/op.h's MoveKind: take, slice,
// reshape, concat) applied to data alone (Segment::data): the inspector does
// it once per instance, so that no segment reads the data whole. A DAG
// encoder's leaf reads one row of its sentence matrix: its segment takes the
// row, whatever the sentence's length, and leaves of every length batch.
struct DataOp {
  const OpCallNode* call = nullptr;
  std::vector<int> args;  // value ids
  // The operands' types as the cell knows them, and the result's: where
  // they are exact and an instance's operands have them, the walk skips
  // type inference, and a view (reshape, squeeze) shares its operand's bytes.
  std::vector<TensorType> in;
  TensorType out;
};

struct Step {
  bool is_call = false;
  int index = 0;  // into segments or calls
};

struct Cell {
  std::vector<Step> steps;
  std::vector<Segment> segments;
  std::vector<CallSite> calls;
  std::vector<DataOp> data_ops;    // Source::kDataOp
  std::vector<Source> sources;     // per value id
  std::vector<Tensor> constants;   // Source::kConstant
  std::vector<Guard> guards;       // Segment::guard
  std::vector<Select> selects;     // Source::kSelect
  ValueTree result;                // tensors in tuples, structures
  Type result_type;                // concrete; null when the result holds a structure
  std::string result_key;          // its type's encoding, structures 'S': the answer to a call of this cell
  // Filled by GenericProgram: the tensor value ids each call passes (but
  // kRoot ones, which the callee knows) and the result returns, flattened.
  std::vector<std::vector<int>> call_leaves;
  std::vector<int> result_leaves;
};

// A question only the concrete structure answers.
struct Question {
  enum class Kind : uint8_t { kMatch, kCall };
  Kind kind = Kind::kMatch;
  const MatchNode* match = nullptr;  // kMatch: which clause does structure `structure` take?
  int structure = -1;
  std::string callee_key;            // kCall: the callee's instance key...
  // ... and the structures it is passed, in order: an index among the
  // instance's structures, or -1 - i for built[i], one this cell built.
  std::vector<int> structure_args;
  std::vector<ValueTree> built;
  bool guarded = false;  // kCall: inside a branch of an `if` on a tensor
};

// An answer: the clause taken and the encoded types of the values its
// pattern bound (EncodeValue), or the callee's result key (Cell::result_key).
struct Answer {
  int clause = -1;
  std::string types;
  bool bottom = false;  // ProbeResultKey's answer for a recursion: not known yet
};

// Binary encodings (compared and hashed whole) of the types keys are made of:
// 'T' dtype rank dims... share | 'U' count fields... | 'S' (a structure value) |
// 'F' then 'G' length name, or 'L' the `fn`'s address, count, captures...
// (a function value: instance keys only, never answers).
// A value of the arguments' structures: its tensors are data (kData).
void EncodeValue(const Value& value, std::string& out);
// A tensor argument of an instance key, with its share class.
void EncodeTensor(const TensorType& type, int32_t share, std::string& out);
// Share classes: an entry argument's tensor leaf index (>= 0), a value
// computed per call (-1), or data from the arguments' structures (kData).
inline constexpr int32_t kData = -2;
// An instance's key: the function, then per argument its encoded type where
// tensors are followed by their share class.
std::string InstanceKey(const std::string& function, const std::string& encoded_args);

// Which functions get cells of their own: those that match, or are
// recursive, or call one that does (transitively). The others are inlined.
std::set<std::string> CellFunctions(const ModuleSnapshot& module, const std::string& entry);

// Evaluates `key`'s function body with `answers` as far as they go: returns
// the next question, or the finished cell. Throws Refusal.
std::variant<Question, Cell> BuildCell(const ModuleSnapshot& module, const std::set<std::string>& cell_functions,
                                       const std::string& key, const std::vector<Answer>& answers);

// The result key of `key`'s cells, inferred without a structure: its calls
// answered by their own probes, a call of one being probed (a recursion)
// by "not known yet", which a branch joined with a known one leaves to the
// known one (the least fixpoint, as jit/refine_shapes.h infers a loop's
// state). Throws Refusal when the function matches on a structure or no path
// through it returns.
// `holds_structure`: the result holds a structure (the walk cannot go on
// without walking the call).
std::string ProbeResultKey(const ModuleSnapshot& module, const std::set<std::string>& cell_functions,
                           const std::string& key, bool* holds_structure);

}  // namespace pejit::generic
