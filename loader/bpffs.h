// The bpffs root that holds sluice's pinned state, and the lock that
// serializes changes to it between processes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/fd.h"
#include "base/result.h"

namespace sluice {

/// Makes sure a bpf filesystem is mounted where `root` lives and that the
/// root directory exists. Fresh nodes often have no bpffs at /sys/fs/bpf:
/// like Cilium's agent, mount it there (and log that we did).
Status ensureBpffsRoot(const std::string& root);

/// True when `path` is on a bpf filesystem.
bool isOnBpffs(const std::string& path);

/// One line of /proc/PID/mountinfo (proc(5)).
struct MountEntry {
  uint64_t id = 0;                    ///< mount ID, unique system-wide
  std::string device;                 ///< "major:minor" of the filesystem instance
  std::string mountPoint;             ///< unescaped
  std::vector<std::string> optional;  ///< propagation: "shared:N", "master:N", ...
  std::string fsType;
};

/// Parses mountinfo text; lines it cannot read are skipped.
std::vector<MountEntry> parseMountinfo(const std::string& text);

/// Whether the bpffs holding a root outlives the caller's mount namespace.
/// A bpf filesystem lives as long as one of its mounts does: a bpffs
/// mounted only inside a container's private mount namespace (an agent
/// that mounted it itself, `ip netns exec`, a missing Bidirectional
/// hostPath) goes with that namespace, and every pin under it -- maps and
/// tcx links, every pod's redirection -- with it.
struct BpffsMount {
  std::string mountPoint;   ///< where the root's bpffs is mounted here
  std::string device;       ///< "major:minor" of the bpffs instance
  std::string propagation;  ///< "private" or the optional fields ("shared:12")
  bool outlivesNamespace = false;
  std::string why;  ///< how that was decided, one phrase
};

/// Decides BpffsMount for the mount with ID @p mountId, from this
/// process's mountinfo and PID 1's (nullopt: unreadable). With
/// @p initialPidNs (the host's PID namespace, as under hostPID) PID 1 is
/// the host's init, so its mount table is the host's: the bpffs outlives
/// this namespace iff the host mounts the same instance (device). Without
/// it only the mount's propagation can tell: shared or slave mounts are
/// tied to mounts outside. Pure, for the unit tests.
Result<BpffsMount> judgeBpffsMount(uint64_t mountId, const std::string& selfMountinfo,
                                   const std::optional<std::string>& initMountinfo, bool initialPidNs);

/// BpffsMount of the bpffs that holds @p root (which must exist), from
/// /proc/self/mountinfo, /proc/1/mountinfo and this process's PID
/// namespace.
Result<BpffsMount> inspectBpffsMount(const std::string& root);

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
