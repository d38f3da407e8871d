#include "train/checkpoint.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>

namespace pejit {
namespace {

constexpr const char* kFormat = "pejit checkpoint";
constexpr int kVersion = 1;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw std::runtime_error(path + ": " + message);
}

std::string SystemError() { return std::strerror(errno); }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void SaveCheckpoint(const std::string& path, const Checkpoint& c) {
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < c.params.size(); ++i) {
    if (c.params[i].dtype() != DType::kF32) Fail(path, "parameter " + std::to_string(i) + " is not f32");
    tensors.push_back({{"name", "param." + std::to_string(i)}, {"shape", c.params[i].shape()}});
  }
  for (size_t i = 0; i < c.optimizer.buffers.size(); ++i) {
    tensors.push_back({{"name", "optimizer." + std::to_string(i)}, {"shape", {c.optimizer.buffers[i].size()}}});
  }
  nlohmann::json header = {{"format", kFormat},
                           {"version", kVersion},
                           {"epoch", c.epoch},
                           {"meta", c.meta},
                           {"optimizer", {{"kind", c.optimizer.kind}, {"steps", c.optimizer.steps}}},
                           {"tensors", tensors}};
  std::string text = header.dump() + "\n";

  const std::string temporary = path + ".tmp";
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(temporary.c_str(), "wb"));
  if (!f) Fail(temporary, "cannot write: " + SystemError());
  bool ok = std::fwrite(text.data(), 1, text.size(), f.get()) == text.size();
  for (const Tensor& t : c.params) ok = ok && std::fwrite(t.raw_data(), 1, t.nbytes(), f.get()) == t.nbytes();
  for (const auto& b : c.optimizer.buffers) {
    ok = ok && std::fwrite(b.data(), sizeof(float), b.size(), f.get()) == b.size();
  }
  // On disk before the rename, so that the name never points at a torn file.
  ok = ok && std::fflush(f.get()) == 0 && ::fsync(::fileno(f.get())) == 0;
  if (!ok) {
    std::string error = SystemError();
    f.reset();
    std::remove(temporary.c_str());
    Fail(temporary, "cannot write: " + error);
  }
  if (std::fclose(f.release()) != 0) {
    std::string error = SystemError();
    std::remove(temporary.c_str());
    Fail(temporary, "cannot write: " + error);
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::remove(temporary.c_str());
    Fail(path, "cannot rename " + temporary + " onto it: " + ec.message());
  }
}

Checkpoint LoadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path, "cannot read: " + SystemError());
  std::string line;
  std::getline(in, line);
  nlohmann::json header = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object() || header.value("format", "") != kFormat) Fail(path, "not a pejit checkpoint");
  if (header.value("version", 0) != kVersion) {
    Fail(path, "checkpoint version " + header["version"].dump() + ", this program reads version " +
                   std::to_string(kVersion));
  }
  Checkpoint c;
  std::vector<std::pair<std::string, Shape>> tensors;
  try {
    c.epoch = header.at("epoch").get<int64_t>();
    c.meta = header.at("meta");
    c.optimizer.kind = header.at("optimizer").at("kind").get<std::string>();
    c.optimizer.steps = header.at("optimizer").at("steps").get<int64_t>();
    for (const auto& t : header.at("tensors")) {
      tensors.emplace_back(t.at("name").get<std::string>(), t.at("shape").get<Shape>());
    }
  } catch (const nlohmann::json::exception& e) {
    Fail(path, std::string("bad checkpoint header: ") + e.what());
  }
  for (const auto& [name, shape] : tensors) {
    for (int64_t d : shape) {
      if (d < 0 || d > (int64_t{1} << 32)) Fail(path, "tensor " + name + " has a bad shape");
    }
    Tensor t = Tensor::Zeros(DType::kF32, shape);
    in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
    if (static_cast<size_t>(in.gcount()) != t.nbytes()) Fail(path, "truncated in tensor " + name);
    if (name.rfind("param.", 0) == 0) {
      c.params.push_back(t);
    } else if (name.rfind("optimizer.", 0) == 0 && shape.size() == 1) {
      c.optimizer.buffers.emplace_back(t.data<float>(), t.data<float>() + t.numel());
    } else {
      Fail(path, "unknown tensor " + name);
    }
  }
  if (in.peek() != std::char_traits<char>::eof()) Fail(path, "bytes after the last tensor");
  return c;
}

void RestoreParameters(const Value& params, const std::vector<Tensor>& saved) {
  std::vector<Tensor> leaves = ParameterLeaves(params);
  if (leaves.size() != saved.size()) {
    throw std::invalid_argument("the checkpoint has " + std::to_string(saved.size()) + " parameter tensors, the model " +
                                std::to_string(leaves.size()));
  }
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (leaves[i].shape() != saved[i].shape()) {
      throw std::invalid_argument("parameter " + std::to_string(i) + " has shape " + ShapeToString(saved[i].shape()) +
                                  " in the checkpoint, " + ShapeToString(leaves[i].shape()) + " in the model");
    }
  }
  for (size_t i = 0; i < leaves.size(); ++i) std::memcpy(leaves[i].raw_data(), saved[i].raw_data(), saved[i].nbytes());
}

}  // namespace pejit
