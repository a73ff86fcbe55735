// The pod guard (bpf/pod_guard.bpf.c): BPF LSM programs that refuse an
// enrolled pod's apps (tasks of its netns without CAP_NET_ADMIN) packet and
// XDP sockets and the proxy's ports, in both capture modes. Node-wide:
// attached once, the links pinned beside the socket mode's node hooks
// (<root>/node_links/guard_*), so they outlive the process. Needs "bpf"
// among the kernel's active LSMs; where it is missing the guard is
// reported inactive with the reason, and what it would refuse is the
// documented limit (README, "Fail closed").
#pragma once

#include <string>

#include "base/result.h"

namespace sluice {

struct PodGuardReport {
  bool active = false;
  std::string why;  ///< when not active: the reason, one line
  int attached = 0; ///< links attached now (0: all were there already)
};

/// The default of DatapathOptions::podGuard: on, unless the environment
/// says SLUICE_POD_GUARD=off (as `sluiced --pod-guard off` does; for
/// sluicectl and for test suites that run many bpffs roots side by side,
/// whose guards would each take a place on the kernel's trampoline).
bool podGuardWanted();

/// Whether the kernel runs BPF LSM programs: "bpf" in the comma-separated
/// list of @p lsmFile (securityfs; mounted at /sys/kernel/security when
/// missing and @p lsmFile is the default). Error: the list cannot be read.
Result<bool> bpfLsmActive(const std::string& lsmFile = "/sys/kernel/security/lsm");

/// Why the guard cannot run on this kernel: the active LSMs lack bpf, or
/// the kernel refuses BPF LSM programs (a probe loads the smallest one);
/// "" when it can.
std::string podGuardUnsupported();

/// Parses the list itself (for tests): whether "bpf" is one of its names.
bool lsmListHasBpf(const std::string& list);

/// Attaches the guard's programs for the maps pinned under @p root (which
/// must hold them: call after PodPrograms::load), unless links of this
/// build's programs are pinned there already; links of another build are
/// replaced (the new one attached before the old one goes). Not active
/// (no error) where the kernel has no BPF LSM.
Result<PodGuardReport> ensurePodGuard(const std::string& root);

/// The guard's state under @p root without changing it, for status.
PodGuardReport podGuardState(const std::string& root);

}  // namespace sluice
