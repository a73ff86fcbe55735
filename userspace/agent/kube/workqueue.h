// A work queue of keys, as Kubernetes controllers use (client-go's
// workqueue): a key queued several times before a worker takes it is
// processed once; a key being processed is never handed to a second worker,
// and if it is queued meanwhile it comes back after done(). Delayed adds
// give retries with back-off.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace sluice::kube {

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  /// Queues @p key (no-op when already queued).
  void add(const std::string& key);
  /// Queues @p key after @p delay (an earlier pending delay wins).
  void addAfter(const std::string& key, std::chrono::milliseconds delay);
  /// The next key, blocking; nullopt once shut down.
  std::optional<std::string> get();
  /// Ends the processing of @p key (taken with get()).
  void done(const std::string& key);
  /// Wakes every get() with nullopt; later adds are ignored.
  void shutdown();
  /// Keys waiting now (not counting delayed ones or those being processed).
  size_t size() const;
  /// Keys waiting, delayed or being processed.
  size_t pending() const;

 private:
  void promoteDueLocked(Clock::time_point now);
  void addLocked(const std::string& key);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;       ///< queued (or to re-queue after done)
  std::set<std::string> processing_;  ///< taken by a worker
  std::multimap<Clock::time_point, std::string> delayed_;
  std::map<std::string, Clock::time_point> delayedAt_;
  bool shutdown_ = false;
};

}  // namespace sluice::kube
