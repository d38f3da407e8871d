// The `pejit` command line: check, run, partially evaluate and compile .pj
// programs, replay their calls through the engine (replay_command.h), and
// read trace files (trace_command.h).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "interp/interpreter.h"
#include "ir/abi.h"
#include "ir/exhaustive.h"
#include "ir/json.h"
#include "ir/module.h"
#include "ir/printer.h"
#include "ir/program_files.h"
#include "jit/control_flow.h"
#include "jit/pass.h"
#include "jit/pipeline.h"
#include "pe/partial_eval.h"
#include "support/cli_checks.h"
#include "tools/export_command.h"
#include "tools/replay_command.h"
#include "tools/trace_command.h"

namespace pejit {
namespace {

int Check(const std::string& file) {
  Snapshot s = LoadProgram(file);
  // Warnings, not errors: the interpreter reports the value no clause fits
  // if one ever reaches the match.
  std::vector<MatchGap> gaps = NonExhaustiveMatches(*s);
  for (const MatchGap& gap : gaps) std::fprintf(stderr, "warning: %s\n", gap.ToString().c_str());
  std::printf("%s: ok, %zu definitions, %zu types%s\n", file.c_str(), s->definitions().size(), s->types().size(),
              gaps.empty() ? "" : (", " + std::to_string(gaps.size()) + " non-exhaustive match" + (gaps.size() == 1 ? "" : "es")).c_str());
  return 0;
}

// The arguments of `entry` from `--args`: a JSON array of them, inline
// (starting with '['), from a file, or from stdin ("-").
std::vector<Value> LoadArgs(const ModuleSnapshot& s, const std::string& entry, const std::string& args) {
  const size_t first = args.find_first_not_of(" \t\r\n");
  const bool inline_json = first != std::string::npos && args[first] == '[';
  const std::string where = inline_json ? std::string("--args") : args;
  if (!inline_json && args != "-" && !std::filesystem::exists(args)) {
    throw std::runtime_error("--args: there is no file '" + args +
                             "' (arguments given inline are a JSON array, starting with '[')");
  }
  nlohmann::json args_json;
  try {
    args_json = nlohmann::json::parse(inline_json ? args
                                      : args == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                                                    : ReadFile(args));
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
    throw std::runtime_error(where + ": not valid JSON: " + e.what());
  }
  return ArgumentsFromJson(s, entry, args_json, where);
}

// What `run` prints, and `compile --run` in the same form (ResultJson).
void PrintResult(const Value& value) { std::printf("%s\n", ResultJson(value).c_str()); }
void PrintResult(const Interpreter::ValueAndGrad& r, const std::vector<int>& wrt) {
  std::printf("%s\n", ResultJson(r.value, &r.grads, wrt).c_str());
}

std::vector<int> WrtOf(const ModuleSnapshot& s, const std::string& entry, const std::string& wrt_list) {
  std::vector<int> wrt = wrt_list.empty() ? std::vector<int>{} : ParseIndices(wrt_list, "--wrt");
  return wrt.empty() ? FloatArguments(s, entry) : wrt;
}

int Run(const std::string& file, const std::string& entry, const std::string& args_file, bool grad,
        const std::string& wrt_list) {
  Snapshot s = LoadProgram(file);
  std::vector<Value> args = LoadArgs(*s, entry, args_file);
  Interpreter interp;
  if (grad) {
    std::vector<int> wrt = WrtOf(*s, entry, wrt_list);
    PrintResult(interp.CallWithGrad(*s, entry, args, wrt), wrt);
  } else {
    PrintResult(interp.Call(*s, entry, args));
  }
  return 0;
}

int PartialEval(const std::string& file, const std::string& entry, const std::string& args_file,
                const std::string& static_list, const PeOptions& options) {
  Snapshot s = LoadProgram(file);
  std::vector<Value> args = LoadArgs(*s, entry, args_file);
  std::vector<bool> static_args(args.size(), false);
  for (int i : static_list.empty() ? std::vector<int>{} : ParseIndices(static_list, "--static")) {
    if (i < 0 || i >= static_cast<int>(args.size())) {
      throw std::runtime_error("--static: @" + entry + " has no argument " + std::to_string(i));
    }
    static_args[i] = true;
  }
  Residual r = PartialEvaluate(*s, entry, args, static_args, options);
  std::printf("%s", r.ToText().c_str());
  const PeStats& st = r.stats;
  std::printf(
      "# signature %s: %lld residual ops, %lld params, %lld residual functions (%lld generalized calls), "
      "%lld unfoldings, %lld folded ops, %lld shared calls, PE %.3f ms\n",
      ComputeSignature(args, static_args).ShortHash().c_str(), static_cast<long long>(st.residual_ops),
      static_cast<long long>(st.params), static_cast<long long>(st.residual_functions),
      static_cast<long long>(st.generalized_calls),
      static_cast<long long>(st.unfoldings), static_cast<long long>(st.folded_ops),
      static_cast<long long>(st.shared_calls), st.seconds * 1e3);
  return 0;
}

int Compile(const std::string& file, const std::string& entry, const std::string& args_file, bool grad,
            const std::string& wrt_list, bool batch, const std::string& emit, int opt_level,
            const std::vector<std::string>& print_after, const PeOptions& pe_options, bool run_compiled) {
  Snapshot s = LoadProgram(file);
  std::vector<Value> args = LoadArgs(*s, entry, args_file);
  auto t0 = std::chrono::steady_clock::now();
  Residual r = PartialEvaluate(*s, entry, args, {}, pe_options);
  double pe_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  PipelineOptions options;
  options.batch = batch;
  std::vector<int> wrt;
  if (grad) {
    wrt = WrtOf(*s, entry, wrt_list);
    // What `run` refuses, compile refuses too, in the same words (it would
    // compile without the gradient). ParseIndices refused a repeated index.
    std::string why = WhyNoGradient(*s, *s->Get(entry).func, wrt);
    if (!why.empty()) throw std::runtime_error("@" + entry + ": " + why);
    options.wrt_leaves = FloatWrtLeaves(args, wrt);
  }
  options.compile.instrument = PrintAfter(print_after, stdout);
  options.compile.opt_level = opt_level;
  options.compile.keep_plan = emit == "fused";
  options.compile.keep_ir = emit == "llvm";
  options.compile.keep_asm = emit == "asm";
  auto session = JitSession::Create();
  ExecutablePtr exe;
  if (HasControlFlow(r.main)) {
    // A branch on a tensor or a loop the data ends: native straight-line
    // regions and the driver between them (jit/control_flow.h), as the engine runs it.
    ControlFlowStats stats;
    auto t1 = std::chrono::steady_clock::now();
    ControlFlowOptions control_flow;
    control_flow.compile = options.compile;
    control_flow.wrt = options.wrt_leaves;
    control_flow.batch_branches = options.batch;
    exe = CompileControlFlow(*session, r.main, r.functions, control_flow, &stats);
    double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    std::string vjps = grad ? " (" + std::to_string(stats.vjp_regions) + " with a compiled VJP)" : "";
    std::string batched = stats.batched_groups > 0 ? " (" + std::to_string(stats.batched_rows) + " instances batched as " +
                                                         std::to_string(stats.batched_groups) + ")"
                                                   : "";
    std::printf("# %s for %s: control flow: %d native regions%s between %d branches and %d residual calls%s, "
                "code %.1f KiB; pe %.2f ms, compile %.2f ms\n",
                entry.c_str(), session->host_cpu().c_str(), stats.regions, vjps.c_str(), stats.branches, stats.calls,
                batched.c_str(), exe->code_bytes() / 1024.0, pe_ms, compile_ms);
  } else {
    PipelineReport pipeline;
    exe = CompileResidual(*session, r.main, options, &pipeline);
    const CompileReport& report = pipeline.compile;
    if (emit == "fused") std::printf("%s", report.plan.c_str());
    if (emit == "llvm") std::printf("%s", report.llvm_ir.c_str());
    if (emit == "asm") std::printf("%s", report.assembly.c_str());
    std::printf(
        "# %s for %s: %d kernels (%d fused, %d distinct fused), arena %.1f KiB (buffers side by side %.1f KiB), "
        "code %.1f KiB\n# times: pe %.2f ms, batch %.2f ms, autodiff %.2f ms, passes %.2f ms, llvm ir %.2f ms, "
        "llvm opt %.2f ms, machine code %.2f ms\n",
        entry.c_str(), session->host_cpu().c_str(), report.kernels, report.fused_kernels,
        report.distinct_fused_kernels, report.arena_bytes / 1024.0, report.buffer_bytes / 1024.0,
        report.code_bytes / 1024.0, pe_ms, pipeline.batch_ms, pipeline.autodiff_ms, report.lower_ms,
        report.codegen_ms, report.optimize_ms, report.machine_code_ms);
    if (pipeline.batched) std::printf("# batching: %s\n", pipeline.batch.ToString().c_str());
    if (!pipeline.batch_skipped.empty()) std::printf("# not batched: %s\n", pipeline.batch_skipped.c_str());
  }
  if (!run_compiled) return 0;
  // The compiled code on the arguments' dynamic leaves, its results rebuilt
  // as `run` prints them.
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, {}, &first);
  std::vector<Tensor> results = exe->Run(leaves);
  std::vector<int> gradient_result;
  if (grad) gradient_result = GradientResultOf(leaves.size(), *options.wrt_leaves);
  ValueAndGrad out = FromResults(exe->result_type(), args, grad ? &wrt : nullptr, leaves, first, gradient_result, results);
  if (grad) {
    PrintResult(out, wrt);
  } else {
    PrintResult(out.value);
  }
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  CLI::App app{"pejit: run and inspect programs of the pejit language (.pj files)"};
  app.require_subcommand(1);

  std::string file, entry, args_file, wrt;
  bool grad = false;
  CLI::App* check = app.add_subcommand("check", "Parse and type-check a .pj file; errors as file:line:col");
  check->add_option("file", file, "the .pj program")->required()->check(CLI::ExistingFile);

  CLI::App* run = app.add_subcommand("run", "Run an entry on JSON arguments in the interpreter; print JSON");
  run->add_option("file", file, "the .pj program")->required()->check(CLI::ExistingFile);
  run->add_option("--entry", entry, "the definition to call, without '@'")->required();
  run->add_option("--args", args_file,
                  "JSON array of arguments: a file, '-' for standard input, or inline (starting with '['); tensors as "
                  "{\"dtype\",\"shape\",\"data\"}, ADT values as {\"ctor\",\"fields\"}, tuples as arrays")
      ->required();
  run->add_flag("--grad", grad, "also compute gradients of the (scalar f32) result");
  run->add_option("--wrt", wrt, "comma-separated argument indices to differentiate (default: every argument whose type can hold a float tensor)");

  std::string static_list;
  pejit::PeOptions pe_options;
  CLI::App* pe = app.add_subcommand("pe", "Partially evaluate an entry against the static structure of JSON "
                                          "arguments; print the residual program and its counts");
  pe->add_option("file", file, "the .pj program")->required()->check(CLI::ExistingFile);
  pe->add_option("--entry", entry, "the definition to specialize, without '@'")->required();
  pe->add_option("--args", args_file, "JSON array of arguments, as for `run`")->required();
  pe->add_option("--static", static_list, "comma-separated argument indices whose whole value is static");
  pe->add_option("--fuel", pe_options.fuel, "function bodies to unfold before residualizing calls")
      ->capture_default_str()->check(pejit::NonNegativeInteger());
  pe->add_option("--max-ops", pe_options.max_residual_ops, "operators the residual may hold")->capture_default_str()->check(pejit::NonNegativeInteger());

  std::string emit = "fused";
  int opt_level = 3;
  CLI::App* compile = app.add_subcommand("compile", "Specialize an entry to JSON arguments and compile it with "
                                                    "LLVM; print the fused plan, LLVM IR or assembly, with counts "
                                                    "and timings");
  compile->add_option("file", file, "the .pj program")->required()->check(CLI::ExistingFile);
  compile->add_option("--entry", entry, "the definition to compile, without '@'")->required();
  compile->add_option("--args", args_file, "JSON array of arguments, as for `run`")->required();
  compile->add_flag("--grad", grad, "compile the loss and its gradients (the result must be a scalar f32)");
  compile->add_option("--wrt", wrt, "comma-separated argument indices to differentiate (default: every argument whose type can hold a float tensor)");
  bool no_batch = false;
  compile->add_flag("--no-batch", no_batch, "compile without batching isomorphic independent operations");
  compile->add_option("--emit", emit, "what to print: fused (the plan with kernel boundaries), llvm "
                                      "(optimized LLVM IR) or asm")
      ->check(CLI::IsMember({"fused", "llvm", "asm"}))
      ->capture_default_str();
  compile->add_option("-O", opt_level, "LLVM optimization level")->check(CLI::Range(0, 3))->capture_default_str();
  compile->add_option("--fuel", pe_options.fuel, "function bodies partial evaluation unfolds before residualizing calls")
      ->capture_default_str()->check(pejit::NonNegativeInteger());
  compile->add_option("--max-ops", pe_options.max_residual_ops, "operators the residual may hold")->capture_default_str()->check(pejit::NonNegativeInteger());
  bool run_compiled = false;
  compile->add_flag("--run", run_compiled, "also run the compiled code on the arguments and print its result as `run` does");
  std::vector<std::string> print_after;
  std::vector<std::string> passes = {"all"};
  for (const pejit::PassList& list : pejit::PassLists()) {
    if (list.pipeline != "segment") passes.insert(passes.end(), list.passes.begin(), list.passes.end());  // compile makes no segments
  }
  passes.push_back("residual");
  compile->add_option("--print-after", print_after,
                      "also print the program after these passes (comma-separated; jit/pass.h), or after all; "
                      "the regions of a program with control flow each go through the residual and lowering passes")
      ->delimiter(',')
      ->check(CLI::IsMember(passes));

  pejit::ReplayCommand replay(app);
  pejit::ExportCommand export_command(app);
  pejit::TraceCommand trace(app);

  CLI11_PARSE(app, argc, argv);
  try {
    if (check->parsed()) return pejit::Check(file);
    if ((run->parsed() || compile->parsed()) && !wrt.empty() && !grad) {
      throw std::runtime_error("--wrt names the arguments to differentiate: it needs --grad");
    }
    if (run->parsed()) return pejit::Run(file, entry, args_file, grad, wrt);
    if (pe->parsed()) return pejit::PartialEval(file, entry, args_file, static_list, pe_options);
    if (compile->parsed()) {
      return pejit::Compile(file, entry, args_file, grad, wrt, !no_batch, emit, opt_level, print_after, pe_options, run_compiled);
    }
    if (replay.parsed()) return replay.Run();
    if (export_command.parsed()) return export_command.Run();
    if (trace.parsed()) return trace.Run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pejit: %s\n", e.what());
    return 1;
  }
  return 2;
}
