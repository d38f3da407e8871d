#include "scheduler/trace_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>
#include <variant>

#include "support/input_file.h"
#include "support/json_integer.h"

namespace pejit {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kCommonKeys[] = {"event", "entry", "signature", "thread", "start_us", "duration_us"};

bool IsCommonKey(std::string_view key) {
  return std::find(std::begin(kCommonKeys), std::end(kCommonKeys), key) != std::end(kCommonKeys);
}

// The fields a reader of the file interprets (trace_stats.cc, the Chrome
// export), each of one type in every event that has it (docs/tracing.md):
// a line with "job": 1e20 or "tier": 3 is refused, not read as something else.
// Counts and durations are not negative.
enum class FieldKind { kCount, kString };
constexpr std::pair<std::string_view, FieldKind> kInterpretedFields[] = {
    {"job", FieldKind::kCount},         {"workers", FieldKind::kCount},  {"slots", FieldKind::kCount},
    {"retained", FieldKind::kCount},    {"inspect_us", FieldKind::kCount}, {"wait_us", FieldKind::kCount},
    {"tier", FieldKind::kString},       {"policy", FieldKind::kString},  {"kind", FieldKind::kString},
    {"reason", FieldKind::kString},     {"state", FieldKind::kString},   {"definitions", FieldKind::kString},
    {"schedule", FieldKind::kString},   {"decision", FieldKind::kString},
};

// The kind of an interpreted field; null for a field no reader interprets.
const FieldKind* FindInterpreted(std::string_view key) {
  for (const auto& [name, kind] : kInterpretedFields) {
    if (name == key) return &kind;
  }
  return nullptr;
}

void CheckInterpretedField(const std::string& key, const FieldValue& value) {
  const FieldKind* kind = FindInterpreted(key);
  if (!kind) return;
  const auto* count = std::get_if<int64_t>(&value);
  if (*kind == FieldKind::kCount && (!count || *count < 0)) {
    throw std::invalid_argument("\"" + key + "\" must be an integer >= 0");
  }
  if (*kind == FieldKind::kString && !std::holds_alternative<std::string>(value)) {
    throw std::invalid_argument("\"" + key + "\" must be a string");
  }
}

FieldKind InterpretedKind(std::string_view key) {
  if (const FieldKind* kind = FindInterpreted(key)) return *kind;
  throw std::logic_error("trace field \"" + std::string(key) + "\" is interpreted but not in kInterpretedFields");
}

int64_t IntegerAt(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) throw std::invalid_argument(std::string("no \"") + key + "\"");
  if (IsIntegerPastInt64(*it)) throw std::invalid_argument(std::string("\"") + key + "\" is past int64's range");
  if (!IsInt64(*it)) throw std::invalid_argument(std::string("\"") + key + "\" must be an integer");
  return it->get<int64_t>();
}

std::string StringAt(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) throw std::invalid_argument(std::string("no \"") + key + "\"");
  if (!it->is_string()) throw std::invalid_argument(std::string("\"") + key + "\" must be a string");
  return it->get<std::string>();
}

// `text` as a JSON string. Plain ASCII is copied as it is; anything else
// goes through nlohmann (escapes, and bad UTF-8 replaced rather than thrown).
void AppendJsonString(std::string& out, std::string_view text) {
  bool plain = std::all_of(text.begin(), text.end(),
                           [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
  if (plain) {
    out += '"';
    out += text;
    out += '"';
  } else {
    out += Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

// Written by hand rather than through a Json object: the trace file gets a
// line per call, and this is several times cheaper (bench/trace.cc). Doubles
// still go through nlohmann, for its shortest round-trip form.
std::string EventToJson(const Event& event) {
  std::string out;
  out.reserve(160 + 32 * event.fields.size());
  out += "{\"event\":";
  AppendJsonString(out, event.name());
  out += ",\"entry\":";
  AppendJsonString(out, event.entry);
  out += ",\"signature\":";
  AppendJsonString(out, event.signature);
  out += ",\"thread\":" + std::to_string(event.thread);
  out += ",\"start_us\":" + std::to_string(event.start_us);
  out += ",\"duration_us\":" + std::to_string(event.duration_us);
  for (const auto& [key, value] : event.fields) {
    out += ',';
    // The engine never names a field like a common key; a sink of someone
    // else's must not be able to produce a line that reads back differently.
    AppendJsonString(out, IsCommonKey(key) ? "field_" + key : key);
    out += ':';
    if (const auto* i = std::get_if<int64_t>(&value)) {
      out += std::to_string(*i);
    } else if (const auto* d = std::get_if<double>(&value)) {
      out += Json(*d).dump();
    } else {
      AppendJsonString(out, std::get<std::string>(value));
    }
  }
  out += '}';
  return out;
}

Event EventFromJson(std::string_view line) {
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number past double's range
    throw std::invalid_argument(std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) throw std::invalid_argument("not a JSON object");
  Event e;
  std::string name = StringAt(j, "event");
  if (!ParseEventName(name, &e.kind)) throw std::invalid_argument("unknown event \"" + name + "\"");
  e.entry = StringAt(j, "entry");
  e.signature = StringAt(j, "signature");
  int64_t thread = IntegerAt(j, "thread");
  if (thread < 0) throw std::invalid_argument("\"thread\" must not be negative");
  e.thread = static_cast<uint64_t>(thread);
  e.start_us = IntegerAt(j, "start_us");
  e.duration_us = IntegerAt(j, "duration_us");
  if (e.duration_us < 0) throw std::invalid_argument("\"duration_us\" must not be negative");
  if (int64_t end; __builtin_add_overflow(e.start_us, e.duration_us, &end)) {
    throw std::invalid_argument("\"start_us\" + \"duration_us\" is past int64's range");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (IsCommonKey(it.key())) continue;
    const Json& v = it.value();
    if (v.is_number_integer()) {
      if (!IsInt64(v)) throw std::invalid_argument("\"" + it.key() + "\" is past int64's range");
      e.fields.push_back({it.key(), v.get<int64_t>()});
    } else if (v.is_number_float()) {
      e.fields.push_back({it.key(), v.get<double>()});
    } else if (v.is_string()) {
      e.fields.push_back({it.key(), v.get<std::string>()});
    } else {
      throw std::invalid_argument("field \"" + it.key() + "\" must be a number or a string");
    }
    CheckInterpretedField(it.key(), e.fields.back().second);
  }
  return e;
}

int64_t CountField(const Event& event, std::string_view key) {
  if (InterpretedKind(key) != FieldKind::kCount) throw std::logic_error("trace field \"" + std::string(key) + "\" is a string");
  const FieldValue* v = event.Find(key);
  const auto* count = v ? std::get_if<int64_t>(v) : nullptr;
  return count ? *count : 0;
}

std::string StringField(const Event& event, std::string_view key) {
  if (InterpretedKind(key) != FieldKind::kString) throw std::logic_error("trace field \"" + std::string(key) + "\" is a count");
  return event.Text(key);
}

std::vector<Event> ReadTrace(std::istream& in, const std::string& name) {
  std::vector<Event> events;
  std::string line;
  bool too_long = false;
  for (int number = 1; ReadLine(in, line, too_long, kMaxJsonLineBytes, /*skip_long_lines=*/false); ++number) {
    if (too_long) {
      throw std::runtime_error(name + ":" + std::to_string(number) + ": " + LineTooLong(kMaxJsonLineBytes));
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      events.push_back(EventFromJson(line));
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(name + ":" + std::to_string(number) + ": " + e.what());
    }
  }
  return events;
}

std::vector<Event> ReadTraceFile(const std::string& path) {
  std::ifstream in = OpenInputFile(path, std::ios::binary);
  return ReadTrace(in, path);
}

// ---- Chrome trace-event format -----------------------------------------------------
//
// Complete slices ("ph":"X") nest by time on their thread's track, so each
// job shows as its span (the swap, refused or failed event, which cover the
// job) with its stages inside. Flows use the v2 form: "bind_id" with
// "flow_out" on the enqueue's slice and "flow_in" on the job's end, which
// Perfetto and chrome://tracing both draw as an arrow.

namespace {

bool EndsJob(const Event& e) {
  return (e.kind == EventKind::kSwap || e.kind == EventKind::kRefused || e.kind == EventKind::kFailed ||
          e.kind == EventKind::kCancel) &&
         e.Find("job");
}

bool IsWorkerStage(EventKind k) {
  switch (k) {
    case EventKind::kPe:
    case EventKind::kAutodiff:
    case EventKind::kBatch:
    case EventKind::kPasses:
    case EventKind::kCodegen:
    case EventKind::kCompile:
    case EventKind::kSwap: return true;
    default: return false;
  }
}

// Catapult's reserved colour names (Perfetto colours by name instead, and
// the names differ by tier).
const char* TierColour(const std::string& tier) {
  if (tier == "interpreter") return "yellow";
  if (tier == "residual-interpreter") return "olive";
  return "good";
}

}  // namespace

std::string ChromeTrace(const std::vector<Event>& events) {
  int64_t origin = events.empty() ? 0 : events.front().start_us;
  for (const Event& e : events) origin = std::min(origin, e.start_us);

  // Name each thread by what it did: calls, jobs, or both.
  std::map<uint64_t, std::pair<bool, bool>> roles;  // thread -> (ran calls, ran jobs)
  for (const Event& e : events) {
    auto& [calls, jobs] = roles[e.thread];
    if (e.kind == EventKind::kCall) calls = true;
    if (IsWorkerStage(e.kind)) jobs = true;
  }

  Json out = Json::array();
  out.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 0}, {"args", {{"name", "pejit"}}}});
  for (const auto& [thread, role] : roles) {
    std::string what = role.first && role.second ? "calls+worker" : role.first ? "calls" : role.second ? "worker" : "engine";
    out.push_back({{"name", "thread_name"},
                   {"ph", "M"},
                   {"pid", 1},
                   {"tid", thread},
                   {"args", {{"name", what + " (thread " + std::to_string(thread) + ")"}}}});
    // Callers above workers.
    out.push_back({{"name", "thread_sort_index"},
                   {"ph", "M"},
                   {"pid", 1},
                   {"tid", thread},
                   {"args", {{"sort_index", (role.first ? 0 : 1000) + static_cast<int64_t>(thread)}}}});
  }

  // Parents before children at equal start: longer first.
  std::vector<const Event*> sorted;
  for (const Event& e : events) sorted.push_back(&e);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Event* a, const Event* b) {
    return a->start_us != b->start_us ? a->start_us < b->start_us : a->duration_us > b->duration_us;
  });

  for (const Event* ev : sorted) {
    const Event& e = *ev;
    Json args = Json::object();
    if (!e.entry.empty()) args["entry"] = e.entry;
    if (!e.signature.empty()) args["signature"] = e.signature;
    for (const auto& [key, value] : e.fields) std::visit([&args, &key = key](const auto& v) { args[key] = v; }, value);

    Json c;
    std::string name(e.name());
    if (e.kind == EventKind::kCall) {
      name = "call " + StringField(e, "tier");
      c["cname"] = TierColour(StringField(e, "tier"));
    } else if (e.kind == EventKind::kSwap || e.kind == EventKind::kRefused || e.kind == EventKind::kFailed) {
      if (e.Find("job")) name = "job " + e.entry + " " + e.signature + ": " + name;
    }
    c["name"] = name;
    c["cat"] = std::string(e.name());
    c["pid"] = 1;
    c["tid"] = e.thread;
    c["ts"] = e.start_us - origin;
    bool flow_out = e.kind == EventKind::kEnqueue && e.Find("job");
    bool flow_in = EndsJob(e);
    if (e.duration_us > 0 || flow_out || flow_in) {
      c["ph"] = "X";
      c["dur"] = std::max<int64_t>(1, e.duration_us);
    } else {
      c["ph"] = "i";
      c["s"] = "t";
    }
    if (flow_out || flow_in) {
      c["bind_id"] = e.Text("job");
      c[flow_out ? "flow_out" : "flow_in"] = true;
    }
    c["args"] = std::move(args);
    out.push_back(std::move(c));
  }
  Json doc = {{"traceEvents", std::move(out)}, {"displayTimeUnit", "ms"}};
  return doc.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace pejit
