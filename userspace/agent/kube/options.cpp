#include "userspace/agent/kube/options.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "userspace/mesh/decisions.h"
#include "userspace/mesh/selectors.h"

namespace sluice::agent {

namespace {

using kube::isDnsLabel;
using kube::isDnsSubdomain;
using kube::isLabelKey;
using kube::isLabelValue;

Status absolutePath(const std::string& flag, const std::string& v) {
  if (v.empty() || v[0] != '/') return Error::msg(flag + " needs an absolute path", EINVAL);
  return {};
}

}  // namespace

bool isKubeFlag(const std::string& flag) {
  static const char* flags[] = {"--kube",          "--kube-api",          "--kube-token-file",
                                "--kube-ca-file",  "--node-name",         "--ztunnel-namespace",
                                "--ztunnel-label", "--exclude-namespaces", "--dns-capture",
                                "--ambient-enablement-selector"};
  return std::any_of(std::begin(flags), std::end(flags), [&](const char* f) { return flag == f; });
}

Status applyKubeFlag(KubeOptions& o, const std::string& flag, const std::string& v) {
  if (flag == "--kube") {
    if (v == "auto")
      o.mode = KubeMode::Auto;
    else if (v == "off")
      o.mode = KubeMode::Off;
    else
      return Error::msg("invalid --kube '" + v + "' (expected auto or off)", EINVAL);
  } else if (flag == "--kube-api") {
    auto scheme = v.find("://");
    std::string s = scheme == std::string::npos ? "" : v.substr(0, scheme);
    std::string rest = scheme == std::string::npos ? "" : v.substr(scheme + 3);
    if ((s != "https" && s != "http") || rest.empty() || rest.front() == '/' || rest.find_first_of(" \t") != std::string::npos)
      return Error::msg("invalid --kube-api '" + v + "' (expected https://HOST:PORT or http://HOST:PORT)", EINVAL);
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    if (rest.find('/') != std::string::npos)
      return Error::msg("invalid --kube-api '" + v + "' (expected https://HOST:PORT, without a path)", EINVAL);
    o.apiUrl = s + "://" + rest;
  } else if (flag == "--kube-token-file") {
    SLUICE_TRY(absolutePath(flag, v));
    o.tokenFile = v;
  } else if (flag == "--kube-ca-file") {
    SLUICE_TRY(absolutePath(flag, v));
    o.caFile = v;
  } else if (flag == "--node-name") {
    if (!isDnsSubdomain(v))
      return Error::msg("invalid --node-name '" + v + "' (expected a node name: lower-case letters, digits, '-' and '.')",
                        EINVAL);
    o.nodeName = v;
  } else if (flag == "--ztunnel-namespace") {
    if (!isDnsLabel(v))
      return Error::msg("invalid --ztunnel-namespace '" + v + "' (expected a namespace name: lower-case letters, digits and '-')",
                        EINVAL);
    o.ztunnelNamespace = v;
  } else if (flag == "--ztunnel-label") {
    auto eq = v.find('=');
    if (eq == std::string::npos || !isLabelKey(v.substr(0, eq)) || !isLabelValue(v.substr(eq + 1)))
      return Error::msg("invalid --ztunnel-label '" + v + "' (expected KEY=VALUE, e.g. app=ztunnel)", EINVAL);
    o.ztunnelLabelKey = v.substr(0, eq);
    o.ztunnelLabelValue = v.substr(eq + 1);
  } else if (flag == "--exclude-namespaces") {
    std::set<std::string> out;
    std::stringstream ss(v);
    std::string ns;
    while (std::getline(ss, ns, ',')) {
      if (!isDnsLabel(ns))
        return Error::msg("invalid --exclude-namespaces '" + v + "': '" + ns +
                              "' is not a namespace name (expected NS[,NS...], or \"\" for none)",
                          EINVAL);
      out.insert(ns);
    }
    o.excludeNamespaces = std::move(out);
  } else if (flag == "--dns-capture") {
    auto b = kube::parseBool(v);
    if (!b.ok()) return Error::msg("invalid --dns-capture '" + v + "' (expected true or false)", EINVAL);
    o.dnsCaptureDefault = *b;
  } else if (flag == "--ambient-enablement-selector") {
    auto sel = kube::parseEnablementSelectorsText(v);
    if (!sel.ok()) return Error::msg("invalid --ambient-enablement-selector: " + sel.error().message, EINVAL);
    o.selectors = std::move(*sel);
    o.selectorsSet = true;
  } else {
    return Error::msg("unknown option '" + flag + "'", EINVAL);
  }
  return {};
}

std::optional<std::string> processEnv(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

Status resolveKubeOptions(KubeOptions& o, const EnvLookup& env) {
  // Istio's istio-cni reads its selectors from this variable (the chart's
  // ambient.enablementSelectors); the flag wins.
  if (!o.selectorsSet)
    if (auto text = env("AMBIENT_ENABLEMENT_SELECTOR")) {
      auto sel = kube::parseEnablementSelectorsText(*text);
      if (!sel.ok()) return Error::msg("invalid AMBIENT_ENABLEMENT_SELECTOR: " + sel.error().message, EINVAL);
      o.selectors = std::move(*sel);
    }
  if (o.mode == KubeMode::Off) {
    if (!o.apiUrl.empty()) return Error::msg("--kube off contradicts --kube-api", EINVAL);
    o.inCluster = false;
    return {};
  }
  if (o.apiUrl.empty()) {
    if (!o.tokenFile.empty()) return Error::msg("--kube-token-file needs --kube-api (in a pod the service account's token is read)", EINVAL);
    if (!o.caFile.empty()) return Error::msg("--kube-ca-file needs --kube-api (in a pod the service account's CA is read)", EINVAL);
    auto host = env("KUBERNETES_SERVICE_HOST");
    o.inCluster = host && !host->empty();
  }
  if (!o.enabled()) return {};
  if (o.nodeName.empty()) {
    auto node = env("NODE_NAME");
    if (!node || node->empty())
      return Error::msg(std::string("Kubernetes is configured (") + (o.inCluster ? "in cluster" : "--kube-api") +
                            ") but the node name is unknown: pass --node-name or set NODE_NAME (the downward API's "
                            "spec.nodeName); --kube off turns Kubernetes off",
                        EINVAL);
    if (!isDnsSubdomain(*node)) return Error::msg("invalid NODE_NAME '" + *node + "' (expected a node name)", EINVAL);
    o.nodeName = *node;
  }
  return {};
}

std::string describeKube(const KubeOptions& o) {
  if (!o.enabled()) return o.mode == KubeMode::Off ? "off (--kube off)" : "off (not in a pod, no --kube-api)";
  std::string ex;
  for (const auto& ns : o.excludeNamespaces) ex += (ex.empty() ? "" : ",") + ns;
  return (o.inCluster ? std::string("in cluster") : o.apiUrl) + ", node " + o.nodeName + ", ztunnel " +
         o.ztunnelNamespace + "/" + o.ztunnelLabelKey + "=" + o.ztunnelLabelValue + ", excluded [" + ex +
         "], DNS capture by default " + (o.dnsCaptureDefault ? "on" : "off") + ", enablement selectors " +
         (o.selectors.isDefault() ? std::string("Istio's default") : o.selectors.toJson().dump());
}

const char* kubeUsage() {
  return R"(Kubernetes (which pods are in the ambient mesh, as Istio's node agent decides;
docs/kubernetes.md):
  --kube MODE              auto (default): the in-cluster configuration when
                           KUBERNETES_SERVICE_HOST is set, or --kube-api;
                           off: no Kubernetes, every pod asked for is enrolled
  --kube-api URL           the API server (https://HOST:PORT) instead of the
                           in-cluster configuration
  --kube-token-file F      bearer token file for --kube-api (re-read when it changes)
  --kube-ca-file F         CA bundle for --kube-api (default: the system's)
  --node-name NAME         this node (default $NODE_NAME)
  --ztunnel-namespace NS   ztunnel's namespace, never enrolled (default istio-system)
  --ztunnel-label K=V      ztunnel's pod label there (default app=ztunnel)
  --exclude-namespaces L   comma-separated namespaces never enrolled
                           (default kube-system; "" for none)
  --dns-capture BOOL       DNS capture of pods without the
                           ambient.istio.io/dns-capture annotation (default true)
  --ambient-enablement-selector YAML
                           which pods are in the mesh: Istio's
                           ambient.enablementSelectors (a list of
                           {podSelector, namespaceSelector}; YAML or JSON);
                           default $AMBIENT_ENABLEMENT_SELECTOR, else Istio's
                           default (pod or namespace labelled
                           istio.io/dataplane-mode=ambient); one that does not
                           parse stops the agent
)";
}

}  // namespace sluice::agent
