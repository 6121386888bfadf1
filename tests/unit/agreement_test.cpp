#include "distributed/agreement.hpp"

#include <gtest/gtest.h>

#include "support/run_process.hpp"

namespace kiln {
namespace {

TEST(Agreement, IdenticalRanksAgree) {
  const std::string e = encode_facts({{"manifest", "a = 1\nb = 2\n"}, {"model parameters", "w [2,3] Float\n"}});
  EXPECT_FALSE(first_difference({e, e, e}).has_value());
}

TEST(Agreement, NamesTheRanksTheFactAndBothLines) {
  const std::string r0 = encode_facts({{"manifest", "a = 1\n"}, {"model parameters", "b [4] Float\nw [2,3] Float\n"}});
  const std::string r2 = encode_facts({{"manifest", "a = 1\n"}, {"model parameters", "b [4] Float\nw [3,3] Float\n"}});
  EXPECT_EQ(first_difference({r0, r0, r2}),
            "ranks 0 and 2 differ in their model parameters: rank 0 has 'w [2,3] Float', rank 2 has 'w [3,3] "
            "Float'; every rank must run the same manifest, plugins and model");
}

TEST(Agreement, AMissingLineIsNamedAsNothing) {
  const std::string r0 = encode_facts({{"model parameters", "w [2] Float\nb [2] Float\n"}});
  const std::string r1 = encode_facts({{"model parameters", "w [2] Float\n"}});
  const auto d = first_difference({r0, r1});
  ASSERT_TRUE(d);
  EXPECT_NE(d->find("rank 0 has 'b [2] Float', rank 1 has '(nothing)'"), std::string::npos) << *d;
}

TEST(Agreement, FileDigestFollowsTheBytes) {
  test::TempDir dir;
  test::write_file(dir / "a.so", "one build");
  test::write_file(dir / "b.so", "one build");
  test::write_file(dir / "c.so", "another build");
  EXPECT_EQ(file_digest(dir / "a.so"), file_digest(dir / "b.so"));
  EXPECT_NE(file_digest(dir / "a.so"), file_digest(dir / "c.so"));
  EXPECT_EQ(file_digest(dir / "a.so").size(), 16u);
}

}  // namespace
}  // namespace kiln
