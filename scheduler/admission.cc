#include "scheduler/admission.h"

#include <algorithm>
#include <cstdio>

namespace pejit {
namespace {

constexpr double kWeight = 0.25;  // of a new measurement in the running means

double Blend(double mean, double x) { return mean == 0 ? x : mean + kWeight * (x - mean); }

std::string Ms(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", us / 1e3);
  return buf;
}

}  // namespace

Admission::Decision Admission::Decide(const Recurrence& r) {
  std::lock_guard lock(mu_);
  Decision d;
  d.pending = pending_;
  d.job_us = r.ops > 0 ? static_cast<double>(r.ops) * (us_per_op_ > 0 ? us_per_op_ : kPriorUsPerOp)
             : job_us_ > 0 ? job_us_
                           : kPriorJobUs;
  if (r.calls < 2) {
    d.reason = "seen once";
    return d;
  }
  d.interval_us = std::max<double>(1, static_cast<double>(r.now_us - r.first_us) / static_cast<double>(r.calls - 1));
  d.saving_us = static_cast<double>(r.generic_us) * (1 - (ratio_ > 0 ? ratio_ : kPriorRatio));
  const double ready_us = static_cast<double>(pending_ + 1) * d.job_us;
  const double calls_to_come = std::max(0.0, static_cast<double>(r.alive_us) - ready_us) / d.interval_us;
  d.benefit_us = d.saving_us * calls_to_come;
  d.admit = d.benefit_us > d.job_us;
  d.reason = std::string(d.admit ? "saves " : "would save ") + Ms(d.benefit_us) + " (" + Ms(d.saving_us) +
             " a call, a call every " + Ms(d.interval_us) + ", ready in " + Ms(ready_us) + ") " +
             (d.admit ? "> " : "<= ") + "a job's " + Ms(d.job_us);
  if (d.admit && job_us_ == 0 && pending_ > 0) {
    d.admit = false;
    d.reason += ", but the entry's first job, not measured yet, is pending: its cost is only a prior until then";
  }
  if (d.admit) ++pending_;
  return d;
}

void Admission::JobEnded(int64_t worker_us, int64_t ops, bool admitted) {
  std::lock_guard lock(mu_);
  if (worker_us >= 0) job_us_ = Blend(job_us_, static_cast<double>(worker_us));
  if (worker_us >= 0 && ops > 0) us_per_op_ = Blend(us_per_op_, static_cast<double>(worker_us) / static_cast<double>(ops));
  if (admitted && pending_ > 0) --pending_;
}

void Admission::SpecializationRan(int64_t native_us, int64_t generic_us) {
  if (native_us <= 0 || generic_us <= 0) return;
  std::lock_guard lock(mu_);
  ratio_ = Blend(ratio_, std::min(1.0, static_cast<double>(native_us) / static_cast<double>(generic_us)));
}

}  // namespace pejit
