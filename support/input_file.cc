#include "support/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace pejit {

std::ifstream OpenInputFile(const std::string& path, std::ios::openmode mode) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw std::runtime_error("cannot read " + path + ": it is a directory");
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      throw std::runtime_error("cannot read " + path + ": it is a device, not a file");
    }
    // Opening one blocks until something writes to it, which may be never.
    if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
      throw std::runtime_error("cannot read " + path + ": it is a " + (S_ISFIFO(st.st_mode) ? "FIFO" : "socket") +
                               ", not a file (write what it gives to a file first)");
    }
  }
  std::ifstream in(path, mode);
  if (!in) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  return in;
}

bool ReadLine(std::istream& in, std::string& line, bool& too_long, size_t max_bytes, bool skip_long_lines) {
  line.clear();
  too_long = false;
  std::streambuf* buf = in.rdbuf();
  int c = buf->sbumpc();
  if (c == std::char_traits<char>::eof()) {
    in.setstate(std::ios::eofbit);
    return false;
  }
  for (; c != std::char_traits<char>::eof() && c != '\n'; c = buf->sbumpc()) {
    if (line.size() < max_bytes) {
      line.push_back(static_cast<char>(c));
    } else {
      too_long = true;
      if (!skip_long_lines) break;
    }
  }
  if (too_long) line.clear();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

std::string UserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || !cwd || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(cwd) / path).string();
}

std::string LineTooLong(size_t max_bytes) { return "line longer than " + std::to_string(max_bytes) + " bytes"; }

}  // namespace pejit
