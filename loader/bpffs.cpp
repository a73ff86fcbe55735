#include "loader/bpffs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <fstream>
#include <sstream>

namespace sluice {

namespace {

constexpr const char* kDefaultMount = "/sys/fs/bpf";

Status mkdirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST)
      return Error::fromErrno(errno, "mkdir " + cur);
  }
  return {};
}

}  // namespace

bool isOnBpffs(const std::string& path) {
  struct statfs st {};
  return ::statfs(path.c_str(), &st) == 0 && st.f_type == BPF_FS_MAGIC;
}

Status ensureBpffsRoot(const std::string& root) {
  if (root.empty() || root[0] != '/') return Error::msg("bpffs root '" + root + "' is not an absolute path");
  std::string mountPoint = kDefaultMount;
  bool underDefault = root.rfind(mountPoint + "/", 0) == 0 || root == mountPoint;
  if (underDefault && !isOnBpffs(mountPoint)) {
    if (::mount("bpf", mountPoint.c_str(), "bpf", 0, "mode=0700") != 0)
      return Error::fromErrno(errno, "mount bpffs at " + mountPoint);
    spdlog::info("mounted bpffs at {} (it was not mounted)", mountPoint);
  }
  SLUICE_TRY(mkdirs(root));
  if (!isOnBpffs(root))
    return Error::msg("bpffs root " + root + " is not on a bpf filesystem (mount -t bpf bpf DIR)");
  // bpffs is often mounted world-writable (mode 1777): a root that someone
  // else made could have its pins swapped under us.
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) return Error::fromErrno(errno, "stat " + root);
  if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))
    return Error::msg("bpffs root " + root + " is owned by uid " + std::to_string(st.st_uid) +
                          " or writable by others; refusing to keep pins there",
                      EPERM);
  return {};
}

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescapeMountField(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\\' && i + 3 < s.size() && std::all_of(s.begin() + i + 1, s.begin() + i + 4, [](char c) { return c >= '0' && c <= '7'; })) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<std::string> readWhole(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool isUnder(const std::string& path, const std::string& mountPoint) {
  if (mountPoint == "/") return true;
  return path == mountPoint || (path.rfind(mountPoint, 0) == 0 && path[mountPoint.size()] == '/');
}

// The ID of the mount that holds path: statx (Linux 5.8), else the
// longest mount point over the canonical path (the last of equal ones is
// on top).
Result<uint64_t> mountIdOf(const std::string& path, const std::vector<MountEntry>& mounts) {
  struct statx stx {};
  if (::statx(AT_FDCWD, path.c_str(), 0, STATX_MNT_ID, &stx) == 0 && (stx.stx_mask & STATX_MNT_ID)) return stx.stx_mnt_id;
  char real[PATH_MAX];
  if (!::realpath(path.c_str(), real)) return Error::fromErrno(errno, "resolve " + path);
  const MountEntry* best = nullptr;
  for (const auto& m : mounts)
    if (isUnder(real, m.mountPoint) && (!best || m.mountPoint.size() >= best->mountPoint.size())) best = &m;
  if (!best) return Error::msg("no mount holds " + path, ENOENT);
  return best->id;
}

// PID 1 is the host's init when this process is in the initial PID
// namespace, whose inode number is fixed (PROC_PID_INIT_INO).
bool inInitialPidNamespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 && st.st_ino == 0xEFFFFFFCu;
}

}  // namespace

std::vector<MountEntry> parseMountinfo(const std::string& text) {
  std::vector<MountEntry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    MountEntry m;
    std::string parent, root, opts, field;
    if (!(f >> m.id >> parent >> m.device >> root >> m.mountPoint >> opts)) continue;
    bool sep = false;
    while (f >> field) {
      if (field == "-") {
        sep = true;
        break;
      }
      m.optional.push_back(field);
    }
    if (!sep || !(f >> m.fsType)) continue;
    m.mountPoint = unescapeMountField(m.mountPoint);
    out.push_back(std::move(m));
  }
  return out;
}

Result<BpffsMount> judgeBpffsMount(uint64_t mountId, const std::string& selfMountinfo,
                                   const std::optional<std::string>& initMountinfo, bool initialPidNs) {
  auto self = parseMountinfo(selfMountinfo);
  auto it = std::find_if(self.begin(), self.end(), [&](const MountEntry& m) { return m.id == mountId; });
  if (it == self.end()) return Error::msg("mount " + std::to_string(mountId) + " is not in this process's mountinfo", ENOENT);
  if (it->fsType != "bpf") return Error::msg(it->mountPoint + " is a " + it->fsType + " mount, not bpffs", EINVAL);
  BpffsMount b;
  b.mountPoint = it->mountPoint;
  b.device = it->device;
  for (const auto& o : it->optional) b.propagation += (b.propagation.empty() ? "" : " ") + o;
  if (b.propagation.empty()) b.propagation = "private";
  const bool tied = b.propagation.find("shared:") != std::string::npos || b.propagation.find("master:") != std::string::npos;
  if (initMountinfo && initialPidNs) {
    // Another mount of the same bpffs instance in the host's table keeps it
    // alive; the same mount ID means this is the host's namespace itself.
    const MountEntry* host = nullptr;
    for (const auto& m : parseMountinfo(*initMountinfo))
      if (m.fsType == "bpf" && m.device == b.device && (!host || m.id == mountId)) host = &m;
    b.outlivesNamespace = host != nullptr;
    if (!host)
      b.why = "the host's mount table (PID 1's) has no bpffs " + b.device;
    else if (host->id == mountId)
      b.why = "this is the host's mount namespace";
    else
      b.why = "the host mounts the same bpffs at " + host->mountPoint;
    return b;
  }
  // No view of the host (no hostPID): the propagation is all there is.
  b.outlivesNamespace = tied;
  b.why = tied ? "its propagation (" + b.propagation + ") ties it to mounts outside this namespace"
               : std::string("a private mount, and the host's mounts are not visible (") +
                     (initialPidNs ? "/proc/1/mountinfo unreadable" : "no host PID namespace") + ")";
  return b;
}

Result<BpffsMount> inspectBpffsMount(const std::string& root) {
  auto self = readWhole("/proc/self/mountinfo");
  if (!self) return Error::fromErrno(errno, "read /proc/self/mountinfo");
  auto id = mountIdOf(root, parseMountinfo(*self));
  SLUICE_TRY(id);
  return judgeBpffsMount(*id, *self, readWhole("/proc/1/mountinfo"), inInitialPidNamespace());
}

Result<StateLock> StateLock::acquire(const std::string& root) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::fromErrno(errno, "open " + root);
  Fd owned(fd);
  while (::flock(owned.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return Error::fromErrno(errno, "lock " + root);
  }
  return StateLock(std::move(owned));
}

Status removeTree(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return {};
    if (errno == ENOTDIR) {
      if (::unlink(dir.c_str()) != 0 && errno != ENOENT) return Error::fromErrno(errno, "unlink " + dir);
      return {};
    }
    return Error::fromErrno(errno, "open " + dir);
  }
  Status st;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = dir + "/" + name;
    if (e->d_type == DT_DIR) {
      Status sub = removeTree(path);
      if (!sub.ok() && st.ok()) st = sub;
    } else if (::unlink(path.c_str()) != 0 && errno != ENOENT && st.ok()) {
      st = Error::fromErrno(errno, "unlink " + path);
    }
  }
  ::closedir(d);
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT && st.ok()) st = Error::fromErrno(errno, "rmdir " + dir);
  return st;
}

}  // namespace sluice
