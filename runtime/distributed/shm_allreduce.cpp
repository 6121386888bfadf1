#include "distributed/shm_allreduce.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>

#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include "util/errors.hpp"

namespace kiln {

namespace {

constexpr uint64_t kMagic = 0x6b696c6e73686d31ull;  // "kilnshm1"
constexpr size_t kAlign = 4096;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string seconds_text(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000);
  return text;
}

const char* phase_text(int phase, const char* contribution) {
  switch (phase) {
    case 0: return contribution;
    case 1: return "its share of the sum";
    default: return "the previous sum";
  }
}

}  // namespace

// Written by one rank, read by all: a cache line each, so ranks never share one.
struct alignas(64) ShmAllReduce::RankState {
  std::atomic<uint64_t> counter[3];  // by Phase: the last chunk arrived / reduced / done
  std::atomic<int32_t> pid;
  std::atomic<int32_t> left;  // 1 once its ShmAllReduce is destroyed
};

struct ShmAllReduce::Header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t ranks;
  uint64_t slot_bytes;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the segment's counters must be lock-free across processes");
static_assert(std::atomic<int32_t>::is_always_lock_free, "the segment's flags must be lock-free across processes");

namespace {
size_t states_offset() { return round_up(sizeof(uint64_t) * 4, 64); }
size_t data_offset(int ranks) { return round_up(states_offset() + 64 * static_cast<size_t>(ranks), kAlign); }
}  // namespace

size_t ShmAllReduce::segment_bytes(int ranks, size_t slot_bytes) {
  // Two sets (by parity) of one slot per rank and one result.
  return data_offset(ranks) + 2 * (static_cast<size_t>(ranks) + 1) * slot_bytes;
}

void ShmAllReduce::initialise(ShmSegment& segment, int ranks, size_t slot_bytes, uint64_t nonce) {
  auto* base = static_cast<uint8_t*>(segment.data());
  for (int r = 0; r < ranks; ++r) new (base + states_offset() + 64 * static_cast<size_t>(r)) RankState{};
  auto* h = new (base) Header{};
  h->nonce = nonce;
  h->ranks = static_cast<uint64_t>(ranks);
  h->slot_bytes = slot_bytes;
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
}

bool ShmAllReduce::matches(const ShmSegment& segment, int ranks, size_t slot_bytes, uint64_t nonce) {
  if (segment.size() < segment_bytes(ranks, slot_bytes)) return false;
  const auto* h = static_cast<const Header*>(segment.data());
  std::atomic_thread_fence(std::memory_order_acquire);
  return h->magic == kMagic && h->nonce == nonce && h->ranks == static_cast<uint64_t>(ranks) &&
         h->slot_bytes == slot_bytes;
}

ShmAllReduce::ShmAllReduce(ShmSegment segment, int rank, int ranks, std::chrono::milliseconds timeout,
                           size_t slot_bytes)
    : segment_(std::move(segment)), rank_(rank), ranks_(ranks), timeout_(timeout), slot_bytes_(slot_bytes) {
  if (ranks < 1 || ranks > kMaxRanks || rank < 0 || rank >= ranks)
    throw std::invalid_argument("shared-memory all-reduce: rank " + std::to_string(rank) + " of " +
                                std::to_string(ranks));
  state(rank_).pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
}

ShmAllReduce::~ShmAllReduce() {
  if (segment_.data()) state(rank_).left.store(1, std::memory_order_release);
}

ShmAllReduce::Header& ShmAllReduce::header() const { return *static_cast<Header*>(segment_.data()); }

ShmAllReduce::RankState& ShmAllReduce::state(int rank) const {
  return *reinterpret_cast<RankState*>(static_cast<uint8_t*>(segment_.data()) + states_offset() +
                                       64 * static_cast<size_t>(rank));
}

uint8_t* ShmAllReduce::slot(uint64_t seq, int rank) const {
  const size_t set = seq & 1;
  return static_cast<uint8_t*>(segment_.data()) + data_offset(ranks_) +
         (set * (static_cast<size_t>(ranks_) + 1) + static_cast<size_t>(rank)) * slot_bytes_;
}

uint8_t* ShmAllReduce::result(uint64_t seq) const { return slot(seq, ranks_); }

void ShmAllReduce::all_reduce_sum(at::Tensor& tensor, const char* contribution) {
  if (ranks_ == 1 || tensor.numel() == 0) return;
  contribution_ = contribution;
  if (!tensor.device().is_cpu())
    throw std::invalid_argument("the shared-memory all-reduce takes CPU tensors, not " + tensor.device().str());
  at::Tensor flat = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const size_t element = flat.element_size();
  const size_t chunk = slot_bytes_ / element * element;
  auto* data = static_cast<uint8_t*>(flat.data_ptr());
  const size_t bytes = static_cast<size_t>(flat.numel()) * element;
  const auto start = std::chrono::steady_clock::now();
  const double waited_before = stats_.waiting_s;
  for (size_t at = 0; at < bytes; at += chunk) reduce_chunk(data + at, std::min(chunk, bytes - at), flat.scalar_type());
  if (!flat.is_same(tensor)) tensor.copy_(flat);
  count_call(start, waited_before);
}

void ShmAllReduce::reduce_chunk(uint8_t* data, size_t bytes, at::ScalarType dtype) {
  const uint64_t seq = ++seq_;
  RankState& me = state(rank_);
  // This parity's slots were last read in chunk seq - 2.
  if (seq > 2) await(Phase::done, seq - 2);
  std::memcpy(slot(seq, rank_), data, bytes);
  me.counter[static_cast<int>(Phase::arrived)].store(seq, std::memory_order_release);
  await(Phase::arrived, seq);

  // This rank's share, in elements, summed over every slot in rank order.
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t n = static_cast<int64_t>(bytes) / element;
  const int64_t per = (n + ranks_ - 1) / ranks_;
  const int64_t lo = std::min<int64_t>(n, per * rank_), hi = std::min<int64_t>(n, lo + per);
  if (hi > lo) {
    const auto options = at::TensorOptions().dtype(dtype);
    auto view = [&](uint8_t* base) { return at::from_blob(base + lo * element, {hi - lo}, options); };
    at::Tensor out = view(result(seq));
    at::add_out(out, view(slot(seq, 0)), view(slot(seq, 1)));
    for (int r = 2; r < ranks_; ++r) out.add_(view(slot(seq, r)));
  }
  me.counter[static_cast<int>(Phase::reduced)].store(seq, std::memory_order_release);
  await(Phase::reduced, seq);
  std::memcpy(data, result(seq), bytes);
  me.counter[static_cast<int>(Phase::done)].store(seq, std::memory_order_release);
}

// One chunk of a collective that needs no shared result: every rank writes
// its slot, waits for all, reads what it needs from every slot, and is done.
void ShmAllReduce::exchange_chunk(const std::function<void(uint8_t* mine)>& write,
                                  const std::function<void(uint64_t seq)>& read) {
  const uint64_t seq = ++seq_;
  RankState& me = state(rank_);
  if (seq > 2) await(Phase::done, seq - 2);  // this parity's slots were last read in chunk seq - 2
  write(slot(seq, rank_));
  me.counter[static_cast<int>(Phase::arrived)].store(seq, std::memory_order_release);
  await(Phase::arrived, seq);
  read(seq);
  // Nothing is read from this chunk's result area: reduced and done at once.
  me.counter[static_cast<int>(Phase::reduced)].store(seq, std::memory_order_release);
  me.counter[static_cast<int>(Phase::done)].store(seq, std::memory_order_release);
}

void ShmAllReduce::count_call(std::chrono::steady_clock::time_point start, double waited_before) {
  ++stats_.calls;
  stats_.moving_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
                     (stats_.waiting_s - waited_before);
}

void ShmAllReduce::reduce_scatter_sum(int64_t begin, int64_t count, int64_t shard, const Fill& fill,
                                      at::Tensor& owned, bool accumulate, const char* contribution) {
  if (count <= 0) return;
  contribution_ = contribution;
  if (!at::isFloatingType(owned.scalar_type()) || !owned.is_contiguous() || !owned.device().is_cpu())
    throw std::invalid_argument("the shared-memory reduce-scatter takes a contiguous floating-point CPU shard");
  // Summed in float32, then rounded once into a shard of another dtype.
  const bool in_place = !accumulate && owned.scalar_type() == at::kFloat;
  const auto options = at::TensorOptions().dtype(at::kFloat);
  const int64_t per_chunk = static_cast<int64_t>(slot_bytes_ / sizeof(float));
  const int64_t mine_lo = rank_ * shard, mine_hi = mine_lo + shard;
  const auto start = std::chrono::steady_clock::now();
  const double waited_before = stats_.waiting_s;
  for (int64_t first = begin; first < begin + count; first += per_chunk) {
    const int64_t n = std::min(per_chunk, begin + count - first);
    exchange_chunk(
        [&](uint8_t* mine) {
          at::Tensor place = at::from_blob(mine, {n}, options);
          fill(first, place);
        },
        [&](uint64_t seq) {
          const int64_t lo = std::max(first, mine_lo), hi = std::min(first + n, mine_hi);
          if (hi <= lo) return;
          auto view = [&](int r) {
            return at::from_blob(slot(seq, r) + (lo - first) * sizeof(float), {hi - lo}, options);
          };
          at::Tensor out = owned.narrow(0, lo - mine_lo, hi - lo);
          // In rank order, as all_reduce_sum adds: the same sums to the bit.
          at::Tensor sum = in_place ? out : at::empty({hi - lo}, options);
          at::add_out(sum, view(0), view(1));
          for (int r = 2; r < ranks_; ++r) sum.add_(view(r));
          if (accumulate)
            out.add_(sum);
          else if (!in_place)
            out.copy_(sum);
        });
  }
  count_call(start, waited_before);
}

void ShmAllReduce::all_gather(const at::Tensor& part, at::Tensor& whole, const char* contribution) {
  contribution_ = contribution;
  if (part.scalar_type() != at::kFloat || !part.device().is_cpu() || !whole.is_contiguous() ||
      whole.numel() != part.numel() * ranks_)
    throw std::invalid_argument("the shared-memory all-gather takes float32 CPU parts and a whole of every rank's");
  const at::Tensor mine = part.contiguous();
  const int64_t n = mine.numel();
  const int64_t per_chunk = static_cast<int64_t>(slot_bytes_ / sizeof(float));
  float* out = whole.data_ptr<float>();
  const float* in = mine.data_ptr<float>();
  const auto start = std::chrono::steady_clock::now();
  const double waited_before = stats_.waiting_s;
  for (int64_t first = 0; first < n; first += per_chunk) {
    const int64_t length = std::min(per_chunk, n - first);
    const size_t bytes = static_cast<size_t>(length) * sizeof(float);
    exchange_chunk([&](uint8_t* slot_of_mine) { std::memcpy(slot_of_mine, in + first, bytes); },
                   [&](uint64_t seq) {
                     for (int r = 0; r < ranks_; ++r) std::memcpy(out + r * n + first, slot(seq, r), bytes);
                   });
  }
  count_call(start, waited_before);
}

void ShmAllReduce::gather_range(int64_t begin, int64_t count, int64_t shard, at::ScalarType dtype, const Give& give,
                                const Take& take, const char* contribution) {
  if (count <= 0) return;
  contribution_ = contribution;
  const auto options = at::TensorOptions().dtype(dtype);
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t per_chunk = static_cast<int64_t>(slot_bytes_) / element;
  const auto start = std::chrono::steady_clock::now();
  const double waited_before = stats_.waiting_s;
  // Rank r's part of the chunk [first, first + n), as [lo, hi).
  auto part = [&](int r, int64_t first, int64_t n) {
    return std::pair<int64_t, int64_t>{std::max(first, r * shard), std::min(first + n, (r + 1) * shard)};
  };
  for (int64_t first = begin; first < begin + count; first += per_chunk) {
    const int64_t n = std::min(per_chunk, begin + count - first);
    exchange_chunk(
        [&](uint8_t* mine) {
          const auto [lo, hi] = part(rank_, first, n);
          if (hi <= lo) return;
          at::Tensor place = at::from_blob(mine + (lo - first) * element, {hi - lo}, options);
          give(lo, place);
        },
        [&](uint64_t seq) {
          for (int r = 0; r < ranks_; ++r) {
            const auto [lo, hi] = part(r, first, n);
            if (hi > lo) take(lo, at::from_blob(slot(seq, r) + (lo - first) * element, {hi - lo}, options));
          }
        });
  }
  count_call(start, waited_before);
}

int ShmAllReduce::first_behind(Phase phase, uint64_t seq) const {
  for (int r = 0; r < ranks_; ++r)
    if (state(r).counter[static_cast<int>(phase)].load(std::memory_order_acquire) < seq) return r;
  return -1;
}

// Gone, or a zombie its parent has not reaped yet: either way it will never arrive.
bool ShmAllReduce::peer_alive(int rank) const {
  const pid_t pid = state(rank).pid.load(std::memory_order_acquire);
  if (pid <= 0) return true;
  if (::kill(pid, 0) != 0) return errno != ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

void ShmAllReduce::await(Phase phase, uint64_t seq) {
  if (first_behind(phase, seq) < 0) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  struct Count {  // the wait's time, however it ends
    ShmAllReduce::Stats& stats;
    Clock::time_point start;
    ~Count() { stats.waiting_s += std::chrono::duration<double>(Clock::now() - start).count(); }
  } count{stats_, start};
  auto next_check = start;
  for (uint64_t round = 0;; ++round) {
    for (int i = 0; i < 64; ++i) {
      if (first_behind(phase, seq) < 0) return;
      cpu_relax();
    }
    // A peer a little behind arrives within microseconds: spin. Longer, give
    // the core to whatever else runs here (the prefetch thread, a peer on the
    // same core), then sleep so a long wait costs no CPU.
    const auto now = Clock::now();
    const auto waited = now - start;
    if (waited > (background_ ? std::chrono::microseconds(200) : std::chrono::milliseconds(2)))
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    else if (background_ || waited > std::chrono::microseconds(100))
      std::this_thread::yield();
    if (now < next_check) continue;
    next_check = now + std::chrono::milliseconds(5);
    const int behind = first_behind(phase, seq);
    if (behind < 0) return;
    if (state(behind).left.load(std::memory_order_acquire))
      fail_waiting(phase, seq, "it left the process group (it failed or is shutting down)");
    if (!peer_alive(behind)) fail_waiting(phase, seq, "its process has exited");
    if (waited >= timeout_)
      fail_waiting(phase, seq, "it did not within " + seconds_text(timeout_) +
                                   " (distributed.timeout_s; it failed or stopped responding)");
  }
}

void ShmAllReduce::fail_waiting(Phase phase, uint64_t seq, const std::string& why) {
  const int behind = first_behind(phase, seq);
  throw PeerFailure("the shared-memory all-reduce waited for rank " + std::to_string(behind) + " (pid " +
                    std::to_string(state(std::max(behind, 0)).pid.load()) + ") to hand over " +
                    phase_text(static_cast<int>(phase), contribution_) + ": " + why);
}

}  // namespace kiln
