// An app of an enrolled pod, as an attacker would be one: a forked child
// that enters the pod's network namespace, sits in a cgroup of its own (a
// child of the calling process's cgroup, so node hooks attached at a test's
// CgroupScope see it, and proxy-cgroup checks do not take it for the
// proxy), and keeps CAP_NET_RAW alone — what containerd and Docker grant a
// container by default (CAP_NET_ADMIN, CAP_SYS_ADMIN and the rest dropped
// from every set, no_new_privs). For the bypass tests: whatever the app
// manages to do, it does with no more than a real pod's app has.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "base/result.h"

namespace sluice::test {

struct PodAppResult {
  int exitCode = -1;  ///< fn's return value (128+N when killed by signal N)
  std::string out;    ///< what fn wrote into its string
};

/// Runs @p fn as such an app in the netns at @p netnsPath and waits for it
/// (killed after @p timeout). An error only when the app could not be set
/// up (fork, cgroup, setns, capabilities); fn's own failures are its exit
/// code. The cgroup is removed afterwards.
Result<PodAppResult> runAsPodApp(const std::string& netnsPath, const std::function<int(std::string& out)>& fn,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(20));

/// Whether the calling process holds @p cap (a CAP_* number) in its
/// effective set: for fn to check that it really runs without a capability.
bool hasCapability(int cap);

}  // namespace sluice::test
