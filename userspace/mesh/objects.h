// The parts of Kubernetes Pod and Namespace objects the node agent decides
// from, read out of the API's JSON. The informers cache these (not the whole
// objects), so 250 pods cost a few hundred kilobytes at most.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace sluice::kube {

/// A pod as the agent needs it.
struct Pod {
  std::string uid;
  std::string name;
  std::string namespaceName;
  std::string resourceVersion;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::string nodeName;        ///< spec.nodeName
  std::string serviceAccount;  ///< spec.serviceAccountName
  bool hostNetwork = false;    ///< spec.hostNetwork
  std::string phase;           ///< status.phase ("" before the kubelet reports one)
  /// status.podIPs, or status.podIP when podIPs is absent (Istio's
  /// GetPodIPsIfPresent); empty before the kubelet reports an address.
  std::vector<std::string> ips;
  bool terminating = false;  ///< metadata.deletionTimestamp is set

  /// The informer's cache key: the UID (a pod deleted and re-created under
  /// the same name is another pod).
  const std::string& key() const { return uid; }
  /// "namespace/name" for logs and messages.
  std::string fullName() const { return namespaceName + "/" + name; }
  bool operator==(const Pod&) const = default;

  /// Reads a Pod object; errors name the missing field ("pod without
  /// metadata.uid").
  static Result<Pod> fromJson(const nlohmann::json& j);
  /// The object kind, for messages ("pod").
  static constexpr const char* kKind = "pod";
};

/// A namespace as the agent needs it.
struct Namespace {
  std::string name;
  std::string uid;
  std::string resourceVersion;
  std::map<std::string, std::string> labels;

  /// The informer's cache key: the name (namespaces are cluster-scoped).
  const std::string& key() const { return name; }
  bool operator==(const Namespace&) const = default;

  static Result<Namespace> fromJson(const nlohmann::json& j);
  static constexpr const char* kKind = "namespace";
};

/// metadata.resourceVersion of any object ("" when absent).
std::string resourceVersionOf(const nlohmann::json& object);

}  // namespace sluice::kube
