#include "loader/cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "base/fd.h"

namespace sluice {

Result<std::string> cgroup2Mount() {
  // mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS... - FSTYPE SOURCE SUPER
  std::ifstream f("/proc/self/mountinfo");
  for (std::string line; std::getline(f, line);) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, dev, root, mountpoint;
    head >> id >> parent >> dev >> root >> mountpoint;
    return mountpoint;
  }
  return Error::msg("no cgroup v2 hierarchy is mounted", ENOENT);
}

Result<uint64_t> cgroupIdOfPath(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Error::fromErrno(errno, "cgroup " + path);
  return static_cast<uint64_t>(st.st_ino);
}

Result<uint64_t> cgroupIdOfPid(pid_t pid) {
  std::string file = "/proc/" + std::to_string(pid) + "/cgroup";
  std::ifstream f(file);
  if (!f) return Error::msg("process " + std::to_string(pid) + " is gone (" + file + ")", ESRCH);
  std::string path;
  for (std::string line; std::getline(f, line);)
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty()) return Error::msg("process " + std::to_string(pid) + " has no cgroup v2 (" + file + ")", ENOENT);
  // A cgroup outside this process's cgroup namespace shows as "/../..":
  // it cannot be resolved under our view of the hierarchy.
  if (path.rfind("/..", 0) == 0)
    return Error::msg("cgroup " + path + " of process " + std::to_string(pid) +
                          " is outside this cgroup namespace (run the agent in the host's)",
                      EXDEV);
  auto mount = cgroup2Mount();
  SLUICE_TRY(mount);
  return cgroupIdOfPath(*mount + (path == "/" ? "" : path));
}

Result<bool> cgroupExists(uint64_t id) {
  auto mount = cgroup2Mount();
  SLUICE_TRY(mount);
  Fd dir(::open(mount->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return Error::fromErrno(errno, "open " + *mount);
  // kernfs (cgroupfs) file handles are the node id: FILEID_KERNFS, 8 bytes.
  alignas(struct file_handle) unsigned char buf[sizeof(struct file_handle) + sizeof(uint64_t)] = {};
  auto* handle = reinterpret_cast<struct file_handle*>(buf);
  handle->handle_bytes = sizeof(uint64_t);
  handle->handle_type = 0xfe;  // FILEID_KERNFS
  std::memcpy(buf + sizeof(struct file_handle), &id, sizeof(id));
  Fd fd(::open_by_handle_at(dir.get(), handle, O_RDONLY | O_CLOEXEC));
  if (fd.valid()) return true;
  if (errno == ESTALE || errno == ENOENT) return false;
  return Error::fromErrno(errno, "open cgroup " + std::to_string(id) + " by handle");
}

}  // namespace sluice
