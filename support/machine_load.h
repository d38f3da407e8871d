// \file How much of the machine's CPU other processes take.
//
// Work divided between threads (lanes, generic/program.h) gains only where
// the helper threads get a core: with another process busy on a core of
// two, a helper at a lower priority is preempted for milliseconds while the
// caller waits for the run it holds, and the divided call runs slower than
// the undivided one (bench/RESULTS.md, issue 51). The engine cannot see that
// in its own threads' timings (a call's time varies more from minibatch to
// minibatch than by the division); it can read it from the kernel's
// counters: every process's CPU time (/proc/stat) less its own
// (/proc/self/stat), between two samples.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace pejit {

// CPU time, in clock ticks: the machine's busy time (all processes, but idle
// and iowait; steal and guest left out, which no process here runs), and
// this process's (user + system).
struct CpuTicks {
  int64_t machine_busy = 0;
  int64_t machine_total = 0;  // busy and idle
  int64_t self = 0;
};

// The ticks in /proc/stat's first line ("cpu ...") and /proc/self/stat's
// text; nullopt where either does not parse.
std::optional<CpuTicks> ParseCpuTicks(const std::string& proc_stat, const std::string& self_stat);

class MachineLoad {
 public:
  // Cores' worth of CPU that other processes took between the last two
  // samples; a new sample is read when the last is older than `period`
  // (else the figure stands). nullopt before two samples, or where /proc
  // cannot be read (not Linux). Thread-safe; a read costs ~20 us.
  std::optional<double> OthersCores(std::chrono::milliseconds period = std::chrono::milliseconds(100));
  // The machine's cores (as /proc/stat counts them; 0 unknown).
  int cores() const;

  // The figure from two samples of `cores` cores.
  static double OthersCores(const CpuTicks& before, const CpuTicks& after, int cores);

 private:
  mutable std::mutex mu_;
  std::optional<CpuTicks> last_;
  std::chrono::steady_clock::time_point last_at_;
  std::optional<double> figure_;
  int cores_ = 0;
};

}  // namespace pejit
