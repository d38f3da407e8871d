// \file Trace files: events as JSON lines, read back, and turned into
// Chrome's trace-event format.
//
// One event per line, one JSON object per event (docs/tracing.md has the
// schema of each kind):
//   {"event":"swap","entry":"loss","signature":"3f2a91c0","thread":2,
//    "start_us":81234567,"duration_us":35012,"job":7,"tier":"native",...}
// The six common keys come first, in that order; the event's own fields
// follow as top-level keys (integers, floats or strings), so that jq and
// grep read a trace without knowing pejit.
#pragma once

#include <istream>
#include <string>
#include <string_view>
#include <vector>

#include "scheduler/events.h"

namespace pejit {

// The JSON object of `event`, on one line, without the newline. Strings that
// are not UTF-8 have their bad bytes replaced, never throw.
std::string EventToJson(const Event& event);

// The event of one JSON line; throws std::invalid_argument saying what is
// wrong ("not JSON: ...", "unknown event \"foo\"", "\"thread\" must be an
// integer", ...).
Event EventFromJson(std::string_view line);

// Every event of a trace, in file order; blank lines are skipped. Throws
// std::runtime_error naming the file and line of the first bad one
// ("trace.jsonl:12: unknown event \"foo\"").
std::vector<Event> ReadTrace(std::istream& in, const std::string& name);
std::vector<Event> ReadTraceFile(const std::string& path);

// A field the summary (trace_stats.h) and the Chrome export interpret, 0 or
// "" when the event has none. ReadTrace has checked the type of each such
// field (a count >= 0, or a string) by one table of names, and these throw
// std::logic_error for a name the table lacks: a reader that starts to
// interpret a new field must list it, so that files are checked for it.
int64_t CountField(const Event& event, std::string_view key);
std::string StringField(const Event& event, std::string_view key);

// The events as Chrome trace-event JSON (opens in Perfetto and
// chrome://tracing): one track per thread, named "calls" or "worker" by what
// ran on it; calls as slices named by their tier ("call native"), job stages
// as nested slices (the job's span, then pe, autodiff, passes, codegen,
// compile), instant events as instants, and a flow arrow from each enqueue
// to the end of its job (swap, refused, failed or cancel). Times are
// relative to the first event.
std::string ChromeTrace(const std::vector<Event>& events);

}  // namespace pejit
