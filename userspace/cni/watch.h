// Keeping sluice-cni in the node's CNI chain: the agent watches the CNI
// configuration directory (inotify) and, when the primary CNI rewrites its
// conflist without sluice-cni (Calico, Cilium and others regenerate theirs
// on start and on config changes), appends it again -- what Istio's node
// agent does for istio-cni (cni/pkg/install). Without it, pods started after
// such a rewrite would run without redirection, silently.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "base/fd.h"
#include "base/result.h"
#include "userspace/cni/install.h"

namespace sluice::cni {

/// What the watcher keeps true.
struct WatchOptions {
  std::string confDir;      ///< the runtime's CNI config dir (--cni-conf-dir)
  std::string agentSocket;  ///< written into the entry as agentSocket
  ConfMode mode;            ///< --cni-conf-name, --cni-owned-conflist[-name], --cni-unchained
  /// A full check even without an event (lost events, a queue overflow).
  std::chrono::milliseconds resync = std::chrono::seconds(60);
};

/// One pass of the watcher that did something or failed.
struct WatchEvent {
  bool restored = false;  ///< sluice-cni was put back (else: an error)
  std::string file;       ///< the primary config it looked at
  std::string message;    ///< the log line's text
  /// From the change's event to the rewritten file (0 for the first pass).
  std::chrono::microseconds delay{0};
};

/// What one check changed.
struct Ensured {
  std::string file;  ///< the file written (or removed)
  std::string what;  ///< "put sluice-cni back at the end of the plugin chain in FILE", ...
};

/// One check of @p confDir as @p mode says (planChain): when the file
/// sluice-cni's entry lives in differs from the plan -- the primary
/// rewritten without sluice-cni last, its .conf rewritten, the owned
/// conflist out of step with its primary, the standalone config changed
/// -- writes it (atomically). With an owned conflist whose primary is gone,
/// removes it (a runtime must not start pods on a copy of a network the
/// primary CNI took away). nullopt when nothing was to do (or no primary
/// yet). Errors name the file and leave it untouched.
Result<std::optional<Ensured>> ensureInChain(const std::string& confDir, const std::string& agentSocket,
                                             const ConfMode& mode = {});

/// The watch: a thread on an inotify descriptor over confDir.
class ConfWatcher {
 public:
  using Callback = std::function<void(const WatchEvent&)>;

  /// Checks once, then watches. Fails (one line) only when confDir is not
  /// a directory or inotify cannot watch it; a bad config is reported
  /// through @p onEvent (and logged) and watched on.
  static Result<std::unique_ptr<ConfWatcher>> start(WatchOptions options, Callback onEvent);
  ~ConfWatcher();
  ConfWatcher(const ConfWatcher&) = delete;
  ConfWatcher& operator=(const ConfWatcher&) = delete;

  /// Stops the thread (prompt: it waits on an eventfd too).
  void stop();

 private:
  ConfWatcher(WatchOptions options, Callback onEvent) : options_(std::move(options)), onEvent_(std::move(onEvent)) {}
  void run();
  /// ensureInChain with logging, the callback and the loop detector.
  void check(std::optional<std::chrono::steady_clock::time_point> changedAt);
  Status addWatch();

  WatchOptions options_;
  Callback onEvent_;
  Fd inotify_, stop_;
  int wd_ = -1;
  std::thread thread_;
  std::string lastError_;  ///< not logged again while it stays the same
  std::chrono::steady_clock::time_point windowStart_{};
  int restoresInWindow_ = 0;
};

}  // namespace sluice::cni
