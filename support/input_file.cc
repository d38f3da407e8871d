#include "support/input_file.h"

#include <sys/stat.h>

#include <stdexcept>

namespace pejit {

std::ifstream OpenInputFile(const std::string& path, std::ios::openmode mode) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw std::runtime_error("cannot read " + path + ": it is a directory");
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      throw std::runtime_error("cannot read " + path + ": it is a device, not a file");
    }
  }
  std::ifstream in(path, mode);
  if (!in) throw std::runtime_error("cannot read " + path);
  return in;
}

}  // namespace pejit
