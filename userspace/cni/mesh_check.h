// What sluice-cni does for a pod when the agent cannot be reached: the
// agent's own rules (userspace/mesh/decisions.h), judged by the plugin.
// A pod of an excluded namespace passes without asking anyone; for the
// others the plugin asks the Kubernetes API (GET the pod and its
// namespace) with the credentials `sluice-cni install` wrote, as Istio's
// plugin does (istio/istio cni/pkg/plugin/plugin.go: exclude_namespaces,
// then isAmbientPod). Only a pod in the mesh must wait for the agent; when
// the API cannot be asked, the answer is an error, never a guess.
#pragma once

#include <chrono>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "userspace/mesh/selectors.h"

namespace sluice::cni {

/// The plugin's configuration keys for this (deploy/README.md):
///   kubeconfig           the credentials (default kDefaultKubeconfig)
///   excludeNamespaces    ["kube-system"] by default, as istio-cni's
///   enablementSelectors  Istio's ambient.enablementSelectors (JSON);
///                        default Istio's default
/// ztunnel's own pods are those of istio-system labelled app=ztunnel, as
/// the agent's defaults.
struct MeshConfig {
  std::string kubeconfig;
  std::set<std::string> excludeNamespaces = {"kube-system"};
  kube::EnablementSelectors selectors = kube::EnablementSelectors::istioDefault();
  /// Given by the entry; otherwise the rules install wrote into the
  /// kubeconfig (kMeshExtension) apply, then the defaults.
  bool excludeNamespacesSet = false;
  bool selectorsSet = false;
  /// Each of the two API requests.
  std::chrono::milliseconds timeout{5000};
};

/// Reads the keys above from the plugin's configuration; errors (EINVAL)
/// are one line naming the key.
Result<MeshConfig> parseMeshConfig(const nlohmann::ordered_json& conf);

/// The rules of @p config with those of @p extension (the kubeconfig's
/// kMeshExtension: {excludeNamespaces, enablementSelectors}) where the
/// entry set none. Errors name the extension's bad key.
Result<MeshConfig> withKubeconfigRules(const MeshConfig& config, const nlohmann::ordered_json& extension);

/// The pod as CNI_ARGS name it.
struct PodName {
  std::string ns;
  std::string name;
  std::string uid;  ///< "" when the runtime does not pass it
};

/// The answer for one pod.
struct MeshAnswer {
  bool inMesh = false;
  std::string reason;
};

/// Judges @p pod as the agent would. Errors (the API cannot be asked:
/// no credentials, unreachable, refused, the pod or namespace missing) say
/// why in one line.
Result<MeshAnswer> judgeWithoutAgent(const PodName& pod, const MeshConfig& config);

}  // namespace sluice::cni
