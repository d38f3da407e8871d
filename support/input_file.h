// \file Opening a file of outside input (programs, arguments, calls, traces,
// data sets) with one refusal for what is not one.
#pragma once

#include <cstddef>
#include <fstream>
#include <istream>
#include <string>

namespace pejit {

// A path the user typed: `bazel run` starts programs in their runfiles, so
// a relative path is taken relative to where the command was typed
// (BUILD_WORKING_DIRECTORY); otherwise, and for "" or an absolute path, as it is.
std::string UserPath(const std::string& path);

// Opens `path` for reading or throws std::runtime_error naming it. A
// directory or a device is refused before anything is read: /dev/zero has
// no line end and no end, so a reader would hold or skip bytes forever
// (issue 24); so is a FIFO or socket, whose open waits for a writer that
// may never come (issue 52). Regular files are read.
std::ifstream OpenInputFile(const std::string& path, std::ios::openmode mode = std::ios::in);

// What a line of a JSON-lines file (calls, traces) may hold: a big tensor's
// arguments fit; a pipe without newlines does not grow a string to all memory.
inline constexpr size_t kMaxJsonLineBytes = size_t{256} << 20;

// Reads one line (without its '\n', or a '\r' before it) into `line`; false
// at the end of the input. A line longer than `max_bytes` leaves `line` empty
// and sets `too_long`. Then with `skip_long_lines` the rest of it is read (at
// constant memory) so that the next call returns the next line, for readers
// that go on past a bad line; without it reading stops there, for readers
// that give up at once: an endless pipe without a newline is not read forever.
bool ReadLine(std::istream& in, std::string& line, bool& too_long, size_t max_bytes, bool skip_long_lines);
// "line longer than N bytes": what every reader says after ReadLine set
// `too_long`, behind its own file:line.
std::string LineTooLong(size_t max_bytes);

}  // namespace pejit
