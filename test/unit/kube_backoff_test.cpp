// Back-off of the Kubernetes informers and the controller's retries
// (userspace/agent/kube/backoff.h): bounded, jittered, reset after success.
#include <gtest/gtest.h>

#include <set>

#include "userspace/agent/kube/backoff.h"

namespace sluice::kube {
namespace {

using std::chrono::milliseconds;

TEST(KubeBackoff, WithoutJitterDoublesUpToTheCap) {
  Backoff b({milliseconds(200), milliseconds(3000), 2.0, 0.0}, 1);
  std::vector<int64_t> got;
  for (int i = 0; i < 7; ++i) got.push_back(b.next().count());
  EXPECT_EQ(got, (std::vector<int64_t>{200, 400, 800, 1600, 3000, 3000, 3000}));
  EXPECT_EQ(b.failures(), 7u);
  b.reset();
  EXPECT_EQ(b.failures(), 0u);
  EXPECT_EQ(b.next().count(), 200);
}

TEST(KubeBackoff, JitteredDelaysStayWithinTheirBoundsAndSpread) {
  BackoffOptions o{milliseconds(100), milliseconds(30000), 2.0, 0.5};
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Backoff b(o, seed);
    for (uint32_t n = 0; n < 40; ++n) {
      auto d = b.next();
      ASSERT_GE(d, b.lowerBound(n)) << "seed " << seed << " n " << n;
      ASSERT_LE(d, b.upperBound(n)) << "seed " << seed << " n " << n;
      ASSERT_LE(d, o.max);
    }
  }
  Backoff probe(o, 0);
  EXPECT_EQ(probe.upperBound(0).count(), 100);
  EXPECT_EQ(probe.lowerBound(0).count(), 50);
  EXPECT_EQ(probe.upperBound(3).count(), 800);
  EXPECT_EQ(probe.lowerBound(3).count(), 400);
  EXPECT_EQ(probe.upperBound(1000).count(), 30000) << "no overflow far past the cap";
  EXPECT_EQ(probe.lowerBound(1000).count(), 15000);

  // Agents restarted together do not retry in lockstep: the first delays of
  // different seeds differ.
  std::set<int64_t> firsts;
  for (uint64_t seed = 0; seed < 20; ++seed) firsts.insert(Backoff(o, seed).next().count());
  EXPECT_GT(firsts.size(), 5u);
}

TEST(KubeBackoff, OddOptionsAreClamped) {
  Backoff b({milliseconds(500), milliseconds(100), 0.5, 7.0}, 3);  // max < initial, factor < 1, jitter > 1
  for (int i = 0; i < 5; ++i) {
    auto d = b.next().count();
    EXPECT_GE(d, 0);
    EXPECT_LE(d, 500);
  }
  Backoff constant({milliseconds(50), milliseconds(1000), 1.0, 0.0}, 3);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(constant.next().count(), 50);
}

}  // namespace
}  // namespace sluice::kube
