// \file The JIT: residual programs to native code, through LLVM ORC.
//
// One JitSession per engine owns an ORC LLJIT for the host CPU. Compile()
// lowers a residual program (jit/plan.h), emits one LLVM module with those of
// its distinct fused elementwise kernels (loops LLVM vectorizes) that no live
// specialization has compiled already, optimizes it with the new pass
// manager, and adds it under a resource tracker of its own; a module's code is
// freed when the last Executable calling into it is dropped. The Executable
// walks the plan's steps: fused kernels natively, other operators (GEMMs
// through OpenBLAS) through their registered kernels. See compiler.cc for why.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ir/expr.h"
#include "jit/executable.h"
#include "jit/pass.h"
#include "jit/plan.h"

namespace pejit {

class CodeStore;

struct CompileOptions {
  LowerOptions lower;
  // LLVM's IR optimization: 0 none (scalar code, ~20x slower kernels);
  // 1 the loop pipeline, only what a fused kernel's loops need (SROA,
  // InstCombine, SimplifyCFG, loop vectorization without interleaving):
  // kernels as fast as at 2-3 for about half the IR time (bench/jit's
  // BM_CompileSmallProgram and BM_FusedTanhKernel, bench/RESULTS.md); 2-3
  // the new pass manager's default pipelines.
  int opt_level = 3;
  // The IR arrives optimized and vectorized (opt_level); machine code is made
  // by fast instruction selection and register allocation unless this asks
  // for LLVM's optimizing code generator (-O2). That takes 4-5x as long (a
  // cold 25-tree training specialization's machine code 22 -> 100 ms) and
  // made the generic tier's fused kernels faster (spills and scheduling: its
  // 32-tree inference step 5-10% faster on Zen 1, bench/generic): worth it
  // for code every minibatch runs, not for one minibatch's.
  bool optimize_machine_code = false;
  // Debug: overwrite each arena buffer with NaN right after its last use, so
  // that a memory plan sharing bytes between live buffers shows up as wrong
  // answers.
  bool poison_dead_buffers = false;
  // Time every step (Executable::profile()); costs two clock reads a step.
  bool profile = false;
  bool keep_plan = false; // fill CompileReport::plan
  bool keep_ir = false;   // fill CompileReport::llvm_ir (optimized)
  bool keep_asm = false;  // fill CompileReport::assembly
  // Shown every pass the program goes through on its way to this compile
  // (jit/pass.h): the pipeline's, a control-flow program's, lowering's.
  PassInstrument instrument;
  // Where compiled code outlives the process (null: nowhere): Compile asks
  // it for the program first and gives it what it compiled (CodeStore).
  std::shared_ptr<CodeStore> store;
  // Who asks (an entry's name): what the store's reports name.
  std::string origin;
};

struct CompileReport {
  std::string plan;        // Plan::ToString(), when CompileOptions::keep_plan
  std::string llvm_ir;
  std::string assembly;
  int kernels = 0;
  int fused_kernels = 0;
  int distinct_fused_kernels = 0;  // fused kernels the steps call, each shared by every step alike
  int reused_fused_kernels = 0;    // ... of which compiled before, for a specialization still live
  int64_t arena_bytes = 0, buffer_bytes = 0;
  int copy_steps = 0;        // steps that only move bytes (jit/plan.h)
  int64_t copied_bytes = 0;  // ... per run
  size_t code_bytes = 0;  // machine code of the kernels compiled now, and constants
  double lower_ms = 0, codegen_ms = 0, optimize_ms = 0, machine_code_ms = 0;
};

class JitSession {
 public:
  // Throws JitFailure when LLVM cannot target the host.
  static std::unique_ptr<JitSession> Create();
  ~JitSession();

  // Compiles `program` (straight-line tensor code; see jit/plan.h). Safe to
  // call from many threads at once. Throws JitFailure. The result is a
  // NativeExecutable (native_executable.h), whose image (image.h) Load takes.
  ExecutablePtr Compile(const Func& program, const CompileOptions& options = {}, CompileReport* report = nullptr);
  // What options.store kept for `program` (as Compile would find it),
  // linked; null when it kept nothing or there is no store. Never compiles.
  ExecutablePtr Kept(const Func& program, const CompileOptions& options);

  // Builds the calling thread's share of LLVM (its TargetMachines, the
  // code of the passes and the code generator, paged in) by compiling a
  // throwaway program as quick code: 10-20 ms that the thread's first real
  // compile would otherwise pay. For a worker idle at start. (Optimized
  // code comes later and in the background: not warmed, which halved the
  // warm-up.) False, doing nothing, on a thread that compiled before.
  // Throws JitFailure.
  bool WarmUp();

  struct LoadReport {
    int objects_linked = 0;  // object files linked now (the others a live executable had)
    double ms = 0;
  };
  // The executable an image describes, its object files linked into this
  // session: no lowering, no optimizer, no code generation. The image must
  // come from this pejit build on a CPU of the same features (the disk
  // cache's entries say which). Throws ImageError for malformed bytes and
  // JitFailure for objects that do not link. Safe from many threads.
  ExecutablePtr Load(std::string_view image, LoadReport* report = nullptr);

  const std::string& host_cpu() const;
  // The host CPU's features LLVM targets ("+avx2,+avx512f,..."): code for
  // one set does not run on another.
  const std::string& host_features() const;
  // Compiled modules whose code is still loaded (their Executables alive).
  int live_modules() const;

  struct State;  // opaque: the LLJIT, shared with the executables it made

 private:
  explicit JitSession(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;  // shared with executables: code outlives the session if held
};

// Compiled code kept by program, under JitSession::Compile (as LLVM's
// ObjectCache is under its compile layer: queried by the compiler, not by
// its callers), so that every path that compiles a program persists it:
// generic segments, control-flow regions, whatever compiles next. The key is
// the program's text, which says all it computes, and the machine code
// generator used; the store adds what else changes the code (the engine's:
// its options and the CPU, scheduler/disk_cache.h). A specialization's
// whole residual is kept by its call signature instead, which finds it
// before partial evaluation (the engine's own index).
class CodeStore {
 public:
  virtual ~CodeStore() = default;
  // The code kept for `key`, linked; null when there is none (or what there
  // was is refused: the store reports why).
  virtual ExecutablePtr Load(const std::string& key, const CompileOptions& options) = 0;
  // Keeps `exec`, just compiled for `key` (code that is not native, a
  // region driver, is not kept).
  virtual void Keep(const std::string& key, const Executable& exec, const CompileOptions& options) = 0;
};

}  // namespace pejit
