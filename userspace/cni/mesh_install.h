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

/// Writes the kubeconfig (when asked) and returns the keys for the
/// plugin's entry: "kubeconfig", and "excludeNamespaces" /
/// "enablementSelectors" when they differ from the defaults. @p done gets
/// one line per file written.
Result<nlohmann::ordered_json> installMesh(const MeshInstallOptions& o, const EnvGet& env, std::vector<std::string>& done);

}  // namespace sluice::cni
