// \file The structure-generic tier of one entry: cells, their code, and the inspector.
//
// A GenericProgram serves calls of one entry on any structure. Inspect()
// walks a call's arguments (matching constructors, never computing a tensor)
// along the trie of cells (generic/cell.h): at each question the concrete
// structure answers, and a cell met for the first time is built then, once
// (abstract interpretation of one body, microseconds to a millisecond). The
// result is an Inspection, the structure as data:
//   - one *segment instance* per straight-line segment of every cell
//     instance;
//   - *runs*: segment instances of one segment program whose inputs earlier
//     runs computed, each run one batched call of that program over its
//     rows. Which ready instances run together is an agenda's choice
//     (AgendaRuns in program.cc): a program runs once all its instances of
//     the lowest rank left (place in the longest chain of its instances)
//     are ready, so that a Tree-LSTM's nodes of one height run together;
//   - for every input of every segment instance, the *slot* it reads: an
//     entry argument's tensor, a row of an earlier run's output, a tensor in
//     the structure (a token), a constant of the cell, or the select of two
//     slots by a condition (the value of an `if` on a tensor);
//   - for every segment instance in a branch of such an `if`, its guard:
//     the conditions under which it runs, which only the run decides.
// The code of a segment program is shared by every cell and every call that
// runs it: code is per (segment program, row bucket), never per structure,
// so its amount is bounded by the model, not by the data set.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <unordered_map>
#include <vector>

#include "generic/cell.h"
#include "generic/pad.h"
#include "ir/module.h"
#include "ir/value.h"
#include "jit/executable.h"
#include "jit/pass.h"
#include "jit/tiered.h"

namespace pejit::generic {

// Where a tensor a segment instance reads lies at run time.
struct Place {
  // kFrontier: the result of a loop's call past the depth unrolled, which
  // a run that reads it asks to unroll deeper (Deeper).
  // kMoved: bytes or a sum of other places (Inspection::moved), what a
  // segment that only moves bytes or adds made (generic/moves.h).
  enum class Kind : uint8_t { kRoot, kRow, kStruct, kConstant, kSelect, kFrontier, kMoved };
  Kind kind = Kind::kRoot;
  int32_t index = 0;               // kRoot: entry-argument tensor leaf; kRow: segment instance; kSelect: Inspection::selects; kFrontier: Inspection::frontiers; kMoved: Inspection::moved
  int32_t output = 0;              // kRow: output of that instance's segment
  const Tensor* tensor = nullptr;  // kStruct, kConstant
};

// One distinct segment program (deduplicated across cells), and its code per
// row bucket: the program vectorized over that many rows, forward and (for
// gradients) its vector-Jacobian product.
struct SegmentCode {
  // A shared input (a weight) a variant's program reads packed for the GEMM
  // micro-kernel, from a parameter appended after the others.
  struct Pack {
    int param = 0;
    bool transpose_b = false;
  };
  // A term of a shared input's gradient that the backward program returns
  // per row for the executor to sum over all runs once per call: a product
  // (two outputs P, Q; the term is the sum over runs of P^T Q) or a row sum
  // (one output G; the term is sum_to(all runs' G stacked, shape)).
  struct Factor {
    enum class Kind : uint8_t { kProduct, kRowSum };
    int param = 0;
    Kind kind = Kind::kProduct;
    Shape shape;  // kRowSum
  };
  // Where an output of a variant's backward comes from: one of the
  // program's results, or one of its inputs (a residual or an input returned
  // as it is), seen as `shape`. A program that returns no input and nothing
  // twice, reshapes included, copies nothing into its results.
  struct Output {
    bool from_input = false;
    int index = 0;
    Shape shape;
  };
  int id = -1;
  const PassInstrument* instrument = nullptr;  // the table's (set by Intern): shown the passes that make variants
  Func program;                    // over one instance
  std::vector<bool> shared;        // per input
  std::vector<bool> data;          // per input: never differentiated for (Segment::data)
  // Per input: the axes padded to the longest of a run's instances
  // (generic/pad.h; PadTo::axes, 0: none), an input whose first axis is its
  // example's length (a sentence's rows, a graph's nodes and, for data, the
  // adjacency's both axes), so that one program serves every length. Empty
  // when none is.
  std::vector<uint32_t> padded;
  // Per output, of a program that pads: the input whose length its first
  // axis has (zeros past it), or -1. Such an output is stored at its run's
  // extent, and each instance's value is its first rows.
  std::vector<int> output_length;
  // Why an input whose first axis may be its example's length (above 1) is
  // not padded, the first refusal of PadSegment: this program then serves
  // that input's one length only (whatever other inputs pad), and every
  // length the data holds makes another (the trace's generic-compile
  // events say so). Empty otherwise.
  std::string unpadded;
  // Per input, where a run finds it: a per-row input's place among an
  // instance's slots (Inspection::si_inputs), a shared input's among the run's
  // entry tensors (Run::shared_roots). Shared inputs are stored once per
  // run, not once per instance: they are a third of a Tree-LSTM's inputs.
  std::vector<int> input_slot;
  std::vector<TensorType> inputs, outputs;
  int ops = 0;
  // Per instance, roughly: multiply-adds of its products plus the elements
  // its operations write (jit/lanes.cc's measure), what a lane's share counts.
  double work = 0;

  struct Variant {
    int64_t rows = 0;
    bool grad = false;
    std::vector<PadTo> pads;  // per input, of a segment that pads some (`padded`); else empty
    // The programs below are made (vectorized, differentiated) on first
    // need, guarded by the SegmentCode's mutex: a variant can be asked for
    // (queued for a worker to make and compile) before anything runs it.
    bool made = false;
    // (inputs...) -> its results, read through `forward_outputs` as
    // (outputs stacked..., residuals...): in grad mode the forward also
    // returns what the backward reads of its intermediates.
    Func forward;
    // (inputs..., cotangents of the f32 outputs..., residuals..., packed weights...)
    //   -> its results, read through `backward_outputs` as
    //      (d/d grad_inputs..., the row factors (P, Q) of each of `factors`...)
    Func backward;
    std::vector<int> grad_inputs;    // the inputs `backward` differentiates for
    std::vector<int> grad_outputs;   // the outputs it takes cotangents of
    int residuals = 0;
    std::vector<Pack> forward_packs, backward_packs;  // in the order of the appended parameters
    std::vector<Factor> factors;  // after the gradients of grad_inputs: two outputs a product, one a row sum
    // Where the programs' logical outputs are (above) among their results and inputs.
    std::vector<Output> forward_outputs, backward_outputs;
    // The code each program runs: its baseline code, which native code
    // replaces while runs go on (jit/tiered.h, as a specialization's code
    // is). Set when the variant is made (under the SegmentCode's mutex, with
    // `made`; a run reads them after it saw `made` or `native`); null
    // before, and `backward_code` in value mode.
    std::shared_ptr<TieredExecutable> forward_code, backward_code;
    // Native code for forward and (once made) backward; both guarded by the
    // SegmentCode's mutex, `native` readable without it.
    bool forward_native = false, backward_native = false;
    // Whether the native code is the optimizing code generator's (else the
    // quick one's, which CompileVariant's kOptimized compile replaces);
    // guarded by the SegmentCode's mutex.
    bool optimized = false;
    std::atomic<bool> native{false};
    std::atomic<bool> queued{false};       // a native compile was asked for (the engine's dedup)
    std::atomic<size_t> code_bytes{0};     // of the native code
  };
  mutable std::mutex mu;
  // By PadKey(pads), then rows * 2 + grad.
  using VariantKey = std::pair<std::vector<int64_t>, int64_t>;
  std::map<VariantKey, std::unique_ptr<Variant>> variants;
};

// A padding as a key: per padded input, (its extent * 2 + masked) << 32 | its axes.
std::vector<int64_t> PadKey(const std::vector<PadTo>& pads);

// Segment programs and their code, shared by every entry of an engine: a
// segment is keyed by its exact text (operators, shapes, the bytes of its
// constants, which inputs are shared), so `infer` runs the code `loss`
// compiled for the same cells, and an edit adds only the segments it changed.
class SegmentTable {
 public:
  // `instrument` is shown the segment passes that make each variant's
  // programs (vectorize, vjp, pack-shared-weights; jit/pass.h), on the
  // thread that makes them.
  explicit SegmentTable(PassInstrument instrument = {}) : instrument_(std::move(instrument)) {}
  // The code of `program`, made on first sight. Thread-safe; the pointer
  // lives as long as the table.
  SegmentCode* Intern(const Func& program, const std::vector<bool>& shared, const std::vector<bool>& data);
  std::vector<SegmentCode*> codes() const;

 private:
  const PassInstrument instrument_;
  mutable std::mutex mu_;
  std::deque<SegmentCode> codes_;
  std::unordered_map<std::string, SegmentCode*> by_text_;
};

struct Run {
  SegmentCode* code = nullptr;
  const std::vector<int>* shared_roots = nullptr;  // per shared input, the entry tensor (Inspection::roots) it is
  std::vector<int> members;  // segment instances, one per row
  int64_t rows = 0;          // the bucket: members padded with copies of the first row
  int lane = 0;              // Inspection::lanes: its members' lane
};

// A select's slots: `then` where the bool scalar at `cond` holds, else `otherwise`.
struct SelectPlace {
  Place cond, then, otherwise;
};

// A guarded segment instance runs where the bool scalar at `cond` is `when`
// and its parent guard (an index into Inspection::guards, or -1) holds.
struct GuardPlace {
  Place cond;
  bool when = true;
  int parent = -1;
  // The row computing `cond` runs under `parent`: waiting for it waits for
  // the parent's conditions too, so a dependency stops here (a loop's d-th
  // iteration waits on one condition, not d).
  bool chained = false;
};

// Where a run's member reads a per-row input, as the walk placed it: row
// `row` of run `run`'s output `output`; run -1 where the slot is anything
// else (resolved when the run gathers it).
struct RowSource {
  int32_t run = -1, row = -1, output = -1;
};

// A moved place's value: bytes [from, from + bytes) of `source` at [to, to +
// bytes), the blocks in order of `to` covering every byte of `type`; or,
// with `sum`, the elementwise sum of those places' values (f32, each of
// `type`), added as add(sum[0], sum[1]) would.
struct MovedPlace {
  struct Block {
    Place source;
    int64_t from = 0, to = 0, bytes = 0;
  };
  std::vector<Block> blocks;
  std::vector<Place> sum;
  TensorType type;
};

// A loop's call the walk did not unroll: the callee's instance key, and how
// many iterations of it the walk had unrolled there.
struct Frontier {
  std::string key;
  int depth = 0;
};

// Thrown by Execute when a run reads a frontier's result: an example's loop
// went on past the depth unrolled. InspectAndExecute (generic/executor.h)
// has the program unroll it deeper (GenericProgram::Deepen) and runs the call
// again.
struct Deeper : std::runtime_error {
  Deeper(Frontier f) : std::runtime_error("generic: a loop ran past the iterations unrolled"), frontier(std::move(f)) {}
  Frontier frontier;
};

// A result that holds structures (an `infer` returning a List of rows, one
// per tree): its skeleton as the walk found the structures the cells built.
// Its tensors are Inspection::result's places, depth first.
struct ResultShape {
  enum class Kind : uint8_t { kTensor, kTuple, kAdt, kValue };
  Kind kind = Kind::kTensor;
  TypeDefPtr adt;  // kAdt: a constructor of this type...
  int tag = -1;    // ... this one
  std::vector<ResultShape> fields;  // kTuple, kAdt
  Value value;                      // kValue: a structure of the arguments, returned as it is
};

struct Inspection {
  std::vector<Tensor> roots;          // the entry arguments' tensors (not those in structures)
  std::vector<int> si_run, si_row;    // per segment instance
  std::vector<int> si_input_begin;    // per segment instance, into si_inputs (one past the end at the back)
  std::vector<Place> si_inputs;        // per segment instance, its per-row inputs (SegmentCode::input_slot)
  std::vector<int> si_guard;          // per segment instance, its guard (into guards) or -1; empty: none has one
  std::vector<GuardPlace> guards;
  std::vector<SelectPlace> selects;   // Place::Kind::kSelect
  std::vector<Frontier> frontiers;    // Place::Kind::kFrontier
  std::vector<MovedPlace> moved;      // Place::Kind::kMoved
  // In execution order: a run reads only earlier runs' rows. A run of
  // guarded instances runs those whose guards hold, packed into the first
  // rows (its rows then a smaller bucket), or not at all.
  std::vector<Run> runs;
  // Lanes (jit/lanes.h's idea for this tier): the segment instances cut, in
  // evaluation order, into `lanes` ranges that read little of one another
  // (between a minibatch's examples), each run's members of one lane, so
  // that threads run lanes side by side (generic/executor.h). With more than
  // one lane, per run the runs it reads rows of (ascending, each once):
  // run r's are run_preds[run_pred_begin[r] .. run_pred_begin[r + 1]).
  int lanes = 1;
  std::vector<int> run_pred_begin, run_preds;
  // When the call could be cut into lanes (GenericOptions), whether or not
  // it was: the instances' estimated work (CutIntoLanes' measure), the
  // cores' worth other processes took then (negative: not known), and, when
  // they left a core for each lane, the speed lanes were estimated to gain
  // (ScheduleRuns' cost model; lanes where above 1); else 0.
  double lane_work = 0, others_cores = 0, lanes_gain = 0;
  std::string lanes_why;  // then, why it was not cut (empty: it was)
  // Per run, per row input (SegmentCode::input_slot order), per member:
  // where it lies, for the executor to gather and to add cotangents to
  // without resolving the slots (random reads: an executor's tenth). Empty
  // when instances are guarded: their rows move as branches pack them.
  // Run r's are run_sources[run_source_begin[r] ..].
  std::vector<int> run_source_begin;
  std::vector<RowSource> run_sources;
  std::vector<Place> result;           // the entry result's tensor leaves, depth first
  // What the walk's data ops (generic/cell.h's DataOp) made, read as kStruct
  // slots: shared, so that the slots stay valid as the inspection moves.
  std::shared_ptr<std::deque<Tensor>> computed = std::make_shared<std::deque<Tensor>>();
  Type result_type;                   // null: the result holds structures (result_shape)
  std::shared_ptr<const ResultShape> result_shape;
  int64_t instances = 0;              // cell instances
  int new_cells = 0;                  // cells this call's structure built first
  int levels = 0;                     // the longest chain of segment instances, each reading the one before
  double inspect_ms = 0;              // this Inspect's time: the walk's, or taking a kept inspection
  bool kept = false;                  // walked ahead by InspectAhead, taken by the call
};

// A variant a run will run: its segment, padding and rows.
struct VariantRef {
  SegmentCode* code = nullptr;
  std::vector<PadTo> pads;
  int64_t rows = 0;
};

// What InspectAhead learned of a call to come.
struct Ahead {
  std::vector<VariantRef> variants;  // its runs will run, distinct
  int new_cells = 0;
  double inspect_ms = 0;  // the walk's
};

// Rows a run of `n` instances is padded to: n itself up to 8, then the next
// multiple of a quarter of n's octave (10, 12, 14, 16, 20, 24, ...), so that
// a segment has at most four variants per octave of row counts and padding
// wastes at most a quarter.
int64_t RowBucket(int64_t n);

// The padding a run of `members` instances of `code` takes: one extent
// for every padded input (the program is typed with them equal), exactly
// the members' length when they all agree, else PadBucket of the longest,
// each input masked where a member's length is short of it. `length(m,
// p)`: member m's length of input p. Empty when `code` pads nothing.
std::vector<PadTo> RunPadding(const SegmentCode& code, int members, const std::function<int64_t(int, int)>& length);
// A padded extent: RowBucket's, at least 2 (a unit axis would be taken for
// one a reshape may drop).
inline int64_t PadBucket(int64_t n) { return std::max<int64_t>(2, RowBucket(n)); }

// Whether a call that could be cut into lanes is: each helper needs a core,
// so lanes are taken while other processes leave at least lanes - 0.3 of
// the machine's `cores` (support/machine_load.h: a helper preempted by
// another process holds a run the caller waits for, and a call cut into
// lanes then runs slower than one that is not; bench/RESULTS.md). Where the
// load is not known (`others_cores` null, or no cores), they are taken.
// (Measured on two cores: other processes' share 0-0.14 of a core while
// idle, 0.4-0.95 with `yes` on one: it yields part of its core to ours.)
bool LanesPay(int lanes, int cores, std::optional<double> others_cores);

struct GenericOptions {
  int max_depth = 4000;  // cell instances nested deeper are refused (native stack)
  // Lanes a call's segment instances are cut into (Inspection::lanes), when
  // it has at least min_lane_instances of them, LanesPay, and the cost model
  // (ScheduleRuns in program.cc) says they gain:
  // the threads a call may have (EngineOptions::step_threads). A call's bits
  // depend on its lanes, not on the threads that run them.
  int lanes = 1;
  int min_lane_instances = 512;
  bool lanes_always = false;  // cut wherever a cut exists, whatever the load and the cost model (tests, benchmarks)
  // True while the threads lanes would run on are taken (the engine's
  // workers compiling: a call then borrows none, and its lanes run on the
  // caller alone); no lanes then. Null: never.
  std::function<bool()> helpers_busy;
};

class GenericProgram {
 public:
  // Throws Refusal when `entry` cannot be served whatever its arguments.
  // Segments go to `segments` (null: a table of its own).
  GenericProgram(Snapshot module, std::string entry, GenericOptions options = {},
                 std::shared_ptr<SegmentTable> segments = nullptr);

  // Throws Refusal naming what this call's structure needs that the tier
  // does not serve; the program is unchanged by a refused call.
  Inspection Inspect(const std::vector<Value>& args);
  // Walks the arguments of a call to come (a prefetch) and keeps the
  // inspection, so that the call's Inspect takes it instead of walking the
  // same structure again. Thread-safe: a worker may walk ahead while the
  // caller's thread runs other calls. A kept inspection is found by the identity of the
  // argument structures (values are immutable) and the types of the other
  // arguments; their tensors are the call's own. At most kMaxKept are kept,
  // the oldest dropped first. Throws Refusal as Inspect does.
  Ahead InspectAhead(const std::vector<Value>& args);
  static constexpr size_t kMaxKept = 32;

  // A loop the data ends (a call inside a branch of an `if` on a tensor
  // that passes no structure) is unrolled kFirstUnroll iterations deep at
  // first; a run past them (Deeper) doubles the depth for that loop's later
  // walks. Throws Refusal past half GenericOptions::max_depth.
  void Deepen(const Deeper& deeper);
  static constexpr int kFirstUnroll = 4;

  const std::string& entry() const { return entry_; }
  const Snapshot& module() const { return module_; }
  int cells() const;
  int segment_codes() const;  // distinct segment programs this entry's cells run
  const std::shared_ptr<SegmentTable>& segments() const { return segments_; }

 private:
  // Nodes live in a deque and point at each other: a walk follows pointers.
  struct TrieNode {
    int cell = -1;      // done: the cell
    Question question;  // else the next question
    TrieNode* callee_root = nullptr;
    std::unordered_map<std::string, TrieNode*> next;  // answer -> node
    std::string key;                                  // the instance key it starts from (root nodes)
    TrieNode* root = nullptr;                         // the root node it descends from
    std::vector<Answer> path;                         // the answers from the root to here
  };
  struct Instance;
  struct Walker;

  TrieNode* RootNode(const std::string& key);
  TrieNode* NodeFor(const std::string& key, const std::vector<Answer>& answers);
  int AddCell(Cell cell);
  int UnrollOf(const std::string& loop) const;  // under mu_
  // Walks one cell instance whose structures are Walker::structures from
  // `base`; returns its index.
  int Walk(TrieNode* root, size_t base, Walker& w, int depth);
  // Inspect's walk and placement, under mu_: the inspection but its roots.
  Inspection Walked(const std::string& encoded, std::vector<const Value*> structures);

  Snapshot module_;
  std::string entry_;
  GenericOptions options_;
  std::set<std::string> cell_functions_;

  mutable std::mutex mu_;
  std::deque<TrieNode> nodes_;
  std::unordered_map<std::string, TrieNode*> roots_;
  std::deque<Cell> cells_;
  std::shared_ptr<SegmentTable> segments_;
  std::vector<SegmentCode*> codes_;  // by the run ids the inspection groups by (Segment::code)
  std::vector<const std::vector<int>*> run_roots_;  // by run id: the shared inputs' entry tensors
  std::map<std::pair<const SegmentCode*, std::vector<int>>, int> run_id_;
  // Schedules InspectAhead walked, oldest first: the structures' identities
  // (weak: a kept inspection never keeps a minibatch alive) and the encoding.
  struct Kept {
    std::string encoded;
    std::vector<std::weak_ptr<const std::vector<Value>>> structures;
    Inspection inspection;
  };
  // Its own lock (taken after mu_ where both are): a call takes its kept
  // inspection while a worker walks another call ahead under mu_.
  mutable std::mutex kept_mu_;
  std::deque<Kept> kept_;
  // The kept inspection of these structures and encoding, or end(); drops
  // those whose structures died. Under kept_mu_.
  std::deque<Kept>::iterator FindKept(const std::string& encoded, const std::vector<const Value*>& structures);
  // That inspection, taken out of kept_ (locks kept_mu_).
  std::optional<Inspection> TakeKept(const std::string& encoded, const std::vector<const Value*>& structures);
  // Per loop (its callee's instance key): iterations unrolled, and its
  // result key (ProbeResultKey) for the frontier; under mu_.
  std::unordered_map<std::string, int> unroll_;
  std::unordered_map<std::string, std::string> probed_;
  struct Sizes {
    size_t instances = 0, leaves = 0, segment_instances = 0, results = 0, inputs = 0;
  } last_;  // of the last call's walk, to reserve the next one's arrays
};

}  // namespace pejit::generic
