#include "userspace/cni/mesh_install.h"

#include <sstream>

#include "userspace/cni/mesh_check.h"
#include "userspace/mesh/selectors.h"

namespace sluice::cni {

using nlohmann::ordered_json;

Result<bool> parseMeshInstallFlag(MeshInstallOptions& o, const std::vector<std::string>& args, size_t& i) {
  const std::string& a = args[i];
  if (a != "--kubeconfig" && a != "--service-account-dir" && a != "--exclude-namespaces" &&
      a != "--ambient-enablement-selector")
    return false;
  if (i + 1 >= args.size()) return Error::msg(a + " needs a value", EINVAL);
  const std::string& v = args[++i];
  if (a == "--kubeconfig" || a == "--service-account-dir") {
    if (v.empty() || v.front() != '/') return Error::msg(a + " must be an absolute path", EINVAL);
    (a == "--kubeconfig" ? o.kubeconfig : o.serviceAccountDir) = v;
  } else if (a == "--exclude-namespaces") {
    o.excludeNamespaces = v;
  } else {
    o.selectors = v;
  }
  return true;
}

Result<MeshInstallPlan> planMeshInstall(const MeshInstallOptions& o, const EnvGet& env) {
  MeshInstallPlan plan;
  ordered_json& keys = plan.keys;
  MeshConfig defaults;
  if (o.excludeNamespaces) {
    ordered_json list = ordered_json::array();
    std::stringstream ss(*o.excludeNamespaces);
    std::string ns;
    while (std::getline(ss, ns, ','))
      if (!kube::isDnsLabel(ns))
        return Error::msg("invalid --exclude-namespaces '" + *o.excludeNamespaces + "': '" + ns + "' is not a namespace name",
                          EINVAL);
      else
        list.push_back(ns);
    if (list != ordered_json(defaults.excludeNamespaces)) keys["excludeNamespaces"] = list;
  }
  std::optional<std::string> text = o.selectors ? o.selectors : env("AMBIENT_ENABLEMENT_SELECTOR");
  if (text) {
    auto sel = kube::parseEnablementSelectorsText(*text);
    if (!sel.ok())
      return Error::msg(std::string("invalid ") + (o.selectors ? "--ambient-enablement-selector" : "AMBIENT_ENABLEMENT_SELECTOR") +
                            ": " + sel.error().message,
                        EINVAL);
    if (!sel->isDefault()) keys["enablementSelectors"] = ordered_json::parse(sel->toJson().dump());
  }
  if (!o.kubeconfig.empty()) {
    auto creds = serviceAccountCredentials(o.serviceAccountDir, env);
    if (!creds.ok()) return Error::msg("--kubeconfig: " + creds.error().message, creds.error().code);
    // The rules beside the credentials too, defaults included: they outlive
    // an entry the agent puts back without them.
    creds->meshRules = ordered_json{{"excludeNamespaces", keys.value("excludeNamespaces", ordered_json(defaults.excludeNamespaces))},
                                    {"enablementSelectors", keys.value("enablementSelectors",
                                                                       ordered_json::parse(defaults.selectors.toJson().dump()))}};
    plan.kubeconfigPath = o.kubeconfig;
    plan.kubeconfigText = kubeconfigText(*creds);
    plan.server = creds->server;
    keys["kubeconfig"] = o.kubeconfig;
  }
  return plan;
}

}  // namespace sluice::cni
