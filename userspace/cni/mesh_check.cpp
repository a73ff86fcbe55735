#include "userspace/cni/mesh_check.h"

#include "userspace/cni/kube_get.h"
#include "userspace/cni/kubeconfig.h"
#include "userspace/mesh/decisions.h"

namespace sluice::cni {

using nlohmann::ordered_json;

Result<MeshConfig> parseMeshConfig(const ordered_json& j) {
  MeshConfig c;
  auto bad = [](const std::string& m) { return Error::msg(m, EINVAL); };
  if (j.contains("kubeconfig")) {
    const auto& k = j["kubeconfig"];
    if (!k.is_string() || k.get<std::string>().empty() || k.get<std::string>().front() != '/')
      return bad("'kubeconfig' must be an absolute path");
    c.kubeconfig = k.get<std::string>();
  }
  if (j.contains("excludeNamespaces")) {
    const auto& e = j["excludeNamespaces"];
    if (!e.is_array()) return bad("'excludeNamespaces' must be an array of namespace names");
    c.excludeNamespaces.clear();
    for (const auto& ns : e) {
      if (!ns.is_string() || !kube::isDnsLabel(ns.get<std::string>()))
        return bad("'excludeNamespaces': " + ns.dump() + " is not a namespace name");
      c.excludeNamespaces.insert(ns.get<std::string>());
    }
  }
  if (j.contains("enablementSelectors")) {
    auto s = kube::parseEnablementSelectors(nlohmann::json::parse(j["enablementSelectors"].dump()));
    if (!s.ok()) return bad("'enablementSelectors': " + s.error().message);
    c.selectors = std::move(*s);
  }
  return c;
}

Result<MeshAnswer> judgeWithoutAgent(const PodName& pod, const MeshConfig& config) {
  if (config.excludeNamespaces.count(pod.ns)) return MeshAnswer{false, "namespace " + pod.ns + " is excluded"};
  const std::string file = config.kubeconfig.empty() ? kDefaultKubeconfig : config.kubeconfig;
  auto creds = loadKubeconfig(file);
  if (!creds.ok()) return Error::msg("no credentials for the Kubernetes API: " + creds.error().message, creds.error().code);
  auto podJson = kubeGetObject(*creds, "/api/v1/namespaces/" + pod.ns + "/pods/" + pod.name, config.timeout);
  SLUICE_TRY(podJson);
  auto nsJson = kubeGetObject(*creds, "/api/v1/namespaces/" + pod.ns, config.timeout);
  SLUICE_TRY(nsJson);
  auto p = kube::Pod::fromJson(*podJson);
  SLUICE_TRY(p);
  auto n = kube::Namespace::fromJson(*nsJson);
  SLUICE_TRY(n);
  if (!pod.uid.empty() && p->uid != pod.uid)
    return Error::msg("the API's pod " + p->fullName() + " has uid " + p->uid + ", not the runtime's " + pod.uid +
                          " (deleted and re-created?)",
                      ESTALE);
  kube::Rules rules;
  rules.excludeNamespaces = config.excludeNamespaces;
  rules.selectors = config.selectors;
  kube::Decision d = kube::decide(*p, n->labels, rules);
  return MeshAnswer{d.enroll, d.reason};
}

}  // namespace sluice::cni
