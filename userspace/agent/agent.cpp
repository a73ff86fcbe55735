// sluiced's wiring: start (Kubernetes, the datapath, the start-up sweep,
// ZDS, the listeners, the CNI config watcher), stop, and the datapath lock.
// What each part does: api_server.cpp, metrics_server.cpp, reconcile.cpp,
// pods.cpp.
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
#include "userspace/agent/io.h"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "dev"
#endif

namespace sluice::agent {

Result<std::unique_ptr<Agent>> Agent::start(const AgentOptions& options) {
  std::unique_ptr<Agent> a(new Agent(options));
  if (!options.metricsAddress.empty()) SLUICE_TRY(parseHostPort(options.metricsAddress));
  // Another agent on the socket owns the state: never run two.
  if (auto other = Client::connect(options.socketPath, std::chrono::seconds(2)); other.ok())
    return Error::msg("another agent is already listening on " + options.socketPath, EADDRINUSE);
  a->istio_ = std::make_unique<IstioSwitch>(options.istioSwitch, options.cniConfDir);
  const bool handingBack = options.istioSwitch == IstioSwitchMode::HandBack;
  if (options.kube.enabled() && !handingBack) {
    // Its token and CA are read before anything is loaded or pinned.
    auto k = KubeWiring::create(options.kube);
    SLUICE_TRY(k);
    a->kube_ = std::move(*k);
  }
  SLUICE_TRY(a->checkBpffs());
  // A long-running enroller: the pods' sk_lookup programs loaded ahead.
  DatapathOptions dopts = options.datapath;
  dopts.skLookupStubsAhead = kSkLookupStubsAhead;
  auto dp = Datapath::open(dopts);
  SLUICE_TRY(dp);
  a->dp_ = std::move(*dp);
  a->stopFd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!a->stopFd_.valid()) return Error::fromErrno(errno, "eventfd");
  // Adopt what is enrolled before answering anyone.
  ReconcileReport r = a->reconcileNow();
  spdlog::info("sluiced {}: {} pod(s) enrolled; start-up sweep removed {}, found {} damaged, switched {} hook(s) to this build's programs",
               SLUICE_VERSION, r.pods, r.removed.size(), r.repaired.size(), r.programsReplaced);
  a->completeNodeSides();
  if (dopts.podGuard) {
    if (std::string why = podGuardUnsupported(); !why.empty())
      spdlog::warn("pod guard inactive: {}; apps of enrolled pods holding CAP_NET_RAW can send frames from packet "
                   "sockets past the proxy (remedy: drop CAP_NET_RAW, or enable the BPF LSM)",
                   why);
    else if (r.pods)
      a->dp_->ensurePodGuardFor();  // pods enrolled by a build without the guard
  }
  SLUICE_TRY(a->startZds());
  // Before the API answers: an add must be decided from Kubernetes.
  if (a->kube_) SLUICE_TRY(a->kube_->start(a->kubeDataplane()));
  a->checkDaemonSet();
  SLUICE_TRY(a->listenApi());
  SLUICE_TRY(a->listenMetrics());
  a->apiThread_ = std::thread([p = a.get()] { p->acceptLoop(p->apiFd_.get(), false); });
  if (a->metricsFd_.valid()) a->metricsThread_ = std::thread([p = a.get()] { p->acceptLoop(p->metricsFd_.get(), true); });
  if (options.reconcileInterval.count() > 0) a->reconcileThread_ = std::thread([p = a.get()] { p->reconcileLoop(); });
  if (options.istioSwitch != IstioSwitchMode::Off) a->istioThread_ = std::thread([p = a.get()] { p->istioLoop(); });
  if (options.removeNodeTaint && a->kube_) a->untaintThread_ = std::thread([p = a.get()] { p->untaintLoop(); });
  // Handing back, sluice-cni leaves the chain: nothing puts it back.
  if (!options.cniConfDir.empty() && !handingBack) {
    cni::WatchOptions w{options.cniConfDir, options.cniAgentSocket.empty() ? options.socketPath : options.cniAgentSocket,
                        options.cniMode};
    auto watcher = cni::ConfWatcher::start(w, [p = a.get()](const cni::WatchEvent& e) { p->metrics_.cniConf(e.restored); });
    SLUICE_TRY(watcher);
    a->cniWatcher_ = std::move(*watcher);
  }
  return a;
}

void Agent::completeNodeSides() {
  DpGuard g(*this);
  for (const auto& p : dp_->listPods()) {
    if (!p.hostIface.empty()) continue;
    // The agent enrolls every pod with its node side (addLocked): a pod
    // without one had its enrollment cut short (an agent killed), or its
    // host-side veth is not in this netns (then this only warns again).
    PodSpec spec;
    spec.id = p.id;
    spec.netnsPath = p.netnsPath;
    spec.dnsCapture = p.dnsCapture;
    spec.inboundCapture = p.inboundCapture;
    spec.rerouteIfaces = p.rerouteIfaces;
    spec.nodeNetnsPath = "";
    spec.ips = p.ips;
    spec.identity = p.identity;
    if (auto c = parseCaptureMode(p.capture); c.ok()) spec.capture = *c;
    if (auto m = parseTcMode(p.tcMode); m.ok()) spec.tcMode = *m;
    auto done = dp_->addPod(spec);
    if (!done.ok()) spdlog::warn("pod {}: its node side could not be completed: {}", p.id, done.error().message);
  }
}

Status Agent::checkBpffs() {
  const std::string& root = options_.datapath.bpffsRoot;
  // Before the root is made: an unprivileged run must not leave one.
  SLUICE_TRY(checkPrivileges());
  SLUICE_TRY(ensureBpffsRoot(root));
  auto m = inspectBpffsMount(root);
  SLUICE_TRY(m);
  bpffsMount_ = *m;
  std::string where = "bpffs " + m->device + " at " + m->mountPoint + " (" + root + ")";
  if (m->outlivesNamespace) {
    spdlog::info("{} outlives this mount namespace: {}", where, m->why);
    return {};
  }
  std::string what = where + " is private to the agent's mount namespace (" + m->why +
                     "): its pinned maps and tcx links, and every pod's redirection with them, vanish with that "
                     "namespace when the agent exits";
  if (!options_.allowPrivateBpffs)
    return Error::msg(what + "; mount the host's /sys/fs/bpf here (hostPath, mountPropagation: Bidirectional) or "
                             "pass --allow-private-bpffs",
                      EPERM);
  spdlog::warn("--allow-private-bpffs: {}", what);
  return {};
}

Agent::~Agent() { stop(); }

void Agent::stop() {
  if (stopping_.exchange(true)) return;
  if (kube_) kube_->stop();  // no controller call into the datapath after this
  untaintStop_.request_stop();
  cniWatcher_.reset();
  if (stopFd_.valid()) {
    uint64_t one = 1;
    (void)!::write(stopFd_.get(), &one, sizeof(one));
  }
  {
    std::lock_guard<std::mutex> g(sweepMu_);
  }
  sweepCv_.notify_all();
  if (apiThread_.joinable()) apiThread_.join();
  if (metricsThread_.joinable()) metricsThread_.join();
  if (reconcileThread_.joinable()) reconcileThread_.join();
  if (istioThread_.joinable()) istioThread_.join();
  if (untaintThread_.joinable()) untaintThread_.join();
  reapConnections(true);
  // The node proxy keeps its pods' proxies across a dropped connection and
  // gets a snapshot from the next agent.
  if (zds_) zds_->stop();
  if (apiFd_.valid()) {
    apiFd_ = Fd();
    ::unlink(options_.socketPath.c_str());
  }
  metricsFd_ = Fd();
  spdlog::info("sluiced stopped; the data plane stays in place");
}

Agent::DpGuard::DpGuard(Agent& a) : a_(a), lk_(a.dpMu_) { a_.dpHeldSinceNs_.store(nowNs()); }
Agent::DpGuard::~DpGuard() { a_.dpHeldSinceNs_.store(0); }

}  // namespace sluice::agent
