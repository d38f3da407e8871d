#include "tools/replay_command.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>

#include "interp/interpreter.h"
#include "ir/program_files.h"
#include "pe/signature.h"
#include "scheduler/engine.h"
#include "support/cli_checks.h"
#include "support/input_file.h"
#include "support/progress.h"
#include "train/lookahead.h"

namespace pejit {
namespace {

struct Call {
  int line;  // in the calls file, from 1
  std::vector<Value> args;
};

// One JSON array of arguments per line; blank lines and lines starting with
// '#' are skipped.
std::vector<Call> ReadCalls(const ModuleSnapshot& module, const std::string& entry, const std::string& path) {
  std::ifstream in = OpenInputFile(path);
  std::vector<Call> calls;
  std::string text;
  bool too_long = false;
  for (int line = 1; ReadLine(in, text, too_long, kMaxJsonLineBytes, /*skip_long_lines=*/false); ++line) {
    std::string where = path + ":" + std::to_string(line);
    if (too_long) throw std::runtime_error(where + ": " + LineTooLong(kMaxJsonLineBytes));
    size_t first = text.find_first_not_of(" \t\r");
    if (first == std::string::npos || text[first] == '#') continue;
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e400
      throw std::runtime_error(where + ": not valid JSON: " + e.what());
    }
    calls.push_back({line, ArgumentsFromJson(module, entry, json, where)});
  }
  if (calls.empty()) throw std::runtime_error(path + ": no calls (one JSON array of arguments per line)");
  return calls;
}

// The tensors a result holds, depth first: the value, then each gradient.
std::vector<Tensor> Leaves(const Value& value, const std::vector<Value>& grads) {
  std::vector<Tensor> out = Flatten({value});
  for (const Tensor& t : Flatten(grads)) out.push_back(t);
  return out;
}

// Empty when `got` matches `want`; otherwise what differs.
std::string Compare(const std::vector<Tensor>& got, const std::vector<Tensor>& want, double rtol, double atol) {
  if (got.size() != want.size()) {
    return std::to_string(got.size()) + " tensors, the interpreter " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].type() != want[i].type()) {
      return "tensor " + std::to_string(i) + " is " + got[i].type().ToString() + ", the interpreter's " +
             want[i].type().ToString();
    }
    bool exact = !IsFloat(want[i].dtype());
    if (!AllClose(got[i], want[i], exact ? 0 : rtol, exact ? 0 : atol)) {
      char error[32];
      std::snprintf(error, sizeof error, "%.3g", MaxRelativeError(got[i], want[i], atol));
      return "tensor " + std::to_string(i) + " differs (largest relative error " + error + ")";
    }
  }
  return "";
}

}  // namespace

ReplayCommand::ReplayCommand(CLI::App& app) {
  replay_ = app.add_subcommand("replay",
                               "Run an entry's calls (a JSON-lines file, one array of arguments per line) through "
                               "the tiered engine as a training loop would; print per-epoch figures and a JSON line");
  replay_->add_option("program", o_.program, "the .pj program")->required()->check(CLI::ExistingFile);
  replay_->add_option("--entry", o_.entry, "the definition to call, without '@'")->required();
  replay_->add_option("--calls", o_.calls, "JSON lines: each an array of arguments, as `run --args` takes")
      ->required()
      ->check(CLI::ExistingFile);
  replay_->add_flag("--grad", o_.grad, "value and gradients of the (scalar f32) result, as training takes them");
  replay_->add_option("--wrt", o_.wrt, "comma-separated argument indices to differentiate (default: every argument whose type can hold a float tensor)");
  replay_->add_option("--static", o_.static_args, "comma-separated argument indices specialized on whole");
  replay_->add_option("--epochs", o_.epochs, "passes over the calls")->capture_default_str()->check(WholeNumber(1, std::numeric_limits<int>::max()));
  replay_->add_flag("--reshuffle", o_.reshuffle, "a new order of the calls every epoch (seeded)");
  replay_->add_option("--seed", o_.seed, "the order --reshuffle draws")->capture_default_str();
  replay_->add_option("--lookahead", o_.lookahead, "calls prefetched ahead of the one running (0: none)")
      ->capture_default_str()
      ->check(WholeNumber(0, 1024));
  replay_->add_flag("--no-generic", o_.no_generic,
                    "leave the structure-generic tier out: every new structure is specialized on its own");
  replay_->add_option("--specialize-after", o_.specialize_after,
                      "with the generic tier, specialize a signature once it has been called this often (0: never)")
      ->capture_default_str()->check(WholeNumber(0, std::numeric_limits<int>::max()));
  replay_->add_flag("--check", o_.check,
                    "compare every compiled result (values and gradients) with the interpreter's; exit 1 on a "
                    "divergence, naming the call");
  replay_->add_option("--rtol", o_.rtol, "--check: relative tolerance for float tensors")->capture_default_str()->check(NonNegativeReal());
  replay_->add_option("--atol", o_.atol, "--check: absolute tolerance for float tensors")->capture_default_str()->check(NonNegativeReal());
  AddEngineFlags(*replay_, o_.engine);
}

bool ReplayCommand::parsed() const { return replay_->parsed(); }

int ReplayCommand::Run() const {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  EngineOptions options;
  ApplyEngineFlags(o_.engine, options);
  options.generic = !o_.no_generic;
  options.specialize_after_calls = o_.specialize_after;
  Engine engine(options);
  engine.module().AddSource(ReadFile(o_.program), o_.program);
  Snapshot snapshot = engine.module().snapshot();
  std::vector<Call> calls = ReadCalls(*snapshot, o_.entry, o_.calls);
  size_t arity = calls[0].args.size();
  auto indices = [&](const std::string& list, const std::string& option) {
    std::vector<int> out = ParseIndices(list, option);
    for (int i : out) {
      if (i < 0 || static_cast<size_t>(i) >= arity) {
        throw std::runtime_error(option + ": @" + o_.entry + " has no argument " + std::to_string(i));
      }
    }
    return out;
  };
  EntryOptions entry_options;
  entry_options.static_argnums = indices(o_.static_args, "--static");
  std::vector<int> wrt = indices(o_.wrt, "--wrt");
  if (o_.grad && wrt.empty()) wrt = FloatArguments(*snapshot, o_.entry);
  if (o_.grad) entry_options.wrt = wrt;
  Entry entry = engine.entry(o_.entry, entry_options);
  Interpreter reference;

  auto start = Clock::now();
  nlohmann::json epochs = nlohmann::json::array();
  std::mt19937_64 rng(o_.seed);
  std::vector<size_t> order(calls.size());
  std::iota(order.begin(), order.end(), 0);
  int64_t divergences = 0;
  for (int epoch = 0; epoch < o_.epochs; ++epoch) {
    if (o_.reshuffle && epoch > 0) std::shuffle(order.begin(), order.end(), rng);
    EntryStats before = entry.stats();
    EngineStats stats_before = engine.stats();
    size_t code_before = stats_before.code_bytes + stats_before.generic_code_bytes;
    ProgressBar progress("epoch " + std::to_string(epoch), "calls", order.size());
    auto epoch_start = Clock::now();
    Lookahead lookahead(
        entry,
        [&](size_t step) -> std::optional<std::vector<Value>> {
          if (step >= order.size()) return std::nullopt;
          return calls[order[step]].args;
        },
        o_.lookahead);
    int64_t compiled_before = before.calls_compiled();
    for (size_t step = 0; step < order.size(); ++step) {
      lookahead.BeforeStep(step);
      const Call& call = calls[order[step]];
      auto where = [&] { return o_.calls + ":" + std::to_string(call.line) + " (epoch " + std::to_string(epoch) + ")"; };
      std::vector<Tensor> got;
      try {
        if (o_.grad) {
          ValueAndGrad r = entry.value_and_grad(call.args);
          got = Leaves(r.value, r.grads);
        } else {
          got = Leaves(entry.call(call.args), {});
        }
      } catch (const std::exception& e) {
        throw std::runtime_error(where() + ": " + e.what());
      }
      // One stats read per step: did this call run compiled code?
      int64_t compiled_now = entry.stats().calls_compiled();
      bool compiled = compiled_now > compiled_before;
      compiled_before = compiled_now;
      if (o_.check && compiled) {
        std::vector<Tensor> want;
        if (o_.grad) {
          Interpreter::ValueAndGrad r = reference.CallWithGrad(*snapshot, o_.entry, call.args, wrt);
          want = Leaves(r.value, r.grads);
        } else {
          want = Leaves(reference.Call(*snapshot, o_.entry, call.args), {});
        }
        if (std::string diff = Compare(got, want, o_.rtol, o_.atol); !diff.empty()) {
          std::fprintf(stderr, "pejit replay: %s: the compiled result diverges from the interpreter's: %s\n",
                       where().c_str(), diff.c_str());
          ++divergences;
        }
      }
      char status[64];
      std::snprintf(status, sizeof status, "%.1f calls/s  compiled %3.0f%%",
                    static_cast<double>(step + 1) / std::max(1e-9, seconds_since(epoch_start)),
                    100.0 * static_cast<double>(compiled_now - before.calls_compiled()) /
                        static_cast<double>(step + 1));
      progress.Update(step + 1, status);
    }
    double seconds = seconds_since(epoch_start);
    EntryStats after = entry.stats();
    double n = static_cast<double>(order.size());
    auto share = [&](int64_t EntryStats::*field) { return static_cast<double>(after.*field - before.*field) / n; };
    double native = share(&EntryStats::calls_native), residual = share(&EntryStats::calls_residual_interpreter);
    double baseline = share(&EntryStats::calls_baseline);
    double interpreter = share(&EntryStats::calls_interpreter);
    double generic = share(&EntryStats::calls_generic);
    double generic_native = share(&EntryStats::calls_generic_native);
    int64_t runs = after.generic_runs - before.generic_runs;
    double generic_native_runs =
        runs ? static_cast<double>(after.generic_native_runs - before.generic_native_runs) / static_cast<double>(runs) : 0;
    int64_t specializations = after.compiled - before.compiled;
    EngineStats es = engine.stats();
    size_t code_bytes = es.code_bytes + es.generic_code_bytes;
    // Compiled: calls that ran native code only. A generic call with a run
    // on a variant's baseline code (generic/executor.h) is counted apart.
    std::printf("epoch %d: %zu calls in %.2f s, %.1f calls/s; compiled %.0f%% (native %.0f%%, generic all-native "
                "%.0f%%), generic with interpreted runs %.0f%% (%.0f%% of all generic runs native), "
                "specializations on baseline code %.0f%%, residual-interpreter %.0f%%, interpreter %.0f%%; "
                "%lld specializations compiled, "
                "%lld of %lld generic segment variants native, %.1f KiB of code held\n",
                epoch, order.size(), seconds, n / std::max(1e-9, seconds), 100 * (native + generic_native), 100 * native,
                100 * generic_native, 100 * (generic - generic_native), 100 * generic_native_runs,
                100 * baseline, 100 * residual, 100 * interpreter, static_cast<long long>(specializations),
                static_cast<long long>(es.generic_native_variants), static_cast<long long>(es.generic_variants),
                static_cast<double>(code_bytes) / 1024);
    epochs.push_back({{"epoch", epoch},
                      {"seconds", seconds},
                      {"calls_per_s", n / std::max(1e-9, seconds)},
                      {"compiled_share", native + generic_native},
                      {"generic_share", generic},
                      {"generic_native_share", generic_native},
                      {"generic_interpreted_share", generic - generic_native},
                      {"generic_native_run_share", generic_native_runs},
                      {"generic_cells", es.generic_cells},
                      {"generic_segments", es.generic_segments},
                      {"generic_padded_segments", es.generic_padded_segments},
                      {"generic_variants", es.generic_variants},
                      {"native_share", native},
                      {"baseline_share", baseline},
                      {"residual_interpreter_share", residual},
                      {"interpreter_share", interpreter},
                      {"compiled_specializations", specializations},
                      {"refused_specializations", after.refused - before.refused},
                      {"failed_specializations", after.failed - before.failed},
                      {"code_bytes", code_bytes},
                      {"code_bytes_added", static_cast<int64_t>(code_bytes) - static_cast<int64_t>(code_before)}});
  }
  EntryStats total = entry.stats();
  nlohmann::json out = {{"entry", o_.entry},
                        {"mode", o_.grad ? "grad" : "value"},
                        {"policy", o_.engine.policy},
                        {"calls", calls.size()},
                        {"epochs", epochs},
                        {"specializations_compiled", total.compiled},
                        {"specializations_refused", total.refused},
                        {"specializations_failed", total.failed},
                        {"seconds", seconds_since(start)}};
  if (o_.check) out["divergences"] = divergences;
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return divergences == 0 ? 0 : 1;
}

}  // namespace pejit
