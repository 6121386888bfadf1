#include "distributed/process_group.hpp"

#include "util/errors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <random>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "distributed/c10d_compat.hpp"
#include "distributed/shm_allreduce.hpp"
#include "distributed/shm_segment.hpp"

namespace kiln {

namespace {

using Clock = ProcessGroup::Clock;

std::vector<uint8_t> text_bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string bytes_text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// Runs a collective step; any failure becomes a PeerFailure naming the step.
std::string seconds(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000);
  return text;
}

// `passthrough`: kiln's own errors (already one line naming the cause) pass unchanged.
template <class F>
auto collective(const char* what, F&& body, bool passthrough = false) -> decltype(body()) {
  try {
    return body();
  } catch (const PeerFailure&) {
    throw;
  } catch (const Interrupted&) {
    throw;
  } catch (const c10::Error& e) {
    throw PeerFailure(std::string(what) + " failed (another rank failed or stopped responding): " +
                      one_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    if (passthrough) throw;
    throw PeerFailure(std::string(what) + " failed (another rank failed or stopped responding): " + one_line(e.what()));
  }
}

bool wants_nccl(const DistributedConfig& config, const std::string& device) {
  switch (config.backend) {
    case DistributedBackend::nccl: return true;
    case DistributedBackend::gloo: return false;
    case DistributedBackend::automatic: break;
  }
  return device.rfind("cuda", 0) == 0;
}

// Whether something accepts TCP connections at host:port within `wait`.
bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool ok = false;
  for (addrinfo* a = found; a && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof error;
      ok = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
           ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return ok;
}

// A rank other than 0 first waits, against the deadline, for rank 0's store
// to listen: c10d's own client retries with back-off and would wait about
// twice the timeout (LibTorch 2.x), logging a backtrace per try.
void await_listening_store(const DistEnv& env, Clock::time_point deadline, std::chrono::milliseconds timeout,
                           const std::string& where, const std::function<void()>& check_interrupted) {
  while (!accepts_connections(env.master_addr, env.master_port, std::chrono::milliseconds(200))) {
    check_interrupted();
    if (Clock::now() >= deadline)
      throw PeerFailure("rendezvous at " + where + " failed within " + seconds(timeout) +
                        ": no store is listening there (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

c10::intrusive_ptr<c10d::Store> open_store(const DistEnv& env, int rank, int world_size,
                                           std::chrono::milliseconds timeout, const std::string& where) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  // Under torchrun's agent the agent serves the store; else rank 0 does.
  options.isServer = rank == 0 && !env.agent_store;
  options.numWorkers = world_size;
  options.waitWorkers = false;  // arrival is counted by the caller, against its deadline
  options.timeout = timeout;
  try {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    // The agent's store outlives a restart: each attempt keys under its own
    // prefix, as PyTorch's workers do ("/worker/attempt_<n>").
    if (env.agent_store)
      store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(env.restart_count), store);
    // A prefix per run id keeps two runs on one store address apart.
    return c10::make_intrusive<c10d::PrefixStore>("kiln/" + env.run_id, store);
  } catch (const std::exception& e) {
    const std::string text = "rendezvous at " + where + " failed" +
                             (rank == 0 ? ": cannot serve the store: " : " within " + seconds(timeout) + ": ") +
                             one_line(e.what());
    // Rank 0 serves the store: its failure (the port is taken) is the cause;
    // another rank that cannot reach it waits on rank 0.
    if (rank == 0 && !env.agent_store) throw std::runtime_error(text + " (choose another distributed.master_port)");
    throw PeerFailure(text + " (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?)");
  }
}

// The host's own decisions (stop votes, checkpoint commits, barriers) are CPU
// tensors and always go over Gloo: they never need the GPU, and keep working
// when the device's group is NCCL. Called once every rank is in the store, so
// Gloo's address exchange is quick; its timeout is also every collective's
// that gives none (the DDP Reducer's): the full timeout.
c10::intrusive_ptr<c10d::ProcessGroup> connect_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const DistEnv& env, int rank, int world_size,
                                                          std::chrono::milliseconds timeout, const std::string& where,
                                                          const std::string& keys) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Which interface Gloo binds, as PyTorch decides it: GLOO_SOCKET_IFNAME if
  // set; loopback when the whole run is on this machine; else the address
  // this host's name resolves to.
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  try {
    return c10d_compat::gloo_group(c10::make_intrusive<c10d::PrefixStore>(keys, store), rank, world_size,
                                   gloo_options);
  } catch (const std::exception& e) {
    throw PeerFailure("rendezvous at " + where + ": connecting the ranks failed: " + one_line(e.what()));
  }
}

// Rank 0's side of the shared-memory set-up: creates the segment and names it
// in the store, or names none. Returns why this rank cannot use it, or "".
std::string offer_segment(c10d::Store& store, const std::string& key, int world_size, size_t slot, size_t bytes,
                          std::optional<ShmSegment>& segment) {
  std::random_device random;
  const uint64_t nonce = (static_cast<uint64_t>(random()) << 32) | random();
  try {
    segment.emplace(ShmSegment::create(bytes));
    ShmAllReduce::initialise(*segment, world_size, slot, nonce);
    store.set(key, text_bytes(segment->name() + " " + std::to_string(nonce)));
    return "";
  } catch (const std::exception& e) {
    store.set(key, text_bytes(""));
    return e.what();
  }
}

// Another rank's side: maps the segment rank 0 offered ("<name> <nonce>"). The
// nonce tells rank 0's segment from another of the same name. Returns why
// this rank cannot use it, or "".
std::string open_offered_segment(const std::string& offer, int rank, int world_size, size_t slot, size_t bytes,
                                 std::optional<ShmSegment>& segment) {
  const size_t space = offer.find(' ');
  if (space == std::string::npos) return "rank 0 could not create a segment";
  try {
    segment.emplace(ShmSegment::open(offer.substr(0, space), bytes));
    if (!ShmAllReduce::matches(*segment, world_size, slot, std::stoull(offer.substr(space + 1))))
      return "rank " + std::to_string(rank) + " opened another segment of that name (another host?)";
  } catch (const std::exception& e) {
    return "rank " + std::to_string(rank) + ": " + e.what();
  }
  return "";
}

}  // namespace

ProcessGroup::ProcessGroup(const DistEnv& env, const DistributedConfig& config, const std::string& device,
                           std::function<std::string()> interrupted)
    : interrupted_(std::move(interrupted)),
      rank_(static_cast<int>(env.rank)),
      world_size_(static_cast<int>(env.world_size)),
      local_rank_(static_cast<int>(env.local_rank)),
      one_host_(env.local_world_size == env.world_size),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(config.timeout_s * 1000))) {
  // The whole rendezvous keeps one deadline, timeout_s from now: the store's
  // connect, the arrival of every rank and Gloo's address exchange share it
  // (c10d's own waits would each take the full timeout, one after another).
  const auto deadline = Clock::now() + timeout_;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  if (rank_ != 0 || env.agent_store)
    await_listening_store(env, deadline, timeout_, where, [this] { check_interrupted("the rendezvous"); });
  store_ = open_store(env, rank_, world_size_, timeout_, where);
  arrive(deadline, where);
  control_ = connect_gloo_group(store_, env, rank_, world_size_, timeout_, where, "control");
  group_ = control_;
  const bool nccl = wants_nccl(config, device);
  // CPU gradients between ranks of one host: shared memory, unless told not to.
  if (!nccl && config.intra_host != IntraHost::gloo) {
    const std::string why_not = env.local_world_size == env.world_size
                                    ? join_shared_memory(Clock::now() + timeout_, "shm/", shm_)
                                    : "the ranks are on " + std::to_string(env.world_size / std::max<int64_t>(env.local_world_size, 1)) +
                                          " hosts";
    if (!why_not.empty() && config.intra_host == IntraHost::shm)
      throw std::runtime_error("distributed.intra_host = \"shm\", but the ranks cannot share memory: " + why_not +
                               " (use intra_host = \"auto\" or \"gloo\")");
    if (shm_) grads_ = c10d_compat::shm_group(store_, shm_);
  }
  if (nccl) {
#ifdef KILN_WITH_NCCL
    // The model's tensors (gradients, the initial weights) on CUDA: NCCL.
    group_ = c10d_compat::nccl_group(store_, rank_, world_size_, timeout_);
#else
    throw std::runtime_error("distributed.backend is nccl (or the device is CUDA), but this kiln was built "
                             "against a LibTorch without NCCL; use backend = \"gloo\"");
#endif
  }
  // ZeRO-3's gathers run on a thread of their own, beside the loop's
  // collectives (a bucket is fetched while the one before it is computed
  // with: optim/sharded_parameters.hpp), so they have a channel of their
  // own. Two threads' collectives on one channel would interleave
  // differently on each rank.
  if (config.shard == ShardMode::parameters && world_size_ > 1) {
    if (nccl) {
#ifdef KILN_WITH_NCCL
      gathers_ = c10d_compat::nccl_group(c10::make_intrusive<c10d::PrefixStore>("gathers", store_), rank_, world_size_,
                                         timeout_);
#endif
    } else {
      gathers_ = connect_gloo_group(store_, env, rank_, world_size_, timeout_, where, "gathers");
      // Without a segment of their own (the ranks agree), over Gloo.
      if (shm_) join_shared_memory(Clock::now() + timeout_, "shm-gathers/", gather_shm_);
      if (gather_shm_) gather_shm_->set_background(true);
    }
  }
}

std::string ProcessGroup::join_shared_memory(Clock::time_point deadline, const std::string& keys,
                                             std::shared_ptr<ShmAllReduce>& joined) {
  return collective("the shared-memory set-up", [&]() -> std::string {
    const size_t slot = ShmAllReduce::kDefaultSlotBytes;
    const size_t bytes = ShmAllReduce::segment_bytes(world_size_, slot);
    std::optional<ShmSegment> segment;
    std::string mine;  // empty: this rank has the segment mapped
    if (rank_ == 0) {
      mine = offer_segment(*store_, keys + "name", world_size_, slot, bytes, segment);
    } else {
      if (!wait_key(keys + "name", deadline, "the shared-memory set-up"))
        throw PeerFailure("the shared-memory set-up timed out after " + seconds(timeout_) +
                          ": rank 0 did not name its segment (it failed or stopped responding)");
      mine = open_offered_segment(bytes_text(store_->get(keys + "name")), rank_, world_size_, slot, bytes, segment);
    }
    // Joined before answering: every rank's pid is in the segment before any
    // all-reduce starts, so a peer that dies is always seen.
    std::shared_ptr<ShmAllReduce> shm;
    if (mine.empty()) {
      shm = std::make_shared<ShmAllReduce>(std::move(*segment), rank_, world_size_, timeout_, slot);
      segment.reset();
    }
    store_->set(keys + "answer/" + std::to_string(rank_), text_bytes(mine.empty() ? "ok" : "no " + mine));
    std::string why_not;
    for (int r = 0; r < world_size_; ++r) {
      const std::string key = keys + "answer/" + std::to_string(r);
      if (!wait_key(key, deadline, "the shared-memory set-up"))
        throw PeerFailure("the shared-memory set-up timed out after " + seconds(timeout_) + ": rank " +
                          std::to_string(r) + " did not answer (it failed or stopped responding)");
      const std::string answer = bytes_text(store_->get(key));
      if (answer != "ok" && why_not.empty()) why_not = answer.substr(3);
    }
    // Every rank has answered, so whoever could map it has: the name goes.
    if (shm) shm->unlink();
    if (segment) segment->unlink();
    if (!why_not.empty()) return why_not;
    joined = std::move(shm);
    return "";
  }, /*passthrough=*/true);
}

void ProcessGroup::arrive(Clock::time_point deadline, const std::string& where) {
  collective("rendezvous", [&] {
    store_->set("arrived/" + std::to_string(rank_), std::vector<uint8_t>{1});
    store_->add("arrived", 1);
    while (store_->add("arrived", 0) < world_size_) {
      check_interrupted("the rendezvous");
      if (Clock::now() >= deadline) {
        std::string missing;
        for (int r = 0; r < world_size_; ++r)
          if (!store_->check({"arrived/" + std::to_string(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        const std::string text = "rendezvous at " + where + ": rank(s) " + missing + " did not arrive within " +
                                 seconds(timeout_) + " (distributed.timeout_s); were they launched, with the same " +
                                 "MASTER_ADDR, MASTER_PORT and WORLD_SIZE?";
        // Rank 0 waits for the others: naming the absent ranks is the cause.
        if (rank_ == 0) throw std::runtime_error(text);
        throw PeerFailure(text);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }, /*passthrough=*/true);
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::gradient_stats() const {
  if (!shm_) return "";
  const ShmAllReduce::Stats s = shm_->stats();
  char text[200];
  std::snprintf(text, sizeof text,
                "shared-memory all-reduce: %llu calls, %.3f s copying and summing (%.1f us a call), %.3f s waiting "
                "for other ranks",
                static_cast<unsigned long long>(s.calls), s.moving_s, s.calls ? 1e6 * s.moving_s / s.calls : 0.0,
                s.waiting_s);
  return text;
}

ProcessGroup::GradientWaits ProcessGroup::gradient_waits() const {
  if (!shm_) return {};
  const ShmAllReduce::Stats s = shm_->stats();
  return {s.waiting_s, static_cast<int64_t>(s.calls)};
}

std::string ProcessGroup::gradient_transport() const {
  if (grads_) return "shared memory";
  return group_ == control_ ? "Gloo" : "NCCL";
}

void ProcessGroup::check_interrupted(const char* what) const {
  if (!interrupted_) return;
  const std::string reason = interrupted_();
  if (!reason.empty()) throw Interrupted("interrupted by " + reason + " while waiting in " + what);
}

// Polls instead of blocking in Work::wait: a signal must not wait out the
// collective's timeout (Gloo ends the work itself at the timeout).
void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what,
                        std::optional<Clock::time_point> deadline) {
  for (int spins = 0; !work->isCompleted(); ++spins) {
    check_interrupted(what);
    if (deadline && Clock::now() >= *deadline)
      throw PeerFailure(std::string(what) + " timed out after " + seconds(timeout_) +
                        " (another rank failed or stopped responding)");
    if (spins < 200)
      std::this_thread::yield();  // most collectives here finish within microseconds
    else
      std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  work->wait();  // rethrows the collective's failure
}

bool ProcessGroup::wait_key(const std::string& key, Clock::time_point deadline, const char* what) {
  for (int spins = 0; !store_->check({key}); ++spins) {
    check_interrupted(what);
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 100 ? 100 : 1000));
  }
  return true;
}

void ProcessGroup::barrier() {
  collective("barrier", [&] {
    c10d::BarrierOptions options;
    options.timeout = timeout_;
    wait(control_->barrier(options), "a barrier");
  });
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  collective("broadcast", [&] {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    // One deadline for the whole set, not one timeout per tensor.
    const auto deadline = Clock::now() + timeout_;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) {
      // A broadcast copies bytes: bfloat16 (bf16-true's weights) travels as
      // float16, its bytes untouched (a broadcast does no arithmetic), which
      // every Gloo build knows (Debian's 1.13 knows no bfloat16, nor int16).
      std::vector<at::Tensor> one{t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t};
      works.push_back(group_->broadcast(one, options));
    }
    for (auto& work : works) wait(work, "the broadcast of the initial weights", deadline);
  });
}

void ProcessGroup::all_reduce_sum(at::Tensor& tensor, const char* contribution) {
  collective("all-reduce", [&] {
    // Not interruptible: kiln's all-reduces are the agreements themselves —
    // the stop vote (which is how a signal is acted on, by all ranks
    // together) and the checkpoint commit. The timeout bounds them.
    // Between the ranks of one host they go through shared memory like the
    // gradients: a round trip over loopback TCP costs 1-2 ms, a vote every
    // 16 steps ~5 % of a 2-process mlp256 epoch (bench/README.md).
    if (shm_ && tensor.is_cpu()) {
      shm_->all_reduce_sum(tensor, contribution);
      return;
    }
    std::vector<at::Tensor> one{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = timeout_;
    const auto work = control_->allreduce(one, options);
    work->wait(timeout_);
  });
}

void ProcessGroup::all_gather(const at::Tensor& part, at::Tensor& whole, const char* what) {
  collective("all-gather", [&] {
    if (shm_ && part.is_cpu() && part.scalar_type() == at::kFloat) {
      shm_->all_gather(part, whole, what);
      return;
    }
    std::vector<at::Tensor> input{part.contiguous()};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(input[0]));
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    const c10::intrusive_ptr<c10d::ProcessGroup>& on = group_;
    wait(on->allgather(outputs, input, options), what);
    const int64_t n = input[0].numel();
    for (int r = 0; r < world_size_; ++r) whole.narrow(0, r * n, n).copy_(outputs[0][r]);
  });
}

void ProcessGroup::gather_range(int64_t begin, int64_t count, int64_t shard, const at::TensorOptions& options,
                                const RangeGive& give, const RangeTake& take, const char* what) {
  if (count <= 0) return;
  collective("all-gather", [&] {
    ShmAllReduce* shm = gathers_ ? gather_shm_.get() : shm_.get();
    const c10::intrusive_ptr<c10d::ProcessGroup>& group = gathers_ ? gathers_ : group_;
    if (shm && options.device().is_cpu()) {
      shm->gather_range(begin, count, shard, c10::typeMetaToScalarType(options.dtype()), give, take, what);
      return;
    }
    // Every rank's part of a chunk is at most the chunk: each sends the
    // chunk's length, its own part in place, the rest unread.
    const int64_t per_chunk = std::min<int64_t>(count, int64_t{1} << 20);
    // Debian's Gloo has no bfloat16: its bits travel as float16's (as broadcast's do).
    const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
    const bool as_half = dtype == at::kBFloat16 && !options.device().is_cuda();
    const at::TensorOptions wire = as_half ? options.dtype(at::kHalf) : options;
    auto values = [&](const at::Tensor& t) { return as_half ? t.view(at::kBFloat16) : t; };
    at::Tensor mine = at::empty({per_chunk}, wire);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty({per_chunk}, wire));
    c10d::AllgatherOptions gather_options;
    gather_options.timeout = timeout_;
    for (int64_t first = begin; first < begin + count; first += per_chunk) {
      const int64_t n = std::min(per_chunk, begin + count - first);
      auto part = [&](int64_t r) {
        return std::pair<int64_t, int64_t>{std::max(first, r * shard), std::min(first + n, (r + 1) * shard)};
      };
      if (const auto [lo, hi] = part(rank_); hi > lo) {
        at::Tensor place = values(mine.narrow(0, lo - first, hi - lo));
        give(lo, place);
      }
      std::vector<at::Tensor> input{mine};
      wait(group->allgather(outputs, input, gather_options), what);
      for (int r = 0; r < world_size_; ++r)
        if (const auto [lo, hi] = part(r); hi > lo) take(lo, values(outputs[0][r].narrow(0, lo - first, hi - lo)));
    }
  });
}

void ProcessGroup::reduce_scatter(int64_t begin, int64_t count, int64_t shard, const ShardFill& fill,
                                  at::Tensor& owned, bool accumulate, const char* what) {
  collective("reduce-scatter", [&] {
    if (shm_ && owned.is_cpu()) {
      shm_->reduce_scatter_sum(begin, count, shard, fill, owned, accumulate, what);
      return;
    }
    // Summed in float32 whatever the owned sums' dtype (rounded as they land).
    at::Tensor range = at::empty({count}, owned.options().dtype(at::kFloat));
    fill(begin, range);
    std::vector<at::Tensor> one{range};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = timeout_;
    wait(group_->allreduce(one, options), what);
    const int64_t lo = std::max(begin, rank_ * shard), hi = std::min(begin + count, (rank_ + 1) * shard);
    if (hi <= lo) return;
    at::Tensor out = owned.narrow(0, lo - rank_ * shard, hi - lo);
    const at::Tensor sum = range.narrow(0, lo - begin, hi - lo);
    if (accumulate)
      out.add_(sum);
    else
      out.copy_(sum);
  });
}

std::vector<std::string> ProcessGroup::all_gather_text(const std::string& text) {
  return collective("all-gather through the store", [&] {
    const std::string round = "gather/" + std::to_string(gather_round_++) + "/";
    store_->set(round + std::to_string(rank_), std::vector<uint8_t>(text.begin(), text.end()));
    std::vector<std::string> out(world_size_);
    const auto deadline = Clock::now() + timeout_;  // for all ranks together
    for (int r = 0; r < world_size_; ++r) {
      const std::string key = round + std::to_string(r);
      if (!wait_key(key, deadline, "a gather through the store"))
        throw PeerFailure("a gather through the store timed out after " + seconds(timeout_) + ": rank " +
                          std::to_string(r) + " did not contribute (it failed or stopped responding)");
      const std::vector<uint8_t> value = store_->get(key);
      out[r].assign(value.begin(), value.end());
    }
    return out;
  });
}

// Large payloads (collected rows) go through Gloo, not the store: the store
// keeps every value it was given, and its one server is rank 0.
std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& bytes) {
  return collective("the gather of collected rows", [&] {
    at::Tensor sizes = at::zeros({world_size_}, at::kLong);
    sizes.data_ptr<int64_t>()[rank_] = static_cast<int64_t>(bytes.size());
    {
      std::vector<at::Tensor> one{sizes};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::SUM;
      options.timeout = timeout_;
      wait(control_->allreduce(one, options), "the sizes of the collected rows");
    }
    const int64_t* size = sizes.data_ptr<int64_t>();
    const int64_t longest = *std::max_element(size, size + world_size_);
    std::vector<std::string> out(world_size_);
    if (longest == 0) return out;
    at::Tensor mine = at::zeros({longest}, at::kByte);
    std::memcpy(mine.data_ptr(), bytes.data(), bytes.size());
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < world_size_; ++r) gathered[0].push_back(at::empty({longest}, at::kByte));
    std::vector<at::Tensor> inputs{mine};
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    wait(control_->allgather(gathered, inputs, options), "the gather of collected rows");
    for (int r = 0; r < world_size_; ++r)
      out[r].assign(static_cast<const char*>(gathered[0][r].data_ptr()), static_cast<size_t>(size[r]));
    return out;
  });
}

}  // namespace kiln
