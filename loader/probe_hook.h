// The node's probe source (bpf/node_probe.bpf.c, spec rules 10 and 11):
// cgroup connect4/connect6 programs that bind a node socket connecting to
// an enrolled pod's address (pod_addrs) to the probe address, attached once
// per node at the node cgroup (the cgroup v2 root by default) in both
// capture modes and pinned as <root>/node_links/probe_connect4 and
// probe_connect6; and the probe addresses the node must own for the
// replies (169.254.7.127/32 scope host, fd16:9254:7127:1337:ffff:ffff:
// ffff:ffff/128 nodad, deprecated so that the kernel never picks it as a
// source by itself) on lo of the node's netns. Enrolling a pod then only
// writes its addresses to pod_addrs: no program is attached per pod and
// no RCU grace period is waited for (cgroup links do not wait for one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

/// What ensureProbeHook did.
struct ProbeHookReport {
  int attached = 0;  ///< links that were missing and were attached
  int replaced = 0;  ///< links switched to this build's program (bpf_link_update)
};

/// Whether both links are pinned under @p root: one directory read, no
/// program loaded (the fast path of every enrollment after the first).
bool probeHookPinned(const std::string& root);

/// Attaches the links missing under @p root at @p cgroupPath, pinned;
/// with @p replace, links running another program (an older build's) are
/// switched in place. Loads the program only when there is something to
/// do or to compare (@p replace). Links at another cgroup: EEXIST.
Result<ProbeHookReport> ensureProbeHook(const std::string& root, const std::string& cgroupPath, bool replace);

/// Problems with the links under @p root: missing, detached (cgroup gone),
/// or at another cgroup than @p cgroupPath.
std::vector<std::string> checkProbeHook(const std::string& root, const std::string& cgroupPath);

/// Detaches and unpins both links (absent: success).
Status removeProbeHook(const std::string& root);

/// The node's counters of the hook (probe_stats): index SLUICE_PROBE_STAT_*,
/// summed over CPUs; zeros when the map is not pinned.
std::vector<uint64_t> probeHookStats(const std::string& root);

/// The probe addresses on lo of the calling thread's netns (present:
/// success); @p probeV4 and @p probeV6 in text (EINVAL: not addresses of
/// their family). A netns without IPv6 gets the IPv4 address only.
Status ensureProbeAddrs(const std::string& probeV4, const std::string& probeV6);

/// Whether both are on lo of the calling thread's netns (IPv6 only where
/// it is enabled): the missing ones, one line each.
std::vector<std::string> checkProbeAddrs(const std::string& probeV4, const std::string& probeV6);

/// Removes them from lo of the calling thread's netns (absent: success).
Status removeProbeAddrs(const std::string& probeV4, const std::string& probeV6);

}  // namespace sluice
