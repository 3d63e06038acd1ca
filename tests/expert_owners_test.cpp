// Which rank computes which routed expert under --expert-parallel (dist/expert_parallel.h,
// docs/scale-out.md §2.1): e mod N by default, shares in proportion to --ep-weights.
#include <gtest/gtest.h>

#include <vector>

#include "dist/expert_parallel.h"
#include "util/error.h"

namespace k3::dist {
namespace {

std::vector<int> counts(const std::vector<int>& owner, int size) {
  std::vector<int> c(static_cast<size_t>(size), 0);
  for (int r : owner) ++c[static_cast<size_t>(r)];
  return c;
}

TEST(ExpertOwners, DefaultIsExpertModRanks) {
  const std::vector<int> owner = expert_owners(10, 3, {});
  EXPECT_EQ(owner, (std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0}));
}

TEST(ExpertOwners, EqualWeightsAreTheDefault) {
  const std::vector<double> w = {1.5, 1.5, 1.5};
  EXPECT_EQ(expert_owners(384, 3, w), expert_owners(384, 3, {}));
}

TEST(ExpertOwners, SharesFollowTheWeightsInterleaved) {
  const std::vector<double> w = {2, 1, 1};
  const std::vector<int> owner = expert_owners(64, 3, w);
  EXPECT_EQ(counts(owner, 3), (std::vector<int>{32, 16, 16}));
  // Interleaved, not in blocks: every run of 4 experts has each rank's share.
  for (size_t at = 0; at + 4 <= owner.size(); at += 4)
    EXPECT_EQ(counts({owner.begin() + at, owner.begin() + at + 4}, 3), (std::vector<int>{2, 1, 1}))
        << "at " << at;
}

TEST(ExpertOwners, AZeroWeightOwnsNothing) {
  const std::vector<double> w = {0, 1, 1};
  EXPECT_EQ(counts(expert_owners(16, 3, w), 3), (std::vector<int>{0, 8, 8}));
}

TEST(ExpertOwners, OneWeightPerRankOrAnErrorNamingBoth) {
  const std::vector<double> w = {1, 1};
  try {
    expert_owners(16, 3, w);
    FAIL() << "2 weights for 3 ranks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--ep-weights gives 2 weights for a job of 3 ranks"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace k3::dist
