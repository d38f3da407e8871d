#include "scheduler/events.h"

#include <atomic>
#include <chrono>

namespace pejit {
namespace {

struct EventInfo {
  std::string_view name, doc;
};

constexpr EventInfo kEventInfo[] = {
#define PEJIT_EVENT_INFO(e, name, doc) {name, doc},
    PEJIT_EVENTS(PEJIT_EVENT_INFO)
#undef PEJIT_EVENT_INFO
};
static_assert(sizeof kEventInfo / sizeof kEventInfo[0] == kEventKinds);

}  // namespace

std::string_view EventName(EventKind kind) { return kEventInfo[static_cast<int>(kind)].name; }
std::string_view EventDoc(EventKind kind) { return kEventInfo[static_cast<int>(kind)].doc; }

bool ParseEventName(std::string_view name, EventKind* kind) {
  for (int i = 0; i < kEventKinds; ++i) {
    if (kEventInfo[i].name == name) {
      *kind = static_cast<EventKind>(i);
      return true;
    }
  }
  return false;
}

const FieldValue* Event::Find(std::string_view key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Event::Text(std::string_view key) const {
  const FieldValue* v = Find(key);
  if (!v) return "";
  if (const auto* i = std::get_if<int64_t>(v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(v)) return std::to_string(*d);
  return std::get<std::string>(*v);
}

void RecordingSink::Emit(const Event& event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(event);
}

std::vector<Event> RecordingSink::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::vector<Event> RecordingSink::Of(EventKind kind, std::string_view entry) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> out;
  for (const Event& e : events_) {
    if (e.kind == kind && (entry.empty() || e.entry == entry)) out.push_back(e);
  }
  return out;
}

int RecordingSink::Count(EventKind kind, std::string_view entry) const {
  return static_cast<int>(Of(kind, entry).size());
}

void RecordingSink::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t ThreadNumber() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t number = next.fetch_add(1, std::memory_order_relaxed);
  return number;
}

Event MakeEvent(EventKind kind, const std::string& entry, std::string signature, int64_t start_us,
                int64_t duration_us) {
  Event e{};
  e.kind = kind;
  e.entry = entry;
  e.signature = std::move(signature);
  e.thread = ThreadNumber();
  e.start_us = start_us ? start_us : NowMicros();
  e.duration_us = duration_us;
  return e;
}

void EmitQuietly(EventSink& sink, const Event& event) {
  try {
    sink.Emit(event);
  } catch (...) {
  }
}

}  // namespace pejit
