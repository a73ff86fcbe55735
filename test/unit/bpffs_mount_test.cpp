// Reading mountinfo and deciding whether a bpffs outlives the agent's mount
// namespace (loader/bpffs.h), from crafted mount tables. The real
// namespaces are in test/netns/bpffs_scope_test.cpp.
#include <gtest/gtest.h>

#include "loader/bpffs.h"
#include "userspace/agent/options.h"
#include "userspace/api/protocol.h"

namespace sluice {
namespace {

// The host's table: /sys/fs/bpf is bpffs 0:39 (mount 44), mounted by hand
// (no propagation), as on the test machines.
const std::string kHost =
    "21 26 0:20 / /proc rw,relatime - proc proc rw\n"
    "22 26 0:21 / /sys rw,relatime shared:7 - sysfs sysfs rw\n"
    "44 22 0:39 / /sys/fs/bpf rw,relatime - bpf bpf rw\n"
    "26 1 8:1 / / rw,relatime shared:1 - ext4 /dev/root rw\n";

TEST(Mountinfo, ParsesFieldsPropagationAndEscapes) {
  auto m = parseMountinfo(
      "44 22 0:39 / /sys/fs/bpf rw,relatime shared:12 master:3 - bpf bpf rw\n"
      "garbage line\n"
      "45 26 0:50 / /tmp/with\\040space\\134x rw - bpf none rw\n"
      "46 26 0:51 / /no/separator rw\n");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].id, 44u);
  EXPECT_EQ(m[0].device, "0:39");
  EXPECT_EQ(m[0].mountPoint, "/sys/fs/bpf");
  EXPECT_EQ(m[0].optional, (std::vector<std::string>{"shared:12", "master:3"}));
  EXPECT_EQ(m[0].fsType, "bpf");
  EXPECT_EQ(m[1].mountPoint, "/tmp/with space\\x");
  EXPECT_TRUE(m[1].optional.empty());
}

TEST(BpffsMountJudge, TheHostsOwnNamespace) {
  auto b = judgeBpffsMount(44, kHost, kHost, true);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_TRUE(b->outlivesNamespace);
  EXPECT_EQ(b->why, "this is the host's mount namespace");
  EXPECT_EQ(b->mountPoint, "/sys/fs/bpf");
  EXPECT_EQ(b->device, "0:39");
  EXPECT_EQ(b->propagation, "private");
}

TEST(BpffsMountJudge, ACopyOfTheHostsBpffsInAnotherNamespace) {
  // unshare -m: new mount IDs, the same filesystem instance.
  std::string self = "901 900 0:39 / /sys/fs/bpf rw,relatime - bpf bpf rw\n";
  auto b = judgeBpffsMount(901, self, kHost, true);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_TRUE(b->outlivesNamespace);
  EXPECT_EQ(b->why, "the host mounts the same bpffs at /sys/fs/bpf");
}

TEST(BpffsMountJudge, ABpffsOnlyThisNamespaceMounts) {
  std::string self = "901 900 0:39 / /sys/fs/bpf rw - bpf bpf rw\n"
                     "905 900 0:77 / /tmp/x rw,relatime - bpf bpf rw\n";
  auto b = judgeBpffsMount(905, self, kHost, true);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_FALSE(b->outlivesNamespace);
  EXPECT_EQ(b->why, "the host's mount table (PID 1's) has no bpffs 0:77");
  // A shared propagation does not help when the host has no such mount.
  self = "905 900 0:77 / /tmp/x rw shared:40 - bpf bpf rw\n";
  b = judgeBpffsMount(905, self, kHost, true);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->outlivesNamespace);
  EXPECT_EQ(b->propagation, "shared:40");
}

TEST(BpffsMountJudge, WithoutTheHostsTableOnlyPropagationCounts) {
  std::string self = "905 900 0:77 / /sys/fs/bpf rw shared:40 - bpf bpf rw\n"
                     "906 900 0:78 / /a rw master:41 - bpf bpf rw\n"
                     "907 900 0:79 / /b rw - bpf bpf rw\n"
                     "908 900 0:80 / /c rw unbindable - bpf bpf rw\n";
  for (bool initialPidNs : {false, true}) {
    // Not in the host's PID namespace: PID 1's table is our own container's,
    // useless. In it but PID 1's table unreadable: the same.
    std::optional<std::string> init = initialPidNs ? std::nullopt : std::optional<std::string>(self);
    auto shared = judgeBpffsMount(905, self, init, initialPidNs);
    ASSERT_TRUE(shared.ok());
    EXPECT_TRUE(shared->outlivesNamespace);
    EXPECT_EQ(shared->why, "its propagation (shared:40) ties it to mounts outside this namespace");
    auto slave = judgeBpffsMount(906, self, init, initialPidNs);
    ASSERT_TRUE(slave.ok());
    EXPECT_TRUE(slave->outlivesNamespace);
    for (uint64_t id : {907u, 908u}) {
      auto priv = judgeBpffsMount(id, self, init, initialPidNs);
      ASSERT_TRUE(priv.ok());
      EXPECT_FALSE(priv->outlivesNamespace);
      EXPECT_EQ(priv->why, std::string("a private mount, and the host's mounts are not visible (") +
                               (initialPidNs ? "/proc/1/mountinfo unreadable" : "no host PID namespace") + ")");
    }
  }
}

TEST(BpffsMountJudge, ErrorsNameTheMount) {
  auto notBpf = judgeBpffsMount(22, kHost, kHost, true);
  ASSERT_FALSE(notBpf.ok());
  EXPECT_EQ(notBpf.error().message, "/sys is a sysfs mount, not bpffs");
  auto missing = judgeBpffsMount(7, kHost, kHost, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "mount 7 is not in this process's mountinfo");
}

TEST(BpffsMountJudge, TheAgentFlagAndHealthFields) {
  auto d = agent::parseDaemonArgs({"--allow-private-bpffs"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(d->agent.allowPrivateBpffs);
  EXPECT_FALSE(agent::parseDaemonArgs({}).value().agent.allowPrivateBpffs);
  EXPECT_NE(agent::daemonUsage().find("--allow-private-bpffs"), std::string::npos);

  agent::Health h;
  h.bpffsRoot = "/sys/fs/bpf/sluice";
  h.bpffsScope = "private";
  h.bpffsScopeWhy = "why";
  auto back = agent::decodeHealth(agent::encodeHealth(h));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->bpffsScope, "private");
  EXPECT_EQ(back->bpffsScopeWhy, "why");
  // An agent from before the fields: nothing reported, not an error.
  auto j = agent::encodeHealth(h);
  j.erase("bpffs_scope");
  j.erase("bpffs_scope_why");
  back = agent::decodeHealth(j);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->bpffsScope, "");
}

}  // namespace
}  // namespace sluice
