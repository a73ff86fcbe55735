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
    c.excludeNamespacesSet = true;
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
    c.selectorsSet = true;
  }
  return c;
}

Result<MeshConfig> withKubeconfigRules(const MeshConfig& config, const ordered_json& extension) {
  if (extension.is_null()) return config;
  if (!extension.is_object()) return Error::msg("its " + std::string(kMeshExtension) + " extension is not an object", EINVAL);
  auto rules = parseMeshConfig(extension);
  if (!rules.ok()) return Error::msg("its " + std::string(kMeshExtension) + " extension: " + rules.error().message, EINVAL);
  MeshConfig c = config;
  if (!c.excludeNamespacesSet && rules->excludeNamespacesSet) c.excludeNamespaces = rules->excludeNamespaces;
  if (!c.selectorsSet && rules->selectorsSet) c.selectors = rules->selectors;
  return c;
}

Result<MeshAnswer> judgeWithoutAgent(const PodName& pod, const MeshConfig& entry) {
  const std::string file = entry.kubeconfig.empty() ? kDefaultKubeconfig : entry.kubeconfig;
  // A local file: the rules install wrote beside the credentials, for the
  // keys the entry does not set (the agent puts the entry back without them).
  auto creds = loadKubeconfig(file);
  MeshConfig config = entry;
  if (creds.ok()) {
    auto merged = withKubeconfigRules(entry, creds->meshRules);
    if (!merged.ok()) return Error::msg(file + ": " + merged.error().message, EINVAL);
    config = std::move(*merged);
  }
  if (config.excludeNamespaces.count(pod.ns)) return MeshAnswer{false, "namespace " + pod.ns + " is excluded"};
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
