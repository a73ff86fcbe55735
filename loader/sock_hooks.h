// The socket mode's attachments. Node-wide: the cgroup programs (connect,
// sendmsg, recvmsg, getpeername, getsockopt, sock_ops, cgroup_skb) as links
// at one cgroup v2 directory, attached once and pinned under
// <root>/node_links/ so that they outlive the process that made them. Per
// pod: a tiny sk_lookup program of its own (loader/sk_lookup_stubs.h: the
// kernel does not tell an sk_lookup program its netns) that names its pod
// and tail-calls the shared one, linked to the pod's netns and pinned at
// links/<pod>/sk_lookup.
// None of these attachments waits for an RCU grace period.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

class PodPrograms;

/// One node-wide hook: its pin name, attach type and program.
struct NodeHook {
  std::string name;  ///< "connect4", "getsockopt", ...
  int attachType = 0;
  int progFd = -1;
};

/// The node hooks of @p p's socket programs (empty when not loaded).
std::vector<NodeHook> nodeHooks(const PodPrograms& p);

/// The cgroup the node hooks go to: @p requested, or the root of the
/// cgroup v2 hierarchy when empty. The path must be a cgroup v2 directory.
Result<std::string> nodeHookCgroup(const std::string& requested);

/// What ensureNodeHooks did.
struct NodeHooksReport {
  int attached = 0;   ///< hooks that were missing (or detached) and were attached
  int replaced = 0;   ///< hooks switched to @p p's programs
};

/// Attaches every node hook missing under @p root at @p cgroupPath
/// (pinned), and fills the shared sk_lookup slot when it is empty. With
/// @p replace, hooks running other programs (an older build's) are switched
/// to @p p's in place (bpf_link_update; no socket sees a hook missing) and
/// so is the shared sk_lookup program. Hooks pinned at another cgroup are
/// an error (EEXIST) naming both.
Result<NodeHooksReport> ensureNodeHooks(const std::string& root, const std::string& cgroupPath, PodPrograms& p,
                                        bool replace);

/// Whether every node hook of @p p is pinned under @p root and the shared
/// sk_lookup slot is filled: one directory read and one map lookup, where
/// ensureNodeHooks reads each link back (~0.35 ms for the 13). It does not
/// see a hook detached behind its pin (checkNodeHooks does); a process
/// that enrolls many pods checks fully once (Datapath), then with this.
bool nodeHooksComplete(const std::string& root, const PodPrograms& p);

/// Problems with the node hooks under @p root: missing, detached (its
/// cgroup was removed), or at another cgroup than @p cgroupPath.
std::vector<std::string> checkNodeHooks(const std::string& root, const std::string& cgroupPath, const PodPrograms& p);

/// The node-wide cgroup links of @p hooks under @p root/node_links (shared
/// by the socket mode's hooks and the probe hook, loader/probe_hook.h):
/// attaches the missing ones at @p cgroupPath, pinned, all or nothing; with
/// @p replace switches those running another program in place. Links at
/// another cgroup: EEXIST. @p what names them in messages.
Result<NodeHooksReport> ensureCgroupLinks(const std::string& root, const std::string& cgroupPath,
                                          const std::vector<NodeHook>& hooks, bool replace, const std::string& what);

/// Problems with the node links @p names under @p root (missing, detached,
/// at another cgroup than @p cgroupPath), one line each naming @p what.
std::vector<std::string> checkCgroupLinks(const std::string& root, const std::string& cgroupPath,
                                          const std::vector<std::string>& names, const std::string& what);

/// Whether every link of @p names is pinned under @p root/node_links (one
/// directory read).
bool nodeLinksPinned(const std::string& root, const std::vector<std::string>& names);

/// Detaches and unpins node link @p name under @p root (absent: success).
Status detachNodeLink(const std::string& root, const std::string& name);

/// Another owner's program at a cgroup hook that chooses a socket's
/// destination, running before sluice's there.
struct ForeignHookAhead {
  std::string hook;  ///< "connect4", "connect6", "sendmsg4", "sendmsg6"
  uint32_t progId = 0;
  std::string progName;
};

/// The programs attached at @p cgroupPath that run before the socket
/// mode's node hooks pinned under @p root, on the hooks that choose a
/// socket's destination: a connect-time load balancer there (Cilium's or
/// Calico's socket LB) translates a service address inside an enrolled pod
/// before sluice records it, and the proxy sees the backend. sluice links
/// its hooks in front where the kernel orders cgroup links (Linux 6.16+);
/// on older kernels whoever attached first runs first. Empty when sluice's
/// are first or not attached. (Programs at a pod's own, deeper cgroups
/// run before the node's: not looked at.)
std::vector<ForeignHookAhead> foreignHooksAhead(const std::string& root, const std::string& cgroupPath);

/// Whether any of the socket mode's node hooks is pinned under @p root.
bool nodeHooksPinned(const std::string& root);

/// Detaches and unpins every node hook under @p root, the socket mode's
/// and the probe hook (absent: success).
Status removeNodeHooks(const std::string& root);

/// Takes pod @p cookie's own sk_lookup program (PodPrograms::skLookupStub:
/// loaded ahead or now) and links it to the network
/// namespace @p netnsFd, pinned at @p pin (replacing a stale pin).
Status attachPodSkLookup(const PodPrograms& p, uint64_t cookie, int netnsFd, const std::string& pin);

/// Detaches and unpins the link at @p pin (absent: success).
Status detachPodSkLookup(const std::string& pin);

/// Whether the link pinned at @p pin is attached to a live netns.
bool podSkLookupAttached(const std::string& pin);

}  // namespace sluice
