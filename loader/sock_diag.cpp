#include "loader/sock_diag.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace sluice {
namespace {

// One dump of family's TCP listeners into @p out.
Status dumpListeners(int nl, int family, std::vector<TcpListenerInfo>& out) {
  struct {
    nlmsghdr nh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nh.nlmsg_len = sizeof(msg);
  msg.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  msg.nh.nlmsg_seq = static_cast<uint32_t>(family);
  msg.req.sdiag_family = static_cast<uint8_t>(family);
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = 1u << TCP_LISTEN;
  if (::send(nl, &msg, sizeof(msg), 0) < 0) return Error::fromErrno(errno, "sock_diag: send");

  alignas(nlmsghdr) char buf[32768];
  for (;;) {
    ssize_t n = ::recv(nl, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, "sock_diag: recv");
    }
    if (n == 0) return Error::msg("sock_diag: the dump ended without NLMSG_DONE", EPROTO);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE) return {};
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        return Error::fromErrno(-e->error, "sock_diag: dump of TCP listeners");
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) continue;
      const auto* d = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      if (d->idiag_state != TCP_LISTEN) continue;
      TcpListenerInfo l;
      l.family = d->idiag_family;
      l.port = ntohs(d->id.idiag_sport);
      l.cookie = static_cast<uint64_t>(d->id.idiag_cookie[0]) | static_cast<uint64_t>(d->id.idiag_cookie[1]) << 32;
      l.inode = d->idiag_inode;
      int len = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*d)));
      for (auto* a = reinterpret_cast<rtattr*>(const_cast<inet_diag_msg*>(d) + 1); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type == INET_DIAG_MARK && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
          uint32_t v;
          std::memcpy(&v, RTA_DATA(a), sizeof(v));
          l.mark = v;
        } else if (a->rta_type == INET_DIAG_CGROUP_ID && RTA_PAYLOAD(a) >= sizeof(uint64_t)) {
          uint64_t v;
          std::memcpy(&v, RTA_DATA(a), sizeof(v));
          l.cgroupId = v;
        }
      }
      out.push_back(l);
    }
  }
}

// Whether fd @p name of /proc/PID/fd (@p dir) is "socket:[inode]".
bool isSocket(int dir, const char* name, const std::string& want) {
  char link[64];
  ssize_t n = ::readlinkat(dir, name, link, sizeof(link) - 1);
  if (n < 0) return false;
  link[n] = '\0';
  return want == link;
}

Result<uint64_t> socketCookie(int fd) {
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  if (::getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) != 0) return Error::fromErrno(errno, "SO_COOKIE");
  return cookie;
}

// The socket of process @p pid with @p want as its link, when it has one:
// ENOENT when it has none (or is gone).
Result<Fd> takeFrom(pid_t pid, const std::string& want, uint64_t cookie) {
  const std::string dirPath = "/proc/" + std::to_string(pid) + "/fd";
  Fd dir(::open(dirPath.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return Error::fromErrno(ENOENT, dirPath);
  DIR* d = ::fdopendir(::dup(dir.get()));
  if (!d) return Error::fromErrno(errno, dirPath);
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (isSocket(dir.get(), e->d_name, want)) {
      found = std::atoi(e->d_name);
      break;
    }
  }
  ::closedir(d);
  if (found < 0) return Error::msg(dirPath + ": no " + want, ENOENT);
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) return Error::fromErrno(errno == ESRCH ? ENOENT : errno, "pidfd_open " + std::to_string(pid));
  Fd sock(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), found, 0)));
  if (!sock.valid())
    return Error::fromErrno(errno == EBADF || errno == ESRCH ? ENOENT : errno,
                            "pidfd_getfd " + std::to_string(pid) + " fd " + std::to_string(found));
  // The fd number may have been closed and reused since it was read.
  auto c = socketCookie(sock.get());
  if (!c.ok() || *c != cookie) return Error::msg(want + " of " + std::to_string(pid) + " changed", ENOENT);
  return sock;
}

}  // namespace

Result<std::vector<TcpListenerInfo>> listTcpListeners() {
  Fd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return Error::fromErrno(errno, "sock_diag: socket");
  std::vector<TcpListenerInfo> out;
  for (int family : {AF_INET, AF_INET6}) SLUICE_TRY(dumpListeners(nl.get(), family, out));
  return out;
}

Result<Fd> takeSocket(uint64_t inode, uint64_t cookie, const std::vector<pid_t>& first) {
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  Error last = Error::msg("no process holds " + want, ENOENT);
  auto tryPid = [&](pid_t pid) -> std::optional<Fd> {
    auto r = takeFrom(pid, want, cookie);
    if (r.ok()) return std::move(*r);
    if (r.error().code != ENOENT) last = r.error();
    return std::nullopt;
  };
  for (pid_t pid : first)
    if (auto fd = tryPid(pid)) return std::move(*fd);
  DIR* proc = ::opendir("/proc");
  if (!proc) return Error::fromErrno(errno, "/proc");
  std::optional<Fd> got;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    bool seen = false;
    for (pid_t p : first) seen |= p == pid;
    if (seen) continue;
    if ((got = tryPid(static_cast<pid_t>(pid)))) break;
  }
  ::closedir(proc);
  if (got) return std::move(*got);
  return last;
}

}  // namespace sluice
