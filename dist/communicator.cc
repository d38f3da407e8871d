#include "dist/communicator.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "support/bounded.h"

namespace pejit::dist {
namespace {

// Launched by mpirun (Open MPI sets these in every rank's environment).
bool UnderMpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK"); }

void Check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(what) + ": " + std::string(text, static_cast<size_t>(length)));
}

// inout[i] = in[i] + inout[i], `in` holding the lower ranks' partial sum.
// Registered as non-commutative: MPI then keeps the operands in rank order,
// so the association, and the bits of the result, do not depend on timing.
void SumInRankOrder(void* in, void* inout, int* length, MPI_Datatype*) {
  const float* a = static_cast<const float*>(in);
  float* b = static_cast<float*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = a[i] + b[i];
}

char stop_message[256];
size_t stop_message_length = 0;

// mpirun sends SIGTERM to the other ranks when one fails: say so on each
// (async-signal-safe: a prepared message and _exit).
void OnTerminate(int) {
  ssize_t ignored = write(STDERR_FILENO, stop_message, stop_message_length);
  (void)ignored;
  _exit(143);
}

// Prepares the message and installs the handler.
void SayWhyOnTerminate(const std::string& rank, const std::string& size) {
  int n = std::snprintf(stop_message, sizeof stop_message,
                        "pejit: rank %s of %s: stopped by mpirun (another rank failed: see its message above, "
                        "or the job was cancelled)\n",
                        rank.c_str(), size.c_str());
  stop_message_length = static_cast<size_t>(std::clamp(n, 0, static_cast<int>(sizeof stop_message) - 1));
  struct sigaction action = {};
  action.sa_handler = OnTerminate;
  sigaction(SIGTERM, &action, nullptr);
}

// A tag of its own for the roll call after a deadline.
constexpr int kRollCallTag = 7001;

// Waits for `requests`, a collective every rank should join, at most
// `deadline` seconds; past it, a roll call: each rank that arrived tells the
// others which collective it waits in, listens for theirs a moment, and ends
// the run naming the ranks it did not hear from (a stopped rank, a wedged
// node). Collectives are numbered alike on every rank: same code, same order.
void WaitOrAbort(Communicator& group, std::vector<MPI_Request>& requests, double deadline, int64_t collective,
                 const char* what) {
  const auto start = std::chrono::steady_clock::now();
  int done = 0;
  for (int spins = 0;; ++spins) {
    Check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > deadline) break;
    if (spins > 1000) usleep(spins > 100000 ? 1000 : 50);  // a long wait sleeps, a short one spins
  }
  const int rank = group.rank(), size = group.size();
  std::vector<int64_t> mine(static_cast<size_t>(size), collective);
  std::vector<MPI_Request> sends(static_cast<size_t>(size), MPI_REQUEST_NULL);
  for (int r = 0; r < size; ++r) {
    if (r != rank) MPI_Isend(&mine[static_cast<size_t>(r)], 1, MPI_INT64_T, r, kRollCallTag, MPI_COMM_WORLD, &sends[static_cast<size_t>(r)]);
  }
  std::vector<bool> heard(static_cast<size_t>(size), false);
  heard[static_cast<size_t>(rank)] = true;
  const auto roll = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - roll < std::chrono::seconds(3)) {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kRollCallTag, MPI_COMM_WORLD, &flag, &status);
    if (!flag) {
      usleep(1000);
      continue;
    }
    int64_t theirs = -1;
    MPI_Recv(&theirs, 1, MPI_INT64_T, status.MPI_SOURCE, kRollCallTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (theirs == collective) heard[static_cast<size_t>(status.MPI_SOURCE)] = true;
  }
  std::string missing;
  for (int r = 0; r < size; ++r) {
    if (!heard[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  char why[256];
  std::snprintf(why, sizeof why, "%s %lld waited %.0f s (--allreduce-deadline) for rank%s %s, which did not arrive",
                what, static_cast<long long>(collective), deadline, missing.find(',') == std::string::npos ? "" : "s",
                missing.empty() ? "(none answered the roll call)" : missing.c_str());
  group.Abort(why);
}

}  // namespace

void Communicator::set_deadline_seconds(double seconds) {
  if (!(seconds > 0)) throw std::invalid_argument("the collectives' deadline must be a positive number of seconds");
  deadline_seconds_ = seconds;
}

Communicator& Communicator::World() {
  static Communicator world;
  return world;
}

Communicator::Communicator() {
  if (!UnderMpirun()) return;
  // Before MPI_Init, from mpirun's environment: a rank that fails as soon as
  // MPI is up must find the others ready to say why they stop.
  const char* env_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* env_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  SayWhyOnTerminate(env_rank ? env_rank : "?", env_size ? env_size : "?");
  int provided = 0;
  Check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  mpi_ = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  Check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  Check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  SayWhyOnTerminate(std::to_string(rank_), std::to_string(size_));  // MPI's word, and our handler again
}

Communicator::~Communicator() {
  int finalized = 0;
  if (mpi_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
}

void Communicator::set_bucket_bytes(size_t bytes) {
  if (bytes < sizeof(float)) throw std::invalid_argument("bucket_bytes must hold at least one f32");
  bucket_bytes_ = bytes;
}

void Communicator::AllReduceSum(std::vector<Tensor>& tensors) {
  size_t total = 0;
  for (const Tensor& t : tensors) {
    if (t.dtype() != DType::kF32) {
      throw std::invalid_argument("AllReduceSum: tensors must be f32, got " + t.type().ToString());
    }
    total += static_cast<size_t>(t.numel());
  }
  if (!mpi_ || size_ == 1 || total == 0) return;
  const auto start = std::chrono::steady_clock::now();
  static MPI_Op op = [] {
    MPI_Op made;
    Check(MPI_Op_create(&SumInRankOrder, /*commute=*/0, &made), "MPI_Op_create");
    return made;
  }();
  staging_.resize(total);
  const size_t bucket = std::max<size_t>(1, bucket_bytes_ / sizeof(float));
  std::vector<MPI_Request> requests;
  // Pack bucket by bucket, each reduction started once its bucket is full.
  size_t tensor = 0, offset_in_tensor = 0;
  for (size_t begin = 0; begin < total; begin += bucket) {
    const size_t end = std::min(total, begin + bucket);
    for (size_t at = begin; at < end;) {
      const Tensor& t = tensors[tensor];
      const size_t n = std::min(end - at, static_cast<size_t>(t.numel()) - offset_in_tensor);
      std::memcpy(staging_.data() + at, t.data<float>() + offset_in_tensor, n * sizeof(float));
      at += n;
      offset_in_tensor += n;
      if (offset_in_tensor == static_cast<size_t>(t.numel())) {
        ++tensor;
        offset_in_tensor = 0;
      }
    }
    requests.emplace_back();
    Check(MPI_Iallreduce(MPI_IN_PLACE, staging_.data() + begin, static_cast<int>(end - begin), MPI_FLOAT, op,
                         MPI_COMM_WORLD, &requests.back()),
          "MPI_Iallreduce");
  }
  WaitOrAbort(*this, requests, deadline_seconds_, collectives_++, "the all-reduce");
  size_t at = 0;
  for (Tensor& t : tensors) {
    std::memcpy(t.data<float>(), staging_.data() + at, static_cast<size_t>(t.numel()) * sizeof(float));
    at += static_cast<size_t>(t.numel());
  }
  stats_.calls += 1;
  stats_.bytes += static_cast<int64_t>(total * sizeof(float));
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Communicator::Broadcast(std::vector<Tensor>& tensors, int root) {
  if (!mpi_ || size_ == 1) return;
  for (Tensor& t : tensors) {
    size_t bytes = t.nbytes();
    for (size_t at = 0; at < bytes;) {  // MPI counts are ints
      const size_t n = std::min<size_t>(bytes - at, size_t{1} << 30);
      std::vector<MPI_Request> request(1);
      Check(MPI_Ibcast(static_cast<char*>(t.raw_data()) + at, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD,
                       request.data()),
            "MPI_Ibcast");
      WaitOrAbort(*this, request, deadline_seconds_, collectives_++, "the broadcast");
      at += n;
    }
  }
}

std::vector<std::string> Communicator::AllGather(const std::string& mine) {
  if (!mpi_ || size_ == 1) return {mine};
  if (mine.size() > (size_t{1} << 30)) throw std::invalid_argument("AllGather: more than 1 GiB from one rank");
  std::vector<int> sizes(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  int my_size = static_cast<int>(mine.size());
  std::vector<MPI_Request> request(1);
  Check(MPI_Iallgather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD, request.data()), "MPI_Iallgather");
  WaitOrAbort(*this, request, deadline_seconds_, collectives_++, "the all-gather");
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[static_cast<size_t>(r)] = static_cast<int>(total);
    total += sizes[static_cast<size_t>(r)];
  }
  if (total > (int64_t{1} << 30)) throw std::invalid_argument("AllGather: more than 1 GiB in all");
  std::string all(static_cast<size_t>(total), '\0');
  Check(MPI_Iallgatherv(mine.data(), my_size, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                        MPI_COMM_WORLD, request.data()),
        "MPI_Iallgatherv");
  WaitOrAbort(*this, request, deadline_seconds_, collectives_++, "the all-gather");
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(offsets[static_cast<size_t>(r)], sizes[static_cast<size_t>(r)]));
  return out;
}

void Communicator::RequireSameSettings(const std::vector<std::pair<std::string, std::string>>& settings) {
  if (size_ == 1) return;
  std::string mine;
  for (const auto& [name, value] : settings) mine += value + '\n';
  const std::vector<std::string> all = AllGather(mine);
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) out.push_back(text.substr(at, nl - at));
    return out;
  };
  const std::vector<std::string> first = lines(all[0]);
  for (size_t rank = 1; rank < all.size(); ++rank) {
    if (all[rank] == all[0]) continue;
    const std::vector<std::string> theirs = lines(all[rank]);
    for (size_t i = 0; i < settings.size() && i < first.size() && i < theirs.size(); ++i) {
      if (first[i] == theirs[i]) continue;
      if (rank_ != 0) std::this_thread::sleep_for(std::chrono::seconds(10));
      Abort("the ranks were started differently: " + settings[i].first + " is \"" + Bounded(first[i], 80) +
            "\" on rank 0 and \"" + Bounded(theirs[i], 80) + "\" on rank " + std::to_string(rank) +
            "; every rank must get the same options and data");
    }
  }
}

void Communicator::Abort(const std::string& why) {
  std::fprintf(stderr, "pejit: rank %d of %d: %s\n", rank_, size_, why.c_str());
  std::fflush(stderr);
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

ValueAndGrad SumShares(Communicator& group, const ValueAndGrad* local, int64_t share, int64_t global,
                       const std::vector<Value>& wrt_args) {
  const double weight = global > 0 ? static_cast<double>(share) / static_cast<double>(global) : 0.0;
  const std::vector<Value>& structures = local ? local->grads : wrt_args;
  std::vector<Tensor> sums;
  std::vector<size_t> ends;  // where each structure's leaves end in `sums`
  for (const Value& structure : structures) {
    for (const Tensor& g : TensorLeaves(structure)) {
      // Copies: the gradients may be buffers the engine returned to others too.
      Tensor scaled = local ? g.Clone() : Tensor::Zeros(g.dtype(), g.shape());
      if (scaled.dtype() == DType::kF32) {
        float* x = scaled.data<float>();
        for (int64_t k = 0; k < scaled.numel(); ++k) x[k] = static_cast<float>(x[k] * weight);
      }
      sums.push_back(std::move(scaled));
    }
    ends.push_back(sums.size());
  }
  sums.push_back(Tensor::Scalar(local ? static_cast<float>(local->value.tensor().item() * weight) : 0.0f));
  group.AllReduceSum(sums);
  ValueAndGrad out;
  out.value = Value(sums.back());
  for (size_t k = 0, begin = 0; k < structures.size(); begin = ends[k++]) {
    std::vector<Value> leaves(sums.begin() + static_cast<std::ptrdiff_t>(begin),
                              sums.begin() + static_cast<std::ptrdiff_t>(ends[k]));
    out.grads.push_back(ReplaceTensorLeaves(structures[k], leaves));
  }
  return out;
}

std::vector<int> ShardByCost(const std::vector<int64_t>& costs, int ranks) {
  if (ranks < 1) throw std::invalid_argument("ShardByCost: ranks must be at least 1");
  std::vector<size_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(costs.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[static_cast<size_t>(r)] += costs[i];
  }
  return owner;
}

}  // namespace pejit::dist
