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

namespace sluice::cni {

/// What the watcher keeps true.
struct WatchOptions {
  std::string confDir;      ///< the runtime's CNI config dir (--cni-conf-dir)
  std::string agentSocket;  ///< written into the entry as agentSocket
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

/// One check of @p confDir: when the primary (lexically first) config is a
/// conflist without sluice-cni as its last plugin, writes it back with it
/// (atomically). Returns the file rewritten, nullopt when nothing was to do
/// (sluice-cni already last, or no config yet). Errors name the file and
/// leave it untouched: not JSON, no plugins, a single-plugin .conf.
Result<std::optional<std::string>> ensureInChain(const std::string& confDir, const std::string& agentSocket);

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
