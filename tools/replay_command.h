// \file `pejit replay`: a program's calls run through the Engine as a
// training loop would run them, so that a model the project did not write can
// be tried, timed and checked against the interpreter without any C++.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "scheduler/engine_flags.h"

namespace pejit {

class ReplayCommand {
 public:
  // Adds `replay` and its options to `app`.
  explicit ReplayCommand(CLI::App& app);
  bool parsed() const;
  // Runs the calls; 0 when every call succeeded (and, with --check, every
  // compiled result agreed with the interpreter's), 1 otherwise. Throws
  // std::runtime_error for bad input, naming the file and line.
  int Run() const;

  struct Options {
    std::string program, entry, calls;
    bool grad = false;
    std::string wrt, static_args;
    int epochs = 1;
    bool reshuffle = false;
    uint64_t seed = 1;
    int lookahead = 0;
    bool no_generic = false;
    int specialize_after = 2;
    EngineFlags engine;
    bool check = false;
    double rtol = 1e-4, atol = 1e-5;
  };

 private:
  CLI::App* replay_;
  Options o_;
};

}  // namespace pejit
