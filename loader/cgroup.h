// cgroup v2 ids of processes: how the agent knows the node proxy's sockets
// apart from an app's (bpf_skb_cgroup_id reports the cgroup v2 of a
// packet's socket).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "base/result.h"

namespace sluice {

/// Where the cgroup v2 hierarchy is mounted in this mount namespace
/// (/sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid
/// ones); ENOENT when it is not mounted.
Result<std::string> cgroup2Mount();

/// The cgroup v2 id of process @p pid: its `0::PATH` line of
/// /proc/PID/cgroup resolved under the v2 mount (the id is the cgroup
/// directory's inode, as the kernel's cgroup ids are). Errors name the pid
/// and why (no such process, no v2 hierarchy, a path outside this cgroup
/// namespace's view).
Result<uint64_t> cgroupIdOfPid(pid_t pid);

/// The cgroup v2 id of the cgroup directory @p path.
Result<uint64_t> cgroupIdOfPath(const std::string& path);

/// Whether the cgroup with v2 id @p id still exists (opened by its file
/// handle on the v2 mount).
Result<bool> cgroupExists(uint64_t id);

}  // namespace sluice
