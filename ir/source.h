// \file Source locations, and the error that carries one.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "support/bounded.h"

namespace pejit {

struct SourceLoc {
  std::shared_ptr<const std::string> file;  // null for programs built in C++
  int line = 0;                             // 1-based; 0 when unknown
  int col = 0;
  // Which lane of a minibatch's work the operation belongs to (jit/lanes.h):
  // set by batching, kept by the passes after it, -1 for work of no lane.
  // Where it runs, never what it computes.
  int lane = -1;

  bool known() const { return line > 0; }
  // "treelstm.pj:14:9", "<builder>" when unknown.
  std::string ToString() const;
};

// An error in a program: what() is "file:line:col: message", the message
// bounded (what it echoes of the program may be megabytes: support/bounded.h).
class IrError : public std::runtime_error {
 public:
  IrError(const SourceLoc& loc, const std::string& message)
      : std::runtime_error(loc.known() ? loc.ToString() + ": " + Bounded(message, kMaxMessage) : Bounded(message, kMaxMessage)),
        loc_(loc),
        message_(Bounded(message, kMaxMessage)) {}
  static constexpr size_t kMaxMessage = 2000;
  const SourceLoc& loc() const { return loc_; }
  const std::string& message() const { return message_; }  // without the location

 private:
  SourceLoc loc_;
  std::string message_;
};

}  // namespace pejit
