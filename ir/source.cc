#include "ir/source.h"

namespace pejit {

std::string SourceLoc::ToString() const {
  if (!known()) return "<builder>";
  return (file ? *file : std::string("<input>")) + ":" + std::to_string(line) + ":" + std::to_string(col);
}

}  // namespace pejit
