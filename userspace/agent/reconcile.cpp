// The periodic sweep (Datapath::reconcile) and the agent's health: wedged
// when the datapath lock or a sweep is held too long.
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

void Agent::reconcileLoop() {
  std::unique_lock<std::mutex> lk(sweepMu_);
  while (!stopping_) {
    sweepCv_.wait_for(lk, options_.reconcileInterval, [this] { return stopping_.load(); });
    if (stopping_) return;
    lk.unlock();
    ReconcileReport r = reconcileNow();
    if (!r.removed.empty() || !r.repaired.empty() || r.programsReplaced)
      spdlog::info("sweep: removed {} pod(s) whose netns was gone, repaired {}, switched {} hook(s)", r.removed.size(),
                   r.repaired.size(), r.programsReplaced);
    if (kube_) kube_->resync();  // the registry as the sweep left it
    lk.lock();
  }
}

void Agent::istioLoop() {
  std::unique_lock<std::mutex> lk(sweepMu_);
  while (!stopping_) {
    lk.unlock();
    istioSweep();
    lk.lock();
    const bool done = istio_->status().ends_with(": done");
    if (done && options_.reconcileInterval.count() == 0) return;
    sweepCv_.wait_for(lk, done ? options_.reconcileInterval : std::chrono::milliseconds(1000),
                      [this] { return stopping_.load(); });
  }
}

void Agent::istioSweep() {
  IstioSwitch::Registry r;
  r.list = [this] {
    DpGuard g(*this);
    return dp_->listPods();
  };
  r.handBack = [this](const std::string& id) {
    DpGuard g(*this);
    return dp_->removePodKeepingReturnPath(id);
  };
  // Istio's node agent serves ztunnel's socket: still (the takeover waits),
  // or again (it came back: nothing of its is taken away meanwhile).
  istio_->sweep(r, zds_ && (!zds_->waiting().empty() || zds_->socketReplaced()));
}

ReconcileReport Agent::reconcileNow() {
  DpGuard g(*this);
  std::map<std::string, std::string> uids;  // of the pods the sweep may remove
  if (zds_)
    for (const auto& p : dp_->listPods()) uids[p.id] = p.identity.uid;
  ReconcileReport r = dp_->reconcile();
  if (zds_) {
    for (const auto& id : r.removed)
      if (!uids[id].empty()) (void)zds_->del(uids[id]);
    dp_->pruneProxyCgroups();
  }
  for (const auto& e : r.errors) spdlog::warn("sweep: {}", e);
  lastReconcileError_ = r.errors.empty() ? "" : r.errors.front();
  metrics_.reconciled(r.removed.size(), r.repaired.size(), r.programsReplaced, r.errors.size());
  reconciles_++;
  lastReconcileNs_.store(nowNs());
  return r;
}

std::string Agent::wedged() const {
  int64_t now = nowNs();
  auto secs = [](int64_t ns) { return std::to_string(ns / 1000000000) + " s"; };
  const int64_t bound = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.wedgedAfter).count();
  if (int64_t since = dpHeldSinceNs_.load(); since != 0 && now - since > bound)
    return "the datapath lock has been held for " + secs(now - since);
  if (options_.reconcileInterval.count() > 0) {
    int64_t last = lastReconcileNs_.load();
    const int64_t interval = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.reconcileInterval).count();
    if (last != 0 && now - last > interval + bound)
      return "no reconcile sweep for " + secs(now - last) + " (one every " + secs(interval) + " expected)";
  }
  return "";
}

Health Agent::health() {
  Health h;
  h.version = SLUICE_VERSION;
  h.bpffsRoot = options_.datapath.bpffsRoot;
  h.capture = captureModeName(options_.datapath.capture);
  h.tcMode = tcModeName(options_.datapath.tcMode);
  h.pods = dp_->listPods().size();
  h.uptimeSeconds = static_cast<uint64_t>(secondsSince(started_));
  h.reconciles = reconciles_;
  h.lastReconcileError = lastReconcileError_;
  if (zds_) {
    h.ztunnelSocket = options_.ztunnelSocket;
    h.ztunnelConnections = zds_->peers().size();
    h.ztunnelWaiting = zds_->waiting();
  }
  if (kube_) {
    h.kubeApi = kube_->apiDescription();
    h.kubeSynced = kube_->ready();
  }
  h.istio = istio_->status();
  h.bpffsScope = bpffsMount_.outlivesNamespace ? "host" : "private";
  h.bpffsScopeWhy = bpffsMount_.why;
  h.notReady = readiness();
  return h;
}

}  // namespace sluice::agent
