#include "userspace/agent/kube/netns_finder.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "loader/netns.h"

namespace sluice::kube {

namespace {

// Go's [[:punct:]]: ASCII punctuation only.
bool punct(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return (u >= 33 && u <= 47) || (u >= 58 && u <= 64) || (u >= 91 && u <= 96) || (u >= 123 && u <= 126);
}

bool hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Parses the 8-4-4-4-12 hex groups with optional single punctuation
// separators starting at s[i]; the end position, or npos.
size_t parseUid(std::string_view s, size_t i, std::string& uid) {
  static constexpr std::array<int, 5> groups{8, 4, 4, 4, 12};
  uid.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) {
      uid.push_back('-');
      if (i < s.size() && punct(s[i])) ++i;
    }
    for (int k = 0; k < groups[g]; ++k, ++i) {
      if (i >= s.size() || !hex(s[i])) return std::string_view::npos;
      uid.push_back(s[i]);
    }
  }
  return i;
}

// (?:[[:^punct:]]+[[:punct:]])*[[:^punct:]]+$ : non-empty segments of
// non-punctuation separated by single punctuation characters, ending in one.
bool containerTail(std::string_view s) {
  if (s.empty() || punct(s.back())) return false;
  bool inSegment = false;
  for (char c : s) {
    if (punct(c)) {
      if (!inSegment) return false;
      inSegment = false;
    } else {
      inSegment = true;
    }
  }
  return inSegment;
}

Result<std::string> readSmallFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::fromErrno(errno, path);
  Fd owner(fd);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) break;
  }
  return out;
}

// Field 22 of /proc/PID/stat (starttime), counted after the command's
// closing parenthesis (the command may hold spaces and parentheses).
std::optional<uint64_t> startTimeOf(const std::string& stat) {
  auto paren = stat.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  size_t pos = paren + 1;
  for (int field = 0; field < 20; ++field) {
    pos = stat.find_first_not_of(' ', pos);
    if (pos == std::string::npos) return std::nullopt;
    if (field == 19) return std::strtoull(stat.c_str() + pos, nullptr, 10);
    pos = stat.find(' ', pos);
    if (pos == std::string::npos) return std::nullopt;
  }
  return std::nullopt;
}

struct Addr {
  int family = 0;
  std::array<unsigned char, 16> bytes{};
  bool operator==(const Addr&) const = default;
};

std::optional<Addr> parseAddr(const std::string& s) {
  Addr a;
  if (inet_pton(AF_INET, s.c_str(), a.bytes.data()) == 1) {
    a.family = AF_INET;
    return a;
  }
  if (inet_pton(AF_INET6, s.c_str(), a.bytes.data()) == 1) {
    a.family = AF_INET6;
    // ::ffff:a.b.c.d is the IPv4 address (Go's Unmap).
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a.bytes.data(), mapped, 12) == 0) {
      Addr v4;
      v4.family = AF_INET;
      std::memcpy(v4.bytes.data(), a.bytes.data() + 12, 4);
      return v4;
    }
    return a;
  }
  return std::nullopt;
}

std::optional<Addr> addrOf(const sockaddr* sa) {
  if (!sa) return std::nullopt;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  else
    return std::nullopt;
  return parseAddr(buf);
}

std::string joinIps(const std::vector<std::string>& ips) {
  std::string out;
  for (const auto& ip : ips) out += (out.empty() ? "" : ", ") + ip;
  return out;
}

}  // namespace

std::optional<std::string> podUidFromCgroupPath(std::string_view path) {
  if (path.size() >= 6 && path.substr(path.size() - 6) == ".scope") path.remove_suffix(6);
  std::string uid;
  for (size_t i = 0; i + 4 <= path.size(); ++i) {
    if (!punct(path[i]) || path.substr(i + 1, 3) != "pod") continue;
    size_t end = parseUid(path, i + 4, uid);
    if (end == std::string_view::npos || end >= path.size() || !punct(path[end])) continue;
    if (containerTail(path.substr(end + 1))) return uid;
  }
  return std::nullopt;
}

Result<std::optional<std::string>> podUidFromCgroupFile(std::string_view content) {
  std::optional<std::string> found;
  while (!content.empty()) {
    auto nl = content.find('\n');
    std::string_view line = content.substr(0, nl);
    content = nl == std::string_view::npos ? std::string_view() : content.substr(nl + 1);
    if (line.empty()) continue;
    auto c1 = line.find(':');
    auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos)
      return Error::msg("cgroup line \"" + std::string(line) + "\" is not ID:controllers:path", EINVAL);
    auto uid = podUidFromCgroupPath(line.substr(c2 + 1));
    if (!uid) continue;
    if (found && *found != *uid) return Error::msg("cgroups name two pods (" + *found + ", " + *uid + ")", EINVAL);
    found = uid;
  }
  return found;
}

NetnsFinder::NetnsFinder(std::string procRoot) : procRoot_(std::move(procRoot)) {}

Result<std::vector<PodProcess>> NetnsFinder::scan() const {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(procRoot_.c_str()), ::closedir);
  if (!dir) return Error::fromErrno(errno, "scan " + procRoot_);
  std::vector<PodProcess> out;
  while (dirent* e = ::readdir(dir.get())) {
    const char* name = e->d_name;
    if (!*name || std::strspn(name, "0123456789") != std::strlen(name)) continue;
    std::string base = procRoot_ + "/" + name;
    auto cgroup = readSmallFile(base + "/cgroup");
    if (!cgroup) continue;  // exited meanwhile
    auto uid = podUidFromCgroupFile(*cgroup);
    if (!uid || !*uid) continue;
    struct stat st {};
    if (::stat((base + "/ns/net").c_str(), &st) != 0) continue;
    auto stat = readSmallFile(base + "/stat");
    if (!stat) continue;
    auto start = startTimeOf(*stat);
    if (!start) continue;
    out.push_back({static_cast<pid_t>(std::strtol(name, nullptr, 10)), **uid, static_cast<uint64_t>(st.st_dev),
                   static_cast<uint64_t>(st.st_ino), *start});
  }
  return out;
}

Result<bool> netnsHoldsAnyIp(int nsfd, const std::vector<std::string>& ips) {
  std::vector<Addr> want;
  for (const auto& ip : ips) {
    auto a = parseAddr(ip);
    if (!a) return Error::msg("\"" + ip + "\" is not an IP address", EINVAL);
    want.push_back(*a);
  }
  bool found = false;
  SLUICE_TRY(runInNetns(nsfd, [&]() -> Status {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return Error::fromErrno(errno, "list the namespace's addresses");
    for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
      auto a = addrOf(i->ifa_addr);
      if (a && std::find(want.begin(), want.end(), *a) != want.end()) found = true;
    }
    ::freeifaddrs(list);
    return {};
  }));
  return found;
}

Result<NetnsLocation> NetnsFinder::locate(const std::vector<PodProcess>& processes, const std::string& uid,
                                          const std::vector<std::string>& ips) const {
  if (ips.empty()) return Error::msg("pod " + uid + ": no IP address to check its network namespace against", EINVAL);
  std::vector<PodProcess> mine;
  for (const auto& p : processes)
    if (p.podUid == uid) mine.push_back(p);
  if (mine.empty())
    return Error::msg("pod " + uid + ": no process in its cgroups (looked at " + procRoot_ + ")", ENOENT);
  std::sort(mine.begin(), mine.end(),
            [](const PodProcess& a, const PodProcess& b) { return std::tie(a.startTime, a.pid) < std::tie(b.startTime, b.pid); });

  // The host's netns (PID 1's) and the agent's own are never a pod's, even
  // when a process of the pod's cgroup sits in one (Istio issue 55139).
  std::vector<std::pair<uint64_t, uint64_t>> hostNs;
  for (const char* who : {"/1/ns/net", "/self/ns/net"}) {
    struct stat st {};
    if (::stat((procRoot_ + who).c_str(), &st) == 0) hostNs.emplace_back(st.st_dev, st.st_ino);
  }
  std::map<std::pair<uint64_t, uint64_t>, bool> checked;  // netns -> holds an IP
  size_t host = 0;
  std::string lastError;
  for (const auto& p : mine) {
    std::pair<uint64_t, uint64_t> id{p.netnsDev, p.netnsIno};
    if (std::find(hostNs.begin(), hostNs.end(), id) != hostNs.end()) {
      ++host;
      continue;
    }
    NetnsLocation loc{p.pid, procRoot_ + "/" + std::to_string(p.pid) + "/ns/net", p.netnsDev, p.netnsIno, p.startTime};
    auto it = checked.find(id);
    if (it == checked.end()) {
      auto fd = openLocatedNetns(loc);
      if (!fd) {
        lastError = fd.error().message;
        continue;  // exited since the scan
      }
      auto holds = netnsHoldsAnyIp(fd->get(), ips);
      if (!holds) return holds.error();
      it = checked.emplace(id, *holds).first;
    }
    if (it->second) return loc;
  }
  std::string msg = "pod " + uid + ": " + std::to_string(mine.size()) + " process(es) in its cgroups, but no network namespace of theirs holds " +
                    joinIps(ips);
  if (host) msg += " (" + std::to_string(host) + " in the host's namespace, skipped)";
  if (!lastError.empty()) msg += "; last error: " + lastError;
  return Error::msg(msg, ENOENT);
}

Result<NetnsLocation> NetnsFinder::find(const std::string& uid, const std::vector<std::string>& ips) const {
  auto procs = scan();
  if (!procs) return procs.error();
  return locate(*procs, uid, ips);
}

Result<Fd> openLocatedNetns(const NetnsLocation& loc) {
  auto fd = openNetns(loc.path);
  if (!fd) return fd.error();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return Error::fromErrno(errno, "fstat " + loc.path);
  if (static_cast<uint64_t>(st.st_dev) != loc.dev || static_cast<uint64_t>(st.st_ino) != loc.ino)
    return Error::msg(loc.path + ": another network namespace than the one found (process " + std::to_string(loc.pid) +
                          " was replaced)",
                      ESTALE);
  return std::move(*fd);
}

}  // namespace sluice::kube
