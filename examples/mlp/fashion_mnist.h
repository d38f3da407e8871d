// \file Fashion-MNIST (Xiao et al., 2017) from Debian's dataset-fashion-mnist
// package: 60000 training and 10000 test images of 28x28 grey pixels, each
// of one of 10 kinds of clothing.
#pragma once

#include <cstdint>
#include <string>

#include "ops/tensor.h"

namespace pejit::mlp {

// Where dataset-fashion-mnist installs its files (`dpkg -L dataset-fashion-mnist`).
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr int kImageSide = 28, kPixels = kImageSide * kImageSide, kClasses = 10;

// One split: images (N, 784) f32 with pixels scaled from 0..255 to [0, 1],
// row-major within an image; labels (N,) i64 in [0, 10).
struct Split {
  Tensor images;
  Tensor labels;
  int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

// Reads a split from its two IDX files (plain or .gz). Throws
// std::runtime_error naming the file when either is unreadable or malformed
// (idx.h), images are not 28x28, a label is 10 or more, or the two files
// count different numbers of examples.
Split ReadSplit(const std::string& images_path, const std::string& labels_path);

struct FashionMnist {
  Split train, test;
};

// Reads `dir`/{train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or
// with .gz. A missing file throws std::runtime_error saying how to install
// the data set (`bash tools/setup.sh mlp`).
FashionMnist LoadFashionMnist(const std::string& dir = kFashionMnistDir);

}  // namespace pejit::mlp
