#include "util/errors.hpp"

#include <gtest/gtest.h>

namespace kiln {
namespace {

// c10::Error::what() in LibTorch 1.13 and 2.x: the message, then the C++
// backtrace. Users see the message only.
TEST(OneLine, DropsTheCxxBacktraceThatC10ErrorsCarry) {
  const std::string what =
      "Socket Timeout\nException raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:604 (most recent "
      "call first):\nframe #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x55 (0x7f in libc10.so)\n"
      "frame #1: <unknown function> + 0x10 (0x7f in libtorch_cpu.so)\n";
  EXPECT_EQ(one_line(what), "Socket Timeout");
}

TEST(OneLine, JoinsTheLinesOfAMultiLineMessage) {
  EXPECT_EQ(one_line("first part\nsecond part\n"), "first part; second part");
  EXPECT_EQ(one_line("cause:\ndetail"), "cause: detail");
  EXPECT_EQ(one_line("already one line"), "already one line");
}

}  // namespace
}  // namespace kiln
