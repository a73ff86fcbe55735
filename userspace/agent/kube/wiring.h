// The Kubernetes side of sluiced: the controller of userspace/agent/kube
// (informers, Istio's rules, the netns finder, status annotations) wired to
// the agent's datapath. The agent hands over four operations on its
// registry (AgentDataplane, each under its datapath lock); this file turns
// the controller's callbacks and the API's add into them.
//
//   CNI ADD ─▶ agent API add ─▶ KubeWiring::add ─▶ Controller::podDecision
//        not in the mesh ─▶ {"enrolled": false, "reason"} (sluice-cni passes prevResult on)
//        in the mesh      ─▶ add (settings from the annotations, identity from the API,
//                            a failed hand-off fails it: CNI 11) ─▶ Controller::enrolled
//   Controller (running pods, annotations, start-up reconciliation):
//        enroll         ─▶ add of the located netns; a failed hand-off keeps the
//                          redirection (annotated "pending", retried)
//        updateSettings ─▶ update in place (Datapath::updatePodSettings)
//        unenroll       ─▶ remove by uid (pods without a uid are never touched)
//        listEnrolled   ─▶ the registry
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "enroll/datapath.h"
#include "userspace/agent/kube/client.h"
#include "userspace/agent/kube/controller.h"
#include "userspace/agent/kube/node_selection.h"
#include "userspace/agent/kube/options.h"
#include "userspace/api/protocol.h"

namespace sluice::agent {

/// What the Kubernetes side asks of the agent. Each operation takes the
/// agent's datapath lock itself; none is called with it held.
struct AgentDataplane {
  /// Enrolls (Datapath::addPod through the agent, with the hand-off when
  /// ZDS is on); @p handOffFatal as Handoff::failureIsFatal.
  std::function<Result<PodInfo>(const PodSpec&, bool handOffFatal)> add;
  /// Removes a pod by id (probe SNAT, redirection, then DelWorkload).
  std::function<Status(const std::string& id)> remove;
  /// The registry.
  std::function<std::vector<PodInfo>()> list;
  /// Datapath::updatePodSettings.
  std::function<Result<PodInfo>(const std::string& id, const CaptureSettings&)> update;
  /// Whether a running pod not enrolled yet may be (its netns, "ns/name"):
  /// an error says why not (Istio's node agent redirects it). May be empty.
  std::function<Status(const std::string& netnsPath, const std::string& who)> admit;
  /// Whether pod @p id's failed hand-off only means that ztunnel is still
  /// connected to Istio's node agent, which handed it this pod: it serves
  /// it, and the snapshot of the takeover keeps it. May be empty.
  std::function<bool(const std::string& id)> servedByIstio;
};

/// What the API says of a DaemonSet: absent (404), or present and maybe
/// being deleted (metadata.deletionTimestamp), and whether its pods still
/// belong on this node (kube/node_selection.h; Unknown when the Node could
/// not be read).
struct DaemonSetState {
  bool present = false;
  std::string deletionTimestamp;  ///< "" when not being deleted
  kube::NodeSelectionAnswer node;
};

/// The registry id of a running pod the controller enrolls ("k8s-" + uid);
/// the CNI path uses the runtime's container id instead.
std::string livePodId(const std::string& uid);

/// What the Kubernetes side counts, for the agent's metrics.
struct KubeCounters {
  kube::ControllerStats controller;
  /// The API's adds answered from Kubernetes, by answer.
  uint64_t cniEnrolled = 0, cniNotInMesh = 0, cniErrors = 0, cniByHand = 0;
};

class KubeWiring {
 public:
  /// Creates the client (in-cluster or explicit): reads the token and CA,
  /// touches nothing else, so the agent checks them before its datapath.
  /// Errors: no in-cluster token/CA, an unreadable file, an invalid URL.
  static Result<std::unique_ptr<KubeWiring>> create(const KubeOptions& options);
  /// Creates the controller on @p dataplane and starts it (once).
  Status start(AgentDataplane dataplane);
  ~KubeWiring();
  KubeWiring(const KubeWiring&) = delete;
  KubeWiring& operator=(const KubeWiring&) = delete;

  /// Stops the controller; no dataplane call runs after it returns.
  void stop();

  /// The agent API's add with Kubernetes. A request without a pod
  /// namespace and name (sluicectl by hand) is enrolled as asked. Otherwise
  /// the controller decides: not in the mesh → not enrolled, nothing
  /// touched; in the mesh → enrolled with the annotations' settings and the
  /// API's identity (service account included). An API error is retryable
  /// (EAGAIN): the pod is never enrolled (or left out) on a guess.
  Result<AddResult> add(const PodSpec& spec);
  /// The agent removed a pod with this uid (API remove, CNI DEL): the
  /// controller forgets it and removes its status annotation.
  void removed(const std::string& uid);
  /// Re-reads the registry and reconciles every pod (after each sweep).
  void resync();
  /// The start-up reconciliation has run.
  bool ready() const;
  /// The API the agent talks to ("in cluster" or the URL).
  std::string apiDescription() const;

  /// Removes every taint with key @p key from this node (--node-name) as
  /// Istio's untaint controller does: a JSON patch that tests the taints
  /// read and replaces them (read again when they changed meanwhile).
  /// True when one was removed, false when the node had none.
  Result<bool> removeNodeTaint(const std::string& key, std::stop_token stop = {});
  /// The DaemonSet NS/NAME as the API has it, asked within @p timeout; an
  /// error when the API did not answer (or answered other than 200/404).
  Result<DaemonSetState> daemonSetState(const std::string& ns, const std::string& name,
                                        std::chrono::milliseconds timeout);

  /// The counters the agent exports as sluice_kube_* metrics.
  KubeCounters counters() const;

 private:
  explicit KubeWiring(KubeOptions options) : options_(std::move(options)) {}
  Result<kube::EnrollOutcome> enroll(const kube::PodRef& pod, const kube::PodSettings& s, const kube::NetnsLocation& loc);
  Status updateSettings(const kube::PodRef& pod, const kube::PodSettings& s);
  Status unenroll(const std::string& uid);
  std::vector<kube::EnrolledPod> listEnrolled();
  std::optional<PodInfo> findByUid(const std::string& uid);

  KubeOptions options_;
  AgentDataplane dp_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<kube::Controller> controller_;
  std::atomic<uint64_t> cniEnrolled_{0}, cniNotInMesh_{0}, cniErrors_{0}, cniByHand_{0};
};

}  // namespace sluice::agent
