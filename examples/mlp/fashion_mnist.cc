#include "examples/mlp/fashion_mnist.h"

#include <filesystem>
#include <stdexcept>

#include "examples/mlp/idx.h"

namespace pejit::mlp {

Split ReadSplit(const std::string& images_path, const std::string& labels_path) {
  IdxArray images = ReadIdx(images_path, 3), labels = ReadIdx(labels_path, 1);
  if (images.dims[1] != kImageSide || images.dims[2] != kImageSide) {
    throw std::runtime_error(images_path + ": images of " + std::to_string(images.dims[1]) + "x" +
                             std::to_string(images.dims[2]) + " pixels, expected 28x28");
  }
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n) {
    throw std::runtime_error(labels_path + ": " + std::to_string(labels.dims[0]) + " labels for the " +
                             std::to_string(n) + " images of " + images_path);
  }
  Split s{Tensor::Empty(DType::kF32, {n, kPixels}), Tensor::Empty(DType::kI64, {n})};
  float* pixels = s.images.data<float>();
  for (size_t i = 0; i < images.data.size(); ++i) pixels[i] = static_cast<float>(images.data[i]) / 255.0f;
  int64_t* y = s.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (labels.data[i] >= kClasses) {
      throw std::runtime_error(labels_path + ": label " + std::to_string(labels.data[i]) + " of example " +
                               std::to_string(i) + " is not a class (0-9)");
    }
    y[i] = labels.data[i];
  }
  return s;
}

namespace {

// `dir`/`name`, or `dir`/`name`.gz (what the Debian package installs).
std::string Find(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  for (const std::string& candidate : {name + ".gz", name}) {
    fs::path p = fs::path(dir) / candidate;
    if (fs::exists(p)) return p.string();
  }
  throw std::runtime_error("Fashion-MNIST not found: no " + (std::filesystem::path(dir) / name).string() +
                           "[.gz]. Install Debian's dataset-fashion-mnist with `bash tools/setup.sh mlp` (as root), "
                           "or give the folder holding the IDX files with --data");
}

}  // namespace

FashionMnist LoadFashionMnist(const std::string& dir) {
  // Every file found before any is read: a missing one fails at once.
  std::string train_images = Find(dir, "train-images-idx3-ubyte"), train_labels = Find(dir, "train-labels-idx1-ubyte");
  std::string test_images = Find(dir, "t10k-images-idx3-ubyte"), test_labels = Find(dir, "t10k-labels-idx1-ubyte");
  return {ReadSplit(train_images, train_labels), ReadSplit(test_images, test_labels)};
}

}  // namespace pejit::mlp
