// \file A PE template: the residual code of one helper call, kept to be replayed.
//
// When partial evaluation unfolds a helper on a static skeleton of arguments
// (pe/partial_eval.cc, step 7 of its essay), the code that unfolding emitted
// is recorded as a template: a residual function of the helper's argument
// nodes. Another run reaching the same helper on the same skeleton (another
// entry, or the same entry in another mode) emits the template's code on its
// own argument atoms instead of unfolding again (pe_cache.h keeps
// templates across runs). pe_template.cc builds a template from a recording;
// the partial evaluator replays it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"
#include "ops/op.h"
#include "ops/tensor.h"

namespace pejit {

// (7) The residual code of one helper call, as a function of the helper's
// argument nodes. Immutable once made; shared by the runs that replay it.
struct PeTemplate {
  // Slots are the template's atoms, numbered: the dynamic argument nodes'
  // atoms, then materialized tensors, then the variables of `lets`. Lists of
  // indices live in the shared arrays below, as [first, first + count).
  struct Static {
    int32_t arg_node = -1;  // the tensor of this static argument node, or
    Tensor value;           // this tensor,
    bool fresh = false;     // computed by the helper: each replay gets a copy
  };
  // What bindings made by one program node have in common (few per
  // template): the bound variable's name and type, the operator call's
  // operator, attributes and location.
  struct Site {
    std::string name;
    Type type;
    const OpDef* op = nullptr;
    Attrs attrs;
    SourceLoc loc;
  };
  struct Let {
    enum class Kind : uint8_t { kOp, kProj, kExpr };
    Kind kind;
    int32_t site;
    int32_t index = 0;              // kProj: the field; kExpr: in `exprs`
    uint32_t first = 0, count = 0;  // kOp: operands (a slot, or ~k for literals[k]); kProj: the tuple's slot;
                                    // kExpr: its free variables, in `free`
  };
  // A value the helper returned or a call inside it answered.
  struct Val {
    enum class Kind : uint8_t { kArg, kDynamic, kStatic, kTuple, kAdt };
    Kind kind;
    int tag = -1;
    int32_t index = -1;             // kArg: argument node; kDynamic: slot; kStatic: statics
    uint32_t first = 0, count = 0;  // kTuple, kAdt: fields, in `fields`
    Type type;                      // kDynamic
    TypeDefPtr adt;                 // kAdt
  };
  // A call inside the helper whose memo entry the caller could still hit:
  // on values `ids[first..]`, answered by value `result`.
  struct Call {
    int32_t callee;  // in `names`
    uint32_t first, count;
    int32_t result;
  };
  // A call inside the helper on argument nodes alone (`ids[first..]` are
  // argument nodes): where the caller's memo already answers it, a fresh
  // unfolding would share that answer, so no replay.
  struct Probe {
    int32_t callee;
    uint32_t first, count;
  };

  std::string helper;
  std::vector<int32_t> param_nodes;  // per param slot: its argument node
  std::vector<int32_t> consts;       // per const slot: its statics entry
  std::vector<Static> statics;
  std::vector<Site> sites;
  std::vector<Let> lets;
  std::vector<Expr> exprs;  // kExpr bindings' values, rewritten over their free variables
  std::vector<Expr> literals;
  std::vector<Val> values;  // fields before the values holding them
  int32_t result = -1;
  std::vector<Call> calls;
  std::vector<Probe> probes;
  std::vector<std::string> names;  // the globals calls and probes call
  std::vector<int32_t> operands, fields, ids;
  std::vector<std::pair<const VarNode*, int32_t>> free;
  std::vector<uint64_t> unfold_keys;  // skeleton keys of the unfoldings inside, sorted
  std::vector<int32_t> unfolded;      // the globals unfolded inside (in `names`), distinct
  int64_t unfoldings = 0, residual_ops = 0, folded_ops = 0, shared_calls = 0;
  int64_t stack_bytes = 0;  // stack depth the unfolding took
};

}  // namespace pejit
