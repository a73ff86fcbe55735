// The build identity of pinned programs (loader/program_pins.h): anything
// that changes the loaded code changes it; nothing else does.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loader/program_pins.h"

namespace sluice {
namespace {

TEST(ProgramIdentity, FollowsTheObjectsAndTheVariant) {
  std::vector<unsigned char> pod(100003, 0x5a), sock(70001, 0x33), host(4096, 0x17);
  auto id = [&](PodCookieMethod m) {
    return identityOf({{pod.data(), pod.size()}, {sock.data(), sock.size()}, {host.data(), host.size()}}, m);
  };
  const std::string base = id(PodCookieMethod::KernCtx);
  EXPECT_EQ(base.size(), 16u);
  EXPECT_EQ(base.find_first_not_of("0123456789abcdef"), std::string::npos) << base;
  EXPECT_EQ(id(PodCookieMethod::KernCtx), base) << "not deterministic";
  EXPECT_NE(id(PodCookieMethod::ProbeRead), base) << "the variant is not in it";
  pod[50000] ^= 1;  // one bit of the pod object, in the word-wise part
  EXPECT_NE(id(PodCookieMethod::KernCtx), base);
  pod[50000] ^= 1;
  pod.back() ^= 1;  // and in the byte-wise tail
  EXPECT_NE(id(PodCookieMethod::KernCtx), base);
  pod.back() ^= 1;
  sock[1234] ^= 4;  // the socket mode's object
  EXPECT_NE(id(PodCookieMethod::KernCtx), base);
  sock[1234] ^= 4;
  host[0] ^= 0x80;  // the node object
  EXPECT_NE(id(PodCookieMethod::KernCtx), base);
  host[0] ^= 0x80;
  host.push_back(0);  // a longer object with the same prefix
  EXPECT_NE(id(PodCookieMethod::KernCtx), base);
  host.pop_back();
  EXPECT_EQ(id(PodCookieMethod::KernCtx), base);
}

TEST(ProgramIdentity, ThisBuildsVariantsDiffer) {
  EXPECT_NE(buildIdentity(PodCookieMethod::KernCtx), buildIdentity(PodCookieMethod::ProbeRead));
  EXPECT_EQ(buildIdentity(PodCookieMethod::KernCtx), buildIdentity(PodCookieMethod::KernCtx));
}

}  // namespace
}  // namespace sluice
