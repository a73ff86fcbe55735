// Finding a running pod's netns from /proc (userspace/agent/kube/netns_finder.h)
// with real processes in real cgroups named like kubelet's, each in a
// network namespace of its own that holds the pod's IP.
//
//   /sys/fs/cgroup/unified/sluice-kube-<pid>-<n>/kubepods/burstable/pod<uid>/<c>   (+ pids v1)
//   /sys/fs/cgroup/unified/sluice-kube-<pid>-<n>/kubepods.slice/.../
//        kubepods-burstable-pod<uid_>.slice/cri-containerd-<c>.scope              (+ name=systemd v1)
//   process: sleeping child, own netns, pod IP on lo
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <thread>

#include "test/common/cgroup_pod.h"
#include "userspace/agent/kube/netns_finder.h"

namespace sluice::kube {
namespace {

using test::CgroupDriver;
using test::TestCgroupRoot;
using test::TestPodProcess;
using test::TestPodProcessOptions;

class KubeNetnsFinder : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups, network namespaces)";
    if (root_.unavailable()) GTEST_SKIP() << root_.error();
    ASSERT_TRUE(root_.ok()) << root_.error();
  }

  std::unique_ptr<TestPodProcess> start(TestPodProcessOptions o) {
    auto p = TestPodProcess::start(root_, o);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? std::move(*p) : nullptr;
  }

  void expectFound(const std::string& uid, const std::vector<std::string>& ips, const TestPodProcess& expected) {
    auto loc = finder_.find(uid, ips);
    ASSERT_TRUE(loc.ok()) << loc.error().message;
    EXPECT_EQ(loc->pid, expected.pid());
    EXPECT_EQ(loc->path, expected.netnsPath());
    EXPECT_EQ(std::make_pair(loc->dev, loc->ino), expected.netnsId());
    EXPECT_GT(loc->startTime, 0u);
    auto fd = openLocatedNetns(*loc);
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    struct stat st {};
    ASSERT_EQ(::fstat(fd->get(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_ino), expected.netnsId().second);
  }

  TestCgroupRoot root_;
  NetnsFinder finder_;
};

TEST_F(KubeNetnsFinder, CgroupfsNaming) {
  for (const char* qos : {"burstable", "besteffort", ""}) {
    TestPodProcessOptions o{.uid = test::randomPodUid(), .qos = qos, .ips = {"10.77.0.5"}};
    auto p = start(o);
    ASSERT_TRUE(p);
    SCOPED_TRACE(std::string("qos ") + qos);
    expectFound(o.uid, {"10.77.0.5"}, *p);
  }
}

TEST_F(KubeNetnsFinder, SystemdNaming) {
  for (const char* qos : {"burstable", ""}) {
    TestPodProcessOptions o{.uid = test::randomPodUid(), .driver = CgroupDriver::Systemd, .qos = qos, .ips = {"10.77.0.6"}};
    auto p = start(o);
    ASSERT_TRUE(p);
    SCOPED_TRACE(std::string("qos ") + qos);
    expectFound(o.uid, {"10.77.0.6"}, *p);
  }
}

TEST_F(KubeNetnsFinder, AnyOfThePodsIpsDualStackAndMapped) {
  TestPodProcessOptions o{.uid = test::randomPodUid(), .ips = {"fd00:77::7"}};
  auto p = start(o);
  ASSERT_TRUE(p);
  expectFound(o.uid, {"10.99.0.1", "fd00:77::7"}, *p);
  TestPodProcessOptions v4{.uid = test::randomPodUid(), .ips = {"10.77.0.8"}};
  auto q = start(v4);
  ASSERT_TRUE(q);
  expectFound(v4.uid, {"::ffff:10.77.0.8"}, *q);
}

TEST_F(KubeNetnsFinder, ContainersSharingThePodsNetnsGiveTheOldest) {
  std::string uid = test::randomPodUid();
  auto pause = start({.uid = uid, .container = "pause", .ips = {"10.77.1.1"}});
  ASSERT_TRUE(pause);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // start times tick at 10 ms
  auto app = start({.uid = uid, .container = "app", .joinNetns = pause->netnsPath()});
  ASSERT_TRUE(app);
  expectFound(uid, {"10.77.1.1"}, *pause);
}

TEST_F(KubeNetnsFinder, OfTwoNamespacesHoldingTheIpTheOldestProcessWins) {
  std::string uid = test::randomPodUid();
  auto older = start({.uid = uid, .container = "one", .ips = {"10.77.2.1"}});
  ASSERT_TRUE(older);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto younger = start({.uid = uid, .container = "two", .ips = {"10.77.2.1"}});
  ASSERT_TRUE(younger);
  expectFound(uid, {"10.77.2.1"}, *older);
}

TEST_F(KubeNetnsFinder, AForeignNamespaceIsRefusedEvenFromAnOlderProcess) {
  std::string uid = test::randomPodUid();
  // Older, in the pod's cgroup, but its netns lacks the pod's IP (a process
  // visiting another namespace): not the pod's.
  auto visitor = start({.uid = uid, .container = "debug", .ips = {"10.77.3.99"}});
  ASSERT_TRUE(visitor);
  auto alone = finder_.find(uid, {"10.77.3.1"});
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.error().code, ENOENT);
  EXPECT_EQ(alone.error().message,
            "pod " + uid + ": 1 process(es) in its cgroups, but no network namespace of theirs holds 10.77.3.1");
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  auto real = start({.uid = uid, .container = "app", .ips = {"10.77.3.1"}});
  ASSERT_TRUE(real);
  expectFound(uid, {"10.77.3.1"}, *real);
}

TEST_F(KubeNetnsFinder, TheHostsNamespaceIsNeverAPods) {
  std::string uid = test::randomPodUid();
  // In the pod's cgroup but in this test's (the agent's) own netns, which
  // holds 127.0.0.1.
  auto p = start({.uid = uid, .newNetns = false});
  ASSERT_TRUE(p);
  auto r = finder_.find(uid, {"127.0.0.1"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "pod " + uid +
                                   ": 1 process(es) in its cgroups, but no network namespace of theirs holds 127.0.0.1 (1 "
                                   "in the host's namespace, skipped)");
}

TEST_F(KubeNetnsFinder, Errors) {
  std::string uid = test::randomPodUid();
  auto none = finder_.find(uid, {"10.0.0.1"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().message, "pod " + uid + ": no process in its cgroups (looked at /proc)");
  EXPECT_EQ(finder_.find(uid, {}).error().message, "pod " + uid + ": no IP address to check its network namespace against");
  auto p = start({.uid = uid, .ips = {"10.77.4.1"}});
  ASSERT_TRUE(p);
  EXPECT_EQ(finder_.find(uid, {"10.77.4.x"}).error().message, "\"10.77.4.x\" is not an IP address");
}

TEST_F(KubeNetnsFinder, AReplacedProcessIsNoticedWhenOpening) {
  std::string uid = test::randomPodUid();
  auto p = start({.uid = uid, .ips = {"10.77.5.1"}});
  ASSERT_TRUE(p);
  auto loc = finder_.find(uid, {"10.77.5.1"});
  ASSERT_TRUE(loc.ok()) << loc.error().message;
  NetnsLocation stale = *loc;
  stale.ino += 1;  // as if the pid now belonged to a process in another netns
  auto fd = openLocatedNetns(stale);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, ESTALE);
  EXPECT_EQ(fd.error().message, loc->path + ": another network namespace than the one found (process " +
                                    std::to_string(loc->pid) + " was replaced)");
  p->kill();
  auto gone = openLocatedNetns(*loc);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, ENOENT) << gone.error().message;
}

TEST_F(KubeNetnsFinder, OneScanServesManyPods) {
  std::vector<std::unique_ptr<TestPodProcess>> pods;
  std::vector<std::string> uids;
  for (int i = 0; i < 20; ++i) {
    uids.push_back(test::randomPodUid());
    pods.push_back(start({.uid = uids.back(), .driver = i % 2 ? CgroupDriver::Systemd : CgroupDriver::Cgroupfs,
                          .ips = {"10.78.0." + std::to_string(i + 1)}}));
    ASSERT_TRUE(pods.back());
  }
  auto scan = finder_.scan();
  ASSERT_TRUE(scan.ok()) << scan.error().message;
  for (int i = 0; i < 20; ++i) {
    auto loc = finder_.locate(*scan, uids[i], {"10.78.0." + std::to_string(i + 1)});
    ASSERT_TRUE(loc.ok()) << loc.error().message;
    EXPECT_EQ(loc->pid, pods[i]->pid());
  }
}

}  // namespace
}  // namespace sluice::kube
