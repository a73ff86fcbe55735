// sluiced's side of a live switch between Istio's node agent and sluice on
// one node (deploy/README.md, "Switching a node from Istio's node agent").
//
// Takeover (--istio-takeover): a pod is enrolled as any other (sluice's
// redirection first: the kube controller enrolls the running ambient pods,
// with their uids, so ZDS's snapshot keeps ztunnel's proxies); right after,
// and in every sweep until done, Istio's in-pod rules leave its netns
// (istio/takeover.h: what redirects first, the connmark restore once the
// connections that need it closed). The node side goes once Istio's agent
// no longer serves the ZDS socket (it would add more): its probe SNAT and
// sets when every address in them is an enrolled pod's, istio-cni from a
// chain that has sluice-cni.
//
// Hand-back (--istio-hand-back): Istio's node agent has come back and put
// its rules into the pods again; in every sweep each enrolled pod that
// carries them loses sluice's redirection (its return path, shared with
// Istio's rules, stays; no DelWorkload: ztunnel is Istio's agent's again);
// a pod without them yet keeps sluice's. With no pod left, sluice-cni
// leaves every chain that has istio-cni.
//
// Off (neither): a running pod carrying Istio's rules is not enrolled (two
// redirections at once), with one line saying so.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "base/pod_types.h"
#include "base/result.h"

namespace sluice::agent {

enum class IstioSwitchMode { Off, Takeover, HandBack };

class IstioSwitch {
 public:
  IstioSwitch(IstioSwitchMode mode, std::string cniConfDir) : mode_(mode), cniConfDir_(std::move(cniConfDir)) {}

  IstioSwitchMode mode() const { return mode_; }

  /// Off: an error when @p netnsPath carries Istio's in-pod rules (the
  /// controller's enrollment of a running pod); nothing otherwise.
  Status admitRunning(const std::string& netnsPath, const std::string& who) const;

  /// Takeover: Istio's in-pod rules out of @p pod's netns, now that
  /// sluice's redirection is in place (after each add). Logs what it did.
  void afterAdd(const PodInfo& pod);

  /// Whether pod @p id carried Istio's rules when sluice enrolled it (so
  /// Istio's node agent had handed it to ztunnel).
  bool tookOver(const std::string& id) const;

  /// What the sweep may do to the registry.
  struct Registry {
    std::function<std::vector<PodInfo>()> list;
    /// Hand-back: removes a pod, leaving its return path.
    std::function<Status(const std::string& id)> handBack;
  };
  /// The sweep's part (outside the datapath lock): pods not yet switched,
  /// then the node. @p otherAgentServesZds: Istio's node agent still serves
  /// the ZDS socket.
  void sweep(const Registry& registry, bool otherAgentServesZds);

  /// For health: "" (off), "takeover: …", "hand-back: …".
  std::string status() const;

 private:
  /// Takeover of one pod, in its netns: "" when nothing of Istio's is left.
  /// Records in tookOver_ a pod that had Istio's rules.
  std::string takeOverPod(const PodInfo& pod);
  void handBackPods(const Registry& registry);
  void takeOverNode(const std::vector<PodInfo>& pods, bool otherAgentServesZds);

  const IstioSwitchMode mode_;
  const std::string cniConfDir_;
  mutable std::mutex mu_;
  std::set<std::string> clean_;                 ///< "id/cookie" of pods with nothing of Istio's left
  std::set<std::string> tookOver_;              ///< ids of pods that carried Istio's rules
  std::map<std::string, std::string> waiting_;  ///< pod id → what is left and why
  std::string node_ = "not looked at yet";      ///< the node's part, one line
  bool nodeDone_ = false;
};

}  // namespace sluice::agent
