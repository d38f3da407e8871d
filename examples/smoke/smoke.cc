#include "examples/smoke/smoke.h"

#include <cblas.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/TargetParser/Host.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "support/parallel.h"

namespace pejit::smoke {
namespace {

using SaxpyFn = void (*)(float, const float*, float*, int64_t, int64_t);

template <typename T>
T Unwrap(llvm::Expected<T> value, const char* what) {
  if (!value) throw std::runtime_error(std::string(what) + ": " + llvm::toString(value.takeError()));
  return std::move(*value);
}

// void saxpy(float a, const float* x, float* y, i64 begin, i64 end)
std::unique_ptr<llvm::Module> BuildSaxpy(llvm::LLVMContext& ctx) {
  auto module = std::make_unique<llvm::Module>("smoke", ctx);
  llvm::IRBuilder<> b(ctx);
  auto* f32 = b.getFloatTy();
  auto* i64 = b.getInt64Ty();
  auto* ptr = b.getPtrTy();
  auto* type = llvm::FunctionType::get(b.getVoidTy(), {f32, ptr, ptr, i64, i64}, false);
  auto* fn = llvm::Function::Create(type, llvm::Function::ExternalLinkage, "saxpy", *module);
  auto args = fn->arg_begin();
  llvm::Value* a = args++;
  llvm::Value* x = args++;
  llvm::Value* y = args++;
  llvm::Value* begin = args++;
  llvm::Value* end = args++;

  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.SetInsertPoint(entry);
  b.CreateCondBr(b.CreateICmpSLT(begin, end), loop, exit);
  b.SetInsertPoint(loop);
  auto* i = b.CreatePHI(i64, 2, "i");
  i->addIncoming(begin, entry);
  auto* xi = b.CreateLoad(f32, b.CreateGEP(f32, x, i));
  auto* yp = b.CreateGEP(f32, y, i);
  auto* yi = b.CreateLoad(f32, yp);
  b.CreateStore(b.CreateFAdd(b.CreateFMul(a, xi), yi), yp);
  auto* next = b.CreateAdd(i, b.getInt64(1));
  i->addIncoming(next, loop);
  b.CreateCondBr(b.CreateICmpSLT(next, end), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();

  std::string errors;
  llvm::raw_string_ostream os(errors);
  if (llvm::verifyModule(*module, &os)) throw std::runtime_error("invalid smoke IR: " + errors);
  return module;
}

}  // namespace

SmokeResult RunSmoke(int64_t length, int gemm_size) {
  SmokeResult result;
  result.vector_length = length;
  result.gemm_size = gemm_size;

  // (1) An LLJIT for the host CPU, and the kernel added to it as IR.
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  result.host_cpu = llvm::sys::getHostCPUName().str();
  auto jit = Unwrap(llvm::orc::LLJITBuilder().create(), "creating LLJIT");
  auto ctx = std::make_unique<llvm::LLVMContext>();
  auto module = BuildSaxpy(*ctx);
  module->setDataLayout(jit->getDataLayout());
  if (auto err = jit->addIRModule(llvm::orc::ThreadSafeModule(std::move(module), std::move(ctx)))) {
    throw std::runtime_error("adding the smoke module: " + llvm::toString(std::move(err)));
  }
  auto saxpy = Unwrap(jit->lookup("saxpy"), "looking up saxpy").toPtr<SaxpyFn>();
  spdlog::info("smoke: compiled saxpy with ORC LLJIT for {}", result.host_cpu);

  // (2) The compiled kernel, run in chunks on the oneTBB pool.
  std::vector<float> x(length), y(length), expected(length);
  for (int64_t i = 0; i < length; ++i) {
    x[i] = static_cast<float>(i % 97) * 0.25f;
    y[i] = static_cast<float>(i % 13) - 6.0f;
    expected[i] = 1.5f * x[i] + y[i];
  }
  std::atomic<int> chunks{0};
  ParallelFor(0, length, 4096, [&](int64_t begin, int64_t end) {
    saxpy(1.5f, x.data(), y.data(), begin, end);
    chunks.fetch_add(1, std::memory_order_relaxed);
  });
  result.tbb_chunks = chunks.load();
  for (int64_t i = 0; i < length; ++i) {
    result.max_saxpy_error = std::max(result.max_saxpy_error, std::abs(y[i] - expected[i]));
  }
  spdlog::info("smoke: saxpy over {} floats in {} TBB chunks, max error {}", length,
               result.tbb_chunks, result.max_saxpy_error);

  // (3) OpenBLAS sgemm against a naive triple loop.
  const int n = gemm_size;
  std::vector<float> a(n * n), bm(n * n), c(n * n, 0.0f);
  for (int i = 0; i < n * n; ++i) {
    a[i] = static_cast<float>((i * 7) % 11) / 11.0f - 0.5f;
    bm[i] = static_cast<float>((i * 5) % 13) / 13.0f - 0.5f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, bm.data(), n,
              0.0f, c.data(), n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int k = 0; k < n; ++k) sum += double(a[i * n + k]) * bm[k * n + j];
      result.max_gemm_error = std::max(result.max_gemm_error, float(std::abs(sum - c[i * n + j])));
    }
  }
  spdlog::info("smoke: OpenBLAS sgemm {}x{}x{}, max error {}", n, n, n, result.max_gemm_error);
  return result;
}

}  // namespace pejit::smoke
