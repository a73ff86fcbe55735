// A private cgroup (v2) for the calling process, for tests and the bench
// that attach the socket mode's node hooks: attached there instead of at the
// root, the hooks see only this process's sockets (and its children's), so
// the BPF statistics and other processes on the machine are left alone.
//
//   <cgroup2 mount>/                  (the machine's processes)
//     sluice-<tag>-<pid>-<n>/         this process, while the scope lives
#pragma once

#include <string>

#include "base/result.h"

namespace sluice::test {

/// Creates the cgroup and moves this process (all its threads) into it;
/// the destructor moves it back to the cgroup it came from and removes the
/// directory (attachments at it go with it).
class CgroupScope {
 public:
  explicit CgroupScope(const std::string& tag);
  ~CgroupScope();
  CgroupScope(const CgroupScope&) = delete;
  CgroupScope& operator=(const CgroupScope&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  /// The cgroup's directory (DatapathOptions::cgroupPath, --cgroup).
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string before_;  ///< the cgroup directory this process came from
  std::string error_;
};

}  // namespace sluice::test
