// The bpffs root that holds sluice's pinned state, and the lock that
// serializes changes to it between processes.
#pragma once

#include <string>

#include "loader/fd.h"
#include "loader/result.h"

namespace sluice {

/// Makes sure a bpf filesystem is mounted where `root` lives and that the
/// root directory exists. Fresh nodes often have no bpffs at /sys/fs/bpf:
/// like Cilium's agent, mount it there (and log that we did).
Status ensureBpffsRoot(const std::string& root);

/// True when `path` is on a bpf filesystem.
bool isOnBpffs(const std::string& path);

/// Exclusive lock over the pinned state under a bpffs root: every change
/// (pod add/remove, first map creation) happens under it, so several
/// sluicectl processes and the agent never interleave.
class StateLock {
 public:
  /// Blocks until the lock on `root` is held.
  static Result<StateLock> acquire(const std::string& root);

 private:
  explicit StateLock(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;  // flock is released when the descriptor closes
};

/// Removes `dir` and, recursively, everything under it (bpffs pins are
/// plain files and directories). Missing is success.
Status removeTree(const std::string& dir);

}  // namespace sluice
