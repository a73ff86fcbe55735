// Finding a running pod's network namespace from /proc, for pods that
// become selected while they run (no CNI call will come for them).
//
// Like Istio's node agent (cni/pkg/nodeagent/podcgroupns_linux.go): a
// process belongs to a pod when its cgroup path names the pod's UID, as
// kubelet names cgroups with either driver:
//   cgroupfs: /kubepods/burstable/pod<uid>/<container>
//   systemd:  /kubepods.slice/kubepods-burstable.slice/
//             kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<container>.scope
// (anywhere in the path, so nested and namespaced cgroup roots work, in any
// v1 hierarchy or the v2 one). The cgroup ties a process to a pod, not to a
// netns — a process may be visiting another pod's namespace — so a
// candidate is accepted only when its netns holds one of the pod's IPs, the
// host's netns never, and the oldest such process wins. The agent runs with
// hostPID, so /proc shows every container's processes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.h"
#include "base/result.h"

namespace sluice::kube {

/// Where a pod's network namespace was found.
struct NetnsLocation {
  pid_t pid = 0;
  /// PROC/PID/ns/net.
  std::string path;
  /// The namespace's identity (stat of path): check it again after opening,
  /// the process may have exited and its pid been reused meanwhile.
  uint64_t dev = 0;
  uint64_t ino = 0;
  /// The process's start time (clock ticks since boot, /proc/PID/stat).
  uint64_t startTime = 0;
};

/// The pod UID (canonical, with '-') a cgroup path names, if any: Istio's
/// (spire's) pattern — "pod" after a punctuation character, 32 hex digits
/// in 8-4-4-4-12 groups with optional separators, a punctuation character,
/// then a container segment at the end (".scope" trimmed).
std::optional<std::string> podUidFromCgroupPath(std::string_view path);

/// The pod UID named by the contents of /proc/PID/cgroup
/// ("ID:controllers:path" lines); nullopt when no line names a pod, an
/// error when lines name two different pods or a line is malformed.
Result<std::optional<std::string>> podUidFromCgroupFile(std::string_view content);

/// One process of a pod, as a scan saw it.
struct PodProcess {
  pid_t pid = 0;
  std::string podUid;
  uint64_t netnsDev = 0;
  uint64_t netnsIno = 0;
  uint64_t startTime = 0;
};

class NetnsFinder {
 public:
  /// @p procRoot: the host's /proc (the agent runs with hostPID).
  explicit NetnsFinder(std::string procRoot = "/proc");

  /// One pass over procRoot: every process whose cgroup names a pod.
  /// Processes that exit during the pass are skipped.
  Result<std::vector<PodProcess>> scan() const;

  /// Pod @p uid's netns among @p processes: its processes oldest first, the
  /// first whose netns (not the host's, not the agent's own) holds one of
  /// @p ips. Errors say why none did.
  Result<NetnsLocation> locate(const std::vector<PodProcess>& processes, const std::string& uid,
                               const std::vector<std::string>& ips) const;

  /// scan() then locate().
  Result<NetnsLocation> find(const std::string& uid, const std::vector<std::string>& ips) const;

 private:
  std::string procRoot_;
};

/// Opens @p loc.path and checks that it is still the namespace the finder
/// saw ((dev, ino)); ESTALE when the process was replaced.
Result<Fd> openLocatedNetns(const NetnsLocation& loc);

/// Whether the network namespace @p nsfd has one of @p ips on an interface
/// (IPv4-mapped IPv6 addresses compare as IPv4). Errors: a bad address.
Result<bool> netnsHoldsAnyIp(int nsfd, const std::vector<std::string>& ips);

}  // namespace sluice::kube
