// The agent's life on a node beyond serving: when it is ready (/readyz,
// health's not_ready), removing the node's readiness taint once it is
// (--remove-node-taint), and what SIGTERM means (an update: nothing
// changes; an uninstall: sluice-cni leaves the chain, the node's pieces
// go). deploy/README.md, "Readiness" and "Removing sluice".
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "loader/bpffs.h"
#include "loader/probe_hook.h"
#include "loader/sock_hooks.h"
#include "userspace/agent/agent.h"
#include "userspace/agent/io.h"
#include "userspace/cni/install.h"
#include "userspace/cni/plugin.h"

namespace sluice::agent {

namespace {

// "" when the file where sluice-cni belongs in the layout @p mode names
// holds it: the runtime's pick (the lexically first config, or the owned
// conflist, which must sort first), the --cni-conf-name file, or the
// standalone config Multus runs (--cni-unchained); otherwise what is wrong.
std::string chainProblem(const std::string& confDir, const cni::ConfMode& mode, const std::string& agentSocket) {
  auto plan = cni::planChain(confDir, agentSocket, mode);
  if (!plan.ok()) return plan.error().message;
  if (!plan->current) return plan->path + " (where sluice-cni belongs) is not there yet, or not JSON";
  const nlohmann::ordered_json& j = *plan->current;
  const nlohmann::ordered_json single = nlohmann::ordered_json::array({j});
  const nlohmann::ordered_json& plugins = j.contains("plugins") && j["plugins"].is_array() ? j["plugins"] : single;
  for (const auto& p : plugins)
    if (p.is_object() && p.value("type", "") == cni::kPluginType) return "";
  return "sluice-cni is not in the plugin chain of " + plan->path +
         (mode.chained ? " (the config the runtime uses)" : " (the standalone config Multus runs)");
}

}  // namespace

std::vector<std::string> Agent::readiness() const {
  std::vector<std::string> missing;
  if (!bpffsMount_.outlivesNamespace)
    missing.push_back("bpffs: " + options_.datapath.bpffsRoot + " is private to the agent's mount namespace (" +
                      bpffsMount_.why + "): every pin goes with it");
  if (!dp_) missing.push_back("programs: not loaded yet");
  if (kube_ && !kube_->ready())
    missing.push_back("kubernetes: the pods and namespaces informers have not synced yet with " +
                      kube_->apiDescription());
  const bool handingBack = options_.istioSwitch == IstioSwitchMode::HandBack;
  if (!options_.cniConfDir.empty() && !handingBack)
    if (std::string why = chainProblem(options_.cniConfDir, options_.cniMode,
                                       options_.cniAgentSocket.empty() ? options_.socketPath : options_.cniAgentSocket);
        !why.empty())
      missing.push_back("cni: " + why);
  if (!options_.ztunnelSocket.empty() && !handingBack) {
    if (!zds_)
      missing.push_back("zds: " + options_.ztunnelSocket + " is not served");
    else if (std::string why = zds_->waiting(); !why.empty())
      missing.push_back("zds: " + why);
    else if (zds_->socketReplaced())
      missing.push_back("zds: another process has put its own socket at " + options_.ztunnelSocket);
  }
  if (std::string why = wedged(); !why.empty()) missing.push_back("wedged: " + why);
  return missing;
}

void Agent::untaintLoop() {
  const std::string& key = options_.nodeTaintKey;
  const std::string& node = options_.kube.nodeName;
  auto delay = std::chrono::milliseconds(500);
  std::string lastProblem;
  std::unique_lock<std::mutex> lk(sweepMu_);
  while (!stopping_) {
    sweepCv_.wait_for(lk, delay, [this] { return stopping_.load(); });
    if (stopping_) return;
    lk.unlock();
    std::vector<std::string> missing = readiness();
    std::string problem;
    if (missing.empty()) {
      auto removed = kube_->removeNodeTaint(key, untaintStop_.get_token());
      if (removed.ok()) {
        if (*removed)
          spdlog::info("node {}: removed its taint {} (the agent is ready)", node, key);
        else
          spdlog::info("node {} has no taint {}; nothing to remove", node, key);
        return;
      }
      if (stopping_) return;
      problem = "could not remove taint " + key + " from node " + node + ": " + removed.error().message;
      delay = std::min<std::chrono::milliseconds>(delay * 2, std::chrono::seconds(30));
    }
    // Once per change, not once per attempt.
    if (!problem.empty() && problem != lastProblem) spdlog::warn("{} (retrying)", problem);
    lastProblem = problem;
    lk.lock();
  }
}

void Agent::checkDaemonSet() {
  if (options_.daemonSet.empty() || !kube_) return;
  const std::string ds = options_.daemonSetNamespace + "/" + options_.daemonSet;
  // Its pod runs, so the DaemonSet is there: a 404 now is a wrong name, which
  // would turn every update into an uninstall. Not answered: asked again
  // on SIGTERM as usual.
  auto state = kube_->daemonSetState(options_.daemonSetNamespace, options_.daemonSet, std::chrono::seconds(2));
  if (state.ok() && !state->present) {
    daemonSetMisnamed_ = true;
    spdlog::error("DaemonSet {} (--daemonset) does not exist while this agent runs: the name is wrong; this agent "
                  "will not uninstall on SIGTERM",
                  ds);
  } else if (!state.ok()) {
    spdlog::debug("DaemonSet {} not checked at start: {}", ds, state.error().message);
  }
}

Agent::Departure Agent::departure() {
  if (options_.daemonSet.empty()) return Departure::Stay;
  const std::string ds = options_.daemonSetNamespace + "/" + options_.daemonSet;
  if (daemonSetMisnamed_) {
    spdlog::warn("stopping: DaemonSet {} did not exist at start (a wrong --daemonset); not uninstalling", ds);
    return Departure::Stay;
  }
  if (!kube_) {
    spdlog::info("stopping: no Kubernetes client to ask whether DaemonSet {} is being removed; not uninstalling", ds);
    return Departure::Stay;
  }
  // Within the pod's grace period: three questions, each bounded, a second
  // apart (Istio's agent asks as often: cni/pkg/nodeagent/server.go).
  Error last = Error::msg("not asked", EIO);
  for (int attempt = 0; attempt < 3; attempt++) {
    if (attempt) std::this_thread::sleep_for(std::chrono::seconds(1));
    auto state = kube_->daemonSetState(options_.daemonSetNamespace, options_.daemonSet, std::chrono::seconds(5));
    if (state.ok()) {
      const std::string& node = options_.kube.nodeName;
      if (state->present && state->deletionTimestamp.empty() &&
          state->node.selection == kube::NodeSelection::NotSelected) {
        spdlog::info("stopping: DaemonSet {} no longer selects node {} ({}): uninstalling sluice from this node", ds,
                     node, state->node.why);
        return Departure::Uninstall;
      }
      if (state->present && state->deletionTimestamp.empty()) {
        spdlog::info("stopping: DaemonSet {} is still there (an update or a restart){}: the CNI chain, sluice-cni and "
                     "the pinned state stay as they are",
                     ds,
                     state->node.selection == kube::NodeSelection::Unknown
                         ? "; whether it still selects node " + node + " was not judged (" + state->node.why + ")"
                         : std::string());
        return Departure::Stay;
      }
      spdlog::info("stopping: DaemonSet {} {}: uninstalling sluice from this node", ds,
                   state->present ? "is being deleted (deletionTimestamp " + state->deletionTimestamp + ")"
                                  : std::string("is gone (404)"));
      return Departure::Uninstall;
    }
    last = state.error();
  }
  spdlog::warn("stopping: cannot ask whether DaemonSet {} is being removed ({}); not uninstalling: the CNI chain, "
               "sluice-cni and the pinned state stay as they are",
               ds, last.message);
  return Departure::Stay;
}

void Agent::uninstallNode() {
  // The chains first, then the binary (cni::uninstall's order): a runtime
  // never finds a chain naming a plugin that is gone.
  cni::InstallOptions io;
  io.confDir = options_.cniConfDir;
  io.binDir = options_.cniBinDir;
  io.mode = options_.cniMode;  // its owned conflist (by the name it was given) is deleted, not stripped
  auto done = cni::uninstall(io);
  if (done.ok())
    for (const auto& a : *done) spdlog::info("uninstall: {}", a);
  else
    spdlog::error("uninstall: sluice-cni could not be taken out of {}: {}", io.confDir, done.error().message);
  const std::string& root = options_.datapath.bpffsRoot;
  const size_t pods = dp_ ? dp_->listPods().size() : 0;
  if (pods) {
    spdlog::info("uninstall: {} pod(s) stay enrolled and keep their redirection until they are re-created; the "
                 "pinned state under {} stays for them (remove it once they are gone: deploy/README.md)",
                 pods, root);
    return;
  }
  // No pod needs them: the node-wide hooks (socket mode's cgroup hooks),
  // the pod guard, the programs and maps.
  if (Status st = removeNodeHooks(root); !st.ok()) spdlog::warn("uninstall: node hooks: {}", st.error().message);
  // The probe addresses the node's probe hook binds to (on lo, this netns).
  const Settings& set = options_.datapath.settings;
  if (Status st = removeProbeAddrs(set.probeV4, set.probeV6); !st.ok())
    spdlog::warn("uninstall: probe addresses: {}", st.error().message);
  if (Status st = removeTree(root); st.ok())
    spdlog::info("uninstall: no pod was enrolled; removed the node's pinned state {}", root);
  else
    spdlog::error("uninstall: could not remove {}: {}", root, st.error().message);
}

void Agent::shutdown() {
  const Departure d = departure();
  stop();
  if (d == Departure::Uninstall) uninstallNode();
}

}  // namespace sluice::agent
