// \file Source locations, and the error that carries one.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

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

// An error in a program: what() is "file:line:col: message".
class IrError : public std::runtime_error {
 public:
  IrError(const SourceLoc& loc, const std::string& message)
      : std::runtime_error(loc.known() ? loc.ToString() + ": " + message : message), loc_(loc), message_(message) {}
  const SourceLoc& loc() const { return loc_; }
  const std::string& message() const { return message_; }  // without the location

 private:
  SourceLoc loc_;
  std::string message_;
};

}  // namespace pejit
