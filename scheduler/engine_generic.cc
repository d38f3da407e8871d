// The structure-generic tier's part of the engine: serving a call, walking a prefetched call's
// structure ahead, compiling segment variants (generic/program.h, generic/executor.h).
#include "scheduler/engine_impl.h"

namespace pejit {

namespace {

// The identities of the structures (ADT values) among `args`: a prefetch
// and its call pass the same minibatch values (their parameters may differ).
std::vector<const void*> StructureIdentities(const std::vector<Value>& args) {
  std::vector<const void*> out;
  auto visit = [&](auto& self, const Value& v) -> void {
    if (v.kind() == Value::Kind::kAdt) {
      out.push_back(&v.fields());
    } else if (v.kind() == Value::Kind::kTuple) {
      for (const Value& f : v.fields()) self(self, f);
    }
  };
  for (const Value& a : args) visit(visit, a);
  return out;
}

}  // namespace

std::vector<std::shared_ptr<generic::GenericProgram>> EngineImpl::GenericPrograms() {
  std::vector<std::shared_ptr<generic::GenericProgram>> programs;
  std::lock_guard<std::mutex> lock(entries_mu_);
  for (const auto& [name, entry] : entries_) {
    std::lock_guard<std::mutex> generic_lock(entry->generic_mu);
    if (entry->generic) programs.push_back(entry->generic);
  }
  return programs;
}

std::shared_ptr<generic::GenericProgram> EngineImpl::GenericFor(Request& r) {
  EntryState& entry = r.entry;
  std::lock_guard<std::mutex> lock(entry.generic_mu);
  if (entry.generic_versions != r.key.versions->key) {
    entry.generic_versions = r.key.versions->key;
    entry.generic.reset();
    entry.generic_refusal.clear();
    entry.generic_refused.clear();
    try {
      generic::GenericOptions generic_options;
      generic_options.lanes = options.generic_lanes ? step_threads : 1;
      generic_options.helpers_busy = [this] { return helpers_.recalled(); };
      entry.generic = std::make_shared<generic::GenericProgram>(r.snapshot, entry.name, generic_options, segments_);
    } catch (const Refusal& e) {
      entry.generic_refusal = e.what();
      RefuseGeneric(r, entry.generic_refusal);
    }
  }
  return entry.generic;
}

void EngineImpl::RefuseGeneric(Request& r, const std::string& reason) {
  if (!On(EventKind::kGenericRefused)) return;
  Event e = Make(EventKind::kGenericRefused, r.entry.name, &r.key.signature);
  e.fields.push_back({"mode", r.key.mode});
  e.fields.push_back({"reason", reason});
  Emit(e);
}

bool EngineImpl::ServeGeneric(Request& r, const GenericStep& step) {
  std::shared_ptr<generic::GenericProgram> program = GenericFor(r);
  if (!program) return false;
  if (r.cacheable) {
    std::lock_guard<std::mutex> lock(r.entry.generic_mu);
    if (r.entry.generic_refused.count(r.key)) return false;
  }
  ClaimGenericWalk(r);  // walked ahead, or now: once
  int64_t start = r.start_us;
  generic::Execution run;
  const generic::Inspection* inspection = nullptr;
  try {
    // Refused before anything runs: the whole run would be thrown away.
    for (size_t k = 0; r.wrt && k < r.wrt->size(); ++k) {
      if (generic::HoldsStructure(r.args.at((*r.wrt)[k]))) {
        throw Refusal("generic: a gradient with respect to a structure argument (argument " +
                      std::to_string((*r.wrt)[k]) + ")");
      }
    }
    generic::ExecuteOptions eo;
    eo.grad = r.wrt != nullptr;
    if (options.policy.kind == Policy::Kind::kSync) eo.compile_now = jit_.get();
    // A warm persistent cache serves a variant natively from its first run.
    if (disk_) eo.load_kept = jit_.get();
    if (eo.compile_now || eo.load_kept) eo.compile_options = CompileOptionsFor(r.entry.name);
    run = step(program, eo, inspection);
  } catch (const Refusal& e) {
    if (r.cacheable) {
      // Bounded: a run of ever new structures keeps the newest few thousand.
      constexpr size_t kMaxRefusedSignatures = 4096;
      std::lock_guard<std::mutex> lock(r.entry.generic_mu);
      if (r.entry.generic_refused.size() >= kMaxRefusedSignatures) r.entry.generic_refused.clear();
      r.entry.generic_refused.insert(r.key);
    }
    RefuseGeneric(r, e.what());
    return false;
  } catch (const Interrupted&) {
    throw;  // the caller's stop, not the tier's fault
  } catch (const std::exception& e) {
    // Bad input, or a fault of this tier: the interpreter gives the answer
    // or the proper error.
    RefuseGeneric(r, std::string("run: ") + e.what());
    return false;
  }
  for (const generic::Execution::Compiled& c : run.compiled) {  // policy sync: on this thread, during the call
    auto micros = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    };
    EmitGenericCompile(r.entry.name, generic::CodeGen::kOptimized, *c.code, *c.variant, micros(c.start),
                       micros(c.end) - micros(c.start));
  }
  if (jit_ && options.policy.kind != Policy::Kind::kSync) {
    for (size_t i = 0; i < run.missing_native.size(); ++i) {
      QueueGenericCompile(r.entry.name, program, run.missing_codes[i], run.missing_native[i]);
    }
  }
  r.generic_ops = 0;  // what a specialization's job would unfold (scheduler/admission.h)
  for (const generic::Run& each : inspection->runs) r.generic_ops += static_cast<int64_t>(each.members.size()) * each.code->ops;
  Count(r.entry.calls_generic);
  if (run.baseline_runs == 0) Count(r.entry.calls_generic_native);
  Count(r.entry.generic_runs, run.native_runs + run.baseline_runs);
  Count(r.entry.generic_native_runs, run.native_runs);
  if (On(EventKind::kCall)) {
    Event e = Make(EventKind::kCall, r.entry.name, &r.key.signature, start, NowMicros() - start);
    e.fields.push_back({"tier", std::string("generic")});
    e.fields.push_back({"mode", std::string(r.pullback ? "pullback" : r.wrt ? "grad" : "value")});
    e.fields.push_back({"threads", static_cast<int64_t>(Team::Current()->threads_used())});
    e.fields.push_back({"inspect_us", static_cast<int64_t>(inspection->inspect_ms * 1000)});
    if (inspection->kept) e.fields.push_back({"schedule", std::string("prefetched")});
    e.fields.push_back({"runs", static_cast<int64_t>(run.native_runs + run.baseline_runs)});
    e.fields.push_back({"native_runs", static_cast<int64_t>(run.native_runs)});
    e.fields.push_back({"levels", static_cast<int64_t>(inspection->levels)});
    if (inspection->lane_work > 0) {
      e.fields.push_back({"lanes", static_cast<int64_t>(inspection->lanes)});
      if (inspection->others_cores >= 0) e.fields.push_back({"others_cores", inspection->others_cores});
      if (inspection->lanes_gain > 0) e.fields.push_back({"lanes_gain", inspection->lanes_gain});
      if (!inspection->lanes_why.empty()) e.fields.push_back({"lanes_why", inspection->lanes_why});
    }
    if (run.skipped_rows > 0) e.fields.push_back({"skipped_rows", run.skipped_rows});
    if (run.reruns > 0) e.fields.push_back({"reruns", static_cast<int64_t>(run.reruns)});
    if (inspection->new_cells > 0) e.fields.push_back({"new_cells", static_cast<int64_t>(inspection->new_cells)});
    Emit(e);
  }
  return true;
}

std::optional<ValueAndGrad> EngineImpl::RunGeneric(Request& r) {
  ValueAndGrad out;
  generic::Inspection inspection;
  const bool served = ServeGeneric(r, [&](const std::shared_ptr<generic::GenericProgram>& program,
                                          const generic::ExecuteOptions& eo, const generic::Inspection*& inspected) {
    generic::Execution run = generic::InspectAndExecute(*program, r.args, eo, inspection);
    inspected = &inspection;
    out = generic::CallResult(r.args, r.wrt, run);  // takes the value; the counts stay
    return run;
  });
  if (!served) return std::nullopt;
  return out;
}

std::optional<ValueAndPullback> EngineImpl::RunGenericPullback(Request& r) {
  ValueAndPullback out;
  const bool served = ServeGeneric(r, [&](const std::shared_ptr<generic::GenericProgram>& program,
                                          const generic::ExecuteOptions& eo, const generic::Inspection*& inspected) {
    generic::Forward forward = generic::InspectAndForward(*program, r.args, eo);
    inspected = forward.inspection.get();
    out.value = forward.run.value;
    out.tier = "generic";
    // The backward reads the program's cells: it keeps the program (an edit
    // of the module makes the entry another one, not this one's end).
    out.pullback = [this, program, inspection = forward.inspection,
                    backward = std::shared_ptr<generic::PendingBackward>(std::move(forward.backward)),
                    value = out.value, args = r.args, wrt = *r.wrt, snapshot = r.snapshot,
                    name = r.entry.name, signature = r.key.signature.ShortHash()](const Value& cotangent) {
      std::vector<Tensor> seeds = CotangentLeaves(value, cotangent, "@" + name);
      const int64_t start = sink_ ? NowMicros() : 0;
      std::vector<Value> grads;
      try {
        Team team(&helpers_, step_threads);
        ScopedTeam scoped_team(&team);
        grads = generic::ArgumentGrads(args, wrt, backward->Backward(seeds));
      } catch (const Interrupted&) {
        throw;
      } catch (const std::logic_error&) {
        throw;  // run twice
      } catch (const std::exception& e) {
        // A fault of the tier's backward: tier 0 answers, computing the
        // forward pass again.
        if (On(EventKind::kGenericRefused)) {
          Event ev = MakeEvent(EventKind::kGenericRefused, name, signature, 0, 0);
          ev.fields.push_back({"mode", std::string("pullback")});
          ev.fields.push_back({"reason", std::string("backward: ") + e.what()});
          Emit(ev);
        }
        return interpreter_.CallWithPullback(*snapshot, name, args, wrt).pullback(cotangent);
      }
      if (sink_) EmitBackward(name, signature, "generic", start);
      return grads;
    };
    return std::move(forward.run);
  });
  if (!served) return std::nullopt;
  return out;
}

void EngineImpl::QueueGenericCompile(const std::string& entry, std::shared_ptr<generic::GenericProgram> program,
                                     generic::SegmentCode* code, generic::SegmentCode::Variant* variant) {
  if (variant->queued.exchange(true)) return;  // one compile per variant at a time
  {
    std::lock_guard<std::mutex> lock(generic_queue_mu_);
    generic_queue_.push_back({entry, std::move(program), code, variant});
  }
  Spawn();
}

void EngineImpl::RunGenericCompile(GenericCompile& job) {
  if (stopping_.load()) return;
  int64_t start = NowMicros();
  std::string failure;
  try {
    job.codegen = generic::CompileVariant(*jit_, *job.code, *job.variant, CompileOptionsFor(job.entry), job.codegen);
  } catch (const std::exception& e) {
    failure = e.what();  // the variant keeps running its baseline code
  }
  if (!failure.empty()) {
    if (On(EventKind::kGenericRefused)) {
      Event e = Make(EventKind::kGenericRefused, job.entry, nullptr);
      e.fields.push_back({"reason", "compile of segment " + std::to_string(job.code->id) + ": " + failure});
      Emit(e);
    }
    return;
  }
  EmitGenericCompile(job.entry, job.codegen, *job.code, *job.variant, start, NowMicros() - start);
  if (job.codegen == generic::CodeGen::kQuick && !job.variant->queued.exchange(true)) {
    job.codegen = generic::CodeGen::kOptimized;
    {
      std::lock_guard<std::mutex> lock(generic_queue_mu_);
      generic_optimize_.push_back(std::move(job));
    }
    Spawn();
  }
}

void EngineImpl::EmitGenericCompile(const std::string& entry, generic::CodeGen codegen,
                                    const generic::SegmentCode& code, const generic::SegmentCode::Variant& variant,
                                    int64_t start_us, int64_t duration_us) {
  if (!On(EventKind::kGenericCompile)) return;
  Event e = Make(EventKind::kGenericCompile, entry, nullptr, start_us, duration_us);
  e.fields.push_back({"segment", static_cast<int64_t>(code.id)});
  e.fields.push_back({"rows", variant.rows});
  e.fields.push_back({"codegen", std::string(codegen == generic::CodeGen::kQuick ? "quick" : "optimized")});
  e.fields.push_back({"ops", static_cast<int64_t>(code.ops)});
  e.fields.push_back({"code_bytes", static_cast<int64_t>(variant.code_bytes.load())});
  if (!variant.pads.empty()) {  // per padded input: its extent, "m" when masked
    std::string padded;
    for (const generic::PadTo& pad : variant.pads) {
      if (pad.extent == 0) continue;
      padded += (padded.empty() ? "" : ",") + std::to_string(pad.extent) + (pad.masked ? "m" : "");
      if (pad.axes != 1) {  // an input of the length along several axes: "24m@0:1"
        std::string axes;
        for (int a = 0; a < 32; ++a) {
          if (pad.axes >> a & 1) axes += (axes.empty() ? "@" : ":") + std::to_string(a);
        }
        padded += axes;
      }
    }
    e.fields.push_back({"padded", padded});
  }
  if (!code.unpadded.empty()) e.fields.push_back({"unpadded", code.unpadded});
  Emit(e);
}

bool EngineImpl::PrefetchGeneric(Request& r, pejit::Prefetch when) {
  std::shared_ptr<generic::GenericProgram> program = GenericFor(r);
  if (!program || !jit_) return false;
  generic::Ahead ahead;
  const int64_t start = NowMicros();
  int queued = 0;
  try {
    // The call takes this walk's inspection (GenericProgram::InspectAhead).
    ahead = program->InspectAhead(r.args);
    for (const generic::VariantRef& ref : ahead.variants) {
      // the worker makes it
      generic::SegmentCode::Variant& v = generic::VariantEntry(*ref.code, ref.rows, r.wrt != nullptr, ref.pads);
      if (!v.native.load()) {
        QueueGenericCompile(r.entry.name, program, ref.code, &v);
        ++queued;
      }
    }
  } catch (const std::exception& e) {
    RefuseGeneric(r, e.what());
    return false;
  }
  if (On(EventKind::kGenericInspect)) {
    Event e = Make(EventKind::kGenericInspect, r.entry.name, &r.key.signature, start, NowMicros() - start);
    e.fields.push_back({"inspect_us", static_cast<int64_t>(ahead.inspect_ms * 1000)});
    if (ahead.new_cells > 0) e.fields.push_back({"new_cells", static_cast<int64_t>(ahead.new_cells)});
    e.fields.push_back({"variants", static_cast<int64_t>(ahead.variants.size())});
    e.fields.push_back({"queued", static_cast<int64_t>(queued)});
    e.fields.push_back({"priority", std::string(JobPriorityName(PriorityOf(when)))});
    Emit(e);
  }
  return true;
}

void EngineImpl::QueueGenericWalk(Request& r, pejit::Prefetch when) {
  GenericWalk walk{&r.entry, r.static_args, r.args, std::nullopt, r.snapshot, r.key, when, StructureIdentities(r.args)};
  if (r.wrt) walk.wrt = *r.wrt;
  {
    std::lock_guard<std::mutex> lock(generic_queue_mu_);
    (when == pejit::Prefetch::kNext ? walks_next_ : walks_idle_).push_back(std::move(walk));
  }
  Spawn();
}

void EngineImpl::ClaimGenericWalk(Request& r) {
  std::unique_lock<std::mutex> lock(generic_queue_mu_);
  if (walks_next_.empty() && walks_idle_.empty() && walking_.empty()) return;
  std::vector<const void*> structures = StructureIdentities(r.args);
  if (structures.empty()) return;
  for (auto* queue : {&walks_next_, &walks_idle_}) {
    std::erase_if(*queue, [&](const GenericWalk& w) { return w.entry == &r.entry && w.structures == structures; });
  }
  auto mine = std::make_pair(&r.entry, structures);
  WaitInterruptibly(walked_cv_, lock,
                    [&] { return std::find(walking_.begin(), walking_.end(), mine) == walking_.end(); });
}

void EngineImpl::RunGenericWalk(GenericWalk& walk) {
  if (stopping_.load()) return;
  // An edit since the prefetch: the entry's program is another one now, and
  // the call will be prepared against it.
  if (module.snapshot()->generation() != walk.snapshot->generation()) return;
  Request r{*walk.entry, walk.static_args, walk.args, walk.wrt ? &*walk.wrt : nullptr, walk.snapshot, walk.key,
            true, "", 0};
  if (!PrefetchGeneric(r, walk.when)) PrefetchSpecialized(r, walk.when);
}

}  // namespace pejit
