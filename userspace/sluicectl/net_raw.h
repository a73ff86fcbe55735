// Which processes of an enrolled pod could send frames past the capture
// where the pod guard (loader/pod_guard.h) does not run: those holding
// CAP_NET_RAW (packet sockets) without CAP_NET_ADMIN (with it a process
// owns the pod's network anyway). Read from /proc, as an operator would:
// a process is the pod's when its network namespace is the pod's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

struct NetRawProcess {
  pid_t pid = 0;
  std::string comm;
};

/// The processes under @p procRoot whose /proc/PID/ns/net is the network
/// namespace with inode @p netnsIno and whose effective capabilities hold
/// CAP_NET_RAW but not CAP_NET_ADMIN. The sandbox's own process (comm
/// "pause") is left out: it runs no app code. Processes that vanish while
/// read are skipped. Error: @p procRoot cannot be listed.
Result<std::vector<NetRawProcess>> netRawProcesses(uint64_t netnsIno, const std::string& procRoot = "/proc");

/// The inode of the network namespace at @p netnsPath (a /proc/PID/ns/net
/// or a bind mount of one).
Result<uint64_t> netnsInodeOf(const std::string& netnsPath);

}  // namespace sluice
