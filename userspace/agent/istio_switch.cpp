#include "userspace/agent/istio_switch.h"

#include <spdlog/spdlog.h>

#include "istio/state.h"
#include "istio/takeover.h"
#include "loader/netns.h"

namespace sluice::agent {
namespace {

std::string who(const PodInfo& p) {
  if (p.identity.ns.empty()) return "pod " + p.id;
  return "pod " + p.id + " (" + p.identity.ns + "/" + p.identity.name + ")";
}

std::string key(const PodInfo& p) { return p.id + "/" + std::to_string(p.netnsCookie); }

std::string joined(const std::vector<std::string>& v, const char* sep = "; ") {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

// Istio's in-pod rules in the netns @p nsfd names.
Result<istio::PodRules> rulesIn(int nsfd) {
  istio::PodRules rules;
  SLUICE_TRY(runInNetns(nsfd, [&]() -> Status {
    auto r = istio::readPodRules();
    SLUICE_TRY(r);
    rules = *r;
    return {};
  }));
  return rules;
}

// Istio's in-pod rules in @p pod's netns (the pod's netns checked by cookie).
Result<istio::PodRules> rulesOf(const PodInfo& pod) {
  auto ns = openNetnsWithCookie(pod.netnsPath, pod.netnsCookie);
  SLUICE_TRY(ns);
  return rulesIn(ns->get());
}

}  // namespace

Status IstioSwitch::admitRunning(const std::string& netnsPath, const std::string& podName) const {
  if (mode_ != IstioSwitchMode::Off) return {};
  auto ns = openNetns(netnsPath);
  SLUICE_TRY(ns);
  auto rules = rulesIn(ns->get());
  SLUICE_TRY(rules);
  if (!rules->any()) return {};
  return Error::msg("pod " + podName + " carries Istio's node agent's redirection (" + rules->describe() +
                        "): not enrolled, as two redirections at once would capture its connections twice; "
                        "sluiced --istio-takeover takes such pods over",
                    EEXIST);
}

std::string IstioSwitch::takeOverPod(const PodInfo& pod) {
  auto ns = openNetnsWithCookie(pod.netnsPath, pod.netnsCookie);
  if (!ns.ok()) return "its netns cannot be entered: " + ns.error().message;
  istio::PodRulesRemoval removal;
  Status st = runInNetns(ns->get(), [&]() -> Status {
    // Socket mode keeps what connections from before need until they close
    // (istio/takeover.h); tc mode cannot (its DNS capture fails beside a
    // REDIRECT rule).
    auto r = istio::removePodRules(pod.capture == "socket");
    SLUICE_TRY(r);
    removal = *r;
    return {};
  });
  if (!st.ok()) return "Istio's rules left as they are: " + st.error().message;
  if (!removal.removed.empty() || !removal.waiting.empty()) {
    std::lock_guard g(mu_);
    tookOver_.insert(pod.id);
  }
  if (!removal.removed.empty())
    spdlog::info("istio takeover: {}: Istio's in-pod rules removed ({}); sluice redirects it", who(pod),
                 joined(removal.removed));
  return joined(removal.waiting);
}

bool IstioSwitch::tookOver(const std::string& id) const {
  std::lock_guard g(mu_);
  return tookOver_.count(id) > 0;
}

void IstioSwitch::afterAdd(const PodInfo& pod) {
  if (mode_ != IstioSwitchMode::Takeover) return;
  {
    std::lock_guard g(mu_);
    if (nodeDone_ || clean_.count(key(pod))) return;  // nobody puts Istio's rules in a new pod any more
  }
  std::string left = takeOverPod(pod);
  std::lock_guard g(mu_);
  if (left.empty()) {
    clean_.insert(key(pod));
    waiting_.erase(pod.id);
  } else {
    waiting_[pod.id] = left;
  }
}

void IstioSwitch::handBackPods(const Registry& registry) {
  std::map<std::string, std::string> waiting;
  for (const auto& pod : registry.list()) {
    auto rules = rulesOf(pod);
    if (!rules.ok()) {
      waiting[pod.id] = "cannot read its netns: " + rules.error().message;
      continue;
    }
    if (!rules->any()) {
      waiting[pod.id] = "Istio's node agent has not put its rules back yet; sluice keeps redirecting it";
      continue;
    }
    if (Status st = registry.handBack(pod.id); !st.ok()) {
      waiting[pod.id] = "removing sluice's redirection failed: " + st.error().message;
      continue;
    }
    spdlog::info("istio hand-back: {}: Istio's node agent redirects it again ({}); sluice's redirection removed",
                 who(pod), rules->describe());
  }
  std::string node;
  if (waiting.empty() && !cniConfDir_.empty()) {
    auto changed = istio::removeCniEntries(cniConfDir_, "sluice-cni", "istio-cni");
    if (!changed.ok())
      node = "sluice-cni stays in the CNI chain: " + changed.error().message;
    else
      for (const auto& f : *changed) spdlog::info("istio hand-back: sluice-cni removed from {}", f);
  }
  std::lock_guard g(mu_);
  for (const auto& [id, why] : waiting)
    if (waiting_[id] != why) spdlog::info("istio hand-back: {}: {}", id, why);
  waiting_ = std::move(waiting);
  node_ = node;
  nodeDone_ = waiting_.empty() && node.empty();
}

void IstioSwitch::takeOverNode(const std::vector<PodInfo>& pods, bool otherAgentServesZds) {
  std::string node;
  if (otherAgentServesZds) {
    node = "Istio's node agent still serves the ZDS socket; its node state stays until it stops";
  } else {
    std::set<std::string> covered;
    for (const auto& p : pods)
      if (!p.hostIface.empty()) covered.insert(p.ips.begin(), p.ips.end());
    auto r = istio::removeNodeState(covered, cniConfDir_);
    if (!r.ok()) {
      node = "Istio's node state left as it is: " + r.error().message;
    } else {
      for (const auto& x : r->removed) spdlog::info("istio takeover: node: removed {}", x);
      node = joined(r->kept);
    }
  }
  std::lock_guard g(mu_);
  if (node != node_ && !node.empty()) spdlog::info("istio takeover: node: {}", node);
  node_ = node;
  nodeDone_ = node.empty() && waiting_.empty();
}

void IstioSwitch::sweep(const Registry& registry, bool otherAgentServesZds) {
  if (mode_ == IstioSwitchMode::Off) return;
  if (mode_ == IstioSwitchMode::HandBack) return handBackPods(registry);
  const auto pods = registry.list();
  std::set<std::string> todo;
  {
    std::lock_guard g(mu_);
    for (const auto& p : pods)
      if (!clean_.count(key(p))) todo.insert(p.id);
  }
  std::map<std::string, std::string> waiting;
  std::set<std::string> clean;
  for (const auto& p : pods) {
    if (!todo.count(p.id)) continue;
    std::string left = takeOverPod(p);
    if (left.empty())
      clean.insert(key(p));
    else
      waiting[p.id] = left;
  }
  {
    std::lock_guard g(mu_);
    for (const auto& [id, why] : waiting)
      if (waiting_[id] != why) spdlog::info("istio takeover: pod {}: {}", id, why);
    waiting_ = std::move(waiting);
    clean_.insert(clean.begin(), clean.end());
    // Forget pods that left the registry.
    std::set<std::string> live;
    for (const auto& p : pods) live.insert(key(p));
    for (auto it = clean_.begin(); it != clean_.end();) it = live.count(*it) ? std::next(it) : clean_.erase(it);
  }
  takeOverNode(pods, otherAgentServesZds);
}

std::string IstioSwitch::status() const {
  std::lock_guard g(mu_);
  if (mode_ == IstioSwitchMode::Off) return "";
  const char* what = mode_ == IstioSwitchMode::Takeover ? "takeover: " : "hand-back: ";
  if (nodeDone_) return std::string(what) + "done";
  std::vector<std::string> lines;
  for (const auto& [id, why] : waiting_) lines.push_back("pod " + id + ": " + why);
  if (!node_.empty()) lines.push_back("node: " + node_);
  return what + std::to_string(waiting_.size()) + " pod(s) not switched yet; " + joined(lines);
}

}  // namespace sluice::agent
