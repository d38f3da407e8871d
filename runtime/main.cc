// pejit-runtime: runs an entry of a `pejit export` artifact on JSON
// arguments, as `pejit run` prints it, with no compiler linked.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "ir/program_files.h"
#include "runtime/artifact.h"
#include "support/input_file.h"

int main(int argc, char** argv) {
  CLI::App app{"Run an entry of a pejit export artifact (runtime/artifact.h) on JSON arguments; no LLVM"};
  std::string dir, entry, args_file, wrt_list;
  bool grad = false;
  app.add_option("artifact", dir, "the directory `pejit export --out` wrote")->required()->check(CLI::ExistingDirectory);
  app.add_option("--entry", entry, "the exported definition, without '@'")->required();
  app.add_option("--args", args_file, "JSON array of arguments, as for `pejit run`")->required();
  app.add_flag("--grad", grad, "the loss and its gradients (as exported with --grad)");
  app.add_option("--wrt", wrt_list, "the argument indices differentiated (default: every argument whose type can hold a float tensor)");
  CLI11_PARSE(app, argc, argv);
  try {
    pejit::Artifact artifact(pejit::UserPath(dir));
    nlohmann::json json = nlohmann::json::parse(pejit::ReadFile(pejit::UserPath(args_file)), nullptr, false);
    if (json.is_discarded()) throw std::runtime_error(args_file + ": not JSON");
    std::vector<pejit::Value> args = pejit::ArgumentsFromJson(artifact.module(), entry, json, args_file);
    std::vector<int> wrt;
    if (grad) {
      wrt = wrt_list.empty() ? pejit::FloatArguments(artifact.module(), entry) : pejit::ParseIndices(wrt_list, "--wrt");
    }
    pejit::Interpreter::ValueAndGrad r = artifact.Call(entry, args, grad ? &wrt : nullptr);
    std::printf("%s\n", pejit::ResultJson(r.value, grad ? &r.grads : nullptr, wrt).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pejit-runtime: %s\n", e.what());
    return 1;
  }
  return 0;
}
