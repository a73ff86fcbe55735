#include "userspace/agent/kube/wiring.h"

#include <spdlog/spdlog.h>

#include "loader/netns.h"

namespace sluice::agent {

namespace {

CaptureSettings captureOf(const kube::PodSettings& s) { return {s.dnsCapture, s.inboundCapture, s.rerouteIfaces}; }

kube::PodSettings settingsOf(const PodInfo& p) { return {p.dnsCapture, p.inboundCapture, p.rerouteIfaces}; }

PodIdentity identityOf(const kube::PodRef& p) { return {p.uid, p.name, p.namespaceName, p.serviceAccount}; }

std::string who(const kube::PodRef& p) { return p.namespaceName + "/" + p.name; }

}  // namespace

std::string livePodId(const std::string& uid) { return "k8s-" + uid; }

Result<std::unique_ptr<KubeWiring>> KubeWiring::create(const KubeOptions& options) {
  std::unique_ptr<KubeWiring> w(new KubeWiring(options));
  auto cfg = options.inCluster ? kube::inClusterConfig()
                               : kube::explicitConfig(options.apiUrl, options.tokenFile, options.caFile);
  SLUICE_TRY(cfg);
  auto client = kube::Client::create(*cfg);
  SLUICE_TRY(client);
  w->client_ = std::move(*client);
  return w;
}

Status KubeWiring::start(AgentDataplane dataplane) {
  if (controller_) return Error::msg("the Kubernetes controller was started already", EALREADY);
  dp_ = std::move(dataplane);
  const KubeOptions& options = options_;

  kube::ControllerOptions co;
  co.nodeName = options.nodeName;
  co.rules.systemNamespace = options.ztunnelNamespace;
  co.rules.ztunnelLabelKey = options.ztunnelLabelKey;
  co.rules.ztunnelLabelValue = options.ztunnelLabelValue;
  co.rules.excludeNamespaces = options.excludeNamespaces;
  co.rules.dnsCaptureDefault = options.dnsCaptureDefault;
  co.rules.selectors = options.selectors;
  kube::DataplaneCallbacks cb;
  KubeWiring* self = this;
  cb.enroll = [self](const kube::PodRef& p, const kube::PodSettings& s, const kube::NetnsLocation& l) {
    return self->enroll(p, s, l);
  };
  cb.updateSettings = [self](const kube::PodRef& p, const kube::PodSettings& s) { return self->updateSettings(p, s); };
  cb.unenroll = [self](const std::string& uid) { return self->unenroll(uid); };
  cb.listEnrolled = [self] { return self->listEnrolled(); };
  auto ctl = kube::Controller::create(*client_, co, std::move(cb));
  SLUICE_TRY(ctl);
  controller_ = std::move(*ctl);
  controller_->start();
  spdlog::info("Kubernetes: {}; watching the pods of node {}", describeKube(options), options.nodeName);
  return {};
}

KubeWiring::~KubeWiring() { stop(); }

void KubeWiring::stop() {
  if (controller_) controller_->stop();
}

bool KubeWiring::ready() const { return controller_ && controller_->stats().reconciled; }

std::string KubeWiring::apiDescription() const { return options_.inCluster ? "in cluster" : options_.apiUrl; }

std::optional<PodInfo> KubeWiring::findByUid(const std::string& uid) {
  if (uid.empty()) return std::nullopt;
  for (auto& p : dp_.list())
    if (p.identity.uid == uid) return std::move(p);
  return std::nullopt;
}

Result<AddResult> KubeWiring::add(const PodSpec& request) {
  if (request.identity.ns.empty() || request.identity.name.empty()) {
    // Not a Kubernetes pod's add (sluicectl without --pod-namespace and
    // --pod-name): enrolled as asked, and never touched by the controller
    // when it has no uid.
    auto info = dp_.add(request, true);
    SLUICE_TRY(info);
    cniByHand_++;
    return AddResult{true, "", *info};
  }
  auto answer = controller_->podDecision({request.identity.ns, request.identity.name, request.identity.uid});
  if (!answer.ok()) {
    cniErrors_++;
    // Never a guess either way: the runtime retries the sandbox (CNI 11).
    return Error::msg("cannot tell from Kubernetes whether the pod is in the mesh: " + answer.error().message +
                          " (retryable)",
                      EAGAIN);
  }
  for (const auto& w : answer->warnings) spdlog::warn("kube: {}", w);
  const std::string name = request.identity.ns + "/" + request.identity.name;
  if (!answer->enroll) {
    cniNotInMesh_++;
    AddResult r;
    r.enrolled = false;
    r.reason = "not in the ambient mesh: " + answer->reason;
    r.pod.id = request.id.empty() ? defaultPodId(request.netnsPath) : request.id;
    spdlog::info("pod {} ({}) is not in the ambient mesh ({}); left alone", r.pod.id, name, answer->reason);
    return r;
  }

  PodSpec spec = request;
  spec.dnsCapture = answer->settings.dnsCapture;
  spec.inboundCapture = answer->settings.inboundCapture;
  spec.rerouteIfaces = answer->settings.rerouteIfaces;
  spec.identity = identityOf(answer->pod);
  const std::string& uid = spec.identity.uid;
  if (auto have = findByUid(uid)) {
    auto ns = openNetns(spec.netnsPath);
    SLUICE_TRY(ns);
    auto cookie = netnsCookie(ns->get());
    SLUICE_TRY(cookie);
    if (*cookie == have->netnsCookie) {
      // The controller found the sandbox running and enrolled it before
      // this ADD: it is this pod's enrollment (no gap, no second id).
      if (settingsOf(*have) != answer->settings) {
        auto updated = dp_.update(have->id, captureOf(answer->settings));
        SLUICE_TRY(updated);
        have = *updated;
      }
      controller_->enrolled(uid, answer->settings, kube::EnrollOutcome::Enabled);
      cniEnrolled_++;
      return AddResult{true, "in the ambient mesh: " + answer->reason + " (already enrolled as " + have->id + ")", *have};
    }
    // The runtime made a new sandbox for the pod: the old one's enrollment
    // goes (its netns is going away), as a pod has one network namespace.
    spdlog::info("pod {} (uid {}) has a new network namespace; removing its enrollment {} in {}", name, uid, have->id,
                 have->netnsPath);
    SLUICE_TRY(dp_.remove(have->id));
  }
  auto info = dp_.add(spec, true);
  SLUICE_TRY(info);
  controller_->enrolled(uid, answer->settings, kube::EnrollOutcome::Enabled);
  cniEnrolled_++;
  return AddResult{true, "in the ambient mesh: " + answer->reason, *info};
}

void KubeWiring::removed(const std::string& uid) {
  if (!uid.empty() && controller_) controller_->removed(uid);
}

void KubeWiring::resync() {
  if (controller_) controller_->resync();
}

Result<kube::EnrollOutcome> KubeWiring::enroll(const kube::PodRef& pod, const kube::PodSettings& s,
                                               const kube::NetnsLocation& loc) {
  // The process the finder saw may have exited and its pid been reused:
  // the netns is checked again, and again after the enrollment (addPod
  // opens the path itself).
  auto ns = kube::openLocatedNetns(loc);
  SLUICE_TRY(ns);
  auto cookie = netnsCookie(ns->get());
  SLUICE_TRY(cookie);
  PodSpec spec;
  spec.netnsPath = loc.path;
  spec.dnsCapture = s.dnsCapture;
  spec.inboundCapture = s.inboundCapture;
  spec.rerouteIfaces = s.rerouteIfaces;
  spec.nodeNetnsPath = "";  // the agent's own netns is the node's
  spec.ips = pod.ips;
  spec.identity = identityOf(pod);
  spec.id = livePodId(pod.uid);
  auto have = findByUid(pod.uid);
  if (!have && dp_.admit) SLUICE_TRY(dp_.admit(loc.path, who(pod)));
  if (have) {
    if (have->netnsCookie != *cookie) {
      spdlog::info("kube: pod {} (uid {}) runs in another network namespace than its enrollment {} ({}); moving it",
                   who(pod), pod.uid, have->id, have->netnsPath);
      SLUICE_TRY(dp_.remove(have->id));
    } else {
      // Enrolled already (a retried hand-off, or enrolled by the CNI path):
      // the same id makes the add idempotent; its settings first.
      spec.id = have->id;
      spec.netnsPath = have->netnsPath;
      if (settingsOf(*have) != s) SLUICE_TRY(dp_.update(have->id, captureOf(s)));
    }
  }
  // A failed hand-off keeps the redirection (the pod runs and its traffic
  // must not pass the proxy): "pending", and the controller retries.
  auto info = dp_.add(spec, false);
  SLUICE_TRY(info);
  if (info->netnsCookie != *cookie) {
    (void)dp_.remove(info->id);
    return Error::msg("pod " + who(pod) + ": " + loc.path + " names another network namespace now (the process exited)",
                      ESTALE);
  }
  // Taken over from Istio's node agent while it still has ztunnel: its
  // annotation stays "enabled" (istiod reads it as captured).
  if (info->handoff == HandoffState::Failed && !(dp_.servedByIstio && dp_.servedByIstio(info->id)))
    return kube::EnrollOutcome::Pending;
  return kube::EnrollOutcome::Enabled;
}

Status KubeWiring::updateSettings(const kube::PodRef& pod, const kube::PodSettings& s) {
  auto have = findByUid(pod.uid);
  if (!have) return Error::msg("pod " + who(pod) + " (uid " + pod.uid + ") is not enrolled", ENOENT);
  SLUICE_TRY(dp_.update(have->id, captureOf(s)));
  return {};
}

Status KubeWiring::unenroll(const std::string& uid) {
  if (uid.empty()) return {};  // never a pod enrolled by hand
  for (const auto& p : dp_.list())
    if (p.identity.uid == uid) {
      Status st = dp_.remove(p.id);
      // Removed meanwhile (CNI DEL, the sweep): what was asked for.
      if (!st.ok() && st.error().code != ENOENT) return st;
    }
  return {};
}

std::vector<kube::EnrolledPod> KubeWiring::listEnrolled() {
  std::vector<kube::EnrolledPod> out;
  for (const auto& p : dp_.list()) out.push_back({p.identity.uid, p.netnsPath, settingsOf(p)});
  return out;
}

Result<bool> KubeWiring::removeNodeTaint(const std::string& key, std::stop_token stop) {
  const std::string path = kube::nodePath(options_.nodeName);
  // Istio's untaint controller's patch (pilot/pkg/controllers/untaint/
  // nodeuntainter.go): test that the taints are still what was read, then
  // replace them without @p key; a node changed in between is read again.
  Error last = Error::msg("not tried", EIO);
  for (int attempt = 0; attempt < 5; attempt++) {
    auto node = client_->get(path, stop);
    SLUICE_TRY(node);
    const nlohmann::json taints = node->contains("spec") && (*node)["spec"].value("taints", nlohmann::json()).is_array()
                                      ? (*node)["spec"]["taints"]
                                      : nlohmann::json::array();
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& t : taints)
      if (!t.is_object() || t.value("key", "") != key) kept.push_back(t);
    if (kept.size() == taints.size()) return false;
    nlohmann::json ops = nlohmann::json::array({{{"op", "test"}, {"path", "/spec/taints"}, {"value", taints}},
                                                {{"op", "replace"}, {"path", "/spec/taints"}, {"value", kept}}});
    auto patched = client_->jsonPatch(path, ops, stop);
    if (patched.ok()) return true;
    // 422: the test failed (the taints changed since the GET); 409: a conflict.
    if (!kube::isHttpStatus(patched.error(), 422) && !kube::isHttpStatus(patched.error(), 409)) return patched.error();
    last = patched.error();
  }
  return last;
}

Result<DaemonSetState> KubeWiring::daemonSetState(const std::string& ns, const std::string& name,
                                                  std::chrono::milliseconds timeout) {
  // A client of its own: this question must be answered within @p timeout.
  kube::ClientConfig cfg = client_->config();
  cfg.requestTimeout = timeout;
  cfg.connectTimeout = std::min(cfg.connectTimeout, timeout);
  auto client = kube::Client::create(cfg);
  SLUICE_TRY(client);
  auto ds = (*client)->get(kube::daemonSetPath(ns, name));
  if (!ds.ok()) {
    if (kube::isNotFound(ds.error())) return DaemonSetState{};
    return ds.error();
  }
  DaemonSetState s;
  s.present = true;
  if (ds->contains("metadata") && (*ds)["metadata"].value("deletionTimestamp", nlohmann::json()).is_string())
    s.deletionTimestamp = (*ds)["metadata"]["deletionTimestamp"].get<std::string>();
  if (s.deletionTimestamp.empty()) {
    auto node = (*client)->get(kube::nodePath(options_.nodeName));
    s.node = node.ok() ? kube::daemonSetSelectsNode(*ds, *node)
                       : kube::NodeSelectionAnswer{kube::NodeSelection::Unknown,
                                                   "node " + options_.nodeName + " not read: " + node.error().message};
  }
  return s;
}

KubeCounters KubeWiring::counters() const {
  return {controller_->stats(), cniEnrolled_.load(), cniNotInMesh_.load(), cniErrors_.load(), cniByHand_.load()};
}

}  // namespace sluice::agent
