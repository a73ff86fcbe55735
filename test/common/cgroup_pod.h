// Processes that look like a pod's containers to anything reading /proc:
// real processes moved into real cgroups named as kubelet names them (both
// cgroup drivers), each in a network namespace of its own that holds the
// pod's addresses. For the tests of finding a running pod's netns.
//
//   TestCgroupRoot  sluice-kube-<pid>-<n>/ under the v2 hierarchy and the
//                   v1 ones present (pids, name=systemd), removed with
//                   everything under it (left-over processes killed)
//   TestPodProcess  fork → unshare(CLONE_NEWNET) → pause(), moved into
//                   <root>/kubepods/burstable/pod<uid>/<container>          (cgroupfs)
//                   <root>/kubepods.slice/kubepods-burstable.slice/
//                     kubepods-burstable-pod<uid_>.slice/cri-containerd-<container>.scope (systemd)
//                   its IPs on the namespace's lo; SIGKILLed and reaped by the
//                   destructor.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice::test {

enum class CgroupDriver { Cgroupfs, Systemd };

class TestCgroupRoot {
 public:
  TestCgroupRoot();
  ~TestCgroupRoot();
  TestCgroupRoot(const TestCgroupRoot&) = delete;
  TestCgroupRoot& operator=(const TestCgroupRoot&) = delete;

  /// False when no cgroup hierarchy could be used; error() says why (tests
  /// skip with it when there is no cgroup v2 mounted at all).
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  /// No cgroup v2 hierarchy is mounted (a reason to skip, not a failure).
  bool unavailable() const { return unavailable_; }
  /// The test parent in each hierarchy a pod of @p driver is put in: the v2
  /// one, plus pids (cgroupfs) or name=systemd (systemd) when mounted.
  std::vector<std::string> parents(CgroupDriver driver) const;

 private:
  std::string name_;
  std::string v2_, pids_, systemd_;  ///< test parents ("" when not mounted)
  std::string error_;
  bool unavailable_ = false;
};

struct TestPodProcessOptions {
  std::string uid;
  CgroupDriver driver = CgroupDriver::Cgroupfs;
  /// "burstable", "besteffort", or "" (guaranteed: no QoS level).
  std::string qos = "burstable";
  std::string container = "c0ffee";
  /// Put on lo of the process's own new netns.
  std::vector<std::string> ips;
  /// false: the process stays in the test's own netns (ips ignored).
  bool newNetns = true;
  /// Join this netns (/proc/PID/ns/net of another process) instead.
  std::string joinNetns;
};

class TestPodProcess {
 public:
  static Result<std::unique_ptr<TestPodProcess>> start(const TestCgroupRoot& root, const TestPodProcessOptions& options);
  ~TestPodProcess();
  TestPodProcess(const TestPodProcess&) = delete;
  TestPodProcess& operator=(const TestPodProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// /proc/PID/ns/net.
  std::string netnsPath() const;
  /// (st_dev, st_ino) of its netns.
  std::pair<uint64_t, uint64_t> netnsId() const;
  /// SIGKILL and reap now (idempotent).
  void kill();

 private:
  TestPodProcess() = default;
  pid_t pid_ = -1;
};

/// A random pod UID (8-4-4-4-12 lowercase hex).
std::string randomPodUid();

}  // namespace sluice::test
