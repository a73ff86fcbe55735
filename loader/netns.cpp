#include "loader/netns.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <system_error>
#include <thread>

// Older uapi headers lack these; the values are fixed kernel ABI.
#ifndef NSFS_MAGIC
#define NSFS_MAGIC 0x6e736673
#endif
#ifndef NS_GET_NSTYPE
#define NS_GET_NSTYPE _IO(0xb7, 0x3)  // from <linux/nsfs.h>, Linux 4.11
#endif
#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71  // Linux 5.14
#endif

namespace sluice {

Result<Fd> openNetns(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::fromErrno(errno, "netns " + path);

  // Namespace files live on nsfs; anything else (a regular file, a directory,
  // or the empty placeholder /var/run/netns/NAME left behind when its bind
  // mount is gone) is not a namespace at all.
  struct statfs sfs {};
  if (::fstatfs(fd.get(), &sfs) != 0) return Error::fromErrno(errno, "fstatfs " + path);
  if (sfs.f_type != static_cast<decltype(sfs.f_type)>(NSFS_MAGIC)) {
    return Error::msg(path + ": not a network namespace", EINVAL);
  }
  // On nsfs, NS_GET_NSTYPE tells mnt/pid/user/... apart from net.
  int type = ::ioctl(fd.get(), NS_GET_NSTYPE);
  if (type < 0) return Error::fromErrno(errno, "NS_GET_NSTYPE " + path);
  if (type != CLONE_NEWNET) return Error::msg(path + ": not a network namespace", EINVAL);
  return fd;
}

Result<uint64_t> netnsInode(int nsfd) {
  struct stat st {};
  if (::fstat(nsfd, &st) != 0) {
    return Error::fromErrno(errno, "fstat netns fd " + std::to_string(nsfd));
  }
  return static_cast<uint64_t>(st.st_ino);
}

namespace {

// The task, run on the calling thread. Exceptions become an Error.
Status runTask(const std::function<Status()>& fn) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Error::msg(std::string("exception in network namespace task: ") + e.what());
  } catch (...) {
    return Error::msg("unknown exception in network namespace task");
  }
}

// The calling thread joins nsfd, runs fn and joins its own namespace
// again: two setns() calls, ~4 µs here. A thread per task cost 30 µs at the
// median and up to 8 ms on a busy node (the new thread waits for a CPU
// while the caller waits for it), most of an enrollment's p99.
std::optional<Status> runOnThisThread(int nsfd, const std::function<Status()>& fn) {
  Fd home(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!home.valid()) return std::nullopt;  // no /proc: use a thread of its own
  if (::setns(nsfd, CLONE_NEWNET) != 0)
    return Error::fromErrno(errno, "setns into network namespace (fd " + std::to_string(nsfd) + ")");
  Status result = runTask(fn);
  if (::setns(home.get(), CLONE_NEWNET) != 0) {
    // Joining a namespace this thread was just in, through an fd it holds,
    // does not fail short of a kernel out of memory; if it did, every later
    // socket of this thread would silently live in the pod's namespace.
    std::fprintf(stderr, "sluice: cannot return to the thread's network namespace: %s\n", std::strerror(errno));
    std::abort();
  }
  return result;
}

}  // namespace

Status runInNetns(int nsfd, const std::function<Status()>& fn) {
  if (auto done = runOnThisThread(nsfd, fn)) return *done;
  // setns(CLONE_NEWNET) only moves the calling *thread*: without a handle on
  // the way back, the work runs on a thread of its own that simply ends
  // afterwards. The namespace it joined is dropped with it.
  std::optional<Status> result;
  auto body = [&]() noexcept {
    try {
      if (::setns(nsfd, CLONE_NEWNET) != 0) {
        result = Error::fromErrno(errno, "setns into network namespace (fd " +
                                             std::to_string(nsfd) + ")");
        return;
      }
      result = runTask(fn);
    } catch (...) {
      result = Error::msg("unknown exception in network namespace task");
    }
  };
  try {
    std::jthread worker(body);  // joined when it goes out of scope
  } catch (const std::system_error& e) {
    return Error::msg(std::string("cannot start network namespace thread: ") + e.what(),
                      e.code().value());
  }
  return *result;
}

Result<uint64_t> currentNetnsCookie() {
  // Any socket reports the netns it was created in, which is the creating
  // thread's; AF_UNIX exists in every namespace regardless of IPv4/IPv6 setup.
  Fd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Error::fromErrno(errno, "socket(AF_UNIX)");
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) != 0) {
    int err = errno;
    if (err == ENOPROTOOPT) {
      return Error::msg("kernel lacks SO_NETNS_COOKIE (needs Linux 5.14)", err);
    }
    return Error::fromErrno(err, "getsockopt(SO_NETNS_COOKIE)");
  }
  return cookie;
}

Result<uint64_t> netnsCookie(int nsfd) {
  uint64_t cookie = 0;
  SLUICE_TRY(runInNetns(nsfd, [&]() -> Status {
    auto c = currentNetnsCookie();
    SLUICE_TRY(c);
    cookie = *c;
    return {};
  }));
  return cookie;
}

Result<Fd> openNetnsWithCookie(const std::string& path, uint64_t cookie) {
  auto fd = openNetns(path);
  SLUICE_TRY(fd);
  auto have = netnsCookie(fd->get());
  SLUICE_TRY(have);
  if (*have != cookie) return Error::msg(path + " is another network namespace now", ENOENT);
  return std::move(*fd);
}

}  // namespace sluice
