// The shared-memory all-reduce between real processes (fork): sums exact and
// bitwise identical on every rank, across chunks and dtypes (and so the
// reduce-scatter's and the all-gather's); a peer that
// exits, leaves or stops never keeps a rank waiting past its bound; the
// segment's name is gone from /dev/shm once every rank has it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "distributed/shm_allreduce.hpp"
#include "util/errors.hpp"

namespace kiln {
namespace {

using std::chrono::milliseconds;

// A child's exit code: 0 ok, 1 wrong result, 2 threw PeerFailure, 3 threw something else.
constexpr int kOk = 0, kWrong = 1, kPeerFailure = 2, kOther = 3;

struct Child {
  pid_t pid;
  int rank;
};

// Runs `body(rank, shm)` in `ranks` forked processes over one segment; the
// children's exit codes by rank.
std::vector<int> run_ranks(int ranks, size_t slot_bytes, milliseconds timeout,
                           const std::function<int(int, std::unique_ptr<ShmAllReduce>&)>& body) {
  ShmSegment segment = ShmSegment::create(ShmAllReduce::segment_bytes(ranks, slot_bytes));
  ShmAllReduce::initialise(segment, ranks, slot_bytes, 42);
  const std::string name = segment.name();
  std::vector<Child> children;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      at::set_num_threads(1);  // no OpenMP team of the parent's in a forked child
      int code = kOther;
      try {
        ShmSegment mine = ShmSegment::open(name, ShmAllReduce::segment_bytes(ranks, slot_bytes));
        if (!ShmAllReduce::matches(mine, ranks, slot_bytes, 42)) ::_exit(kWrong);
        auto shm = std::make_unique<ShmAllReduce>(std::move(mine), r, ranks, timeout, slot_bytes);
        code = body(r, shm);
      } catch (const PeerFailure& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = kPeerFailure;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: unexpected: %s\n", r, e.what());
      }
      ::_exit(code);
    }
    children.push_back({pid, r});
  }
  std::vector<int> codes(ranks, -1);
  for (const Child& c : children) {
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    codes[c.rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return codes;
}

at::Tensor rank_values(int rank, int64_t n, at::ScalarType dtype) {
  at::Generator g = at::detail::createCPUGenerator(1000 + rank);
  return at::randn({n}, g, at::kFloat).to(dtype);
}

struct Case {
  const char* name;
  int ranks;
  int64_t elements;
  size_t slot_bytes;
  at::ScalarType dtype;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

class ShmAllReduceSum : public testing::TestWithParam<Case> {};

TEST_P(ShmAllReduceSum, EveryRankHoldsTheSameExactSum) {
  const Case c = GetParam();
  // The expected sum, in the same rank order as the segment adds.
  at::Tensor expected = rank_values(0, c.elements, c.dtype);
  for (int r = 1; r < c.ranks; ++r) expected = expected + rank_values(r, c.elements, c.dtype);
  const auto codes = run_ranks(c.ranks, c.slot_bytes, milliseconds(60000), [&](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    // Several calls in a row: the slot sets alternate and are reused.
    for (int round = 0; round < 5; ++round) {
      at::Tensor t = rank_values(rank, c.elements, c.dtype);
      shm->all_reduce_sum(t);
      if (!at::equal(t, expected)) return kWrong;  // bitwise: every rank adds in rank order
    }
    return kOk;
  });
  for (int r = 0; r < c.ranks; ++r) EXPECT_EQ(codes[r], kOk) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ShmAllReduceSum,
    testing::Values(Case{"two_ranks_one_chunk", 2, 235146, ShmAllReduce::kDefaultSlotBytes, at::kFloat},
                    Case{"two_ranks_many_chunks", 2, 100003, 4096, at::kFloat},
                    Case{"three_ranks_uneven_shares", 3, 1001, 1024, at::kFloat},
                    Case{"four_ranks_double", 4, 5000, 8192, at::kDouble},
                    Case{"two_ranks_bfloat16", 2, 70001, 4096, at::kBFloat16},
                    Case{"two_ranks_float16", 2, 70001, 4096, at::kHalf},
                    Case{"fewer_elements_than_ranks", 4, 3, 4096, at::kFloat}),
    [](const testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The reduce-scatter of a sharded step: each rank ends with exactly the
// all-reduce's sums for its own shard (bitwise: the same rank order), for
// ranges that start and end inside shards, over many chunks, mixed with
// all-reduces on the same segment; with `accumulate` the sums are added.
struct ScatterCase {
  const char* name;
  int ranks;
  int64_t shard;
  size_t slot_bytes;
};

void PrintTo(const ScatterCase& c, std::ostream* out) { *out << c.name; }

class ShmReduceScatter : public testing::TestWithParam<ScatterCase> {};

TEST_P(ShmReduceScatter, EachRankHoldsTheAllReducesSumsForItsShardOnly) {
  const ScatterCase c = GetParam();
  const int64_t n = c.shard * c.ranks;
  at::Tensor expected = rank_values(0, n, at::kFloat);
  for (int r = 1; r < c.ranks; ++r) expected = expected + rank_values(r, n, at::kFloat);
  // Ranges as a sharded step's buckets make them: from the end, uneven.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t end = n; end > 0;) {
    const int64_t begin = std::max<int64_t>(0, end - (c.shard * 2 / 3 + 5));
    ranges.emplace_back(begin, end - begin);
    end = begin;
  }
  const auto codes = run_ranks(c.ranks, c.slot_bytes, milliseconds(60000), [&](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    const at::Tensor mine = rank_values(rank, n, at::kFloat);
    const at::Tensor want = expected.narrow(0, rank * c.shard, c.shard);
    for (int round = 0; round < 3; ++round) {
      at::Tensor owned = at::full({c.shard}, 7.0f);
      for (auto [begin, count] : ranges)
        shm->reduce_scatter_sum(begin, count, c.shard,
                                [&](int64_t at, at::Tensor& slot) { slot.copy_(mine.narrow(0, at, slot.numel())); },
                                owned, /*accumulate=*/false);
      if (!at::equal(owned, want)) return kWrong;
      at::Tensor vote = at::ones({3});
      shm->all_reduce_sum(vote);  // the same segment, between reduce-scatters
      if (!at::equal(vote, at::full({3}, static_cast<float>(c.ranks)))) return kWrong;
      shm->reduce_scatter_sum(0, n, c.shard,
                              [&](int64_t at, at::Tensor& slot) { slot.copy_(mine.narrow(0, at, slot.numel())); },
                              owned, /*accumulate=*/true);
      if (!at::equal(owned, want + want)) return kWrong;
    }
    return kOk;
  });
  for (int r = 0; r < c.ranks; ++r) EXPECT_EQ(codes[r], kOk) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ShmReduceScatter,
                         testing::Values(ScatterCase{"two_ranks_one_chunk", 2, 5003, ShmAllReduce::kDefaultSlotBytes},
                                         ScatterCase{"two_ranks_many_chunks", 2, 20011, 4096},
                                         ScatterCase{"three_ranks", 3, 3337, 1024},
                                         ScatterCase{"four_ranks", 4, 999, 4096}),
                         [](const testing::TestParamInfo<ScatterCase>& info) { return std::string(info.param.name); });

TEST(ShmAllReduce, AllGatherPutsEveryRanksPartInRankOrder) {
  const int ranks = 3;
  const int64_t part = 10007;
  const auto codes = run_ranks(ranks, 4096, milliseconds(60000), [&](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    at::Tensor whole = at::empty({part * ranks});
    for (int round = 0; round < 3; ++round) {
      shm->all_gather(rank_values(rank + round, part, at::kFloat), whole, "its part");
      for (int r = 0; r < ranks; ++r)
        if (!at::equal(whole.narrow(0, r * part, part), rank_values(r + round, part, at::kFloat))) return kWrong;
    }
    return kOk;
  });
  EXPECT_EQ(codes, (std::vector<int>(ranks, kOk)));
}

// Sharded parameters gathered before use: any range of the flat space,
// across shard borders and chunks, in float32 and bfloat16, arrives whole
// on every rank from the ranks that hold it.
TEST(ShmAllReduce, GatherRangeGivesEveryRankEachElementFromTheRankThatHoldsIt) {
  const int ranks = 3;
  const int64_t shard = 2500;  // 4096-byte slots: 1024 float32 or 2048 bfloat16 a chunk
  const auto codes = run_ranks(ranks, 4096, milliseconds(60000), [&](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor everything = at::arange(shard * ranks, at::kFloat).mul_(0.25).to(dtype);
      for (const auto& [begin, count] : std::vector<std::pair<int64_t, int64_t>>{
               {0, shard * ranks}, {2400, 200}, {10, 20}, {4999, 2}, {2600, 4400}}) {
        at::Tensor got = at::full({count}, -1.0, dtype);
        bool outside = false;
        shm->gather_range(
            begin, count, shard, dtype,
            [&](int64_t first, at::Tensor& place) {
              outside |= first < rank * shard || first + place.numel() > (rank + 1) * shard;
              place.copy_(everything.narrow(0, first, place.numel()));
            },
            [&](int64_t first, const at::Tensor& values) { got.narrow(0, first - begin, values.numel()).copy_(values); },
            "its parameters");
        if (outside || !at::equal(got, everything.narrow(0, begin, count))) return kWrong;
      }
    }
    return kOk;
  });
  EXPECT_EQ(codes, (std::vector<int>(ranks, kOk)));
}

TEST(ShmAllReduce, NonContiguousTensorsAreSummedInPlace) {
  const auto codes = run_ranks(2, 4096, milliseconds(60000), [](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    at::Tensor base = at::full({40, 30}, static_cast<double>(rank + 1), at::kFloat);
    at::Tensor t = base.t();  // a transposed view
    shm->all_reduce_sum(t);
    return at::equal(base, at::full({40, 30}, 3.0, at::kFloat)) ? kOk : kWrong;
  });
  EXPECT_EQ(codes, (std::vector<int>{kOk, kOk}));
}

TEST(ShmAllReduce, APeerKilledMidRunIsNoticedAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const auto codes = run_ranks(2, 4096, milliseconds(120000), [](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    at::Tensor t = at::ones({1000});
    shm->all_reduce_sum(t);  // both arrive once
    if (rank == 1) ::raise(SIGKILL);
    shm->all_reduce_sum(t);  // rank 0 waits for a dead peer
    return kOk;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(codes[0], kPeerFailure);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_LT(seconds, 60.0) << "a dead peer is found by its pid, not by the 120 s timeout";
}

TEST(ShmAllReduce, APeerThatLeftIsNoticedAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const auto codes = run_ranks(2, 4096, milliseconds(120000), [](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    at::Tensor t = at::ones({1000});
    shm->all_reduce_sum(t);
    if (rank == 1) {
      // Stays alive, but its all-reduce is gone (a failed run cleaning up).
      shm.reset();
      ::sleep(3);
      return kOk;
    }
    shm->all_reduce_sum(t);
    return kOk;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(codes[0], kPeerFailure);
  EXPECT_LT(seconds, 60.0) << "a peer that left is seen at once, not after the 120 s timeout";
}

TEST(ShmAllReduce, AStoppedPeerEndsTheWaitAtTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto codes = run_ranks(2, 4096, milliseconds(500), [](int rank, std::unique_ptr<ShmAllReduce>& shm) {
    at::Tensor t = at::ones({1000});
    shm->all_reduce_sum(t);
    if (rank == 1) {
      ::sleep(3);  // alive, never arrives: as a SIGSTOPped rank
      return kOk;
    }
    shm->all_reduce_sum(t);
    return kOk;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(codes[0], kPeerFailure);
  EXPECT_GE(seconds, 0.5);
}

// What /dev/shm holds under this process's pid, as a POSIX segment name
// (kiln-<pid>-*) would appear there.
std::vector<std::string> names_of_this_process() {
  std::vector<std::string> out;
  const std::string prefix = "kiln-" + std::to_string(::getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename());
  return out;
}

// The segment never has a name in /dev/shm (a SIGKILL at any instant leaves
// nothing there): others open it by the creator's handle until it is withdrawn.
TEST(ShmSegment, NothingIsNamedInDevShmAndTheHandleGoesOnceWithdrawn) {
  ShmSegment segment = ShmSegment::create(8192);
  const std::string name = segment.name();
  EXPECT_TRUE(names_of_this_process().empty());
  EXPECT_EQ(name.rfind("/proc/" + std::to_string(::getpid()) + "/fd/", 0), 0u) << name;
  ShmSegment other = ShmSegment::open(name, 8192);
  segment.unlink();
  static_cast<char*>(segment.data())[100] = 'k';
  EXPECT_EQ(static_cast<char*>(other.data())[100], 'k') << "one memory, two mappings";
  EXPECT_THROW(ShmSegment::open(name, 8192), std::runtime_error);
  EXPECT_TRUE(names_of_this_process().empty());
}

// Another process opens it by the handle (as the other ranks do), and it is
// one memory with the creator's.
TEST(ShmSegment, AnotherProcessOpensItByTheHandle) {
  ShmSegment segment = ShmSegment::create(8192);
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      ShmSegment mine = ShmSegment::open(segment.name(), 8192);
      static_cast<char*>(mine.data())[7] = 'x';
      std::_Exit(0);
    } catch (...) {
      std::_Exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(static_cast<char*>(segment.data())[7], 'x');
}

TEST(ShmSegment, DestroyingTheCreatorWithdrawsTheHandle) {
  std::string name;
  {
    ShmSegment segment = ShmSegment::create(4096);
    name = segment.name();
    ASSERT_NO_THROW(ShmSegment::open(name, 4096));
  }
  EXPECT_THROW(ShmSegment::open(name, 4096), std::runtime_error);
  EXPECT_TRUE(names_of_this_process().empty());
}

TEST(ShmSegment, ASegmentTooSmallIsRefused) {
  ShmSegment segment = ShmSegment::create(4096);
  EXPECT_THROW(ShmSegment::open(segment.name(), 1 << 20), std::runtime_error);
  ShmAllReduce::initialise(segment, 1, 1024, 7);
  EXPECT_FALSE(ShmAllReduce::matches(segment, 1, 1024, 8)) << "another nonce: another segment";
}

}  // namespace
}  // namespace kiln
