// \file IDX files, the format of MNIST and Fashion-MNIST: a big-endian
// header (magic number, dimension sizes) followed by the raw elements.
//
// Only arrays of unsigned bytes (type code 0x08) are read, plain or
// gzip-compressed (told apart by their contents, not their names), since
// that is all the MNIST family uses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pejit::mlp {

// The magic number of an array of unsigned bytes with `rank` dimensions:
// 0x00000801 for labels, 0x00000803 for images.
constexpr uint32_t IdxMagic(int rank) { return 0x00000800u | static_cast<uint32_t>(rank); }

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;  // row-major, as many bytes as dims multiply to
};

// Reads the IDX file at `path`, which must hold an array of `rank`
// dimensions. Throws std::runtime_error naming the file and what is wrong:
// it cannot be opened, is not valid gzip, has another magic number, or its
// data is shorter or longer than its header says.
IdxArray ReadIdx(const std::string& path, int rank);

}  // namespace pejit::mlp
