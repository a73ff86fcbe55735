// The attacker of the bypass tests (test/common/pod_app.h) really is no
// more than a pod's app: CAP_NET_RAW alone, a cgroup of its own.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "test/common/pod_app.h"
#include "test/common/topology.h"
#include "userspace/sluicectl/net_raw.h"

namespace sluice::test {
namespace {

std::string cgroupLine() {
  std::ifstream f("/proc/self/cgroup");
  std::string line, v2;
  while (std::getline(f, line))
    if (line.rfind("0::", 0) == 0) v2 = line;
  return v2;
}

TEST(PodApp, HoldsNetRawAloneInACgroupOfItsOwn) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups, setns)";
  const std::string mine = cgroupLine();
  auto r = runAsPodApp("/proc/self/ns/net", [](std::string& out) {
    out = cgroupLine();
    if (!hasCapability(CAP_NET_RAW)) return 1;
    if (hasCapability(CAP_NET_ADMIN) || hasCapability(CAP_SYS_ADMIN) || hasCapability(CAP_NET_BIND_SERVICE)) return 2;
    // CAP_NET_RAW works: a raw socket opens; CAP_NET_ADMIN is gone: SO_MARK
    // needs CAP_NET_RAW or CAP_NET_ADMIN, so it still works, but a
    // capability-gated bind below 1024 does not.
    int raw = ::socket(AF_INET, SOCK_RAW, IPPROTO_UDP);
    if (raw < 0) return 3;
    ::close(raw);
    return 0;
  });
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->exitCode, 0) << r->out;
  EXPECT_NE(r->out, mine) << "the app must sit in a cgroup of its own";
  EXPECT_NE(r->out.find("/app-"), std::string::npos) << r->out;
}

TEST(PodApp, ASetUpFailureIsAnErrorNotAResult) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups, setns)";
  auto r = runAsPodApp("/proc/self/ns/does-not-exist", [](std::string&) { return 0; });
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("does-not-exist"), std::string::npos) << r.error().message;
}

// sluicectl pod list's NET_RAW column finds such an app by its netns, and
// only while it runs (userspace/sluicectl/net_raw.h, on the real /proc).
TEST(PodApp, IsWhatPodListReportsAsHoldingNetRaw) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, cgroups)";
  TestNetns ns("netraw");
  ASSERT_TRUE(ns.ok()) << ns.error();
  auto ino = netnsInodeOf(ns.path());
  ASSERT_TRUE(ino.ok()) << ino.error().message;
  EXPECT_TRUE(netRawProcesses(*ino)->empty());
  std::thread app([&] {
    (void)runAsPodApp(ns.path(), [](std::string&) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return 0;
    });
  });
  bool seen = false;
  for (int i = 0; i < 150 && !seen; i++) {
    auto procs = netRawProcesses(*ino);
    seen = procs.ok() && !procs->empty();
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  app.join();
  EXPECT_TRUE(seen) << "the app holding CAP_NET_RAW in the netns was not reported";
  EXPECT_TRUE(netRawProcesses(*ino)->empty()) << "reported after it exited";
}

}  // namespace
}  // namespace sluice::test
