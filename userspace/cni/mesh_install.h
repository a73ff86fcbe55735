// What `sluice-cni install` adds for the plugin to judge pods itself when
// the agent cannot be reached (mesh_check.h): the Kubernetes credentials
// (a kubeconfig from the pod's service account, mode 0600) and the rules
// the agent was given, as keys of the plugin's conflist entry.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "userspace/cni/kubeconfig.h"

namespace sluice::cni {

struct MeshInstallOptions {
  /// --kubeconfig PATH: write the credentials there (a path that is the
  /// same on the node and in the container); "" writes none.
  std::string kubeconfig;
  /// --service-account-dir DIR: token and ca.crt.
  std::string serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";
  /// --exclude-namespaces NS[,NS...] (the agent's flag of the same name).
  std::optional<std::string> excludeNamespaces;
  /// --ambient-enablement-selector TEXT, else $AMBIENT_ENABLEMENT_SELECTOR.
  std::optional<std::string> selectors;
};

/// Consumes args[i] (and its value, advancing @p i) when it is one of the
/// flags above; false when it is not. Errors (EINVAL) name the flag.
Result<bool> parseMeshInstallFlag(MeshInstallOptions& o, const std::vector<std::string>& args, size_t& i);

/// What install adds: the kubeconfig to write (when asked; mode 0600) and
/// the keys for the plugin's entry: "kubeconfig", and "excludeNamespaces"
/// / "enablementSelectors" when they differ from the defaults.
struct MeshInstallPlan {
  nlohmann::ordered_json keys = nlohmann::ordered_json::object();
  std::string kubeconfigPath;  ///< "" when none is written
  std::string kubeconfigText;
  std::string server;  ///< the API the kubeconfig names
};
Result<MeshInstallPlan> planMeshInstall(const MeshInstallOptions& o, const EnvGet& env);

}  // namespace sluice::cni
