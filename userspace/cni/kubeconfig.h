// The credentials sluice-cni asks the Kubernetes API with when the agent
// cannot be reached: a kubeconfig that `sluice-cni install` writes from the
// service account the DaemonSet mounts (as Istio's install writes one for
// istio-cni: istio/istio cni/pkg/install/kubeconfig.go), in JSON (a
// kubeconfig kubectl reads too), mode 0600.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace sluice::cni {

/// Where install writes the kubeconfig by default, and where the plugin
/// looks when its configuration names none: next to the agent's socket, a
/// directory the DaemonSet mounts at the same path on the node and in its
/// containers.
inline constexpr const char* kDefaultKubeconfig = "/var/run/sluice/cni-kubeconfig";

/// What the plugin needs of a kubeconfig: the API server (https://IP:PORT,
/// no name: a static binary resolves none), the CA that signed it (PEM) and
/// the bearer token.
struct KubeCredentials {
  std::string server;
  std::string caPem;
  std::string token;
  /// The rules install wrote beside the credentials (the kubeconfig's
  /// extension kMeshExtension: excludeNamespaces, enablementSelectors), so
  /// the plugin judges alike even after its conflist entry was put back
  /// without them; null when absent.
  nlohmann::ordered_json meshRules;
};

/// The name of that extension.
inline constexpr const char* kMeshExtension = "sluice-cni.mesh";

/// Reads the current context's cluster and user of a kubeconfig in JSON:
/// server, certificate-authority-data (or certificate-authority, a file),
/// token (or tokenFile). Errors (EINVAL) name @p file and what is missing.
Result<KubeCredentials> parseKubeconfig(const std::string& text, const std::string& file);

/// Reads and parses @p path.
Result<KubeCredentials> loadKubeconfig(const std::string& path);

/// The kubeconfig (JSON) of @p c: one cluster "local", one user
/// "sluice-cni", one context, as Istio's names them; meshRules (when set)
/// as the extension kMeshExtension.
nlohmann::ordered_json kubeconfigJson(const KubeCredentials& c);

/// Reads an environment variable (nullopt when unset).
using EnvGet = std::function<std::optional<std::string>(const char*)>;

/// The credentials of the pod's service account: KUBERNETES_SERVICE_HOST
/// and KUBERNETES_SERVICE_PORT from @p env (an IP: the API's service
/// address), token and ca.crt from @p serviceAccountDir. Errors name what
/// is missing.
Result<KubeCredentials> serviceAccountCredentials(const std::string& serviceAccountDir, const EnvGet& env);

/// The file's text: kubeconfigJson, indented. Install writes it with mode
/// 0600 (it holds the token).
std::string kubeconfigText(const KubeCredentials& c);

}  // namespace sluice::cni
