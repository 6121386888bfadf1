#include "dist/process_group.hpp"

#include "util/errors.hpp"

#include <cstdlib>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KILN_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace kiln {

namespace {

// Runs a collective step; any failure becomes a PeerFailure naming the step.
template <class F>
auto collective(const char* what, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    throw PeerFailure(std::string(what) + " failed (another rank failed or stopped responding): " +
                      e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw PeerFailure(std::string(what) + " failed (another rank failed or stopped responding): " + e.what());
  }
}

bool wants_nccl(const DistributedConfig& config, const std::string& device) {
  if (config.backend == "nccl") return true;
  if (config.backend == "gloo") return false;
  return device.rfind("cuda", 0) == 0;
}

}  // namespace

ProcessGroup::ProcessGroup(const DistEnv& env, const DistributedConfig& config, const std::string& device)
    : rank_(static_cast<int>(env.rank)),
      world_size_(static_cast<int>(env.world_size)),
      local_rank_(static_cast<int>(env.local_rank)),
      timeout_(std::chrono::milliseconds(static_cast<int64_t>(config.timeout_s * 1000))) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = rank_ == 0;
  options.numWorkers = world_size_;
  options.waitWorkers = true;
  options.timeout = timeout_;
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    // A prefix per run id keeps two runs on one store address apart.
    store_ = c10::make_intrusive<c10d::PrefixStore>("kiln/" + env.run_id, tcp);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous at " + env.master_addr + ":" + std::to_string(env.master_port) +
                             " failed within " + std::to_string(config.timeout_s) + " s: " + e.what());
  }
  if (wants_nccl(config, device)) {
#ifdef KILN_WITH_NCCL
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = timeout_;
    group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, rank_, world_size_, nccl_options);
    return;
#else
    throw std::runtime_error("distributed.backend is nccl (or the device is CUDA), but this kiln was built "
                             "against a LibTorch without NCCL; use backend = \"gloo\"");
#endif
  }
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout_);
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
  group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank_, world_size_, gloo_options);
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::barrier() {
  collective("barrier", [&] {
    c10d::BarrierOptions options;
    options.timeout = timeout_;
    group_->barrier(options)->wait(timeout_);
  });
}

void ProcessGroup::broadcast(std::vector<at::Tensor>& tensors, int root) {
  collective("broadcast", [&] {
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      group_->broadcast(one, options)->wait(timeout_);
    }
  });
}

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) {
  collective("all-reduce", [&] {
    std::vector<at::Tensor> one{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = timeout_;
    group_->allreduce(one, options)->wait(timeout_);
  });
}

std::vector<std::string> ProcessGroup::all_gather_text(const std::string& text) {
  return collective("all-gather through the store", [&] {
    const std::string round = "gather/" + std::to_string(gather_round_++) + "/";
    store_->set(round + std::to_string(rank_), std::vector<uint8_t>(text.begin(), text.end()));
    std::vector<std::string> out(world_size_);
    for (int r = 0; r < world_size_; ++r) {
      const std::string key = round + std::to_string(r);
      store_->wait({key}, timeout_);
      const std::vector<uint8_t> value = store_->get(key);
      out[r].assign(value.begin(), value.end());
    }
    return out;
  });
}

}  // namespace kiln
