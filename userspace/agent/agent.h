// sluiced: the node agent. Owns the Datapath (programs loaded once),
// answers the unix socket API, serves Prometheus metrics, and reconciles
// the pinned state with the pods' namespaces at start and periodically.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>

#include "loader/bpffs.h"
#include "enroll/datapath.h"
#include "base/fd.h"
#include "userspace/agent/istio_switch.h"
#include "userspace/agent/kube/wiring.h"
#include "userspace/agent/metrics.h"
#include "userspace/api/protocol.h"
#include "userspace/agent/zds/server.h"
#include "userspace/cni/watch.h"

namespace sluice::agent {

struct AgentOptions {
  DatapathOptions datapath;
  std::string socketPath = kDefaultSocket;
  /// HOST:PORT for /metrics; "" serves none. Port 0 picks a free one.
  std::string metricsAddress = "127.0.0.1:9464";
  /// Between reconciliation sweeps; 0 turns the periodic sweep off.
  std::chrono::milliseconds reconcileInterval = std::chrono::seconds(30);
  /// The ZDS socket the node proxy (ztunnel) connects to; "" hands no pod
  /// to a node proxy (standalone use, per-pod proxies).
  std::string ztunnelSocket;
  /// Another node agent serves ztunnelSocket: wait for it to stop (true)
  /// instead of refusing to start.
  bool ztunnelTakeover = false;
  /// ZDS deadlines and idle checks (the protocol's 5 s; tests shorten them).
  std::chrono::milliseconds ztunnelTimeout = std::chrono::seconds(5);
  /// Kubernetes: which pods are in the mesh, running pods, annotations
  /// (kube/wiring.h); off unless in a pod or given --kube-api.
  KubeOptions kube;
  /// A live switch with Istio's node agent (userspace/agent/istio_switch.h).
  IstioSwitchMode istioSwitch = IstioSwitchMode::Off;
  /// Start even when the bpffs is private to the agent's mount namespace
  /// (every pin goes with it).
  bool allowPrivateBpffs = false;
  /// The CNI config dir to keep sluice-cni in (userspace/cni/watch.h); ""
  /// watches nothing. The entry's agentSocket: cniAgentSocket, else socketPath.
  std::string cniConfDir;
  std::string cniAgentSocket;
  /// How sluice-cni joins it (--cni-conf-name, --cni-owned-conflist[-name],
  /// --cni-unchained: the init container's flags).
  cni::ConfMode cniMode;
  /// Connections served at once, per listener (API, metrics); one more is
  /// answered with an error (EBUSY / HTTP 503) and closed.
  size_t maxConnections = 32;
  /// A whole request (the API's line, the metrics request head) must
  /// arrive within this; a client trickling bytes is answered ETIMEDOUT
  /// (HTTP 408) and closed. Also how long an idle connection is kept.
  std::chrono::milliseconds requestDeadline = std::chrono::seconds(10);
  /// /healthz fails (503) when the datapath lock has been held this long,
  /// or a reconcile sweep runs this much longer than its interval.
  std::chrono::milliseconds wedgedAfter = std::chrono::seconds(10);
  /// Once ready, remove the taint nodeTaintKey from this node (needs
  /// Kubernetes): for clusters without istiod's untaint controller.
  bool removeNodeTaint = false;
  std::string nodeTaintKey = "cni.istio.io/not-ready";
  /// This agent's DaemonSet (needs Kubernetes, cniConfDir and cniBinDir):
  /// on SIGTERM, gone or being deleted means uninstall; "" never uninstalls.
  std::string daemonSet;
  std::string daemonSetNamespace;
  /// Where sluice-cni's binary is (taken away on uninstall).
  std::string cniBinDir;
};

/// "HOST:PORT" / "[V6]:PORT" → address for bind; errors name the input.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
Result<HostPort> parseHostPort(const std::string& s);

class Agent {
 public:
  /// Opens the datapath, reconciles (adopting every enrolled pod's hooks),
  /// then listens. Refuses to start when another agent answers on the
  /// socket.
  static Result<std::unique_ptr<Agent>> start(const AgentOptions& options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  /// Stops listening and serving; leaves the data plane as it is.
  void stop();

  /// On SIGTERM: asks whether the agent's DaemonSet is being removed
  /// (--daemonset); then stop(), and on an uninstall sluice-cni leaves the
  /// chain, its binary goes, and the pinned state when no pod needs it.
  /// An update, or an API that cannot be asked, changes nothing.
  void shutdown();

  /// What keeps the agent from being ready, one line each (empty: ready):
  /// a private bpffs, programs not loaded, Kubernetes not synced,
  /// sluice-cni not in the chain, the ZDS socket not served, wedged. Never
  /// waits on the datapath.
  std::vector<std::string> readiness() const;

  /// One request line → one response line (with its newline). Thread-safe.
  std::string handle(const std::string& line);

  /// A sweep now (also what the periodic sweep runs).
  ReconcileReport reconcileNow();

  /// The metrics page: the agent's counters and the pods' counters.
  std::string renderMetrics();

  /// The port /metrics listens on (0 when off).
  uint16_t metricsPort() const { return metricsPort_; }

 private:
  explicit Agent(AgentOptions options) : options_(std::move(options)) {}
  Result<nlohmann::json> dispatch(const Request& req);
  Status listenApi();
  Status listenMetrics();
  void acceptLoop(int listenFd, bool metrics);
  void serveApi(int fd);
  void serveMetrics(int fd);
  void reconcileLoop();
  /// The Istio switch's sweep, every second until done, then every
  /// reconcile interval.
  void istioLoop();
  void istioSweep();
  Health health();
  /// Why the agent is wedged ("" when it is not), without waiting on it.
  std::string wedged() const;
  /// dpMu_, recording since when it is held (for wedged()).
  class DpGuard {
   public:
    explicit DpGuard(Agent& a);
    ~DpGuard();
    DpGuard(const DpGuard&) = delete;
    DpGuard& operator=(const DpGuard&) = delete;

   private:
    Agent& a_;
    std::lock_guard<std::mutex> lk_;
  };
  /// ZDS: AddWorkload of an enrolled pod with its netns and the ack
  /// (Handoff::apply); errors are retryable (EAGAIN). With
  /// @p takeBackOnRefusal an error ack is followed by DelWorkload (the
  /// enrollment is rolled back; a running pod keeps it, and ztunnel retries).
  Status handOff(const PodInfo& pod, bool takeBackOnRefusal);
  /// ZDS: the pods of a new connection's snapshot.
  std::vector<zds::SnapshotEntry> snapshot();
  /// The API's add and remove, dpMu_ held; with ZDS on, @p handOffFatal as
  /// Handoff::failureIsFatal. removeLocked returns the pod's uid.
  Result<PodInfo> addLocked(PodSpec spec, bool handOffFatal);
  Result<std::string> removeLocked(const std::string& id);
  /// The registry operations the Kubernetes side uses (each takes dpMu_).
  AgentDataplane kubeDataplane();
  /// With a ZDS socket: starts the ZDS server; without: the proxy identity
  /// is the mark alone.
  Status startZds();
  /// At start: pods enrolled without their node side get it (an enrollment
  /// cut short by a killed agent).
  void completeNodeSides();
  /// Refuses a bpffs private to this mount namespace unless allowed.
  Status checkBpffs();
  /// --remove-node-taint: waits until ready, then removes the taint once.
  void untaintLoop();
  enum class Departure { Stay, Uninstall };
  /// What SIGTERM means, asked of the API (one log line says which).
  Departure departure();
  /// At start, the agent's own DaemonSet must exist: a 404 then means a
  /// wrong --daemonset, and SIGTERM never uninstalls (an error line).
  void checkDaemonSet();
  bool daemonSetMisnamed_ = false;
  /// sluice-cni out of the chain, its binary, and the node-wide pinned
  /// state when no pod is enrolled.
  void uninstallNode();

  AgentOptions options_;
  std::unique_ptr<Datapath> dp_;
  std::mutex dpMu_;  ///< one operation on the datapath at a time
  Metrics metrics_;
  ZdsMetrics zdsMetrics_;  ///< the ZDS server's observer; outlives zds_
  Fd apiFd_, metricsFd_, stopFd_;  ///< stopFd_: eventfd that wakes the loops
  uint16_t metricsPort_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread apiThread_, metricsThread_, reconcileThread_, istioThread_, untaintThread_;
  std::stop_source untaintStop_;  ///< cancels the untaint loop's API request
  struct Conn {
    int fd = -1;
    bool metrics = false;  ///< served on the metrics listener
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void reapConnections(bool all);
  std::mutex connMu_;
  std::list<Conn> conns_;
  std::mutex sweepMu_;
  std::condition_variable sweepCv_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> reconciles_{0};
  /// steady_clock ns: since when dpMu_ is held, and when the last sweep
  /// ended (0: none); read by wedged() without the lock.
  std::atomic<int64_t> dpHeldSinceNs_{0};
  std::atomic<int64_t> lastReconcileNs_{0};
  std::string lastReconcileError_;  ///< under dpMu_

  std::unique_ptr<zds::Server> zds_;  ///< null without --ztunnel-socket
  std::unique_ptr<KubeWiring> kube_;  ///< null without Kubernetes (and while handing back)
  std::unique_ptr<IstioSwitch> istio_;
  BpffsMount bpffsMount_;
  std::unique_ptr<cni::ConfWatcher> cniWatcher_;
};

}  // namespace sluice::agent
