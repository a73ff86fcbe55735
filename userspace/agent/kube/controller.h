// The node agent's Kubernetes controller: from the informers' view of the
// node's pods and of namespaces, and Istio's rules (decisions.h), it keeps
// the agent's enrolled pods equal to the pods Istio's node agent would
// enroll, through callbacks the agent provides (it knows nothing of the
// datapath, the registry or ZDS):
//
//   pod/namespace event ─▶ queue (pod UID) ─▶ worker: reconcile(UID)
//     selected, running, has IPs, not enrolled ─▶ find its netns in /proc
//                                                 ─▶ enroll(pod, settings, netns)
//     enrolled, settings (annotations) changed  ─▶ updateSettings(pod, settings)
//     enrolled, not selected / finished / gone  ─▶ unenroll(uid)
//     then the status annotation (pods/status merge patch):
//       ambient.istio.io/redirection = enabled | pending | (removed)
//   failures ─▶ the UID comes back after a per-pod back-off (5 ms .. 5 s)
//
// At start, after both informers' first list, the registry (listEnrolled)
// is read and every enrolled and every cached pod reconciled: enrolled pods
// that are gone or no longer selected are removed, selected running pods
// that are missing are enrolled. The CNI path asks podDecision() and tells
// the controller what it did with enrolled()/removed().
//
// Safety: while the API server is unreachable nothing changes (the cache is
// kept). A pod list that is empty for this node is not trusted to remove
// pods ("gone"): the agent's own pod always runs there, so an empty list
// means a wrong --node-name, not a node without pods.
//
// Threading: start() runs the two informer threads, a start-up thread and
// `workers` worker threads. The dataplane callbacks run on the workers:
// concurrently for different pods, never for the same pod at once.
// podDecision(), enrolled(), removed(), resync() and stats() may be called
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "userspace/agent/kube/backoff.h"
#include "userspace/agent/kube/client.h"
#include "userspace/mesh/decisions.h"
#include "userspace/agent/kube/informer.h"
#include "userspace/agent/kube/netns_finder.h"
#include "userspace/agent/kube/workqueue.h"

namespace sluice::kube {

/// A pod as the dataplane needs it: identity for the registry and for
/// ztunnel (ZDS WorkloadInfo), addresses for probe SNAT.
struct PodRef {
  std::string uid;
  std::string name;
  std::string namespaceName;
  std::string serviceAccount;
  std::vector<std::string> ips;
  bool operator==(const PodRef&) const = default;
};

/// PodRef of a cached pod.
PodRef podRef(const Pod& pod);

/// What an enrollment achieved.
enum class EnrollOutcome {
  /// Redirection in place and the pod handed to ztunnel (or no hand-off
  /// configured): annotated "enabled".
  Enabled,
  /// Redirection in place but the hand-off failed: annotated "pending" and
  /// enrolled again after a back-off.
  Pending,
};

/// A pod in the agent's registry.
struct EnrolledPod {
  /// Its Kubernetes UID; "" for a pod enrolled by hand (sluicectl without
  /// --uid), which the controller never touches.
  std::string uid;
  std::string netnsPath;
  PodSettings settings;
};

/// What the agent does for the controller.
struct DataplaneCallbacks {
  /// Enrolls a running pod in the netns the controller found (open it with
  /// openLocatedNetns() to be sure it is still that namespace). Must be
  /// idempotent: a pod already enrolled in that netns with these settings
  /// is a success. A failure leaves nothing behind.
  std::function<Result<EnrollOutcome>(const PodRef&, const PodSettings&, const NetnsLocation&)> enroll;
  /// Applies new settings to an enrolled pod without a gap in capture.
  std::function<Status(const PodRef&, const PodSettings&)> updateSettings;
  /// Removes the pod with this UID; a success when it is not enrolled.
  std::function<Status(const std::string& uid)> unenroll;
  /// The registry's pods (read at start and by resync()).
  std::function<std::vector<EnrolledPod>()> listEnrolled;
};

struct ControllerOptions {
  /// The node whose pods are watched (spec.nodeName); required.
  std::string nodeName;
  Rules rules;
  /// Patch ambient.istio.io/redirection on pods/status.
  bool annotateStatus = true;
  /// Worker threads calling the dataplane.
  int workers = 4;
  /// How long podDecision() waits for a pod (or its namespace) the watch
  /// has not delivered yet before asking the API server directly.
  std::chrono::milliseconds cniWait{2000};
  /// Per-pod retry spacing after a failed reconcile (Istio: 5 ms .. 5 s).
  BackoffOptions retry{std::chrono::milliseconds(5), std::chrono::milliseconds(5000), 2.0, 0.5};
  /// Informers' watch length, stall limit and error back-off.
  std::chrono::seconds watchTimeout{300};
  std::chrono::milliseconds stallTimeout{0};
  BackoffOptions informerBackoff;
  /// The host's /proc (hostPID) and how long one scan of it serves lookups.
  std::string procRoot = "/proc";
  std::chrono::milliseconds scanMaxAge{250};
};

/// The CNI path's question (CNI_ARGS K8S_POD_NAMESPACE/NAME/UID).
struct PodQuery {
  std::string namespaceName;
  std::string name;
  /// "" when the runtime did not pass one (then the name decides).
  std::string uid;
};

/// The answer: enroll or leave the pod alone, and why.
struct PodAnswer {
  bool enroll = false;
  std::string reason;
  PodRef pod;
  PodSettings settings;
  std::vector<std::string> warnings;
  /// false: the watch had not delivered it; the API server was asked.
  bool fromCache = true;
};

/// Counters for logs, metrics and tests.
struct ControllerStats {
  bool synced = false;      ///< both informers listed once
  bool reconciled = false;  ///< the start-up reconciliation ran
  uint64_t reconciles = 0;
  uint64_t enrolls = 0, enrollFailures = 0;
  uint64_t updates = 0, updateFailures = 0;
  uint64_t unenrolls = 0, unenrollFailures = 0;
  uint64_t netnsNotFound = 0;
  uint64_t patches = 0, patchFailures = 0;
  uint64_t directLookups = 0;  ///< podDecision() answers from a GET
  size_t enrolled = 0;         ///< pods the controller holds as enrolled
  size_t queued = 0;           ///< pods waiting for a worker (or a retry)
  InformerStats pods, namespaces;
};

class Controller {
 public:
  /// Checks the options (a node name, every callback set).
  static Result<std::unique_ptr<Controller>> create(Client& client, ControllerOptions options,
                                                    DataplaneCallbacks callbacks);
  /// stop().
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  /// Starts the informers, the start-up reconciliation and the workers.
  void start();
  /// Stops everything; no callback runs after it returns. Idempotent; a
  /// stopped controller is not started again.
  void stop();
  /// Waits until the start-up reconciliation has run.
  bool waitReady(std::chrono::milliseconds timeout) const;

  /// Whether pod ns/name (uid) is to be enrolled, and with which settings:
  /// from the cache, waiting up to cniWait for the watch to deliver the pod
  /// and its namespace, then from a direct GET. Errors: the pod cannot be
  /// found (or has another UID), the API server cannot be asked.
  Result<PodAnswer> podDecision(const PodQuery& query, std::stop_token stop = {});

  /// The agent enrolled this pod itself (CNI ADD): recorded, and the status
  /// annotation follows.
  void enrolled(const std::string& uid, const PodSettings& settings, EnrollOutcome outcome);
  /// The agent removed this pod itself (CNI DEL, sluicectl).
  void removed(const std::string& uid);
  /// Reads the registry again and reconciles every pod (for the agent's
  /// periodic sweep).
  void resync();

  ControllerStats stats() const;

 private:
  struct State {
    PodSettings settings;
    EnrollOutcome outcome = EnrollOutcome::Enabled;
  };
  Controller(Client& client, ControllerOptions options, DataplaneCallbacks callbacks);
  void startup(std::stop_token stop);
  void worker();
  /// One pass for one pod; false asks for a retry after a back-off.
  bool reconcile(const std::string& uid);
  /// reconcile() of an enrolled pod that is gone from the watch cache.
  bool reconcileGone(const std::string& uid);
  /// The status annotation of one pod (queue key kStatusKeyPrefix + UID).
  bool reconcileStatus(const std::string& uid);
  bool reconcileAnnotation(const Pod& pod, const std::optional<State>& state);
  /// nullopt: the annotation is right; "" remove it; else the value to set.
  std::optional<std::string> wantedAnnotation(const Pod& pod, const std::optional<State>& state) const;
  void queueStatus(const Pod& pod, const std::optional<State>& state);
  static constexpr const char* kStatusKeyPrefix = "status/";
  Result<NetnsLocation> locateNetns(const Pod& pod);
  /// Logs a failure that will be retried (mu_ held): a warning the first
  /// time and every 20th, debug otherwise.
  void retryWarn(const std::string& key, const std::string& message);
  void enqueueNamespace(const std::string& ns);
  void loadRegistry();
  void notifyCache();
  Result<PodAnswer> answerFromApi(const PodQuery& query, std::stop_token stop);

  Client& client_;
  ControllerOptions options_;
  DataplaneCallbacks callbacks_;
  NetnsFinder finder_;
  std::unique_ptr<Informer<Pod>> pods_;
  std::unique_ptr<Informer<Namespace>> namespaces_;
  WorkQueue queue_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  ///< cache changes, readiness
  std::map<std::string, State> enrolled_;
  /// Pods the API server was asked for directly (podDecision) and the watch
  /// has not shown yet, with when: reconcile does not take them for gone
  /// for kUnwatchedGrace.
  std::map<std::string, std::chrono::steady_clock::time_point> unwatched_;
  static constexpr std::chrono::seconds kUnwatchedGrace{60};
  std::map<std::string, Backoff> retries_;
  /// Per pod: the resourceVersion a status patch was sent for, and its value.
  std::map<std::string, std::pair<std::string, std::optional<std::string>>> lastPatch_;
  bool ready_ = false;
  bool warnedEmptyNode_ = false;
  uint64_t cacheGeneration_ = 0;
  ControllerStats counters_;

  std::mutex scanMu_;
  std::optional<std::vector<PodProcess>> scan_;
  std::chrono::steady_clock::time_point scanAt_;

  std::stop_source stopSource_;  ///< cancels API calls and waits at stop()
  std::jthread startThread_;
  std::vector<std::thread> workers_;
  bool started_ = false;
};

}  // namespace sluice::kube
