// \file `pejit export`: a model's compiled code for a runtime without LLVM.
//
//   pejit export model.pj --entry infer --args a.json --args b.json --out model.pjx.d
//
// specializes and compiles the entry for each argument file's structure,
// then writes an artifact directory (runtime/artifact.h) that
// `pejit-runtime` (//runtime) loads and runs with no compiler linked.
// `--from-cache DIR` instead takes the specializations a run produced: the
// entry's code in a persistent code cache (every mode), for the program's
// current definitions and this CPU.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace pejit {

class ExportCommand {
 public:
  explicit ExportCommand(CLI::App& app);
  bool parsed() const;
  // 0 on success; throws std::runtime_error naming what failed.
  int Run() const;

 private:
  CLI::App* export_;
  std::string program_, entry_, wrt_, out_, from_cache_;
  std::vector<std::string> args_files_;
  bool grad_ = false;
};

}  // namespace pejit
