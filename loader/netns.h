// Network namespace handles: open, identify, and run code inside one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/fd.h"
#include "base/result.h"

namespace sluice {

/// Opens the network namespace file at @p path (e.g. /var/run/netns/NAME or
/// /proc/PID/ns/net) read-only and close-on-exec, and checks that it really
/// is a network namespace. Errors name the path: missing file, permission
/// denied, or "PATH: not a network namespace" (another namespace type, a
/// regular file, or an unmounted /var/run/netns placeholder).
Result<Fd> openNetns(const std::string& path);

/// The inode number of the namespace behind @p nsfd; two fds refer to the
/// same namespace exactly when their inodes (on nsfs) are equal.
Result<uint64_t> netnsInode(int nsfd);

/// Runs @p fn in the network namespace @p nsfd and returns fn's status (or
/// the setns error): the calling thread joins the namespace, runs fn and
/// joins its own again before returning (a fresh dedicated thread when
/// /proc/thread-self is not available). Calls nest. Exceptions thrown by
/// @p fn are caught and returned as an Error.
///
/// Inside @p fn, sockets (including netlink) and /proc/sys/net belong to the
/// target namespace, but /proc/self refers to the process's main thread: use
/// /proc/thread-self/ns/net to see the namespace fn runs in. Sockets opened
/// inside fn stay in the target namespace after it returns.
Status runInNetns(int nsfd, const std::function<Status()>& fn);

/// The cookie of the calling thread's network namespace (SO_NETNS_COOKIE):
/// a 64-bit id that is never reused while the system is up, unlike inodes.
/// Fails with "kernel lacks SO_NETNS_COOKIE (needs Linux 5.14)" on older
/// kernels.
Result<uint64_t> currentNetnsCookie();

/// The cookie of the network namespace @p nsfd (enters it briefly).
Result<uint64_t> netnsCookie(int nsfd);

/// Opens the netns file at @p path and checks that it is still the
/// namespace whose cookie is @p cookie (a path such as /proc/PID/ns/net can
/// name another namespace once PID is gone): ENOENT when it is not.
Result<Fd> openNetnsWithCookie(const std::string& path, uint64_t cookie);

}  // namespace sluice
