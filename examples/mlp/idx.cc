#include "examples/mlp/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace pejit::mlp {
namespace {

std::string Hex(uint32_t v, int digits = 8) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}

// The whole file, decompressed when it is gzip (zlib's gzread passes other
// files through unchanged).
std::vector<uint8_t> ReadAll(const std::string& path) {
  errno = 0;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) {
    throw std::runtime_error(path + ": cannot open (" + (errno ? std::strerror(errno) : "out of memory") + ")");
  }
  std::vector<uint8_t> bytes;
  constexpr size_t kChunk = size_t{1} << 20;
  for (;;) {
    size_t have = bytes.size();
    bytes.resize(have + kChunk);
    int n = gzread(f.get(), bytes.data() + have, static_cast<unsigned>(kChunk));
    int err = Z_OK;
    const char* message = gzerror(f.get(), &err);
    if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
      // A truncated gzip stream is Z_BUF_ERROR, "unexpected end of file";
      // zlib puts the path in front of its messages, and so do we.
      std::string what = message;
      if (what.starts_with(path + ": ")) what.erase(0, path.size() + 2);
      throw std::runtime_error(path + ": bad gzip data (" + what + ")");
    }
    bytes.resize(have + static_cast<size_t>(n));
    if (n == 0) break;
  }
  return bytes;
}

uint32_t BigEndian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

}  // namespace

IdxArray ReadIdx(const std::string& path, int rank) {
  std::vector<uint8_t> bytes = ReadAll(path);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < 4) {
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes, too short for an IDX file");
  }
  uint32_t magic = BigEndian32(bytes.data());
  if (magic != IdxMagic(rank)) {
    std::string what = magic >> 16 != 0 ? "not an IDX file"
                       : (magic >> 8 & 0xFF) != 0x08
                           ? "elements of type code " + Hex(magic >> 8 & 0xFF, 2) + ", not unsigned bytes (0x08)"
                           : std::to_string(magic & 0xFF) + " dimensions, not " + std::to_string(rank);
    throw std::runtime_error(path + ": bad magic number " + Hex(magic) + ", expected " + Hex(IdxMagic(rank)) + " (" +
                             what + ")");
  }
  if (bytes.size() < header) {
    throw std::runtime_error(path + ": truncated header (" + std::to_string(bytes.size()) + " bytes, " +
                             std::to_string(header) + " needed for " + std::to_string(rank) + " dimensions)");
  }
  IdxArray out;
  uint64_t elements = 1;
  std::string sizes;
  for (int i = 0; i < rank; ++i) {
    uint32_t d = BigEndian32(bytes.data() + 4 + 4 * i);
    out.dims.push_back(d);
    sizes += (i ? " x " : "") + std::to_string(d);
    elements *= d;
    // Past 4 GiB the header is corrupt, whatever the file's size.
    if (elements > (uint64_t{1} << 32)) throw std::runtime_error(path + ": implausible sizes " + sizes + "...");
  }
  const uint64_t data = bytes.size() - header;
  if (data != elements) {
    throw std::runtime_error(path + (data < elements ? ": truncated" : ": trailing bytes") + ": the header says " +
                             sizes + " = " + std::to_string(elements) + " bytes of data, the file has " +
                             std::to_string(data));
  }
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

}  // namespace pejit::mlp
