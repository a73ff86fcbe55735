// Enrolling and removing pods through the agent: the datapath with the
// hand-off to the node proxy over ZDS, the ZDS server's snapshot, and the
// operations the Kubernetes side calls.
#include "userspace/agent/agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "loader/netns.h"
#include "loader/pod_guard.h"
#include "loader/privileges.h"
#include "userspace/api/client.h"
#include "userspace/agent/kube/wiring.h"

#include "userspace/agent/io.h"

namespace sluice::agent {

Result<PodInfo> Agent::addLocked(PodSpec spec, bool handOffFatal) {
  // The pod's host-side interface is looked up in the agent's own netns.
  if (!spec.nodeNetnsPath) spec.nodeNetnsPath = "";
  auto t = Clock::now();
  Result<PodInfo> info = Error::msg("not enrolled", EINVAL);
  if (zds_) {
    if (spec.identity.uid.empty())
      return Error::msg("pod has no uid: this agent hands every pod to the node proxy (--ztunnel-socket), which "
                        "needs the pod's Kubernetes uid (sluice-cni takes it from CNI_ARGS K8S_POD_UID; "
                        "sluicectl: --uid)",
                        EINVAL);
    Handoff hook{[this, handOffFatal](const PodInfo& p) { return handOff(p, handOffFatal); },
                    [this](const PodInfo& p) { (void)zds_->del(p.identity.uid); }, handOffFatal};
    info = dp_->addPod(spec, &hook);
  } else {
    info = dp_->addPod(spec);
  }
  SLUICE_TRY(info);
  metrics_.addLatency(secondsSince(t));
  // Taking over from Istio's node agent: its rules leave once ours are in.
  istio_->afterAdd(*info);
  return info;
}

Result<std::string> Agent::removeLocked(const std::string& id) {
  auto t = Clock::now();
  std::string uid;
  for (const auto& p : dp_->listPods())
    if (p.id == id) uid = p.identity.uid;
  // Istio's order: probe SNAT and redirection out, then DelWorkload to
  // every node proxy connection (none connected: nobody to tell).
  SLUICE_TRY(dp_->removePod(id));
  if (zds_ && !uid.empty()) (void)zds_->del(uid);
  metrics_.removeLatency(secondsSince(t));
  return uid;
}

Status Agent::handOff(const PodInfo& pod, bool takeBackOnRefusal) {
  auto fail = [&](const std::string& why) {
    spdlog::warn("hand-off of pod {} (uid {}, {}/{}) to the node proxy failed: {}", pod.id, pod.identity.uid,
                 pod.identity.ns, pod.identity.name, why);
    return Error::msg("hand-off to the node proxy failed: " + why + " (retryable)", EAGAIN);
  };
  auto ns = openNetnsWithCookie(pod.netnsPath, pod.netnsCookie);
  if (!ns.ok()) return fail(ns.error().message);
  Status st = zds_->add({pod.identity.uid, pod.identity.name, pod.identity.ns, pod.identity.serviceAccount}, ns->get());
  if (!st.ok()) {
    // It refused the pod (e.g. "failure to start proxy") and would retry it
    // on its own; the enrollment is rolled back, so take the pod back.
    // (A running pod keeps its enrollment: the node proxy keeps retrying.)
    if (st.error().code == EPROTO && takeBackOnRefusal) (void)zds_->del(pod.identity.uid);
    return fail(st.error().message);
  }
  return {};
}

std::vector<zds::SnapshotEntry> Agent::snapshot() {
  // Without dpMu_ (the registry is read entry by entry from its map): a pod
  // is in the registry before its AddWorkload is sent, and leaves it before
  // its DelWorkload, so a snapshot misses no pod the node proxy must keep.
  std::vector<zds::SnapshotEntry> out;
  for (const auto& p : dp_->listPods()) {
    if (p.identity.uid.empty()) {
      spdlog::warn("ZDS snapshot: pod {} has no uid (enrolled without an identity); the node proxy is not told of it", p.id);
      continue;
    }
    zds::SnapshotEntry e;
    e.workload = {p.identity.uid, p.identity.name, p.identity.ns, p.identity.serviceAccount};
    auto ns = openNetnsWithCookie(p.netnsPath, p.netnsCookie);
    if (ns.ok())
      e.netns = std::move(*ns);
    else
      spdlog::info("ZDS snapshot: pod {} netns: {}; sent without it (KeepWorkload)", p.id, ns.error().message);
    out.push_back(std::move(e));
  }
  return out;
}

AgentDataplane Agent::kubeDataplane() {
  AgentDataplane d;
  d.add = [this](const PodSpec& spec, bool handOffFatal) {
    DpGuard g(*this);
    return addLocked(spec, handOffFatal);
  };
  d.remove = [this](const std::string& id) -> Status {
    DpGuard g(*this);
    SLUICE_TRY(removeLocked(id));
    return {};
  };
  d.list = [this] {
    DpGuard g(*this);
    return dp_->listPods();
  };
  d.admit = [this](const std::string& netnsPath, const std::string& who) {
    return istio_->admitRunning(netnsPath, who);
  };
  d.servedByIstio = [this](const std::string& id) {
    return istio_->tookOver(id) && zds_ && !zds_->waiting().empty();
  };
  d.update = [this](const std::string& id, const CaptureSettings& s) {
    DpGuard g(*this);
    return dp_->updatePodSettings(id, s);
  };
  return d;
}

// ZDS when a node proxy socket is given: the server, and the node proxy's
// cgroups learned from its connections; without it, the mark alone.
Status Agent::startZds() {
  const AgentOptions& options = options_;
  if (options.istioSwitch == IstioSwitchMode::HandBack) {
    // ztunnel is Istio's node agent's again: no snapshot, no DelWorkload.
    spdlog::info("handing the node back to Istio's node agent: ZDS{} not served", options.ztunnelSocket.empty() ? "" : " (" + options.ztunnelSocket + ")");
    return {};
  }
  if (!options.ztunnelSocket.empty()) {
    // The node proxy connects when it likes; the agent only listens.
    zds::ServerOptions zo;
    zo.socketPath = options.ztunnelSocket;
    zo.takeOver = options.ztunnelTakeover;
    zo.helloTimeout = zo.writeTimeout = zo.ackTimeout = zo.idleCheckInterval = options.ztunnelTimeout;
    zo.snapshot = [p = this] { return p->snapshot(); };
    zo.observer = &zdsMetrics_;
    // The proxy's cgroup is known before it gets a pod: its sockets' mark
    // counts from then on, an app's setting the same mark no longer does.
    zo.onConnected = [p = this](const zds::Peer& peer) {
      auto id = p->dp_->addProxyProcess(peer.pid);
      if (id.ok())
        spdlog::info("node proxy pid {} runs in cgroup {}: the proxy mark counts only from its cgroups", peer.pid, *id);
      else
        spdlog::warn("node proxy pid {}: {}; its cgroup is not known, so its sockets' mark may not be honoured", peer.pid,
                     id.error().message);
    };
    // On the server's notifier thread, which nothing waits on: it may wait
    // for an add holding dpMu_.
    zo.onSnapshotAck = [p = this](const std::string& uid, const std::string& error) {
      DpGuard g(*p);
      for (const auto& pod : p->dp_->listPods())
        if (pod.identity.uid == uid)
          (void)p->dp_->setHandoff(pod.id, error.empty() ? HandoffState::Acked : HandoffState::Failed, error);
    };
    // Node proxies gone since the last run leave the set.
    dp_->pruneProxyCgroups();
    auto server = zds::Server::start(std::move(zo));
    SLUICE_TRY(server);
    zds_ = std::move(*server);
    spdlog::info("ZDS: waiting for the node proxy (ztunnel) on {}", options.ztunnelSocket);
  } else if (Status st = dp_->clearProxyIdentity(); !st.ok()) {
    // Without a node proxy over ZDS no cgroup is learned: the mark alone.
    return Error::msg("reset the proxy identity to the mark alone: " + st.error().message, st.error().code);
  }
  return {};
}

}  // namespace sluice::agent
