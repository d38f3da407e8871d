#include "support/machine_load.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

namespace pejit {

namespace {

std::string Slurp(const char* path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int CountCores(const std::string& proc_stat) {
  int cores = 0;
  std::istringstream lines(proc_stat);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > 3 && line.compare(0, 3, "cpu") == 0 && std::isdigit(static_cast<unsigned char>(line[3]))) ++cores;
  }
  return cores;
}

}  // namespace

std::optional<CpuTicks> ParseCpuTicks(const std::string& proc_stat, const std::string& self_stat) {
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
  std::istringstream first(proc_stat.substr(0, proc_stat.find('\n')));
  std::string label;
  first >> label;
  if (label != "cpu") return std::nullopt;
  std::vector<int64_t> f;
  for (int64_t v; f.size() < 8 && first >> v;) f.push_back(v);
  if (f.size() < 5) return std::nullopt;
  f.resize(8, 0);
  CpuTicks t;
  const int64_t idle = f[3] + f[4];
  t.machine_busy = f[0] + f[1] + f[2] + f[5] + f[6];
  t.machine_total = t.machine_busy + idle;
  // "pid (comm) state ppid ... utime stime ...": comm may hold spaces and
  // parentheses, so fields are counted after its last ')'. utime and stime
  // are fields 14 and 15, the 12th and 13th after it.
  const size_t close = self_stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(self_stat.substr(close + 1));
  std::string field;
  int64_t utime = -1, stime = -1;
  auto number = [](const std::string& text, int64_t& out) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
    if (error != std::errc() || end != text.data() + text.size()) out = -1;
  };
  for (int k = 1; k <= 13 && rest >> field; ++k) {
    if (k == 12) number(field, utime);
    if (k == 13) number(field, stime);
  }
  if (utime < 0 || stime < 0) return std::nullopt;
  t.self = utime + stime;
  return t;
}

double MachineLoad::OthersCores(const CpuTicks& before, const CpuTicks& after, int cores) {
  const int64_t total = after.machine_total - before.machine_total;
  if (total <= 0 || cores <= 0) return 0;
  const int64_t others = (after.machine_busy - before.machine_busy) - (after.self - before.self);
  // Ticks of all cores: a core's share is total / cores of them.
  return std::clamp(static_cast<double>(others) * cores / static_cast<double>(total), 0.0, static_cast<double>(cores));
}

int MachineLoad::cores() const {
  std::lock_guard lock(mu_);
  return cores_;
}

std::optional<double> MachineLoad::OthersCores(std::chrono::milliseconds period) {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (last_ && now - last_at_ < period) return figure_;
  const std::string proc_stat = Slurp("/proc/stat");
  std::optional<CpuTicks> sample = ParseCpuTicks(proc_stat, Slurp("/proc/self/stat"));
  if (!sample) return figure_;
  if (cores_ == 0) cores_ = CountCores(proc_stat);
  if (last_) figure_ = OthersCores(*last_, *sample, cores_);
  last_ = sample;
  last_at_ = now;
  return figure_;
}

}  // namespace pejit
