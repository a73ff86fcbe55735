// List-then-watch of one kind of object, keeping a cache: what client-go's
// reflector + informer do, for the two the node agent needs (its node's
// pods, all namespaces).
//
//   list (chunked, limit/continue) ──▶ cache replaced, added/updated/deleted
//        │                               for the differences, synced once
//        ▼
//   watch ?resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=T
//        │  ADDED/MODIFIED/DELETED ──▶ cache + callback, RV = object's
//        │  BOOKMARK               ──▶ RV moves on (nothing else)
//        │  stream ends (timeout)  ──▶ watch again from RV
//        │  410 (HTTP or ERROR)    ──▶ list again (the diff reports what
//        │                             changed while events were lost)
//        └  any other error, dropped or stalled stream ──▶ back-off with
//           jitter, then watch again from RV (list first if never listed)
//
// The cache is never emptied by an error: while the API server is away the
// consumer keeps seeing the last state, and nothing is reported deleted
// until a list or a DELETED event says so.
//
// Threading: start() runs one thread per informer. The callbacks run on it,
// one at a time, after the cache has been updated and without any lock
// held, so they may call get()/list(); they should be quick (enqueue work)
// since the stream waits for them. get(), list(), synced() and stats() are
// safe from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "userspace/agent/kube/backoff.h"
#include "userspace/agent/kube/client.h"
#include "userspace/mesh/objects.h"

namespace sluice::kube {

struct InformerOptions {
  /// Collection path: podsPath(), namespacesPath().
  std::string path;
  /// e.g. "spec.nodeName=node-a".
  std::string fieldSelector;
  /// Name in logs ("pods on node-a").
  std::string name;
  /// Objects per list page (limit).
  int pageSize = 500;
  /// timeoutSeconds of each watch, drawn from [t, 2t) like client-go so the
  /// agents of a cluster do not re-watch in step.
  std::chrono::seconds watchTimeout{300};
  /// A watch with no byte for this long is given up (and re-made); 0 means
  /// 2 * watchTimeout + 30 s, longer than any healthy stream stays silent.
  std::chrono::milliseconds stallTimeout{0};
  /// Spacing of retries after errors.
  BackoffOptions backoff;
};

template <typename T>
struct InformerHandlers {
  std::function<void(const T&)> added;
  std::function<void(const T& old, const T& current)> updated;
  /// With the object's last known state.
  std::function<void(const T& last)> deleted;
  /// Once, after the first complete list and its added calls (synced()
  /// turns true right after it returns).
  std::function<void()> synced;
};

/// What an informer did so far (for tests, logs and metrics).
struct InformerStats {
  uint64_t lists = 0;        ///< complete lists (the first one included)
  uint64_t watches = 0;      ///< watch requests made
  uint64_t gone = 0;         ///< 410s that led to a new list
  uint64_t errors = 0;       ///< failed lists and watches (before a back-off)
  std::string lastError;     ///< one line, "" when none yet
  bool connected = false;    ///< a watch stream is open now
};

template <typename T>
class Informer {
 public:
  Informer(Client& client, InformerOptions options, InformerHandlers<T> handlers);
  /// Stops the thread (stop()).
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  /// Starts listing and watching on a new thread.
  void start();
  /// Stops it: the open request is cancelled (≤ ~100 ms) and the thread
  /// joined. No callback runs after stop() returns. Idempotent.
  void stop();

  /// The first list has completed and its callbacks (added..., then
  /// synced) have run.
  bool synced() const;
  /// Waits for synced() up to @p timeout.
  bool waitSynced(std::chrono::milliseconds timeout) const;

  /// The cached object under @p key (T::key()).
  std::optional<T> get(const std::string& key) const;
  /// Every cached object.
  std::vector<T> list() const;
  /// The cached objects @p pred accepts.
  std::vector<T> list(const std::function<bool(const T&)>& pred) const;
  /// Number of cached objects.
  size_t size() const;
  /// The resourceVersion the next watch starts from.
  std::string resourceVersion() const;
  InformerStats stats() const;

 private:
  void run(std::stop_token stop);
  /// A complete (chunked) list; replaces the cache and reports differences.
  Status relist(std::stop_token stop);
  /// Waits @p d or until stopped; false when stopped.
  bool sleepFor(std::chrono::milliseconds d, std::stop_token stop);
  void failed(const Error& e, std::chrono::milliseconds delay);

  Client& client_;
  InformerOptions options_;
  InformerHandlers<T> handlers_;
  Backoff backoff_;
  std::mt19937_64 rng_;

  mutable std::mutex mu_;
  mutable std::condition_variable_any cv_;
  std::map<std::string, T> cache_;
  std::string resourceVersion_;
  bool synced_ = false;
  InformerStats stats_;
  std::jthread thread_;
};

extern template class Informer<Pod>;
extern template class Informer<Namespace>;

}  // namespace sluice::kube
