// Two "machines" on one host: two network namespaces joined by a veth pair,
// 2 kiln processes in each, started the way torchrun starts them on two
// nodes, rendezvousing over that link only. Needs root (ip netns); skipped
// with a message where that is not permitted.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "common.hpp"

namespace kiln::test {
namespace {

const char* kIp = "/usr/sbin/ip";

bool ip(const std::vector<std::string>& args, std::string* output = nullptr) {
  std::vector<std::string> argv{kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = run_process(argv, {.timeout = std::chrono::seconds(30)});
  if (output) *output = r.output;
  return r.exit_code == 0;
}

// Two namespaces, 10.77.<n>.1 and 10.77.<n>.2, removed on destruction.
class TwoNodes {
 public:
  TwoNodes() {
    const std::string id = std::to_string(getpid() % 100000);
    subnet_ = std::to_string(1 + getpid() % 250);
    ns_ = {"kiln-a-" + id, "kiln-b-" + id};
    const std::string va = "kva" + id, vb = "kvb" + id;
    ok_ = ip({"netns", "add", ns_[0]}, &error_) && ip({"netns", "add", ns_[1]}, &error_) &&
          ip({"link", "add", va, "type", "veth", "peer", "name", vb}, &error_) &&
          ip({"link", "set", va, "netns", ns_[0]}, &error_) && ip({"link", "set", vb, "netns", ns_[1]}, &error_) &&
          ip({"-n", ns_[0], "addr", "add", address(0) + "/24", "dev", va}, &error_) &&
          ip({"-n", ns_[1], "addr", "add", address(1) + "/24", "dev", vb}, &error_) &&
          ip({"-n", ns_[0], "link", "set", va, "up"}, &error_) && ip({"-n", ns_[1], "link", "set", vb, "up"}, &error_) &&
          ip({"-n", ns_[0], "link", "set", "lo", "up"}, &error_) && ip({"-n", ns_[1], "link", "set", "lo", "up"}, &error_);
    interfaces_ = {va, vb};
  }
  ~TwoNodes() {
    for (const auto& ns : ns_) ip({"netns", "del", ns});  // deletes the veth pair with it
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string address(int node) const { return "10.77." + subnet_ + "." + std::to_string(node + 1); }
  const std::string& ns(int node) const { return ns_[node]; }
  const std::string& interface(int node) const { return interfaces_[node]; }

 private:
  bool ok_ = false;
  std::string error_, subnet_;
  std::vector<std::string> ns_, interfaces_;
};

TEST(MultiNode, TwoNodesTimesTwoProcessesOverAVethLink) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for ip netns (running as uid " << geteuid() << ")";
  TwoNodes nodes;
  if (!nodes.ok()) GTEST_SKIP() << "ip netns/veth not permitted here: " << nodes.error();

  TempDir dir;
  const auto manifest = synthetic_manifest(dir, "\n[distributed]\ntimeout_s = 30.0\n");
  const int port = 20000 + static_cast<int>(std::random_device{}() % 20000);
  std::vector<ProcessResult> results(4);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    const int node = rank / 2;
    threads.emplace_back([&, rank, node] {
      results[rank] = run_process(
          {kIp, "netns", "exec", nodes.ns(node), "/usr/bin/env", "RANK=" + std::to_string(rank),
           "LOCAL_RANK=" + std::to_string(rank % 2), "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2",
           "GROUP_RANK=" + std::to_string(node), "MASTER_ADDR=" + nodes.address(0), "MASTER_PORT=" + std::to_string(port),
           "TORCHELASTIC_RUN_ID=multinode", "GLOO_SOCKET_IFNAME=" + nodes.interface(node), kiln_exe().string(), "fit",
           manifest.string()},
          {.timeout = std::chrono::seconds(300)});
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_FALSE(results[rank].timed_out) << "rank " << rank;
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << "\n" << results[rank].output;
  }
  EXPECT_NE(results[0].output.find("rank 0/4 joined the process group (torchrun launch; gradients over Gloo)"), std::string::npos)
      << results[0].output;
  const auto rows = read_metrics(dir / "run" / "metrics.csv");  // written by rank 0 only
  ASSERT_EQ(rows.size(), 3u);
  // 1024 samples over 4 ranks, 32 per batch: 8 steps an epoch.
  EXPECT_EQ(rows.back().at("step"), 24);
  EXPECT_GT(rows.back().at("val/acc"), 0.9);
}

}  // namespace
}  // namespace kiln::test
