#include "support/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace pejit {

ProgressBar::ProgressBar(std::string label, std::string unit, size_t total, int lines)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      every_(std::max<size_t>(1, total / static_cast<size_t>(std::max(1, lines)))),
      tty_(isatty(2)) {}

void ProgressBar::Update(size_t done, const std::string& status) {
  bool last = done == total_;
  if (!tty_ && !last && done % every_ != 0) return;
  auto now = std::chrono::steady_clock::now();
  if (tty_ && !last && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  const int width = 24;
  int filled = static_cast<int>(width * std::min(done, total_) / std::max<size_t>(1, total_));
  std::fprintf(stderr, "%s  %s [%s%s] %zu/%zu %s  %s%s", tty_ ? "\r" : "", label_.c_str(),
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done, total_,
               unit_.c_str(), status.c_str(), tty_ ? "" : "\n");
  if (tty_ && last) std::fprintf(stderr, "\n");
}

}  // namespace pejit
