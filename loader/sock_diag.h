// Sockets that exist already: the TCP listeners of a netns as the kernel's
// socket table lists them (NETLINK_SOCK_DIAG), and a socket of another
// process taken into this one (pidfd_getfd), so that it can be put into a
// SOCKHASH from user space. sluice uses both to find the node proxy's
// listeners that were opened before its sock_ops hook saw them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "base/fd.h"
#include "base/result.h"

namespace sluice {

/// A TCP socket in LISTEN state.
struct TcpListenerInfo {
  int family = 0;      ///< of the socket: AF_INET, or AF_INET6 (dual-stack ones too)
  uint16_t port = 0;   ///< host order
  uint64_t cookie = 0; ///< SO_COOKIE
  uint64_t inode = 0;  ///< its socket inode ("socket:[inode]" in /proc/PID/fd)
  std::optional<uint32_t> mark;      ///< SO_MARK (the kernel shows it to CAP_NET_ADMIN)
  std::optional<uint64_t> cgroupId;  ///< the cgroup (v2) it was created in
};

/// The TCP listeners of the calling thread's netns, both families.
Result<std::vector<TcpListenerInfo>> listTcpListeners();

/// A duplicate of the socket whose inode is @p inode, taken from the process
/// holding it (pidfd_getfd: needs CAP_SYS_PTRACE over it). The processes in
/// @p first are searched first, then every process. The duplicate is checked
/// to be the socket with @p cookie. ENOENT: no process holds it (any more).
Result<Fd> takeSocket(uint64_t inode, uint64_t cookie, const std::vector<pid_t>& first = {});

}  // namespace sluice
