#include "jit/image.h"

#include <cstring>

#include "jit/schedule.h"
#include "ops/op.h"

namespace pejit {
namespace {

class Writer {
 public:
  template <typename T>
  void Raw(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void U8(uint8_t v) { Raw(v); }
  void I32(int32_t v) { Raw(v); }
  void I64(int64_t v) { Raw(v); }
  void F64(double v) { Raw(v); }
  void Bytes(std::string_view s) {
    I64(static_cast<int64_t>(s.size()));
    out_.append(s);
  }
  void Ints(const std::vector<int>& v) {
    I64(static_cast<int64_t>(v.size()));
    for (int x : v) I32(x);
  }
  void Int64s(const std::vector<int64_t>& v) {
    I64(static_cast<int64_t>(v.size()));
    for (int64_t x : v) I64(x);
  }
  void Tensor_(const TensorType& t) {
    U8(static_cast<uint8_t>(t.dtype));
    Int64s(t.shape);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T Raw() {
    Need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  uint8_t U8() { return Raw<uint8_t>(); }
  int32_t I32() { return Raw<int32_t>(); }
  int64_t I64() { return Raw<int64_t>(); }
  double F64() { return Raw<double>(); }
  // A count of items of at least `item_bytes` each: never more than the bytes left allow.
  size_t Count(size_t item_bytes) {
    int64_t n = I64();
    if (n < 0 || static_cast<uint64_t>(n) > (in_.size() - at_) / std::max<size_t>(item_bytes, 1)) {
      throw ImageError("image: a count of " + std::to_string(n) + " at byte " + std::to_string(at_) +
                       " runs past its end");
    }
    return static_cast<size_t>(n);
  }
  std::string Bytes() {
    size_t n = Count(1);
    std::string s(in_.substr(at_, n));
    at_ += n;
    return s;
  }
  std::vector<int> Ints() {
    std::vector<int> v(Count(4));
    for (int& x : v) x = I32();
    return v;
  }
  std::vector<int64_t> Int64s() {
    std::vector<int64_t> v(Count(8));
    for (int64_t& x : v) x = I64();
    return v;
  }
  DType Dtype() {
    uint8_t d = U8();
    if (d > static_cast<uint8_t>(DType::kBool)) throw ImageError("image: dtype " + std::to_string(d));
    return static_cast<DType>(d);
  }
  TensorType Tensor_() {
    TensorType t;
    t.dtype = Dtype();
    t.shape = Int64s();
    for (int64_t d : t.shape) {
      if (d < 0) throw ImageError("image: a tensor of shape " + ShapeToString(t.shape));
    }
    try {
      NumBytes(t);  // a size that fits
    } catch (const std::exception& e) {
      throw ImageError(std::string("image: ") + e.what());
    }
    return t;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  void Need(size_t n) {
    if (in_.size() - at_ < n) throw ImageError("image: truncated at byte " + std::to_string(at_));
  }
  std::string_view in_;
  size_t at_ = 0;
};

// Format 2 adds the parallel schedule (stages, each step's parts): a format 1
// image's memory plan shares bytes between steps format 2 may run at once.
// Format 3 adds each step's lane (jit/lanes.h) and drops whether a stage is
// divided (steps now run as their inputs are ready). Older formats are
// refused by name: compiling again is what gives their programs lanes.
constexpr uint32_t kMagic = 0x334d4a50;    // "PJM3"
constexpr uint32_t kMagicV2 = 0x324d4a50;  // "PJM2"
constexpr uint32_t kMagicV1 = 0x4d494a50;  // "PJIM"
// Lanes a step may name: far more than any plan cuts (jit/lanes.h).
constexpr int kMaxLanes = 1024;

void WriteType(Writer& w, const Type& t) {
  if (const TensorTypeNode* tensor = AsTensor(t)) {
    w.U8(0);
    w.Tensor_(tensor->type);
    return;
  }
  const TupleTypeNode* tuple = AsTuple(t);
  if (!tuple) throw ImageError("image: a result that is not tensors in tuples");
  w.U8(1);
  w.I64(static_cast<int64_t>(tuple->fields.size()));
  for (const Type& f : tuple->fields) WriteType(w, f);
}

Type ReadType(Reader& r, int depth) {
  if (depth > 64) throw ImageError("image: a result type nested deeper than 64");
  if (r.U8() == 0) return TensorTy(r.Tensor_());
  std::vector<Type> fields(r.Count(1));
  for (Type& f : fields) f = ReadType(r, depth + 1);
  return TupleTy(std::move(fields));
}

void WriteAttrs(Writer& w, const Attrs& attrs) {
  const Attrs::Items& items = attrs.empty() ? Attrs::Items{} : attrs.items();
  w.I64(static_cast<int64_t>(items.size()));
  for (const auto& [name, value] : items) {
    w.Bytes(name);
    w.U8(static_cast<uint8_t>(value.index()));
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, bool>) w.U8(v);
          else if constexpr (std::is_same_v<V, int64_t>) w.I64(v);
          else if constexpr (std::is_same_v<V, double>) w.F64(v);
          else if constexpr (std::is_same_v<V, DType>) w.U8(static_cast<uint8_t>(v));
          else w.Int64s(v);
        },
        value);
  }
}

Attrs ReadAttrs(Reader& r) {
  Attrs attrs;
  size_t n = r.Count(9);
  for (size_t i = 0; i < n; ++i) {
    std::string name = r.Bytes();
    switch (r.U8()) {
      case 0: attrs.Set(std::move(name), r.U8() != 0); break;
      case 1: attrs.Set(std::move(name), r.I64()); break;
      case 2: attrs.Set(std::move(name), r.F64()); break;
      case 3: attrs.Set(std::move(name), r.Int64s()); break;
      case 4: attrs.Set(std::move(name), r.Dtype()); break;
      default: throw ImageError("image: an attribute of unknown kind");
    }
  }
  return attrs;
}

void WritePlan(Writer& w, const Plan& plan) {
  w.I64(static_cast<int64_t>(plan.buffers.size()));
  for (const PlanBuffer& b : plan.buffers) {
    w.U8(static_cast<uint8_t>(b.kind));
    w.Tensor_(b.type);
    w.I32(b.param);
    w.I64(b.offset);
    w.I32(b.result);
    w.I32(b.alias_of);
    w.I32(b.first_step);
    w.I32(b.last_step);
    w.Bytes(b.name);
    if (b.kind == PlanBuffer::Kind::kConstant) {
      w.Bytes(std::string_view(static_cast<const char*>(b.constant.raw_data()), b.constant.nbytes()));
    }
  }
  w.I64(static_cast<int64_t>(plan.steps.size()));
  for (const PlanStep& s : plan.steps) {
    w.U8(static_cast<uint8_t>(s.kind));
    w.Bytes(s.op ? s.op->name : "");
    WriteAttrs(w, s.attrs);
    w.Ints(s.inputs);
    w.Ints(s.outputs);
    w.I64(static_cast<int64_t>(s.nodes.size()));
    for (const FusedNode& n : s.nodes) {
      w.U8(static_cast<uint8_t>(n.kind));
      w.I32(n.buffer);
      w.F64(n.immediate);
      w.U8(static_cast<uint8_t>(n.op));
      w.F64(n.param);
      w.F64(n.param2);
      w.Ints(n.args);
      w.U8(static_cast<uint8_t>(n.dtype));
    }
    w.I64(static_cast<int64_t>(s.fused_ops.size()));
    for (const std::string& op : s.fused_ops) w.Bytes(op);
    w.I64(static_cast<int64_t>(s.blocks.size()));
    for (const CopyBlock& b : s.blocks) {
      w.I32(b.input);
      w.I64(b.from);
      w.I64(b.to);
      w.I64(b.bytes);
    }
    w.I64(s.parts);
    w.I32(s.lane);
  }
  w.I64(static_cast<int64_t>(plan.stages.size()));
  for (const PlanStage& st : plan.stages) {
    w.I32(st.begin);
    w.I32(st.end);
  }
  w.Ints(plan.params);
  w.Ints(plan.results);
  WriteType(w, plan.result_type);
  w.I64(plan.arena_bytes);
  w.I64(plan.buffer_bytes);
}

void Require(bool ok, const std::string& what) {
  if (!ok) throw ImageError("image: " + what);
}

// [offset, offset + bytes) lies in [0, limit), without overflowing.
bool Within(int64_t offset, int64_t bytes, int64_t limit) {
  return offset >= 0 && bytes >= 0 && offset <= limit && bytes <= limit - offset;
}

Plan ReadPlan(Reader& r) {
  Plan plan;
  plan.buffers.resize(r.Count(30));
  const int nbuffers = static_cast<int>(plan.buffers.size());
  auto buffer_index = [&](int b) { return b >= 0 && b < nbuffers; };
  for (PlanBuffer& b : plan.buffers) {
    uint8_t kind = r.U8();
    Require(kind <= static_cast<uint8_t>(PlanBuffer::Kind::kAlias), "a buffer of unknown kind");
    b.kind = static_cast<PlanBuffer::Kind>(kind);
    b.type = r.Tensor_();
    b.param = r.I32();
    b.offset = r.I64();
    b.result = r.I32();
    b.alias_of = r.I32();
    b.first_step = r.I32();
    b.last_step = r.I32();
    b.name = r.Bytes();
    if (b.kind == PlanBuffer::Kind::kConstant) {
      std::string data = r.Bytes();
      Require(static_cast<int64_t>(data.size()) == NumBytes(b.type), "constant " + b.name + " of the wrong size");
      b.constant = Tensor::Empty(b.type.dtype, b.type.shape);
      if (!data.empty()) std::memcpy(b.constant.raw_data(), data.data(), data.size());
    }
  }
  plan.steps.resize(r.Count(20));
  for (PlanStep& s : plan.steps) {
    uint8_t kind = r.U8();
    Require(kind <= static_cast<uint8_t>(PlanStep::Kind::kCopy), "a step of unknown kind");
    s.kind = static_cast<PlanStep::Kind>(kind);
    std::string op = r.Bytes();
    try {
      if (!op.empty()) s.op = &LookupOp(op);
    } catch (const std::exception&) {
      throw ImageError("image: an operator this build does not have: " + op);
    }
    Require(s.kind == PlanStep::Kind::kFused || s.op, "a kernel step without an operator");
    s.attrs = ReadAttrs(r);
    s.inputs = r.Ints();
    s.outputs = r.Ints();
    for (int b : s.inputs) Require(buffer_index(b), "a step reading buffer " + std::to_string(b));
    for (int b : s.outputs) Require(buffer_index(b), "a step writing buffer " + std::to_string(b));
    Require(!s.outputs.empty() || s.kind == PlanStep::Kind::kKernel, "a step without an output");
    s.nodes.resize(r.Count(30));
    for (size_t i = 0; i < s.nodes.size(); ++i) {
      FusedNode& n = s.nodes[i];
      uint8_t nk = r.U8();
      Require(nk <= static_cast<uint8_t>(FusedNode::Kind::kOp), "a fused node of unknown kind");
      n.kind = static_cast<FusedNode::Kind>(nk);
      n.buffer = r.I32();
      n.immediate = r.F64();
      n.op = static_cast<ScalarOp>(r.U8());
      n.param = r.F64();
      n.param2 = r.F64();
      n.args = r.Ints();
      n.dtype = r.Dtype();
      if (n.kind == FusedNode::Kind::kLoad) Require(buffer_index(n.buffer), "a load of buffer " + std::to_string(n.buffer));
      for (int a : n.args) Require(a >= 0 && static_cast<size_t>(a) < i, "a fused node reading a later one");
    }
    Require(s.kind != PlanStep::Kind::kFused || !s.nodes.empty(), "a fused step without nodes");
    s.fused_ops.resize(r.Count(8));
    for (std::string& op : s.fused_ops) op = r.Bytes();
    s.blocks.resize(r.Count(28));
    Require(s.blocks.empty() || (s.kind == PlanStep::Kind::kCopy && !s.outputs.empty()), "copy blocks in a step that copies nothing");
    for (CopyBlock& b : s.blocks) {
      b.input = r.I32();
      b.from = r.I64();
      b.to = r.I64();
      b.bytes = r.I64();
      Require(b.input >= 0 && static_cast<size_t>(b.input) < s.inputs.size() &&
                  Within(b.from, b.bytes, plan.buffers[s.inputs[b.input]].bytes()) &&
                  Within(b.to, b.bytes, plan.buffers[s.outputs.at(0)].bytes()),
              "a copy block outside its buffers");
    }
    s.parts = r.I64();
    s.lane = r.I32();
    Require(s.lane >= -1 && s.lane < kMaxLanes, "a step of lane " + std::to_string(s.lane));
  }
  plan.stages.resize(r.Count(8));
  for (PlanStage& st : plan.stages) {
    st.begin = r.I32();
    st.end = r.I32();
  }
  plan.params = r.Ints();
  plan.results = r.Ints();
  for (int b : plan.params) Require(buffer_index(b), "a parameter buffer " + std::to_string(b));
  for (int b : plan.results) Require(buffer_index(b), "a result buffer " + std::to_string(b));
  plan.result_type = ReadType(r, 0);
  plan.arena_bytes = r.I64();
  plan.buffer_bytes = r.I64();
  Require(plan.arena_bytes >= 0, "a negative arena");
  // Every buffer inside the memory it lives in: the arena, or the bytes it views.
  for (int i = 0; i < nbuffers; ++i) {
    const PlanBuffer& b = plan.buffers[i];
    switch (b.kind) {
      case PlanBuffer::Kind::kArena:
        Require(Within(b.offset, b.bytes(), plan.arena_bytes), "buffer " + b.name + " outside the arena");
        break;
      case PlanBuffer::Kind::kParam:
        Require(b.param >= 0 && static_cast<size_t>(b.param) < plan.params.size(), "a parameter out of range");
        break;
      case PlanBuffer::Kind::kAlias: {
        Require(buffer_index(b.alias_of) && b.alias_of != i, "a view of buffer " + std::to_string(b.alias_of));
        // Each view inside the one it views: a chain's offsets then add up
        // inside its root, without overflowing.
        Require(Within(b.offset, b.bytes(), plan.buffers[b.alias_of].bytes()), "view " + b.name + " outside its buffer");
        int depth = 0;
        for (int at = b.alias_of; plan.buffers[at].kind == PlanBuffer::Kind::kAlias; at = plan.buffers[at].alias_of) {
          Require(++depth < nbuffers && buffer_index(plan.buffers[at].alias_of), "views in a cycle");
        }
        break;
      }
      default: break;
    }
  }
  // Steps run side by side only where they touch disjoint bytes.
  try {
    CheckStages(plan);
  } catch (const JitFailure& e) {
    throw ImageError(std::string("image: ") + e.what());
  }
  return plan;
}

// What the decoder's index checks cannot see: that each step's code,
// given its buffers, stays inside them. As a WebAssembly validator or the
// eBPF verifier checks a program before it runs, every step is checked
// against the buffers it reads and writes:
//   - an operator's kernel gets inputs of the types it accepts, and outputs
//     of exactly the types it infers for them (its kernel trusts both);
//   - a fused kernel is the one compiled for this step (its key names the
//     output's inner extents, every load's strides and dtype, its nodes),
//     every load broadcasts to the output, and the rows it is run for are
//     the output's outermost extent;
//   - parts and the results' and parameters' buffers are what the plan says.
// A plan that passes cannot make a kernel read or write outside its buffers
// (the kernels and compiled code themselves are trusted: what the
// container's MAC or the artifact's owner vouches for).
void VerifySteps(const Image& image) {
  const Plan& plan = image.plan;
  auto type_of = [&](int b) { return plan.buffers[b].type; };
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const PlanStep& step = plan.steps[s];
    const std::string at = "step " + std::to_string(s);
    Require(step.parts >= 1 && step.parts <= (int64_t{1} << 20), at + " in " + std::to_string(step.parts) + " parts");
    switch (step.kind) {
      case PlanStep::Kind::kKernel: {
        std::vector<TensorType> in, out;
        for (int b : step.inputs) in.push_back(type_of(b));
        try {
          out = InferTypes(*step.op, in, step.attrs);
        } catch (const std::exception& e) {
          throw ImageError("image: " + at + " (" + step.op->name + ") on its buffers: " + e.what());
        }
        Require(out.size() == step.outputs.size(), at + " (" + step.op->name + ") writes " +
                                                       std::to_string(step.outputs.size()) + " buffers, not " +
                                                       std::to_string(out.size()));
        for (size_t o = 0; o < out.size(); ++o) {
          Require(out[o] == type_of(step.outputs[o]), at + " (" + step.op->name + ") writes " +
                                                          type_of(step.outputs[o]).ToString() + " where it computes " +
                                                          out[o].ToString());
        }
        Require(step.parts == 1 || (step.op->split.kernel && step.op->split.max_parts &&
                                    step.parts <= step.op->split.max_parts(in, out, step.attrs)),
                at + " (" + step.op->name + ") split in more parts than its kernel divides into");
        break;
      }
      case PlanStep::Kind::kFused: {
        Require(step.outputs.size() == 1, at + ": a fused step writes one buffer");
        const TensorType& out = type_of(step.outputs[0]);
        for (const FusedNode& n : step.nodes) {
          if (n.kind == FusedNode::Kind::kLoad) {
            Require(type_of(n.buffer).dtype == n.dtype, at + " loads " + type_of(n.buffer).ToString() + " as " + std::string(DTypeName(n.dtype)));
          }
        }
        Require(step.nodes.back().dtype == out.dtype, at + " computes " + std::string(DTypeName(step.nodes.back().dtype)) +
                                                          " into " + out.ToString());
        LoopNest nest;
        try {
          nest = NestOf(plan, step);
        } catch (const JitFailure& e) {
          throw ImageError("image: " + at + ": " + e.what());
        }
        Require(image.outer[s] == nest.dims[0], at + "'s kernel runs " + std::to_string(image.outer[s]) +
                                                    " rows of an output of " + std::to_string(nest.dims[0]));
        const std::string key = FusedKernelKey(plan, step, nest);
        const std::string& claimed = image.kernels[image.step_kernel[s]].key;
        Require(claimed == key || claimed == key + "O2", at + " calls a kernel compiled for another computation");
        break;
      }
      case PlanStep::Kind::kCopy:
        Require(step.outputs.size() == 1, at + ": a copy writes one buffer");
        break;
    }
  }
  // Every buffer has memory when the plan runs: a parameter's and a
  // result's are given by the call (NativeExecutable::Run), by their lists.
  for (size_t p = 0; p < plan.params.size(); ++p) {
    const PlanBuffer& b = plan.buffers[plan.params[p]];
    Require(b.kind == PlanBuffer::Kind::kParam && b.param == static_cast<int>(p), "parameter " + std::to_string(p) + "'s buffer");
  }
  for (size_t i = 0; i < plan.buffers.size(); ++i) {
    const PlanBuffer& b = plan.buffers[i];
    if (b.kind == PlanBuffer::Kind::kParam) Require(plan.params[b.param] == static_cast<int>(i), "buffer " + b.name + ", a parameter not in the list");
    if (b.kind == PlanBuffer::Kind::kResult) {
      Require(b.result >= 0 && static_cast<size_t>(b.result) < plan.results.size() &&
                  plan.results[b.result] == static_cast<int>(i),
              "buffer " + b.name + ", a result not in the list");
    }
  }
  Require(IsTensorTree(plan.result_type) && CountTensorLeaves(plan.result_type) == plan.results.size(),
          "results that are not its result type's");
}

}  // namespace

std::string EncodeImage(const NativeExecutable& exe, bool objects) {
  Writer w;
  w.Raw(kMagic);
  WritePlan(w, exe.plan());
  w.Ints(exe.step_kernel());
  w.Int64s(exe.outer());
  w.I64(static_cast<int64_t>(exe.kernels().size()));
  for (const KernelRef& k : exe.kernels()) {
    w.Bytes(k.symbol);
    w.Bytes(k.key);
    w.I32(k.object);
  }
  w.I64(static_cast<int64_t>(exe.objects().size()));
  for (const auto& o : exe.objects()) {
    w.Bytes(o->name);
    w.Bytes(objects && o->object ? std::string_view(*o->object) : std::string_view());
  }
  return w.Take();
}

Image DecodeImage(std::string_view bytes) {
  Reader r(bytes);
  const uint32_t magic = r.Raw<uint32_t>();
  if (magic == kMagicV1) throw ImageError("image: written by an older pejit (format 1, without a parallel schedule)");
  if (magic == kMagicV2) throw ImageError("image: written by an older pejit (format 2, without lanes)");
  if (magic != kMagic) throw ImageError("image: not a pejit executable image");
  Image image;
  image.plan = ReadPlan(r);
  image.step_kernel = r.Ints();
  image.outer = r.Int64s();
  image.kernels.resize(r.Count(20));
  for (Image::Kernel& k : image.kernels) {
    k.symbol = r.Bytes();
    k.key = r.Bytes();
    k.object = r.I32();
  }
  image.objects.resize(r.Count(16));
  for (Image::Object& o : image.objects) {
    o.name = r.Bytes();
    o.bytes = std::make_shared<const std::string>(r.Bytes());
  }
  Require(r.done(), "bytes after its end");
  const size_t steps = image.plan.steps.size();
  Require(image.step_kernel.size() == steps && image.outer.size() == steps, "kernel slots for another plan");
  for (size_t s = 0; s < steps; ++s) {
    int k = image.step_kernel[s];
    Require((k >= 0) == (image.plan.steps[s].kind == PlanStep::Kind::kFused) &&
                k < static_cast<int>(image.kernels.size()) && image.outer[s] >= 0,
            "step " + std::to_string(s) + " calls kernel " + std::to_string(k));
  }
  for (const Image::Kernel& k : image.kernels) {
    Require(k.object >= 0 && static_cast<size_t>(k.object) < image.objects.size() && !k.symbol.empty(),
            "kernel " + k.symbol + " in object " + std::to_string(k.object));
  }
  VerifySteps(image);
  return image;
}

}  // namespace pejit
