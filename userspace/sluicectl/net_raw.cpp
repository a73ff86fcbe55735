#include "userspace/sluicectl/net_raw.h"

#include <dirent.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <memory>

namespace sluice {

namespace {

// "net:[4026531993]" -> 4026531993; 0 when it is not one.
uint64_t nsLinkInode(const std::string& link) {
  const std::string prefix = "net:[";
  if (link.rfind(prefix, 0) != 0 || link.back() != ']') return 0;
  return std::strtoull(link.c_str() + prefix.size(), nullptr, 10);
}

// CapEff of /proc/PID/status; nullopt when unreadable.
std::optional<uint64_t> effectiveCaps(const std::string& dir) {
  std::ifstream f(dir + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("CapEff:", 0) == 0) return std::strtoull(line.c_str() + 7, nullptr, 16);
  return std::nullopt;
}

}  // namespace

Result<uint64_t> netnsInodeOf(const std::string& netnsPath) {
  struct stat st {};
  if (::stat(netnsPath.c_str(), &st) != 0) return Error::fromErrno(errno, "stat " + netnsPath);
  return static_cast<uint64_t>(st.st_ino);
}

Result<std::vector<NetRawProcess>> netRawProcesses(uint64_t netnsIno, const std::string& procRoot) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(procRoot.c_str()), ::closedir);
  if (!d) return Error::fromErrno(errno, "list " + procRoot);
  std::vector<NetRawProcess> out;
  while (struct dirent* e = ::readdir(d.get())) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    const std::string dir = procRoot + "/" + e->d_name;
    char link[64];
    ssize_t n = ::readlink((dir + "/ns/net").c_str(), link, sizeof(link) - 1);
    if (n <= 0) continue;
    if (nsLinkInode(std::string(link, static_cast<size_t>(n))) != netnsIno) continue;
    auto caps = effectiveCaps(dir);
    if (!caps) continue;
    const bool raw = (*caps >> CAP_NET_RAW) & 1, admin = (*caps >> CAP_NET_ADMIN) & 1;
    if (!raw || admin) continue;
    std::string comm;
    std::ifstream c(dir + "/comm");
    std::getline(c, comm);
    if (comm == "pause") continue;
    out.push_back({static_cast<pid_t>(pid), comm});
  }
  return out;
}

}  // namespace sluice
