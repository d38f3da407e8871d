// \file Opening a file of outside input (programs, arguments, calls, traces,
// data sets) with one refusal for what is not one.
#pragma once

#include <fstream>
#include <string>

namespace pejit {

// Opens `path` for reading or throws std::runtime_error naming it. A
// directory or a device is refused before anything is read: /dev/zero has
// no line end and no end, so a reader would hold or skip bytes forever
// (issue 24). Regular files, pipes and sockets are read.
std::ifstream OpenInputFile(const std::string& path, std::ios::openmode mode = std::ios::in);

}  // namespace pejit
