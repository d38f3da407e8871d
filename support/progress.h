// \file A progress bar on standard error, for the epochs of the demos and
// `pejit replay`: "  epoch 3 [########........] 120/313 steps  loss 1.402 ...".
//
// On a terminal the line is redrawn in place, at most every 1/10 s (a redraw
// costs a write in the training loop); written to a file or pipe, it prints
// `lines` lines per epoch (at every 1/lines of it) and the last one, so that
// logs stay short.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace pejit {

class ProgressBar {
 public:
  // `label` leads the line ("epoch 3"), `unit` follows the counts ("steps").
  ProgressBar(std::string label, std::string unit, size_t total, int lines = 4);
  // `done` of the total are finished; `status` ends the line.
  void Update(size_t done, const std::string& status);

 private:
  std::string label_, unit_;
  size_t total_;
  size_t every_;  // not a terminal: a line every this many
  bool tty_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace pejit
