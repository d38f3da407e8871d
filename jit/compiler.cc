// Codegen and the ORC session.
//
// A plan (jit/plan.h) becomes one LLVM module holding its distinct fused
// kernels, and a table of steps that the Executable walks:
//   (1) each distinct fused kernel (same expression, loop nest and strides)
//       is one function `void k(ptr* buffers, i64 outer)` (output first, then
//       each load): a loop nest over the output's shape, adjacent dimensions
//       merged where every operand allows it, optimized at -O3 for the host
//       CPU and vectorized; the outermost extent is an argument, so every step
//       computing the same thing on any number of rows (the batched cells of
//       each tree level) calls the same function;
//   (2) any other step runs the operator's registered kernel (OpenBLAS for
//       GEMMs) on views of the buffers;
//   (3) a call's intermediate buffers live in its thread's arena, so
//       concurrent calls share nothing mutable (ThreadArena below).
// Kernels are shared across specializations: the session keeps the kernels of
// every live module by what they compute, and a compile emits only those no
// live module has (after the first minibatches, usually none: the cells of a
// Tree-LSTM are the same kernels whatever the trees, their row counts being
// an argument). A module's code goes when the last executable using one of
// its kernels does.
// The steps are a table, not generated code, because residual programs have
// tens of thousands of them and only tens of distinct kernels: emitting a
// call per step made machine-code generation (register allocation over
// thousands of calls) the slowest part of compiling, by seconds.
// Elementwise math is compiled without fast-math. f32 exp, tanh and sigmoid
// are polynomials the loop vectorizer can widen (ExpF32 below: within 2 ulp
// of the exact result), not libm calls, so compiled values may differ from
// the interpreter's by a few ulp there; everything else calls the same libm
// functions as the reference kernels and agrees exactly.
#include "jit/compiler.h"

#include <llvm/Support/MemoryBuffer.h>

#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutorProcessControl.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectTransformLayer.h>
#include <llvm/ExecutionEngine/Orc/TaskDispatch.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/Transforms/Utils/Cloning.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <random>

#include "ir/module.h"
#include "ir/visitor.h"
#include "jit/image.h"
#include "jit/native_executable.h"

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


}  // namespace

namespace {

// One LLVM module's machine code (CodeObject::loaded): removed from the JIT
// when the last executable using one of its kernels lets go.
class CodeModule {
 public:
  CodeModule(std::shared_ptr<JitSession::State> state, llvm::orc::ResourceTrackerSP tracker);
  ~CodeModule();

 private:
  std::shared_ptr<JitSession::State> state_;  // keeps the LLJIT alive as long as this code
  llvm::orc::ResourceTrackerSP tracker_;
};

struct CachedKernel {
  KernelFn fn = nullptr;
  std::string symbol;
  std::weak_ptr<const CodeObject> object;
};

}  // namespace

struct JitSession::State {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::optional<llvm::orc::JITTargetMachineBuilder> host;  // what every compile's TargetMachine is made of
  std::string cpu;
  std::string features;  // enabled ones, sorted: "+avx,+avx2,..."
  // Module (and symbol) names are "pejit_<nonce>_<n>": the nonce, random per
  // session, keeps the symbols of objects another process wrote (images)
  // apart from this session's.
  std::string nonce;
  std::atomic<uint64_t> next_module{0};
  std::atomic<int> live_modules{0};
  // Each module's object file, as ORC links it (on any thread), until the
  // compile that made it takes it.
  std::mutex object_mu;
  std::map<std::string, std::shared_ptr<const std::string>> objects;
  // Fused kernels of live modules, by what they compute (FusedKernelKey, jit/plan.h),
  // and the live objects by name (an image's objects link once).
  std::mutex kernels_mu;
  std::map<std::string, CachedKernel> kernels;
  std::map<std::string, std::weak_ptr<const CodeObject>> linked;
};

namespace {

CodeModule::CodeModule(std::shared_ptr<JitSession::State> state, llvm::orc::ResourceTrackerSP tracker)
    : state_(std::move(state)), tracker_(std::move(tracker)) {
  state_->live_modules.fetch_add(1);
}

CodeModule::~CodeModule() {
  if (llvm::Error err = tracker_->remove()) llvm::consumeError(std::move(err));
  state_->live_modules.fetch_sub(1);
}

}  // namespace

namespace {

// ---- Codegen --------------------------------------------------------------------------

class Codegen {
 public:
  Codegen(const Plan& plan, llvm::Module& module)
      : plan_(plan), m_(module), ctx_(module.getContext()), b_(ctx_) {
    ptr_ = b_.getPtrTy();
    i64_ = b_.getInt64Ty();
  }

  // Emits the function `name` computing `step`.
  void EmitKernel(const PlanStep& step, const LoopNest& nest, const std::string& name) {
    const PlanBuffer& out = plan_.buffers[step.outputs[0]];
    kernel_fn_ = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_}, false),
                                        llvm::Function::ExternalLinkage, name, m_);
    kernel_fn_->addFnAttr(llvm::Attribute::NoUnwind);
    // The output never overlaps an input: the memory plan frees a buffer's
    // bytes only after the last step that reads it, and results and
    // parameters have bytes of their own (jit/plan.h). Telling LLVM so spares
    // every loop a run-time overlap check and a scalar copy of its body.
    llvm::MDBuilder md(ctx_);
    llvm::MDNode* domain = md.createAnonymousAliasScopeDomain("pejit.kernel");
    output_scope_ = llvm::MDNode::get(ctx_, {md.createAnonymousAliasScope(domain, "output")});
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", kernel_fn_));
    // The buffers' addresses, loaded once, before the loops.
    llvm::Value* table = kernel_fn_->getArg(0);
    std::vector<llvm::Value*> ptrs;
    for (size_t i = 0; i < 1 + nest.loads.size(); ++i) {
      ptrs.push_back(b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, table, i)));
    }
    if (NumElements(out.type.shape) > 0) EmitFused(step, nest, ptrs);
    b_.CreateRetVoid();
  }

 private:
  const Plan& plan_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  llvm::Type *ptr_, *i64_;
  llvm::Function* kernel_fn_ = nullptr;  // the fused kernel being emitted
  llvm::MDNode* output_scope_ = nullptr;  // its output's alias scope

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

  llvm::Value* F32(float v) { return llvm::ConstantFP::get(b_.getFloatTy(), v); }

  // a * b + c, fused where the host has FMA: the polynomials below are ours,
  // not the interpreter's, and one rounding instead of two only helps them.
  llvm::Value* MulAdd(llvm::Value* a, llvm::Value* b, llvm::Value* c) {
    return b_.CreateIntrinsic(llvm::Intrinsic::fmuladd, {a->getType()}, {a, b, c});
  }

  // exp of an f32 in straight-line arithmetic the loop vectorizer widens (a
  // libm call it cannot: each lane became a call of its own), as Cephes'
  // expf: x = k ln2 + r with |r| <= ln2/2, e^r by a polynomial, 2^k through
  // the exponent bits of two factors (so that k from -150 to 128 stays in
  // range). Within 2 ulp of the exact result wherever that is a normal f32
  // (tests/jit/compiler_test); +inf above ln(FLT_MAX), 0 below ln(2^-150),
  // NaN for NaN.
  llvm::Value* ExpF32(llvm::Value* x) {
    const float kHigh = 88.72283935546875f, kLow = -103.97208404541015625f;
    llvm::Value* c = b_.CreateSelect(b_.CreateFCmpOGT(x, F32(kHigh)), F32(kHigh), x);
    c = b_.CreateSelect(b_.CreateFCmpOLT(c, F32(kLow)), F32(kLow), c);
    llvm::Value* k = b_.CreateUnaryIntrinsic(llvm::Intrinsic::floor,
                                             MulAdd(c, F32(1.44269504088896341f), F32(0.5f)));
    llvm::Value* r = b_.CreateFSub(c, b_.CreateFMul(k, F32(0.693359375f)));
    r = b_.CreateFSub(r, b_.CreateFMul(k, F32(-2.12194440e-4f)));
    llvm::Value* p = F32(1.9875691500e-4f);
    for (float coefficient : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
      p = MulAdd(p, r, F32(coefficient));
    }
    p = b_.CreateFAdd(MulAdd(b_.CreateFMul(p, r), r, r), F32(1.0f));
    llvm::Value* ki = b_.CreateFPToSI(k, b_.getInt32Ty());
    llvm::Value* half = b_.CreateAShr(ki, 1);
    auto pow2 = [&](llvm::Value* e) {  // 2^e for e in [-126, 127]
      return b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(e, b_.getInt32(127)), 23), b_.getFloatTy());
    };
    llvm::Value* y = b_.CreateFMul(b_.CreateFMul(p, pow2(half)), pow2(b_.CreateSub(ki, half)));
    y = b_.CreateSelect(b_.CreateFCmpOGT(x, F32(kHigh)), F32(std::numeric_limits<float>::infinity()), y);
    y = b_.CreateSelect(b_.CreateFCmpOLT(x, F32(kLow)), F32(0.0f), y);
    return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, y);
  }

  // tanh of an f32, vectorizable as ExpF32 is, as Cephes' tanhf: of |x|, an
  // odd polynomial below 0.625 and 1 - 2 / (e^2|x| + 1) above; then x's sign.
  llvm::Value* TanhF32(llvm::Value* x) {
    llvm::Value* a = b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
    llvm::Value* z = b_.CreateFMul(a, a);
    llvm::Value* p = F32(-5.70498872745e-3f);
    for (float coefficient : {2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f, -3.33332819422e-1f}) {
      p = MulAdd(p, z, F32(coefficient));
    }
    llvm::Value* small = MulAdd(b_.CreateFMul(p, z), a, a);
    llvm::Value* e = ExpF32(b_.CreateFAdd(a, a));
    llvm::Value* large = b_.CreateFSub(F32(1.0f), b_.CreateFDiv(F32(2.0f), b_.CreateFAdd(e, F32(1.0f))));
    llvm::Value* t = b_.CreateSelect(b_.CreateFCmpOLT(a, F32(0.625f)), small, large);
    return b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, t, x);
  }

  llvm::Value* Exp(llvm::Value* x) {
    return x->getType()->isFloatTy() ? ExpF32(x) : Unary(llvm::Intrinsic::exp, x);
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
      case ScalarOp::kAbs:
        if (fp) return Unary(llvm::Intrinsic::fabs, arg(0));
        return b_.CreateSelect(b_.CreateICmpSLT(arg(0), llvm::ConstantInt::get(arg(0)->getType(), 0)),
                               b_.CreateNeg(arg(0)), arg(0));
      case ScalarOp::kNot: return b_.CreateNot(arg(0));
      case ScalarOp::kZero: return llvm::Constant::getNullValue(arg(0)->getType());
      case ScalarOp::kClip: {  // as the kernel: the bounds in x's type, NaN kept
        llvm::Type* t = arg(0)->getType();
        llvm::Value* lo = fp ? llvm::ConstantFP::get(t, n.param) : llvm::ConstantInt::get(t, static_cast<int64_t>(n.param));
        llvm::Value* hi = fp ? llvm::ConstantFP::get(t, n.param2) : llvm::ConstantInt::get(t, static_cast<int64_t>(n.param2));
        llvm::Value* below = fp ? b_.CreateFCmpOLT(arg(0), lo) : b_.CreateICmpSLT(arg(0), lo);
        llvm::Value* above = fp ? b_.CreateFCmpOGT(arg(0), hi) : b_.CreateICmpSGT(arg(0), hi);
        return b_.CreateSelect(below, lo, b_.CreateSelect(above, hi, arg(0)));
      }
      case ScalarOp::kOne:
        return fp ? llvm::ConstantFP::get(arg(0)->getType(), 1.0) : llvm::ConstantInt::get(arg(0)->getType(), 1);
      case ScalarOp::kAnd: return b_.CreateAnd(arg(0), arg(1));
      case ScalarOp::kOr: return b_.CreateOr(arg(0), arg(1));
      case ScalarOp::kExp: return Exp(arg(0));
      case ScalarOp::kLog: return Unary(llvm::Intrinsic::log, arg(0));
      case ScalarOp::kSqrt: return Unary(llvm::Intrinsic::sqrt, arg(0));
      case ScalarOp::kTanh: return arg(0)->getType()->isFloatTy() ? TanhF32(arg(0)) : CallLibm("tanhf", "tanh", arg(0));
      case ScalarOp::kSigmoid: {
        llvm::Value* one = llvm::ConstantFP::get(arg(0)->getType(), 1.0);
        return b_.CreateFDiv(one, b_.CreateFAdd(one, Exp(b_.CreateFNeg(arg(0)))));
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
      case ScalarOp::kLessEqual: return fp ? b_.CreateFCmpOLE(arg(0), arg(1)) : b_.CreateICmpSLE(arg(0), arg(1));
      case ScalarOp::kGreaterEqual: return fp ? b_.CreateFCmpOGE(arg(0), arg(1)) : b_.CreateICmpSGE(arg(0), arg(1));
      // Unordered: NaN != NaN holds, as in C++ and the kernel.
      case ScalarOp::kNotEqual: return fp ? b_.CreateFCmpUNE(arg(0), arg(1)) : b_.CreateICmpNE(arg(0), arg(1));
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

  // The body of a fused kernel: `ptrs` are its output, then its loads; the
  // outermost extent is the kernel's second argument.
  void EmitFused(const PlanStep& step, const LoopNest& nest, const std::vector<llvm::Value*>& ptrs) {
    const Shape& dims = nest.dims;
    const std::vector<int>& loads = nest.loads;
    const std::vector<Shape>& merged = nest.load_strides;
    Shape out_strides = RowMajorStrides(dims);

    std::vector<llvm::Value*> iv;
    std::function<void(size_t)> loop = [&](size_t d) {
      if (d == dims.size()) {
        EmitElement(step, loads, merged, out_strides, iv, ptrs);
        return;
      }
      llvm::Value* extent = d == 0 ? static_cast<llvm::Value*>(kernel_fn_->getArg(1)) : b_.getInt64(dims[d]);
      Loop(extent, [&](llvm::Value* i) {
        iv.push_back(i);
        loop(d + 1);
        iv.pop_back();
      });
    };
    loop(0);
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
          llvm::LoadInst* x = b_.CreateLoad(t, p);
          x->setMetadata(llvm::LLVMContext::MD_noalias, output_scope_);
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
    b_.CreateStore(result, b_.CreateGEP(t, ptrs[0], offset(out_strides)))
        ->setMetadata(llvm::LLVMContext::MD_alias_scope, output_scope_);
  }
};

// A TargetMachine for the host at code generator level `level`, one per
// thread and level, made on the thread's first compile and kept: making two
// per compile (and the subtarget each one's first module builds) was a fifth
// of a small program's compile (bench/jit's BM_CompileSmallProgram). A
// TargetMachine serves one module at a time, so threads never share one;
// the host is the process's, the same for every session.
llvm::Expected<llvm::TargetMachine*> HostMachine(const llvm::orc::JITTargetMachineBuilder& host,
                                                 llvm::CodeGenOptLevel level) {
  thread_local std::map<llvm::CodeGenOptLevel, std::unique_ptr<llvm::TargetMachine>> machines;
  std::unique_ptr<llvm::TargetMachine>& tm = machines[level];
  if (!tm) {
    llvm::orc::JITTargetMachineBuilder builder = host;
    builder.setCodeGenOptLevel(level);
    auto made = builder.createTargetMachine();
    if (!made) return made.takeError();
    tm = std::move(*made);
  }
  return tm.get();
}

// Machine code for a module, at the code generator level its flag
// kCodegenLevelFlag asks for, by the calling thread's TargetMachine.
constexpr const char* kCodegenLevelFlag = "pejit.codegen-level";

class MachineCodeCompiler : public llvm::orc::IRCompileLayer::IRCompiler {
 public:
  explicit MachineCodeCompiler(llvm::orc::JITTargetMachineBuilder host)
      : IRCompiler(llvm::orc::irManglingOptionsFromTargetOptions(host.getOptions())), host_(std::move(host)) {}

  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> operator()(llvm::Module& m) override {
    auto* level = llvm::mdconst::extract_or_null<llvm::ConstantInt>(m.getModuleFlag(kCodegenLevelFlag));
    auto tm = HostMachine(host_, level && level->getZExtValue() > 0 ? llvm::CodeGenOptLevel::Default
                                                                    : llvm::CodeGenOptLevel::None);
    if (!tm) return tm.takeError();
    return llvm::orc::SimpleCompiler(**tm)(m);
  }

 private:
  llvm::orc::JITTargetMachineBuilder host_;
};

// opt_level 1 (compiler.h). A fused kernel arrives as loops over memory
// (allocas for its indices): SROA makes them registers, the loop vectorizer
// makes the vector code the kernel's speed depends on, InstCombine and
// SimplifyCFG clean up around it. Without interleaving, whose wider loop
// bodies cost the quick code generator more time than they gained.
constexpr const char* kLoopPipeline =
    "function(sroa,instcombine,simplifycfg,loop-simplify,lcssa,loop-vectorize<interleave-forced-only>,"
    "instcombine,simplifycfg)";

void Optimize(llvm::Module& m, llvm::TargetMachine& tm, int level) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  // No loop unrolling: a fused kernel's inner extents are constants, and
  // unrolling the vectorized loops of a 384-wide row into straight-line code
  // doubled LLVM's time and code size without a measurable gain in the
  // training step (bench/jit). Vectorization and interleaving stay.
  llvm::PipelineTuningOptions tuning;
  tuning.LoopUnrolling = false;
  llvm::PassBuilder pb(&tm, tuning);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::ModulePassManager mpm;
  if (level <= 0) {
    mpm = pb.buildO0DefaultPipeline(llvm::OptimizationLevel::O0);
  } else if (level == 1) {
    if (auto err = pb.parsePassPipeline(mpm, kLoopPipeline)) {
      throw JitFailure("the loop pipeline: " + llvm::toString(std::move(err)));
    }
  } else {
    mpm = pb.buildPerModuleDefaultPipeline(level == 2 ? llvm::OptimizationLevel::O2 : llvm::OptimizationLevel::O3);
  }
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

// Whether this thread compiled a module: its share of LLVM is set up.
thread_local bool t_compiled = false;

}  // namespace

JitSession::JitSession(std::shared_ptr<State> state) : state_(std::move(state)) {}
JitSession::~JitSession() = default;

std::unique_ptr<JitSession> JitSession::Create() {
  std::call_once(g_llvm_init, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  auto state = std::make_shared<State>();
  char nonce[17];
  std::snprintf(nonce, sizeof nonce, "%016llx",
                static_cast<unsigned long long>(std::random_device()()) << 32 ^ std::random_device()());
  state->nonce = nonce;
  auto jtmb = Unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "detecting the host CPU");
  // Position-independent code: an image's objects then also link into a
  // shared library (`pejit export`) that a runtime without LLVM loads.
  jtmb.setRelocationModel(llvm::Reloc::PIC_);
  state->host = jtmb;
  state->cpu = jtmb.getCPU();
  std::vector<std::string> features = jtmb.getFeatures().getFeatures();
  std::sort(features.begin(), features.end());
  for (const std::string& f : features) {
    if (!f.empty() && f[0] == '+') state->features += (state->features.empty() ? "" : ",") + f;
  }
  // Workers compile at once: each compile needs a TargetMachine of its own
  // (LLJIT's default shares one, which corrupts objects built concurrently).
  // Code generation and linking run on the thread that asked for the code
  // (a worker): with concurrent compilation LLJIT's default dispatcher
  // starts a thread per task, so a worker's compile took a third thread
  // beside it and the training thread, on two cores.
  auto epc = Unwrap(llvm::orc::SelfExecutorProcessControl::Create(
                        nullptr, std::make_unique<llvm::orc::InPlaceTaskDispatcher>()),
                    "creating the executor process control");
  state->jit = Unwrap(llvm::orc::LLJITBuilder()
                          .setExecutorProcessControl(std::move(epc))
                          .setJITTargetMachineBuilder(jtmb)
                          .setSupportConcurrentCompilation(true)
                          .setCompileFunctionCreator([](llvm::orc::JITTargetMachineBuilder host)
                                                         -> llvm::Expected<std::unique_ptr<
                                                             llvm::orc::IRCompileLayer::IRCompiler>> {
                            return std::make_unique<MachineCodeCompiler>(std::move(host));
                          })
                          .create(),
                      "creating LLJIT");
  llvm::orc::LLJIT& jit = *state->jit;
  // libm (tanhf, expf, ...) from the process.
  jit.getMainJITDylib().addGenerator(Unwrap(
      llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit.getDataLayout().getGlobalPrefix()),
      "searching the process for libm"));
  State* raw = state.get();
  jit.getObjTransformLayer().setTransform([raw](std::unique_ptr<llvm::MemoryBuffer> object) {
    // ORC names object buffers "<module>-jitted-objectbuffer".
    std::string module = object->getBufferIdentifier().split("-jitted").first.str();
    auto bytes = std::make_shared<const std::string>(object->getBuffer().str());
    std::lock_guard<std::mutex> lock(raw->object_mu);
    raw->objects[module] = std::move(bytes);
    return llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>(std::move(object));
  });
  return std::unique_ptr<JitSession>(new JitSession(std::move(state)));
}

const std::string& JitSession::host_cpu() const { return state_->cpu; }
const std::string& JitSession::host_features() const { return state_->features; }
int JitSession::live_modules() const { return state_->live_modules.load(); }

namespace {

// A CodeStore's key for `program`: its text, the bytes of its constants
// (hashed: the printer abbreviates large ones) and the code generator.
std::string StoreKey(const Func& program, const CompileOptions& options) {
  std::string key = ProgramText(program);
  PostOrderVisit(program->body, [&](const Expr& e) {
    auto* c = As<ConstantNode>(e);
    if (!c) return;
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    const auto* bytes = static_cast<const unsigned char*>(c->value.raw_data());
    for (size_t i = 0; i < c->value.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    char hex[20];
    std::snprintf(hex, sizeof hex, "\n#%016llx", static_cast<unsigned long long>(h));
    key += hex;
  });
  return key + (options.optimize_machine_code ? "\n-O2" : "\n-O0");
}

}  // namespace

bool JitSession::WarmUp() {
  if (t_compiled) return false;
  Module m;
  m.AddSource(
      "def @warm_up(%x: Tensor[(8, 64), f32]) -> (Tensor[(8, 64), f32], Tensor[(8, 64), f32]) {\n"
      "  let %s: Tensor[(8, 64), f32] = sigmoid(%x);\n"
      "  let %m: Tensor[(8, 64), f32] = mul(%x, %s);\n"
      "  let %y: Tensor[(8, 64), f32] = tanh(%m);\n"
      "  let %e: Tensor[(8, 64), f32] = exp(%x);\n"
      "  let %z: Tensor[(8, 64), f32] = add(%x, %e);\n"
      "  (%y, %z)\n"
      "}\n",
      "<warm-up>");
  const Func program = m.snapshot()->Get("warm_up").func;
  CompileOptions quick;
  quick.opt_level = 1;
  Compile(program, quick);
  return true;
}

ExecutablePtr JitSession::Kept(const Func& program, const CompileOptions& options) {
  return options.store ? options.store->Load(StoreKey(program, options), options) : nullptr;
}

ExecutablePtr JitSession::Compile(const Func& program, const CompileOptions& options, CompileReport* report) {
  if (options.store) {
    const std::string key = StoreKey(program, options);
    if (ExecutablePtr kept = options.store->Load(key, options)) return kept;
    CompileOptions now = options;
    now.store = nullptr;
    ExecutablePtr exec = Compile(program, now, report);
    options.store->Keep(key, *exec, options);
    return exec;
  }
  CompileReport local;
  CompileReport& r = report ? *report : local;

  // (1) Lower: simplify, fuse, plan memory.
  auto t0 = Clock::now();
  LowerOptions lower = options.lower;
  lower.instrument = &options.instrument;
  Plan plan = Lower(program, lower);
  r.lower_ms = Ms(t0);
  if (options.keep_plan) r.plan = plan.ToString();
  r.kernels = plan.kernels();
  r.fused_kernels = static_cast<int>(std::count_if(plan.steps.begin(), plan.steps.end(),
                                                   [](const PlanStep& s) { return s.kind == PlanStep::Kind::kFused; }));
  r.arena_bytes = plan.arena_bytes;
  r.copy_steps = static_cast<int>(std::count_if(plan.steps.begin(), plan.steps.end(),
                                                [](const PlanStep& s) { return s.kind == PlanStep::Kind::kCopy; }));
  r.copied_bytes = plan.copied_bytes();
  r.buffer_bytes = plan.buffer_bytes;

  // (2) Per fused step, its kernel: one a live module has, or a new one,
  // emitted into this compile's LLVM module.
  t0 = Clock::now();
  const size_t steps = plan.steps.size();
  std::vector<int64_t> outer(steps, 0);
  std::vector<std::string> keys(steps);
  std::vector<LoopNest> nests(steps);
  for (size_t i = 0; i < steps; ++i) {
    if (plan.steps[i].kind != PlanStep::Kind::kFused) continue;
    nests[i] = NestOf(plan, plan.steps[i]);
    keys[i] = FusedKernelKey(plan, plan.steps[i], nests[i]) + (options.optimize_machine_code ? "O2" : "");
    outer[i] = nests[i].dims[0];
  }
  std::map<std::string, int> functions;  // key → index in `refs`
  std::vector<KernelRef> refs;
  std::vector<std::shared_ptr<const CodeObject>> objects;
  auto object_index = [&](std::shared_ptr<const CodeObject> o) {
    for (size_t i = 0; i < objects.size(); ++i) {
      if (objects[i] == o) return static_cast<int>(i);
    }
    objects.push_back(std::move(o));
    return static_cast<int>(objects.size()) - 1;
  };
  {
    std::lock_guard<std::mutex> lock(state_->kernels_mu);
    for (const std::string& key : keys) {
      if (key.empty() || functions.count(key)) continue;
      auto it = state_->kernels.find(key);
      if (it == state_->kernels.end()) continue;
      std::shared_ptr<const CodeObject> o = it->second.object.lock();
      if (!o) {
        state_->kernels.erase(it);
        continue;
      }
      functions[key] = static_cast<int>(refs.size());
      refs.push_back({it->second.fn, it->second.symbol, key, object_index(std::move(o))});
    }
  }
  r.reused_fused_kernels = static_cast<int>(functions.size());
  std::string prefix = "pejit_" + state_->nonce + "_" + std::to_string(state_->next_module.fetch_add(1));
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>(prefix, *context);
  llvm::orc::LLJIT& jit = *state_->jit;
  module->setDataLayout(jit.getDataLayout());
  module->setTargetTriple(jit.getTargetTriple().str());
  module->addModuleFlag(llvm::Module::Warning, kCodegenLevelFlag, options.optimize_machine_code ? 2 : 0);
  Codegen codegen(plan, *module);
  std::map<std::string, std::string> emitted;  // key → function name
  for (size_t i = 0; i < steps; ++i) {
    if (keys[i].empty() || functions.count(keys[i]) || emitted.count(keys[i])) continue;
    std::string name = prefix + "_fused_" + std::to_string(emitted.size());
    codegen.EmitKernel(plan.steps[i], nests[i], name);
    emitted.emplace(keys[i], name);
  }
  r.distinct_fused_kernels = static_cast<int>(functions.size() + emitted.size());
  std::string errors;
  llvm::raw_string_ostream es(errors);
  if (llvm::verifyModule(*module, &es)) throw JitFailure("generated invalid LLVM IR: " + errors);
  r.codegen_ms = Ms(t0);

  if (!emitted.empty() || options.keep_ir || options.keep_asm) {
    // (3) Optimize for the host CPU.
    t0 = Clock::now();
    llvm::TargetMachine* tm =
        Unwrap(HostMachine(*state_->host, llvm::CodeGenOptLevel::Default), "creating a target machine");
    Optimize(*module, *tm, options.opt_level);
    r.optimize_ms = Ms(t0);
    if (options.keep_ir) {
      llvm::raw_string_ostream os(r.llvm_ir);
      module->print(os, nullptr);
    }
    if (options.keep_asm) r.assembly = Assembly(*module, *tm);
  }
  if (!emitted.empty()) {
    // (4) Machine code, under a resource tracker of its own.
    t0 = Clock::now();
    llvm::orc::ResourceTrackerSP tracker = jit.getMainJITDylib().createResourceTracker();
    Check(jit.addIRModule(tracker, llvm::orc::ThreadSafeModule(std::move(module), std::move(context))),
          "adding the module");
    auto own = std::make_shared<CodeObject>();
    own->name = prefix;
    own->loaded = std::make_shared<CodeModule>(state_, tracker);
    std::vector<std::pair<std::string, KernelFn>> made;
    for (const auto& [key, name] : emitted) made.emplace_back(key, Unwrap(jit.lookup(name), "compiling " + name).toPtr<KernelFn>());
    r.machine_code_ms = Ms(t0);
    t_compiled = true;
    {
      std::lock_guard<std::mutex> lock(state_->object_mu);
      own->object = state_->objects[prefix];
      state_->objects.erase(prefix);
    }
    r.code_bytes = own->object ? own->object->size() : 0;
    std::shared_ptr<const CodeObject> object = own;
    const int index = object_index(object);
    std::lock_guard<std::mutex> lock(state_->kernels_mu);
    if (state_->linked.size() > 2 * static_cast<size_t>(state_->live_modules.load()) + 64) {
      std::erase_if(state_->linked, [](const auto& kv) { return kv.second.expired(); });
    }
    state_->linked[prefix] = object;
    for (const auto& [key, fn] : made) {
      functions[key] = static_cast<int>(refs.size());
      refs.push_back({fn, emitted.at(key), key, index});
      state_->kernels[key] = {fn, emitted.at(key), object};
    }
  }
  std::vector<int> step_kernel(steps, -1);
  for (size_t i = 0; i < steps; ++i) {
    if (!keys[i].empty()) step_kernel[i] = functions.at(keys[i]);
  }
  for (const PlanBuffer& b : plan.buffers) {
    if (b.kind == PlanBuffer::Kind::kConstant) r.code_bytes += b.constant.nbytes();
  }
  return std::make_shared<NativeExecutable>(std::move(plan), std::move(step_kernel), std::move(outer), std::move(refs),
                                            std::move(objects), r.code_bytes, options.poison_dead_buffers,
                                            options.profile);
}

ExecutablePtr JitSession::Load(std::string_view bytes, LoadReport* report) {
  auto t0 = Clock::now();
  Image image = DecodeImage(bytes);
  llvm::orc::LLJIT& jit = *state_->jit;
  // Each object links once per session: one a live executable has is shared.
  std::vector<std::shared_ptr<const CodeObject>> objects;
  for (const Image::Object& o : image.objects) {
    std::lock_guard<std::mutex> lock(state_->kernels_mu);
    auto it = state_->linked.find(o.name);
    std::shared_ptr<const CodeObject> live = it == state_->linked.end() ? nullptr : it->second.lock();
    if (!live) {
      llvm::orc::ResourceTrackerSP tracker = jit.getMainJITDylib().createResourceTracker();
      Check(jit.addObjectFile(tracker, llvm::MemoryBuffer::getMemBufferCopy(*o.bytes, o.name)),
            "linking object " + o.name);
      auto own = std::make_shared<CodeObject>();
      own->name = o.name;
      own->object = o.bytes;
      own->loaded = std::make_shared<CodeModule>(state_, tracker);
      live = own;
      state_->linked[o.name] = live;
      if (report) ++report->objects_linked;
    }
    objects.push_back(std::move(live));
  }
  std::vector<KernelRef> refs;
  for (const Image::Kernel& k : image.kernels) {
    KernelFn fn = Unwrap(jit.lookup(k.symbol), "linking " + k.symbol).toPtr<KernelFn>();
    refs.push_back({fn, k.symbol, k.key, k.object});
  }
  {
    // Later compiles reuse these kernels as they reuse their own.
    std::lock_guard<std::mutex> lock(state_->kernels_mu);
    for (const KernelRef& k : refs) {
      if (!k.key.empty() && !state_->kernels.count(k.key)) state_->kernels[k.key] = {k.fn, k.symbol, objects[k.object]};
    }
  }
  size_t code_bytes = 0;
  for (const auto& o : objects) code_bytes += o->object ? o->object->size() : 0;
  for (const PlanBuffer& b : image.plan.buffers) {
    if (b.kind == PlanBuffer::Kind::kConstant) code_bytes += b.constant.nbytes();
  }
  auto exe = std::make_shared<NativeExecutable>(std::move(image.plan), std::move(image.step_kernel),
                                                std::move(image.outer), std::move(refs), std::move(objects),
                                                code_bytes, false, false);
  if (report) report->ms = Ms(t0);
  return exe;
}

}  // namespace pejit
