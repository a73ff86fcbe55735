#include "test/common/cgroup_scope.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "loader/cgroup.h"

namespace sluice::test {

namespace {

std::atomic<int> gScopes{0};

Status movePid(const std::string& dir) {
  std::ofstream f(dir + "/cgroup.procs");
  f << ::getpid() << std::flush;
  if (!f) return Error::msg("move process " + std::to_string(::getpid()) + " into " + dir, EIO);
  return {};
}

}  // namespace

CgroupScope::CgroupScope(const std::string& tag) {
  auto mount = cgroup2Mount();
  if (!mount.ok()) {
    error_ = mount.error().message;
    return;
  }
  std::ifstream self("/proc/self/cgroup");
  std::string rel;
  for (std::string line; std::getline(self, line);)
    if (line.rfind("0::", 0) == 0) rel = line.substr(3);
  before_ = *mount + (rel == "/" ? "" : rel);
  path_ = before_ + "/sluice-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(gScopes++);
  if (::mkdir(path_.c_str(), 0755) != 0) {
    error_ = "mkdir " + path_ + ": " + std::strerror(errno);
    path_.clear();
    return;
  }
  if (Status st = movePid(path_); !st.ok()) error_ = st.error().message;
}

CgroupScope::~CgroupScope() {
  if (path_.empty()) return;
  (void)movePid(before_);
  // The directory is busy until the kernel has let go of the moved tasks.
  for (int i = 0; i < 100 && ::rmdir(path_.c_str()) != 0 && errno == EBUSY; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace sluice::test
