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

#include <cerrno>

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
