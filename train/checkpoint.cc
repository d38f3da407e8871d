#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>

#include "support/hash.h"
#include "support/json_integer.h"
#include "train/finite.h"

namespace pejit {
namespace {

constexpr const char* kFormat = "pejit checkpoint";
constexpr int kVersion = 2;
// "fnv1a64 " + 16 hex digits + "\n".
constexpr size_t kTrailerBytes = 8 + 16 + 1;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw std::runtime_error(path + ": " + message);
}

std::string SystemError() { return std::strerror(errno); }

std::string Trailer(uint64_t checksum) {
  char text[kTrailerBytes + 1];
  std::snprintf(text, sizeof text, "fnv1a64 %016" PRIx64 "\n", checksum);
  return text;
}

void RequireFinite(const std::string& path, const std::string& what, const float* v, int64_t n, const char* verb) {
  int64_t i = FirstNonFinite(v, n);
  if (i >= 0) {
    Fail(path, what + " holds " + std::to_string(v[i]) + " at index " + std::to_string(i) + " (" + verb + ")");
  }
}

// Why an existing `path` is not a regular file; "" for one, or for none.
// A destination is not followed through a link (a rename would replace the
// link); a file to read is.
std::string NotARegularFile(const std::string& path, bool follow_links) {
  struct stat st;
  if ((follow_links ? ::stat(path.c_str(), &st) : ::lstat(path.c_str(), &st)) != 0) return "";
  if (S_ISLNK(st.st_mode)) return "is a symbolic link (give the file it points to, or another name)";
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (!S_ISREG(st.st_mode)) return "is not a regular file (a device, pipe or socket)";
  return "";
}

struct FdCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Writes and hashes as it goes.
class HashingWriter {
 public:
  explicit HashingWriter(std::FILE* f) : f_(f) {}
  bool Write(const void* data, size_t n) {
    checksum_ = Fnv1a(data, n, checksum_);
    return std::fwrite(data, 1, n, f_) == n;
  }
  uint64_t checksum() const { return checksum_; }

 private:
  std::FILE* f_;
  uint64_t checksum_ = kFnv1aStart;
};

}  // namespace

void CheckCheckpointDestination(const std::string& path, const std::vector<std::string>& inputs) {
  if (path.empty()) Fail("(checkpoint)", "the path is empty");
  std::string unfit = NotARegularFile(path, /*follow_links=*/false);
  if (!unfit.empty()) Fail(path, "cannot hold a checkpoint: it " + unfit);
  std::error_code ec;
  for (const std::string& input : inputs) {
    if (!input.empty() && std::filesystem::equivalent(path, input, ec)) {
      Fail(path, "is " + input + ", which this run reads: a checkpoint would overwrite it");
    }
  }
  // Whether the directory takes the temporary file, by making it.
  const std::string temporary = path + ".tmp";
  if (std::string in_the_way = NotARegularFile(temporary, /*follow_links=*/false); !in_the_way.empty()) {
    Fail(temporary, "is in the way of saving: it " + in_the_way);
  }
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) Fail(temporary, "cannot write: " + SystemError());
  ::close(fd);
  ::unlink(temporary.c_str());
}

void SaveCheckpoint(const std::string& path, const Checkpoint& c) {
  std::string unfit = NotARegularFile(path, /*follow_links=*/false);
  if (!unfit.empty()) Fail(path, "cannot hold a checkpoint: it " + unfit);
  if (c.epoch < 0 || c.epoch > INT_MAX) Fail(path, "epoch " + std::to_string(c.epoch) + " is out of range");
  nlohmann::json tensors = nlohmann::json::array();
  for (size_t i = 0; i < c.params.size(); ++i) {
    const std::string name = "param." + std::to_string(i);
    if (c.params[i].dtype() != DType::kF32) Fail(path, "parameter " + std::to_string(i) + " is not f32");
    RequireFinite(path, "parameter " + std::to_string(i), c.params[i].data<float>(), c.params[i].numel(),
                  "not saved: the previous checkpoint is kept");
    tensors.push_back({{"name", name}, {"shape", c.params[i].shape()}});
  }
  for (size_t i = 0; i < c.optimizer.buffers.size(); ++i) {
    const auto& b = c.optimizer.buffers[i];
    RequireFinite(path, "optimizer buffer " + std::to_string(i), b.data(), static_cast<int64_t>(b.size()),
                  "not saved: the previous checkpoint is kept");
    tensors.push_back({{"name", "optimizer." + std::to_string(i)}, {"shape", {b.size()}}});
  }
  nlohmann::json header = {{"format", kFormat},
                           {"version", kVersion},
                           {"epoch", c.epoch},
                           {"meta", c.meta},
                           {"optimizer", {{"kind", c.optimizer.kind}, {"steps", c.optimizer.steps}}},
                           {"tensors", tensors}};
  std::string text = header.dump() + "\n";

  const std::string temporary = path + ".tmp";
  // O_NOFOLLOW: a link planted at the temporary name is not written through.
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) Fail(temporary, "cannot write: " + SystemError());
  std::unique_ptr<std::FILE, FdCloser> f(::fdopen(fd, "wb"));
  if (!f) {
    ::close(fd);
    Fail(temporary, "cannot write: " + SystemError());
  }
  HashingWriter out(f.get());
  bool ok = out.Write(text.data(), text.size());
  for (const Tensor& t : c.params) ok = ok && out.Write(t.raw_data(), t.nbytes());
  for (const auto& b : c.optimizer.buffers) ok = ok && out.Write(b.data(), b.size() * sizeof(float));
  const std::string trailer = Trailer(out.checksum());
  ok = ok && std::fwrite(trailer.data(), 1, trailer.size(), f.get()) == trailer.size();
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
  // A device or pipe (/dev/zero) would be read forever.
  std::string unfit = NotARegularFile(path, /*follow_links=*/true);
  if (!unfit.empty()) Fail(path, "cannot be read as a checkpoint: it " + unfit);
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail(path, "cannot read: " + SystemError());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) Fail(path, "cannot read: " + SystemError());
  return ParseCheckpoint(bytes, path);
}

Checkpoint ParseCheckpoint(std::string_view bytes, const std::string& path) {
  const size_t newline = std::min(bytes.find('\n'), bytes.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(0, newline));
  } catch (const nlohmann::json::exception&) {  // parse_error, and out_of_range for a number past double's range
    Fail(path, "not a pejit checkpoint");
  }
  if (!header.is_object() || !header.contains("format") || header["format"] != kFormat) {
    Fail(path, "not a pejit checkpoint");
  }
  if (!header.contains("version") || header["version"] != kVersion) {
    Fail(path, "checkpoint version " + (header.contains("version") ? header["version"].dump() : std::string("(none)")) +
                   ", this program reads version " + std::to_string(kVersion));
  }
  Checkpoint c;
  std::vector<std::pair<std::string, Shape>> tensors;
  // nlohmann converts a float such as 1e40 to int64 without a check (UB):
  // counts must be written as integers.
  auto integer = [&](const nlohmann::json& j, const std::string& what) -> int64_t {
    if (!IsInt64(j)) {
      Fail(path, "bad checkpoint header: " + what + " is " + j.dump() +
                     (IsIntegerPastInt64(j) ? ", out of int64's range" : ", not an integer"));
    }
    return j.get<int64_t>();
  };
  try {
    c.epoch = integer(header.at("epoch"), "the epoch");
    c.meta = header.at("meta");
    c.optimizer.kind = header.at("optimizer").at("kind").get<std::string>();
    c.optimizer.steps = integer(header.at("optimizer").at("steps"), "the optimizer's step count");
    for (const auto& t : header.at("tensors")) {
      std::string name = t.at("name").get<std::string>();
      Shape shape;
      for (const auto& d : t.at("shape")) shape.push_back(integer(d, "a dimension of tensor " + name));
      tensors.emplace_back(std::move(name), std::move(shape));
    }
  } catch (const nlohmann::json::exception& e) {
    Fail(path, std::string("bad checkpoint header: ") + e.what());
  }
  if (c.epoch < 0 || c.epoch > INT_MAX) Fail(path, "epoch " + std::to_string(c.epoch) + " is out of range (0 to 2^31 - 1)");
  // Adam's bias correction raises its betas to the step count, and the next
  // step adds one: a count past 2^53 (exact in a double; no run takes as
  // many) is not a run's.
  if (c.optimizer.steps < 0 || c.optimizer.steps > (int64_t{1} << 53)) {
    Fail(path, "optimizer step count " + std::to_string(c.optimizer.steps) + " is out of range (0 to 2^53)");
  }

  if (newline == bytes.size()) Fail(path, "truncated after its header");
  // Sizes first (none can overflow: each is bounded by the file's length),
  // then the checksum, then the values.
  const size_t payload_start = newline + 1;
  std::vector<size_t> counts;
  size_t payload = 0;
  for (const auto& [name, shape] : tensors) {
    size_t count = 1;
    for (int64_t d : shape) {
      if (d < 0) Fail(path, "tensor " + name + " has a negative dimension");
      if (d != 0 && count > bytes.size() / static_cast<size_t>(d)) Fail(path, "truncated in tensor " + name);
      count *= static_cast<size_t>(d);
    }
    if (count > (bytes.size() - std::min(bytes.size(), payload_start + payload)) / sizeof(float)) {
      Fail(path, "truncated in tensor " + name);
    }
    counts.push_back(count);
    payload += count * sizeof(float);
  }
  const size_t body = payload_start + payload;
  if (bytes.size() < body + kTrailerBytes) Fail(path, "truncated before its checksum");
  if (bytes.size() > body + kTrailerBytes) {
    // A header edited to list a tensor fewer, or bytes appended to the file.
    Fail(path, "its header's " + std::to_string(tensors.size()) + " tensors take " + std::to_string(payload) +
                   " bytes, but " + std::to_string(bytes.size() - payload_start - kTrailerBytes) +
                   " bytes lie between the header and a checksum line at the end: the header does not describe the "
                   "file");
  }
  if (bytes.substr(body) != Trailer(Fnv1a(bytes.data(), body))) {
    Fail(path, "checksum mismatch: the file is damaged (its last line is \"" +
                   std::string(bytes.substr(body, kTrailerBytes - 1)) + "\", its bytes hash to \"" +
                   Trailer(Fnv1a(bytes.data(), body)).substr(0, kTrailerBytes - 1) + "\")");
  }
  size_t at = payload_start;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, shape] = tensors[i];
    Tensor t = Tensor::Zeros(DType::kF32, shape);
    std::memcpy(t.raw_data(), bytes.data() + at, counts[i] * sizeof(float));
    at += counts[i] * sizeof(float);
    RequireFinite(path, "tensor " + name, t.data<float>(), t.numel(), "the run that saved it had diverged");
    if (name.rfind("param.", 0) == 0) {
      c.params.push_back(t);
    } else if (name.rfind("optimizer.", 0) == 0 && shape.size() == 1) {
      c.optimizer.buffers.emplace_back(t.data<float>(), t.data<float>() + t.numel());
    } else {
      Fail(path, "unknown tensor " + name);
    }
  }
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
