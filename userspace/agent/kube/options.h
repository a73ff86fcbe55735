// sluiced's Kubernetes options: where the API is (in-cluster, explicit, or
// off), the node, and the knobs of Istio's rules that istio-cni exposes.
// Pure and unit-tested; the agent wires them in through kube/wiring.h.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>

#include "base/result.h"
#include "userspace/mesh/selectors.h"

namespace sluice::agent {

/// --kube: auto uses the in-cluster configuration when the agent runs in a
/// pod (KUBERNETES_SERVICE_HOST set) or --kube-api when given; off never
/// talks to Kubernetes (the agent enrolls every pod it is asked to).
enum class KubeMode { Auto, Off };

struct KubeOptions {
  KubeMode mode = KubeMode::Auto;
  /// --kube-api URL --kube-token-file F --kube-ca-file F (explicit, for
  /// tests and out-of-cluster runs).
  std::string apiUrl;
  std::string tokenFile;
  std::string caFile;
  /// --node-name, default $NODE_NAME (the downward API's spec.nodeName).
  std::string nodeName;
  /// ztunnel's own pods: namespace (Istio's system namespace) and label.
  std::string ztunnelNamespace = "istio-system";
  std::string ztunnelLabelKey = "app";
  std::string ztunnelLabelValue = "ztunnel";
  /// Pods in these namespaces are never enrolled (istio-cni's
  /// excludeNamespaces; default kube-system).
  std::set<std::string> excludeNamespaces = {"kube-system"};
  /// DNS capture of pods without a valid ambient.istio.io/dns-capture
  /// annotation (Istio's AMBIENT_DNS_CAPTURE, default true).
  bool dnsCaptureDefault = true;
  /// --ambient-enablement-selector, else $AMBIENT_ENABLEMENT_SELECTOR:
  /// which pods are in the mesh (Istio's default unless set).
  kube::EnablementSelectors selectors = kube::EnablementSelectors::istioDefault();
  bool selectorsSet = false;  ///< given by the flag

  /// Set by resolveKubeOptions: the in-cluster configuration is used.
  bool inCluster = false;
  /// Kubernetes is used (in cluster, or --kube-api).
  bool enabled() const { return inCluster || !apiUrl.empty(); }
};

/// The flags of KubeOptions (each takes a value).
bool isKubeFlag(const std::string& flag);

/// Applies one flag; the error is one line naming the flag and the value.
Status applyKubeFlag(KubeOptions& options, const std::string& flag, const std::string& value);

/// Reads an environment variable (nullopt when unset).
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
/// The process environment.
std::optional<std::string> processEnv(const char* name);

/// After every flag: in-cluster when --kube is auto, no --kube-api and
/// KUBERNETES_SERVICE_HOST is set; the node name from NODE_NAME unless
/// --node-name; and the checks across flags (a token or CA file without
/// --kube-api, --kube off with --kube-api, Kubernetes without a node name).
Status resolveKubeOptions(KubeOptions& options, const EnvLookup& env);

/// "https://10.0.0.1:443 (in cluster), node node-a" or "off", for logs.
std::string describeKube(const KubeOptions& options);

/// The --help text of the Kubernetes flags.
const char* kubeUsage();

}  // namespace sluice::agent
