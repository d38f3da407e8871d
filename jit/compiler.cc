// Codegen and the ORC session.
//
// The generated module for a plan has
//   void main(ptr ctx, ptr params, ptr results, ptr arena)
// where params/results are arrays of tensor data pointers and arena is the
// call's own scratch memory (so concurrent calls share nothing mutable):
//   (1) each distinct fused kernel (same expression, shapes and strides)
//       becomes one function, a loop nest over the output's shape (adjacent
//       dimensions merged where every operand allows it) that LLVM optimizes
//       and vectorizes; every step using it calls it with its buffers;
//   (2) any other step calls pejit_rt_kernel(ctx, step, ptrs), which runs the
//       operator's registered kernel (OpenBLAS for GEMMs) on views of the
//       buffers; a kernel that throws records the error in ctx, later kernel
//       calls do nothing, and Run reports it;
//   (3) with poisoning on, buffers past their last use are overwritten.
// main is one straight-line block of calls and is not optimized (optnone):
// residual programs have tens of thousands of steps, and optimizing one huge
// function is what makes compile times explode; the kernels it calls are
// few, small and deduplicated, and get the full -O3 pipeline.
// Elementwise math calls the same libm functions as the reference kernels,
// without fast-math, so compiled and interpreted values agree exactly.
#include "jit/compiler.h"

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectTransformLayer.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

namespace pejit {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point since) { return std::chrono::duration<double, std::milli>(Clock::now() - since).count(); }

template <typename T>
T Unwrap(llvm::Expected<T> value, const std::string& what) {
  if (!value) throw JitFailure(what + ": " + llvm::toString(value.takeError()));
  return std::move(*value);
}

void Check(llvm::Error err, const std::string& what) {
  if (err) throw JitFailure(what + ": " + llvm::toString(std::move(err)));
}

class NativeExecutable;

// What one call of a compiled function shares with the runtime.
struct CallContext {
  const NativeExecutable* exe;
  std::string error;
};

// Object code bytes of the module being materialized on this thread.
thread_local size_t g_object_bytes = 0;

}  // namespace

struct JitSession::State {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::string cpu;
  std::atomic<uint64_t> next_module{0};
  std::atomic<int> live_modules{0};
};

namespace {

class NativeExecutable final : public Executable {
 public:
  using MainFn = void (*)(CallContext*, void* const*, void* const*, char*);

  NativeExecutable(Plan plan, std::shared_ptr<JitSession::State> state, llvm::orc::ResourceTrackerSP tracker,
                   MainFn fn, size_t code_bytes)
      : plan_(std::move(plan)), state_(std::move(state)), tracker_(std::move(tracker)), fn_(fn), code_bytes_(code_bytes) {
    state_->live_modules.fetch_add(1);
  }

  // The last holder is gone, so no call can be running this code: free it.
  ~NativeExecutable() override {
    if (llvm::Error err = tracker_->remove()) llvm::consumeError(std::move(err));
    state_->live_modules.fetch_sub(1);
  }

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override {
    if (inputs.size() != plan_.params.size()) {
      throw std::invalid_argument("compiled function takes " + std::to_string(plan_.params.size()) + " inputs, got " +
                                  std::to_string(inputs.size()));
    }
    std::vector<void*> params(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const TensorType& want = plan_.buffers[plan_.params[i]].type;
      if (!inputs[i].defined() || inputs[i].type() != want) {
        throw std::invalid_argument("input " + std::to_string(i) + " of the compiled function must be " +
                                    want.ToString() + ", got " +
                                    (inputs[i].defined() ? inputs[i].type().ToString() : "nothing"));
      }
      params[i] = const_cast<void*>(inputs[i].raw_data());
    }
    std::vector<Tensor> results;
    std::vector<void*> result_ptrs;
    for (int b : plan_.results) {
      const TensorType& t = plan_.buffers[b].type;
      results.push_back(Tensor::Empty(t.dtype, t.shape));
      result_ptrs.push_back(results.back().raw_data());
    }
    std::unique_ptr<char, decltype(&std::free)> arena(
        static_cast<char*>(std::aligned_alloc(64, std::max<int64_t>(64, plan_.arena_bytes))), &std::free);
    CallContext ctx{this, {}};
    fn_(&ctx, params.data(), result_ptrs.data(), arena.get());
    if (!ctx.error.empty()) throw std::runtime_error(ctx.error);
    return results;
  }

  const Type& result_type() const override { return plan_.result_type; }
  size_t code_bytes() const override { return code_bytes_; }
  const char* tier() const override { return "native"; }

  // Runs step `index`'s operator kernel on the buffers at `ptrs` (inputs, then outputs).
  void RunKernel(int64_t index, void* const* ptrs) const {
    const PlanStep& step = plan_.steps[index];
    std::vector<Tensor> ins, outs;
    size_t k = 0;
    for (int b : step.inputs) {
      const TensorType& t = plan_.buffers[b].type;
      ins.push_back(Tensor::Wrap(ptrs[k++], t.dtype, t.shape, nullptr));
    }
    for (int b : step.outputs) {
      const TensorType& t = plan_.buffers[b].type;
      outs.push_back(Tensor::Wrap(ptrs[k++], t.dtype, t.shape, nullptr));
    }
    step.op->kernel(ins, outs, step.attrs);
  }

 private:
  Plan plan_;
  std::shared_ptr<JitSession::State> state_;  // keeps the LLJIT alive as long as this code
  llvm::orc::ResourceTrackerSP tracker_;
  MainFn fn_;
  size_t code_bytes_;
};

}  // namespace
}  // namespace pejit

// ---- The runtime ABI called by generated code ---------------------------------------

extern "C" void pejit_rt_kernel(void* ctx, int64_t step, void* const* ptrs) {
  auto* call = static_cast<pejit::CallContext*>(ctx);
  if (!call->error.empty()) return;  // an earlier kernel failed: the call's results are void
  try {
    call->exe->RunKernel(step, ptrs);
  } catch (const std::exception& e) {
    call->error = e.what();
  }
}

extern "C" void pejit_rt_poison(void* ptr, int64_t bytes) {
  std::memset(ptr, 0xff, static_cast<size_t>(bytes));  // NaN in every float, -1 in every integer
}

namespace pejit {
namespace {

// ---- Codegen --------------------------------------------------------------------------

class Codegen {
 public:
  Codegen(const Plan& plan, llvm::Module& module, const std::string& name, bool poison)
      : plan_(plan), m_(module), ctx_(module.getContext()), b_(ctx_), poison_(poison) {
    ptr_ = b_.getPtrTy();
    i64_ = b_.getInt64Ty();
    i32_ = b_.getInt32Ty();
    fn_ = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_, ptr_, ptr_, ptr_}, false),
                                 llvm::Function::ExternalLinkage, name, m_);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    fn_->addFnAttr(llvm::Attribute::OptimizeNone);
    fn_->addFnAttr(llvm::Attribute::NoInline);
    rt_kernel_ = m_.getOrInsertFunction("pejit_rt_kernel",
                                        llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_, ptr_}, false));
    rt_poison_ = m_.getOrInsertFunction("pejit_rt_poison", llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_}, false));
  }

  int distinct_kernels() const { return static_cast<int>(kernels_.size()); }

  void Emit() {
    auto args = fn_->arg_begin();
    llvm::Value* ctx = args++;
    llvm::Value* params = args++;
    llvm::Value* results = args++;
    llvm::Value* arena = args++;
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));

    // Buffer addresses are computed where each step uses them, not once at
    // the top: tens of thousands of values live across the whole function
    // would make register allocation the slowest part of compiling.
    size_t max_ptrs = 1;
    for (const PlanStep& s : plan_.steps) max_ptrs = std::max(max_ptrs, s.inputs.size() + s.outputs.size());

    // The steps go into functions of kStepsPerPart steps each, which main
    // calls in order: register allocation is quadratic in the calls one
    // function makes, so one function of 20,000 calls takes minutes to compile.
    constexpr size_t kStepsPerPart = 256;
    llvm::BasicBlock* main_block = b_.GetInsertBlock();
    for (size_t start = 0; start < plan_.steps.size(); start += kStepsPerPart) {
      llvm::Function* part = llvm::Function::Create(fn_->getFunctionType(), llvm::Function::InternalLinkage,
                                                    fn_->getName() + "_part_" + std::to_string(start / kStepsPerPart), m_);
      part->addFnAttr(llvm::Attribute::NoUnwind);
      part->addFnAttr(llvm::Attribute::OptimizeNone);
      part->addFnAttr(llvm::Attribute::NoInline);
      b_.SetInsertPoint(main_block);
      b_.CreateCall(part, {ctx, params, results, arena});
      auto part_args = part->arg_begin();
      ctx_arg_ = part_args++;
      params_arg_ = part_args++;
      results_arg_ = part_args++;
      arena_arg_ = part_args++;
      b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", part));
      ptr_array_ = b_.CreateAlloca(ptr_, b_.getInt64(max_ptrs), "ptrs");
      for (size_t s = start; s < std::min(plan_.steps.size(), start + kStepsPerPart); ++s) {
        const PlanStep& step = plan_.steps[s];
        if (step.kind == PlanStep::Kind::kFused) {
          CallFused(step);
        } else {
          EmitKernelCall(ctx_arg_, static_cast<int64_t>(s), step);
        }
        if (poison_) EmitPoison(static_cast<int>(s));
      }
      b_.CreateRetVoid();
    }
    b_.SetInsertPoint(main_block);
    b_.CreateRetVoid();
  }

 private:
  const Plan& plan_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  bool poison_;
  llvm::Type *ptr_, *i64_, *i32_;
  llvm::Function* fn_;          // main
  llvm::Function* kernel_fn_ = nullptr;  // the fused kernel being emitted
  llvm::FunctionCallee rt_kernel_, rt_poison_;
  llvm::Value* ptr_array_ = nullptr;
  llvm::Value *ctx_arg_ = nullptr, *params_arg_ = nullptr, *results_arg_ = nullptr, *arena_arg_ = nullptr;

  // The address of buffer `i`'s data, computed at the insertion point.
  llvm::Value* Address(int i) {
    while (plan_.buffers[i].kind == PlanBuffer::Kind::kAlias) i = plan_.buffers[i].alias_of;
    const PlanBuffer& buf = plan_.buffers[i];
    switch (buf.kind) {
      case PlanBuffer::Kind::kParam: return b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, params_arg_, buf.param));
      case PlanBuffer::Kind::kResult: return b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, results_arg_, buf.result));
      case PlanBuffer::Kind::kArena: return b_.CreateConstGEP1_64(b_.getInt8Ty(), arena_arg_, buf.offset);
      case PlanBuffer::Kind::kConstant:
        return b_.CreateIntToPtr(b_.getInt64(reinterpret_cast<uint64_t>(buf.constant.raw_data())), ptr_);
      case PlanBuffer::Kind::kAlias: break;
    }
    return nullptr;
  }
  std::map<std::string, llvm::Function*> kernels_;  // fused kernels by signature

  void EmitKernelCall(llvm::Value* ctx, int64_t index, const PlanStep& step) {
    int k = 0;
    for (int buf : step.inputs) b_.CreateStore(Address(buf), b_.CreateConstGEP1_64(ptr_, ptr_array_, k++));
    for (int buf : step.outputs) b_.CreateStore(Address(buf), b_.CreateConstGEP1_64(ptr_, ptr_array_, k++));
    b_.CreateCall(rt_kernel_, {ctx, b_.getInt64(index), ptr_array_});
  }

  void EmitPoison(int step) {
    for (size_t i = 0; i < plan_.buffers.size(); ++i) {
      const PlanBuffer& buf = plan_.buffers[i];
      if (buf.kind == PlanBuffer::Kind::kArena && buf.last_step == step && buf.bytes() > 0) {
        b_.CreateCall(rt_poison_, {Address(static_cast<int>(i)), b_.getInt64(buf.bytes())});
      }
    }
  }

  llvm::Type* ElementType(DType d) {
    switch (d) {
      case DType::kF32: return b_.getFloatTy();
      case DType::kF64: return b_.getDoubleTy();
      case DType::kI64: return b_.getInt64Ty();
      case DType::kBool: return b_.getInt8Ty();
    }
    return nullptr;
  }

  // Register type of a value: bools are i1 in registers, i8 in memory.
  llvm::Type* RegisterType(DType d) { return d == DType::kBool ? b_.getInt1Ty() : ElementType(d); }

  llvm::Value* Immediate(double v, DType d) {
    switch (d) {
      case DType::kF32: return llvm::ConstantFP::get(b_.getFloatTy(), static_cast<float>(v));
      case DType::kF64: return llvm::ConstantFP::get(b_.getDoubleTy(), v);
      case DType::kI64: return b_.getInt64(static_cast<int64_t>(v));
      case DType::kBool: return b_.getInt1(v != 0);
    }
    return nullptr;
  }

  llvm::Value* Unary(llvm::Intrinsic::ID id, llvm::Value* x) {
    return b_.CreateUnaryIntrinsic(id, x);
  }

  llvm::Value* CallLibm(const char* f32_name, const char* f64_name, llvm::Value* x) {
    bool f32 = x->getType()->isFloatTy();
    llvm::FunctionCallee f = m_.getOrInsertFunction(f32 ? f32_name : f64_name,
                                                    llvm::FunctionType::get(x->getType(), {x->getType()}, false));
    llvm::cast<llvm::Function>(f.getCallee())->setDoesNotThrow();
    llvm::cast<llvm::Function>(f.getCallee())->setDoesNotAccessMemory();
    return b_.CreateCall(f, {x});
  }

  llvm::Value* Cast(llvm::Value* x, DType from, DType to) {
    if (from == to) return x;
    llvm::Type* t = RegisterType(to);
    bool ff = IsFloat(from), tf = IsFloat(to);
    if (to == DType::kBool) return ff ? b_.CreateFCmpUNE(x, llvm::ConstantFP::get(x->getType(), 0))
                                      : b_.CreateICmpNE(x, llvm::ConstantInt::get(x->getType(), 0));
    if (from == DType::kBool) return tf ? b_.CreateUIToFP(x, t) : b_.CreateZExt(x, t);
    if (ff && tf) return b_.CreateFPCast(x, t);
    if (ff) return b_.CreateFPToSI(x, t);
    if (tf) return b_.CreateSIToFP(x, t);
    return x;  // i64 to i64
  }

  llvm::Value* Compute(const FusedNode& n, const std::vector<llvm::Value*>& v, const std::vector<FusedNode>& nodes) {
    auto arg = [&](int i) { return v[n.args[i]]; };
    DType in = n.args.empty() ? n.dtype : nodes[n.args[0]].dtype;
    bool fp = IsFloat(in);
    switch (n.op) {
      case ScalarOp::kNeg: return fp ? b_.CreateFNeg(arg(0)) : b_.CreateNeg(arg(0));
      case ScalarOp::kExp: return Unary(llvm::Intrinsic::exp, arg(0));
      case ScalarOp::kLog: return Unary(llvm::Intrinsic::log, arg(0));
      case ScalarOp::kSqrt: return Unary(llvm::Intrinsic::sqrt, arg(0));
      case ScalarOp::kTanh: return CallLibm("tanhf", "tanh", arg(0));
      case ScalarOp::kSigmoid: {
        llvm::Value* one = llvm::ConstantFP::get(arg(0)->getType(), 1.0);
        return b_.CreateFDiv(one, b_.CreateFAdd(one, Unary(llvm::Intrinsic::exp, b_.CreateFNeg(arg(0)))));
      }
      case ScalarOp::kRelu: {
        llvm::Value* zero = llvm::ConstantFP::get(arg(0)->getType(), 0.0);
        return b_.CreateSelect(b_.CreateFCmpOGT(arg(0), zero), arg(0), zero);
      }
      case ScalarOp::kPow:
        if (n.param == 2.0) return b_.CreateFMul(arg(0), arg(0));
        return b_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, arg(0), llvm::ConstantFP::get(arg(0)->getType(), n.param));
      case ScalarOp::kAdd: return fp ? b_.CreateFAdd(arg(0), arg(1)) : b_.CreateAdd(arg(0), arg(1));
      case ScalarOp::kSub: return fp ? b_.CreateFSub(arg(0), arg(1)) : b_.CreateSub(arg(0), arg(1));
      case ScalarOp::kMul: return fp ? b_.CreateFMul(arg(0), arg(1)) : b_.CreateMul(arg(0), arg(1));
      case ScalarOp::kDiv: return b_.CreateFDiv(arg(0), arg(1));
      case ScalarOp::kMaximum:
        return b_.CreateSelect(fp ? b_.CreateFCmpOGT(arg(0), arg(1)) : b_.CreateICmpSGT(arg(0), arg(1)), arg(0), arg(1));
      case ScalarOp::kMinimum:
        return b_.CreateSelect(fp ? b_.CreateFCmpOLT(arg(0), arg(1)) : b_.CreateICmpSLT(arg(0), arg(1)), arg(0), arg(1));
      case ScalarOp::kLess: return fp ? b_.CreateFCmpOLT(arg(0), arg(1)) : b_.CreateICmpSLT(arg(0), arg(1));
      case ScalarOp::kGreater: return fp ? b_.CreateFCmpOGT(arg(0), arg(1)) : b_.CreateICmpSGT(arg(0), arg(1));
      case ScalarOp::kEqual: return fp ? b_.CreateFCmpOEQ(arg(0), arg(1)) : b_.CreateICmpEQ(arg(0), arg(1));
      case ScalarOp::kWhere: return b_.CreateSelect(arg(0), arg(1), arg(2));
      case ScalarOp::kCast: return Cast(arg(0), in, n.dtype);
      case ScalarOp::kCopy: return arg(0);
      case ScalarOp::kNone: break;
    }
    throw JitFailure("no code for a fused operator");
  }

  // A loop over [0, n) around `body(index)`; leaves the builder after the loop.
  void Loop(llvm::Value* n, const std::function<void(llvm::Value*)>& body) {
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    llvm::BasicBlock* head = llvm::BasicBlock::Create(ctx_, "loop", kernel_fn_);
    llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx_, "loop_end", kernel_fn_);
    b_.CreateCondBr(b_.CreateICmpSGT(n, b_.getInt64(0)), head, exit);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(i64_, 2, "i");
    i->addIncoming(b_.getInt64(0), pre);
    body(i);
    llvm::Value* next = b_.CreateAdd(i, b_.getInt64(1), "", /*HasNUW=*/true, /*HasNSW=*/true);
    i->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, n), head, exit);
    b_.SetInsertPoint(exit);
  }

  // Calls the fused kernel for `step`, emitting it first if no earlier step
  // has the same one. Its arguments: the output, then each load's buffer.
  void CallFused(const PlanStep& step) {
    const PlanBuffer& out = plan_.buffers[step.outputs[0]];
    if (NumElements(out.type.shape) == 0) return;
    std::string key = out.type.ToString() + "|";
    std::vector<llvm::Value*> args = {Address(step.outputs[0])};
    for (const FusedNode& n : step.nodes) {
      key += std::to_string(static_cast<int>(n.kind)) + "," + std::to_string(static_cast<int>(n.op)) + "," +
             std::to_string(static_cast<int>(n.dtype)) + ",";
      char imm[64];
      std::snprintf(imm, sizeof imm, "%a,%a", n.immediate, n.param);
      key += imm;
      for (int a : n.args) key += "," + std::to_string(a);
      if (n.kind == FusedNode::Kind::kLoad) {
        key += "," + ShapeToString(plan_.buffers[n.buffer].type.shape);
        args.push_back(Address(n.buffer));
      }
      key += ";";
    }
    llvm::Function*& kernel = kernels_[key];
    if (!kernel) {
      llvm::IRBuilderBase::InsertPointGuard guard(b_);
      std::vector<llvm::Type*> params(args.size(), ptr_);
      kernel = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), params, false),
                                      llvm::Function::InternalLinkage,
                                      fn_->getName() + "_fused_" + std::to_string(kernels_.size()), m_);
      kernel->addFnAttr(llvm::Attribute::NoUnwind);
      kernel->addFnAttr(llvm::Attribute::NoInline);
      // Distinct buffers: lets LLVM vectorize without runtime alias checks.
      for (unsigned i = 0; i < params.size(); ++i) kernel->addParamAttr(i, llvm::Attribute::NoAlias);
      kernel_fn_ = kernel;
      b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", kernel));
      std::vector<llvm::Value*> kernel_args;
      for (auto& a : kernel->args()) kernel_args.push_back(&a);
      EmitFused(step, kernel_args);
      b_.CreateRetVoid();
    }
    b_.CreateCall(kernel, args);
  }

  // The body of a fused kernel: `ptrs` are its output, then its loads.
  void EmitFused(const PlanStep& step, const std::vector<llvm::Value*>& ptrs) {
    const PlanBuffer& out = plan_.buffers[step.outputs[0]];
    const Shape& shape = out.type.shape;
    // Strides (elements) of every load, broadcast to the output's shape.
    std::vector<int> loads;
    for (size_t i = 0; i < step.nodes.size(); ++i) {
      if (step.nodes[i].kind == FusedNode::Kind::kLoad) loads.push_back(static_cast<int>(i));
    }
    std::vector<Shape> strides;
    for (int l : loads) {
      const Shape& in = plan_.buffers[step.nodes[l].buffer].type.shape;
      Shape st(shape.size(), 0), own = RowMajorStrides(in);
      size_t offset = shape.size() - in.size();
      for (size_t d = 0; d < in.size(); ++d) st[offset + d] = in[d] == 1 ? 0 : own[d];
      strides.push_back(st);
    }
    // Merge adjacent dimensions every operand walks contiguously; drop size-1 ones.
    Shape dims;
    std::vector<Shape> merged(loads.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool merge = !dims.empty();
      for (size_t k = 0; merge && k < loads.size(); ++k) merge = merged[k].back() == strides[k][d] * shape[d];
      if (merge) {
        dims.back() *= shape[d];
        for (size_t k = 0; k < loads.size(); ++k) merged[k].back() = strides[k][d];
      } else {
        dims.push_back(shape[d]);
        for (size_t k = 0; k < loads.size(); ++k) merged[k].push_back(strides[k][d]);
      }
    }
    if (dims.empty()) {
      dims.push_back(1);
      for (auto& m : merged) m.push_back(0);
    }
    Shape out_strides = RowMajorStrides(dims);

    std::vector<llvm::Value*> iv;
    std::function<void(size_t)> nest = [&](size_t d) {
      if (d == dims.size()) {
        EmitElement(step, loads, merged, out_strides, iv, ptrs);
        return;
      }
      Loop(b_.getInt64(dims[d]), [&](llvm::Value* i) {
        iv.push_back(i);
        nest(d + 1);
        iv.pop_back();
      });
    };
    nest(0);
  }

  void EmitElement(const PlanStep& step, const std::vector<int>& loads, const std::vector<Shape>& strides,
                   const Shape& out_strides, const std::vector<llvm::Value*>& iv,
                   const std::vector<llvm::Value*>& ptrs) {
    auto offset = [&](const Shape& st) {
      llvm::Value* o = b_.getInt64(0);
      for (size_t d = 0; d < iv.size(); ++d) {
        if (st[d] != 0) o = b_.CreateAdd(o, b_.CreateMul(iv[d], b_.getInt64(st[d]), "", true, true), "", true, true);
      }
      return o;
    };
    std::vector<llvm::Value*> values(step.nodes.size(), nullptr);
    size_t load_index = 0;
    for (size_t i = 0; i < step.nodes.size(); ++i) {
      const FusedNode& n = step.nodes[i];
      switch (n.kind) {
        case FusedNode::Kind::kLoad: {
          llvm::Type* t = ElementType(n.dtype);
          llvm::Value* p = b_.CreateGEP(t, ptrs[1 + load_index], offset(strides[load_index]));
          ++load_index;
          llvm::Value* x = b_.CreateLoad(t, p);
          values[i] = n.dtype == DType::kBool ? b_.CreateICmpNE(x, b_.getInt8(0)) : x;
          break;
        }
        case FusedNode::Kind::kImmediate: values[i] = Immediate(n.immediate, n.dtype); break;
        case FusedNode::Kind::kOp: values[i] = Compute(n, values, step.nodes); break;
      }
    }
    const PlanBuffer& out = plan_.buffers[step.outputs[0]];
    llvm::Value* result = values.back();
    if (out.type.dtype == DType::kBool) result = b_.CreateZExt(result, b_.getInt8Ty());
    llvm::Type* t = ElementType(out.type.dtype);
    b_.CreateStore(result, b_.CreateGEP(t, ptrs[0], offset(out_strides)));
  }
};

void Optimize(llvm::Module& m, llvm::TargetMachine& tm, int level) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::OptimizationLevel o = level <= 0 ? llvm::OptimizationLevel::O0 : level == 1 ? llvm::OptimizationLevel::O1
                              : level == 2 ? llvm::OptimizationLevel::O2 : llvm::OptimizationLevel::O3;
  llvm::ModulePassManager mpm = level <= 0 ? pb.buildO0DefaultPipeline(o) : pb.buildPerModuleDefaultPipeline(o);
  mpm.run(m, mam);
}

std::string Assembly(const llvm::Module& m, llvm::TargetMachine& tm) {
  std::unique_ptr<llvm::Module> copy = llvm::CloneModule(m);
  llvm::SmallString<4096> text;
  llvm::raw_svector_ostream os(text);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile)) return "<no assembly printer>";
  pm.run(*copy);
  return std::string(text.str());
}

std::once_flag g_llvm_init;

}  // namespace

JitSession::JitSession(std::shared_ptr<State> state) : state_(std::move(state)) {}
JitSession::~JitSession() = default;

std::unique_ptr<JitSession> JitSession::Create() {
  std::call_once(g_llvm_init, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  auto state = std::make_shared<State>();
  auto jtmb = Unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host CPU");
  state->cpu = jtmb.getCPU();
  // Workers compile at once: each compile needs a TargetMachine of its own
  // (LLJIT's default shares one, which corrupts objects built concurrently).
  state->jit = Unwrap(
      llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(jtmb).setSupportConcurrentCompilation(true).create(),
      "creating LLJIT");
  llvm::orc::LLJIT& jit = *state->jit;
  // libm (tanhf, expf, ...) from the process; the runtime ABI by address.
  jit.getMainJITDylib().addGenerator(Unwrap(
      llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit.getDataLayout().getGlobalPrefix()),
      "searching the process for libm"));
  llvm::orc::SymbolMap runtime;
  auto flags = llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable;
  runtime[jit.mangleAndIntern("pejit_rt_kernel")] = {llvm::orc::ExecutorAddr::fromPtr(&pejit_rt_kernel), flags};
  runtime[jit.mangleAndIntern("pejit_rt_poison")] = {llvm::orc::ExecutorAddr::fromPtr(&pejit_rt_poison), flags};
  Check(jit.getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(runtime))), "defining the runtime ABI");
  jit.getObjTransformLayer().setTransform([](std::unique_ptr<llvm::MemoryBuffer> object) {
    g_object_bytes += object->getBufferSize();
    return llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>(std::move(object));
  });
  return std::unique_ptr<JitSession>(new JitSession(std::move(state)));
}

const std::string& JitSession::host_cpu() const { return state_->cpu; }
int JitSession::live_modules() const { return state_->live_modules.load(); }

ExecutablePtr JitSession::Compile(const Func& program, const CompileOptions& options, CompileReport* report) {
  CompileReport local;
  CompileReport& r = report ? *report : local;

  // (1) Lower: simplify, fuse, plan memory.
  auto t0 = Clock::now();
  Plan plan = Lower(program, options.lower);
  r.lower_ms = Ms(t0);
  r.plan = plan.ToString();
  r.kernels = plan.kernels();
  r.fused_kernels = static_cast<int>(std::count_if(plan.steps.begin(), plan.steps.end(),
                                                   [](const PlanStep& s) { return s.kind == PlanStep::Kind::kFused; }));
  r.arena_bytes = plan.arena_bytes;
  r.buffer_bytes = plan.buffer_bytes;

  // (2) Emit LLVM IR.
  t0 = Clock::now();
  std::string name = "pejit_main_" + std::to_string(state_->next_module.fetch_add(1));
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>(name, *context);
  llvm::orc::LLJIT& jit = *state_->jit;
  module->setDataLayout(jit.getDataLayout());
  module->setTargetTriple(jit.getTargetTriple().str());
  Codegen codegen(plan, *module, name, options.poison_dead_buffers);
  codegen.Emit();
  r.distinct_fused_kernels = codegen.distinct_kernels();
  std::string errors;
  llvm::raw_string_ostream es(errors);
  if (llvm::verifyModule(*module, &es)) throw JitFailure("generated invalid LLVM IR: " + errors);
  r.codegen_ms = Ms(t0);

  // (3) Optimize for the host CPU.
  t0 = Clock::now();
  auto jtmb = Unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host CPU");
  std::unique_ptr<llvm::TargetMachine> tm = Unwrap(jtmb.createTargetMachine(), "creating a target machine");
  Optimize(*module, *tm, options.opt_level);
  r.optimize_ms = Ms(t0);
  if (options.keep_ir) {
    llvm::raw_string_ostream os(r.llvm_ir);
    module->print(os, nullptr);
  }
  if (options.keep_asm) r.assembly = Assembly(*module, *tm);

  // (4) Machine code, under a resource tracker of its own.
  t0 = Clock::now();
  llvm::orc::ResourceTrackerSP tracker = jit.getMainJITDylib().createResourceTracker();
  Check(jit.addIRModule(tracker, llvm::orc::ThreadSafeModule(std::move(module), std::move(context))),
        "adding the module");
  g_object_bytes = 0;
  auto address = Unwrap(jit.lookup(name), "compiling " + name);
  r.machine_code_ms = Ms(t0);
  size_t constants = 0;
  for (const PlanBuffer& b : plan.buffers) {
    if (b.kind == PlanBuffer::Kind::kConstant) constants += b.constant.nbytes();
  }
  r.code_bytes = g_object_bytes + constants;
  return std::make_shared<NativeExecutable>(std::move(plan), state_, std::move(tracker),
                                            address.toPtr<NativeExecutable::MainFn>(), r.code_bytes);
}

}  // namespace pejit
