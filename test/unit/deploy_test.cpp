// deploy/: the DaemonSet manifest has what sluiced and the CNI install step
// need on a node (parsed with Debian's python3-yaml, checked here), and the
// Dockerfile builds and ships the binaries the manifest runs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using nlohmann::json;

const std::string kDeployDir = std::string(SLUICE_SOURCE_DIR) + "/deploy";

/// Every YAML document of @p path as JSON (python3 -c with yaml.safe_load_all).
json loadYaml(const std::string& path) {
  auto r = runCommand({"/usr/bin/python3", "-c",
                       "import json, sys, yaml\n"
                       "json.dump(list(yaml.safe_load_all(open(sys.argv[1]))), sys.stdout)\n",
                       path});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return json::parse(r.out, nullptr, false);
}

class DeployManifest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/python3 with python3-yaml";
    docs_ = loadYaml(kDeployDir + "/daemonset.yaml");
    ASSERT_TRUE(docs_.is_array()) << "daemonset.yaml did not parse";
    for (const auto& d : docs_) {
      ASSERT_TRUE(d.is_object() && d.contains("kind")) << d;
      if (d["kind"] == "DaemonSet") ds_ = d;
    }
    ASSERT_TRUE(ds_.is_object()) << "no DaemonSet in daemonset.yaml";
    pod_ = ds_["spec"]["template"]["spec"];
  }

  const json& container(const std::string& listKey, const std::string& name) const {
    static const json none;
    for (const auto& c : pod_[listKey])
      if (c["name"] == name) return c;
    ADD_FAILURE() << "no " << listKey << " entry named " << name;
    return none;
  }

  /// hostPath of the volume mounted at @p mountPath in container @p c.
  std::string hostPathAt(const json& c, const std::string& mountPath, std::string* propagation = nullptr) const {
    for (const auto& m : c["volumeMounts"]) {
      if (m["mountPath"] != mountPath) continue;
      if (propagation) *propagation = m.value("mountPropagation", "");
      for (const auto& v : pod_["volumes"])
        if (v["name"] == m["name"] && v.contains("hostPath")) return v["hostPath"]["path"];
    }
    return "";
  }

  json docs_;
  json ds_;
  json pod_;
};

TEST_F(DeployManifest, NamespaceServiceAccountAndDaemonSet) {
  std::map<std::string, std::string> kinds;
  for (const auto& d : docs_) kinds[d["kind"]] = d["metadata"]["name"];
  EXPECT_EQ(kinds["Namespace"], "sluice-system");
  EXPECT_EQ(kinds["ServiceAccount"], "sluice");
  EXPECT_EQ(ds_["apiVersion"], "apps/v1");
  EXPECT_EQ(ds_["metadata"]["namespace"], "sluice-system");
  EXPECT_EQ(pod_["serviceAccountName"], "sluice");
  // The selector must match the template's labels or the API refuses it.
  for (const auto& [k, v] : ds_["spec"]["selector"]["matchLabels"].items())
    EXPECT_EQ(ds_["spec"]["template"]["metadata"]["labels"][k], v) << k;
}

TEST_F(DeployManifest, PrivilegedOnTheHostNetwork) {
  EXPECT_EQ(pod_["hostNetwork"], true);
  EXPECT_EQ(pod_["hostPID"], true) << "/proc/PID/ns/net netns paths resolve through the host PID namespace";
  EXPECT_EQ(pod_["dnsPolicy"], "ClusterFirstWithHostNet");
  const auto& agent = container("containers", "sluiced");
  EXPECT_EQ(agent["securityContext"]["privileged"], true);
  bool tolerateAll = false;
  for (const auto& t : pod_["tolerations"]) tolerateAll |= t == json{{"operator", "Exists"}};
  EXPECT_TRUE(tolerateAll) << "must run on every node, tainted or not";
}

TEST_F(DeployManifest, AgentImageArgsAndReadiness) {
  const auto& agent = container("containers", "sluiced");
  const std::string image = agent["image"];
  EXPECT_EQ(image, "sluice/sluice:0.1.0");
  EXPECT_EQ(agent["command"], json({"/usr/local/bin/sluiced"}));
  std::vector<std::string> args = agent["args"];
  auto flag = [&](const std::string& f) -> std::string {
    auto it = std::find(args.begin(), args.end(), f);
    return it == args.end() || it + 1 == args.end() ? "<missing>" : *(it + 1);
  };
  EXPECT_EQ(flag("--bpffs"), "/sys/fs/bpf/sluice");
  EXPECT_EQ(flag("--socket"), "/var/run/sluice/agent.sock");
  EXPECT_EQ(flag("--log-format"), "json");
  EXPECT_EQ(flag("--metrics-address"), "127.0.0.1:9464");
  // A live node of Istio's is taken over, never shared.
  EXPECT_NE(std::find(args.begin(), args.end(), "--istio-takeover"), args.end());
  // Ready: sluice can enroll (/readyz); alive: not wedged (/healthz).
  for (const auto& [probe, path] : {std::pair{"readinessProbe", "/readyz"}, std::pair{"livenessProbe", "/healthz"}}) {
    const auto& get = agent[probe]["httpGet"];
    EXPECT_EQ(get["host"], "127.0.0.1") << probe;
    EXPECT_EQ(get["port"], 9464) << probe;
    EXPECT_EQ(get["path"], path) << probe;
  }
  // On SIGTERM the agent asks about its own DaemonSet, in its own namespace.
  EXPECT_EQ(flag("--daemonset"), ds_["metadata"]["name"]);
  EXPECT_EQ(flag("--cni-bin-dir"), "/host/opt/cni/bin");
  json podNamespace;
  for (const auto& e : agent["env"])
    if (e["name"] == "POD_NAMESPACE") podNamespace = e;
  EXPECT_EQ(podNamespace["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace") << agent["env"];
  // The flags the manifest passes are ones sluiced knows.
  auto help = runCommand({builtBinary("sluiced"), "--help"});
  ASSERT_EQ(help.exitCode, 0) << help.describe();
  for (const auto& a : args) {
    if (a.rfind("--", 0) == 0) {
      EXPECT_NE(help.out.find(a), std::string::npos) << a << " is not a sluiced flag";
    }
  }
}

TEST_F(DeployManifest, EveryHostPathTheAgentNeeds) {
  const auto& agent = container("containers", "sluiced");
  std::string prop;
  EXPECT_EQ(hostPathAt(agent, "/sys/fs/bpf", &prop), "/sys/fs/bpf");
  EXPECT_EQ(prop, "Bidirectional") << "pins must land in the host's bpffs";
  EXPECT_EQ(hostPathAt(agent, "/var/run/netns", &prop), "/var/run/netns");
  EXPECT_EQ(prop, "HostToContainer") << "netns files created later must show up";
  EXPECT_EQ(hostPathAt(agent, "/var/run/sluice"), "/var/run/sluice") << "sluice-cni on the host connects here";
  EXPECT_EQ(hostPathAt(agent, "/host/opt/cni/bin"), "/opt/cni/bin");
  EXPECT_EQ(hostPathAt(agent, "/host/etc/cni/net.d"), "/etc/cni/net.d");
}

TEST_F(DeployManifest, InitContainerInstallsTheCniPlugin) {
  const auto& init = container("initContainers", "install-cni");
  EXPECT_EQ(init["image"], container("containers", "sluiced")["image"]);
  EXPECT_EQ(init["command"], json({"/usr/local/bin/sluice-cni", "install", "--cni-conf-dir", "/host/etc/cni/net.d",
                                   "--cni-bin-dir", "/host/opt/cni/bin", "--agent-socket",
                                   "/var/run/sluice/agent.sock", "--kubeconfig", "/var/run/sluice/cni-kubeconfig"}));
  EXPECT_EQ(hostPathAt(init, "/host/opt/cni/bin"), "/opt/cni/bin");
  EXPECT_EQ(hostPathAt(init, "/host/etc/cni/net.d"), "/etc/cni/net.d");
  // The socket it writes into the chain is the one the agent serves.
  const auto& agentArgs = container("containers", "sluiced")["args"];
  const auto& initCmd = init["command"];
  auto sock = std::find(initCmd.begin(), initCmd.end(), "--agent-socket");
  ASSERT_TRUE(sock != initCmd.end() && sock + 1 != initCmd.end()) << "the init container names no --agent-socket";
  EXPECT_NE(std::find(agentArgs.begin(), agentArgs.end(), *(sock + 1)), agentArgs.end());
  // The layout flags (--cni-conf-name, --cni-owned-conflist[-name],
  // --cni-unchained) are the same on both: the agent's watch keeps what
  // the init container wrote.
  auto layout = [](const json& argv) {
    std::vector<std::string> out;
    for (size_t i = 0; i < argv.size(); i++) {
      std::string a = argv[i];
      if (a == "--cni-owned-conflist" || a == "--cni-unchained") out.push_back(a);
      if ((a == "--cni-conf-name" || a == "--cni-owned-conflist-name") && i + 1 < argv.size())
        out.push_back(a + "=" + argv[i + 1].get<std::string>());
    }
    return out;
  };
  EXPECT_EQ(layout(init["command"]), layout(agentArgs));
  // Every flag it passes is one `sluice-cni install` knows.
  auto help = runCommand({builtBinary("sluice-cni"), "--help"});
  ASSERT_EQ(help.exitCode, 0) << help.describe();
  for (const auto& a : init["command"])
    if (a.get<std::string>().rfind("--", 0) == 0)
      EXPECT_NE(help.out.find(a.get<std::string>()), std::string::npos) << a << " is not a sluice-cni install flag";
  // The plugin on the host reads the kubeconfig at the path written here.
  EXPECT_EQ(hostPathAt(init, "/var/run/sluice"), "/var/run/sluice");
}

// The agent's Kubernetes client (userspace/agent/kube) needs exactly this
// much of the API, under the DaemonSet's own service account.
TEST_F(DeployManifest, RbacForTheKubernetesClient) {
  json role, binding, account;
  for (const auto& d : docs_) {
    if (d["kind"] == "ClusterRole" && d["metadata"]["name"] == "sluice-node") role = d;
    if (d["kind"] == "ClusterRoleBinding" && d["metadata"]["name"] == "sluice-node") binding = d;
    if (d["kind"] == "ServiceAccount") account = d;
  }
  ASSERT_TRUE(role.is_object()) << "no ClusterRole";
  ASSERT_TRUE(binding.is_object()) << "no ClusterRoleBinding";
  EXPECT_EQ(role["apiVersion"], "rbac.authorization.k8s.io/v1");
  std::map<std::string, std::set<std::string>> verbs;  // resource -> verbs
  for (const auto& r : role["rules"]) {
    EXPECT_EQ(r["apiGroups"], json::array({""})) << r;
    for (const auto& res : r["resources"])
      for (const auto& v : r["verbs"]) verbs[res].insert(v);
  }
  using S = std::set<std::string>;
  EXPECT_EQ(verbs["pods"], (S{"get", "list", "watch"}));
  EXPECT_EQ(verbs["namespaces"], (S{"get", "list", "watch"}));
  EXPECT_EQ(verbs["pods/status"], S{"patch"});
  EXPECT_EQ(verbs["nodes"], S{"get"}) << "SIGTERM: does the DaemonSet still select this node";
  EXPECT_EQ(verbs.size(), 4u) << "nothing more than that";
  EXPECT_EQ(binding["roleRef"], json({{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"},
                                      {"name", role["metadata"]["name"]}}));
  EXPECT_EQ(binding["subjects"], json::array({{{"kind", "ServiceAccount"}, {"name", pod_["serviceAccountName"]},
                                               {"namespace", ds_["metadata"]["namespace"]}}}));
  EXPECT_EQ(account.value("automountServiceAccountToken", true), true);
  EXPECT_EQ(pod_.value("automountServiceAccountToken", true), true) << "the in-cluster configuration reads the token";
}

// Beyond the client's reads: the node's readiness taint (--remove-node-taint:
// get and patch of nodes) and the agent's own DaemonSet on SIGTERM (get of
// that one object), each bound to the DaemonSet's service account.
TEST_F(DeployManifest, RbacForTheTaintAndTheUninstall) {
  std::map<std::string, json> byName;  // kind/name -> object
  for (const auto& d : docs_) byName[d["kind"].get<std::string>() + "/" + d["metadata"]["name"].get<std::string>()] = d;
  const json& untaint = byName["ClusterRole/sluice-node-untaint"];
  ASSERT_TRUE(untaint.is_object()) << "no ClusterRole sluice-node-untaint";
  EXPECT_EQ(untaint["rules"], json::parse(R"([{"apiGroups":[""],"resources":["nodes"],"verbs":["get","patch"]}])"));
  const json& ds = byName["Role/sluice-node-daemonset"];
  ASSERT_TRUE(ds.is_object()) << "no Role sluice-node-daemonset";
  EXPECT_EQ(ds["metadata"]["namespace"], ds_["metadata"]["namespace"]);
  EXPECT_EQ(ds["rules"], json::array({{{"apiGroups", {"apps"}}, {"resources", {"daemonsets"}},
                                       {"resourceNames", {ds_["metadata"]["name"]}}, {"verbs", {"get"}}}}));
  const json subjects = json::array({{{"kind", "ServiceAccount"}, {"name", pod_["serviceAccountName"]},
                                      {"namespace", ds_["metadata"]["namespace"]}}});
  EXPECT_EQ(byName["ClusterRoleBinding/sluice-node-untaint"]["subjects"], subjects);
  EXPECT_EQ(byName["ClusterRoleBinding/sluice-node-untaint"]["roleRef"]["name"], "sluice-node-untaint");
  EXPECT_EQ(byName["RoleBinding/sluice-node-daemonset"]["subjects"], subjects);
  EXPECT_EQ(byName["RoleBinding/sluice-node-daemonset"]["roleRef"]["name"], "sluice-node-daemonset");
}

// istiod's untaint controller (pilot/pkg/controllers/untaint/nodeuntainter.go)
// counts a node's CNI agent by this label.
TEST_F(DeployManifest, PodsCarryTheLabelIstiodsUntaintControllerLooksFor) {
  EXPECT_EQ(ds_["spec"]["template"]["metadata"]["labels"]["k8s-app"], "istio-cni-node");
}

TEST_F(DeployManifest, NodeNameFromTheDownwardApi) {
  const auto& agent = container("containers", "sluiced");
  json nodeName;
  for (const auto& e : agent["env"])
    if (e["name"] == "NODE_NAME") nodeName = e;
  ASSERT_TRUE(nodeName.is_object()) << "no NODE_NAME in the agent's env";
  EXPECT_EQ(nodeName["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
}

TEST(DeployDockerfile, MultiStageOnBookwormShippingTheBinaries) {
  const std::string df = readTextFile(kDeployDir + "/Dockerfile");
  ASSERT_FALSE(df.empty());
  EXPECT_NE(df.find("FROM debian:bookworm AS build"), std::string::npos);
  EXPECT_NE(df.find("FROM debian:bookworm-slim"), std::string::npos);
  EXPECT_NE(df.find("libcurl4-openssl-dev"), std::string::npos) << "the Kubernetes client's build dependency";
  for (const char* dev : {"libssl-dev", "libyaml-dev"})
    EXPECT_NE(df.find(dev), std::string::npos) << dev << ": sluice-cni's static HTTPS and the selectors' YAML";
  for (const char* lib : {"libbpf1", "libnl-3-200", "libnl-route-3-200", "libspdlog1.10", "libfmt9", "libcurl4 ", "libyaml-0-2"})
    EXPECT_NE(df.find(lib), std::string::npos) << lib;
  EXPECT_NE(df.find("COPY --from=build /build/sluiced /build/sluice-cni /build/sluicectl /usr/local/bin/"),
            std::string::npos);
}

}  // namespace
}  // namespace sluice::test
