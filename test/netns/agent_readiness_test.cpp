// sluiced's readiness (issue 30): /readyz answers 200 only once sluice can
// enroll a pod — the host's bpffs, its programs loaded, the Kubernetes
// informers synced, sluice-cni in the CNI chain, the ZDS socket served —
// and names each missing piece (503), as health's not_ready and `sluicectl
// status` do; with --remove-node-taint the agent removes the node's
// readiness taint once ready, from its own node only, that taint only.
//
//   test API server (127.0.0.1, TLS) ◀── list/watch, GET/PATCH node-a ──┐
//   TMP/net.d (the CNI conf dir the agent watches)  ◀── inotify ────────┤
//   TMP/zds.sock ◀── a FakeAgent holds it first, then sluiced ──────────┤
//                                                       sluiced (child, --metrics-address 127.0.0.1:P)
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <thread>

#include "test/common/agent_process.h"
#include "test/common/apiserver.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/common/zds_peers.h"

namespace sluice::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kTaint = "cni.istio.io/not-ready";

json nodeObject(const std::string& name, const json& taints) {
  return {{"metadata", {{"name", name}}}, {"spec", {{"taints", taints}}}};
}

json taint(const std::string& key, const std::string& effect) { return {{"key", key}, {"effect", effect}}; }

/// A primary CNI's conflist (what the runtime reads), without sluice-cni.
void writePrimaryConflist(const std::string& dir) {
  json list = {{"cniVersion", "1.0.0"},
               {"name", "podnet"},
               {"plugins", json::array({{{"type", "bridge"}, {"bridge", "cni0"}, {"ipam", {{"type", "host-local"}}}}})}};
  writeTextFile(dir + "/10-podnet.conflist", list.dump(2));
}

class AgentReadiness : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (BPF)";
    ASSERT_FALSE(tmp_.path().empty());
    ASSERT_EQ(::mkdir(confDir().c_str(), 0755), 0);
    auto s = TestApiServer::start();
    ASSERT_TRUE(s.ok()) << s.error().message;
    server_ = std::move(*s);
    ASSERT_TRUE(server_->createNodeAgentPod().ok());
    port_ = freeLoopbackPort();
    ASSERT_NE(port_, 0);
  }

  void TearDown() override {
    if (agent_ && HasFailure())
      std::cerr << "---- agent log ----\n" << agent_->log() << "\n---- API server log ----\n" << server_->log();
    agent_.reset();
  }

  std::string confDir() const { return tmp_.file("net.d"); }
  std::string zdsPath() const { return tmp_.file("zds.sock"); }

  std::vector<std::string> kubeArgs() const {
    return {"--kube-api", server_->url(), "--kube-token-file", server_->tokenFile(), "--kube-ca-file", server_->caFile(),
            "--node-name", "node-a"};
  }

  void startAgent(std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--metrics-address", "127.0.0.1:" + std::to_string(port_)});
    auto a = AgentProcess::start(bpffs_.root(), extra, tmp_.file("agent.sock"));
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  /// /readyz: the status line's code and the body.
  std::pair<int, std::string> readyz() {
    std::string r = httpGetLoopback(port_, "/readyz");
    int code = r.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(r.c_str() + 9) : 0;
    auto body = r.find("\r\n\r\n");
    return {code, body == std::string::npos ? "" : r.substr(body + 4)};
  }

  /// The items of /readyz's body ("- item" lines).
  std::vector<std::string> readyzItems() {
    std::vector<std::string> items;
    std::string body = readyz().second;
    size_t at = 0;
    while ((at = body.find("\n- ", at)) != std::string::npos) {
      at += 3;
      items.push_back(body.substr(at, body.find('\n', at) - at));
    }
    return items;
  }

  /// Whether exactly these pieces (by their prefix) are missing.
  bool missingExactly(const std::vector<std::string>& prefixes) {
    auto items = readyzItems();
    if (items.size() != prefixes.size()) return false;
    for (size_t i = 0; i < items.size(); i++)
      if (items[i].rfind(prefixes[i] + ": ", 0) != 0) return false;
    return true;
  }

  std::unique_ptr<TestApiServer> server_;
  TestBpffs bpffs_;
  TempDir tmp_{"ready"};
  std::unique_ptr<AgentProcess> agent_;
  uint16_t port_ = 0;
};

// Every missing piece named, in /readyz, in health and in `sluicectl status
// --json`, each gone once it is in place, and then 200; /healthz (liveness)
// is 200 throughout.
TEST_F(AgentReadiness, EachMissingPieceIsNamedUntilReady) {
  // Another node agent serves the ZDS socket; the API server is down; the
  // CNI conf dir has no config yet.
  auto other = std::make_unique<FakeAgent>(zdsPath());
  ASSERT_TRUE(other->ok());
  ASSERT_TRUE(server_->fault({{"down", true}}).ok());
  std::vector<std::string> args = kubeArgs();
  args.insert(args.end(), {"--cni-conf-dir", confDir(), "--ztunnel-socket", zdsPath(), "--ztunnel-socket-takeover"});
  ASSERT_NO_FATAL_FAILURE(startAgent(args));

  auto [code, body] = readyz();
  EXPECT_EQ(code, 503) << body;
  EXPECT_EQ(body.rfind("not ready:\n", 0), 0u) << body;
  EXPECT_TRUE(missingExactly({"kubernetes", "cni", "zds"})) << body;
  EXPECT_NE(body.find("no CNI network configuration in " + confDir()), std::string::npos) << body;
  EXPECT_NE(httpGetLoopback(port_, "/healthz").find("200 OK"), std::string::npos) << "alive, only not ready";

  // The same list in health and in sluicectl status (text and JSON).
  auto c = agent_->client();
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto h = c->health();
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_TRUE(h->notReady.has_value());
  std::vector<std::string> items = readyzItems();
  EXPECT_EQ(*h->notReady, items);
  auto st = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", agent_->socket(), "status",
                        "--json", "--cni-conf-dir", confDir()});
  auto j = json::parse(st.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << st.describe();
  EXPECT_EQ(j["agent"]["ready"], false) << j["agent"];
  EXPECT_EQ(j["agent"]["not_ready"], json(items)) << j["agent"];
  st = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", agent_->socket(), "status",
                   "--cni-conf-dir", confDir()});
  EXPECT_NE(st.out.find("ready              NO (/readyz answers 503): kubernetes: "), std::string::npos) << st.out;

  // The API server back: the informers sync.
  ASSERT_TRUE(server_->fault({{"up", true}}).ok());
  EXPECT_TRUE(eventually([&] { return missingExactly({"cni", "zds"}); }, 30s)) << readyz().second;

  // The primary CNI writes its conflist: the agent's watch appends
  // sluice-cni, and the chain has it.
  writePrimaryConflist(confDir());
  EXPECT_TRUE(eventually([&] { return missingExactly({"zds"}); }, 10s)) << readyz().second;
  EXPECT_NE(readyz().second.find("zds: "), std::string::npos);

  // The other node agent stops: sluiced serves the socket, and is ready.
  other.reset();
  EXPECT_TRUE(eventually([&] { return readyz().first == 200; }, 10s)) << readyz().second;
  EXPECT_EQ(readyz().second, "ready\n");
  h = c->health();
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_TRUE(h->notReady.has_value());
  EXPECT_TRUE(h->notReady->empty());
  st = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", agent_->socket(), "status",
                   "--json", "--cni-conf-dir", confDir()});
  j = json::parse(st.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << st.describe();
  EXPECT_EQ(j["agent"]["ready"], true) << j["agent"];
  EXPECT_EQ(j["agent"]["not_ready"], json::array()) << j["agent"];

  // The chain the runtime reads has sluice-cni last.
  auto conf = json::parse(readTextFile(confDir() + "/10-podnet.conflist"));
  ASSERT_EQ(conf["plugins"].size(), 2u) << conf;
  EXPECT_EQ(conf["plugins"][1]["type"], "sluice-cni");
}

// The chain is judged in the layout the agent was given. Unchained (Multus,
// OpenShift): the runtime's first config is Multus's own, without
// sluice-cni, and the agent is ready once its standalone config is there.
// An owned conflist that another file sorts before: the runtime would use
// that file, so not ready, saying which.
TEST_F(AgentReadiness, TheChainIsJudgedInTheLayoutGiven) {
  json multus = {{"cniVersion", "1.0.0"}, {"name", "multus-cni-network"}, {"type", "multus"}};
  writeTextFile(confDir() + "/00-multus.conf", multus.dump(2));
  ASSERT_NO_FATAL_FAILURE(startAgent({"--kube", "off", "--cni-conf-dir", confDir(), "--cni-unchained"}));
  EXPECT_TRUE(eventually([&] { return readyz().first == 200; }, 10s)) << readyz().second;
  auto conf = json::parse(readTextFile(confDir() + "/sluice-cni.conf"), nullptr, false);
  EXPECT_EQ(conf.value("type", ""), "sluice-cni") << conf;
  EXPECT_EQ(json::parse(readTextFile(confDir() + "/00-multus.conf")), multus) << "Multus's own config was changed";
  agent_.reset();

  ASSERT_EQ(::unlink((confDir() + "/00-multus.conf").c_str()), 0);
  ASSERT_EQ(::unlink((confDir() + "/sluice-cni.conf").c_str()), 0);
  writePrimaryConflist(confDir());
  writeTextFile(confDir() + "/01-early.conflist", readTextFile(confDir() + "/10-podnet.conflist"));
  ASSERT_NO_FATAL_FAILURE(startAgent({"--kube", "off", "--cni-conf-dir", confDir(), "--cni-owned-conflist"}));
  EXPECT_TRUE(eventually([&] { return missingExactly({"cni"}); }, 10s)) << readyz().second;
  EXPECT_NE(readyz().second.find("01-early.conflist sorts before the owned conflist 02-sluice-cni.conflist"),
            std::string::npos)
      << readyz().second;
  // The early file goes: the owned conflist sorts first and holds sluice-cni.
  ASSERT_EQ(::unlink((confDir() + "/01-early.conflist").c_str()), 0);
  EXPECT_TRUE(eventually([&] { return readyz().first == 200; }, 10s)) << readyz().second;
}

// A bpffs private to the agent's mount namespace (only with
// --allow-private-bpffs): never ready, whatever else is in place.
TEST_F(AgentReadiness, PrivateBpffsIsNeverReady) {
  // A mount namespace of its own with a bpffs of its own (its pins go
  // with the namespace).
  const std::string mountPoint = tmp_.file("bpffs");
  ASSERT_EQ(::mkdir(mountPoint.c_str(), 0700), 0);
  std::vector<std::string> wrapper = {"/usr/bin/unshare", "--mount", "--propagation", "private", "sh", "-c",
                                      "mount -t bpf bpf \"$0\" && exec \"$@\"", mountPoint};
  auto a = AgentProcess::start(mountPoint + "/sluice",
                               {"--allow-private-bpffs", "--kube", "off", "--metrics-address",
                                "127.0.0.1:" + std::to_string(port_)},
                               tmp_.file("agent.sock"), "", "", wrapper);
  ASSERT_TRUE(a.ok()) << a.error().message;
  agent_ = std::move(*a);
  auto [code, body] = readyz();
  EXPECT_EQ(code, 503) << body;
  EXPECT_TRUE(missingExactly({"bpffs"})) << body;
  EXPECT_NE(body.find("is private to the agent's mount namespace"), std::string::npos) << body;
}

// --remove-node-taint: nothing is asked of the Node while the agent is not
// ready; once ready, node-a's cni.istio.io/not-ready goes — one JSON patch
// that tests the taints it read — its other taint stays, node-b is not
// touched.
TEST_F(AgentReadiness, NodeTaintRemovedOnceReadyFromItsOwnNodeOnly) {
  ASSERT_TRUE(server_
                  ->apply(json::array(
                      {{{"op", "create"}, {"kind", "nodes"},
                        {"object", nodeObject("node-a", json::array({taint(kTaint, "NoSchedule"),
                                                                     taint("example.com/other", "NoExecute")}))}},
                       {{"op", "create"}, {"kind", "nodes"},
                        {"object", nodeObject("node-b", json::array({taint(kTaint, "NoSchedule")}))}}}))
                  .ok());
  std::vector<std::string> args = kubeArgs();
  args.insert(args.end(), {"--cni-conf-dir", confDir(), "--remove-node-taint"});
  ASSERT_NO_FATAL_FAILURE(startAgent(args));

  // Synced, but no conflist: not ready. The agent looks every 500 ms; three
  // looks later it has still not asked for the node.
  EXPECT_TRUE(eventually([&] { return missingExactly({"cni"}); }, 30s)) << readyz().second;
  std::this_thread::sleep_for(1500ms);
  auto nodeRequests = server_->countRequests("get", "/api/v1/nodes");
  ASSERT_TRUE(nodeRequests.ok());
  EXPECT_EQ(*nodeRequests, 0) << "the node was read before the agent was ready";
  auto patches = server_->countRequests("patch", "/api/v1/nodes");
  ASSERT_TRUE(patches.ok());
  EXPECT_EQ(*patches, 0);
  auto a = server_->object("nodes", "", "node-a");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((**a)["spec"]["taints"].size(), 2u) << **a;

  // Ready: the taint goes.
  writePrimaryConflist(confDir());
  EXPECT_TRUE(eventually([&] {
    auto n = server_->object("nodes", "", "node-a");
    return n.ok() && n->has_value() && (**n)["spec"]["taints"].size() == 1;
  }, 15s)) << agent_->log();
  EXPECT_EQ(readyz().first, 200);
  a = server_->object("nodes", "", "node-a");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((**a)["spec"]["taints"], json::array({taint("example.com/other", "NoExecute")}));
  auto b = server_->object("nodes", "", "node-b");
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((**b)["spec"]["taints"], json::array({taint(kTaint, "NoSchedule")})) << "another node's taint";
  auto all = server_->patches();
  ASSERT_TRUE(all.ok());
  json nodePatches = json::array();
  for (const auto& p : *all)
    if (p.value("kind", "") == "nodes") nodePatches.push_back(p);
  ASSERT_EQ(nodePatches.size(), 1u) << *all;
  EXPECT_EQ(nodePatches[0]["name"], "node-a");
  EXPECT_EQ(nodePatches[0]["contentType"], "application/json-patch+json");
  EXPECT_EQ(nodePatches[0]["patch"][0]["op"], "test") << nodePatches[0];
  EXPECT_EQ(nodePatches[0]["patch"][1]["op"], "replace") << nodePatches[0];
  EXPECT_NE(agent_->log().find("node node-a: removed its taint cni.istio.io/not-ready"), std::string::npos);
}

// The named taint only: with --node-taint-key, cni.istio.io/not-ready is
// another taint and stays.
TEST_F(AgentReadiness, OnlyTheNamedTaintIsRemoved) {
  ASSERT_TRUE(server_
                  ->apply(json::array({{{"op", "create"}, {"kind", "nodes"},
                                        {"object", nodeObject("node-a", json::array({taint(kTaint, "NoSchedule"),
                                                                                     taint("example.com/mesh-not-ready",
                                                                                           "NoSchedule")}))}}}))
                  .ok());
  std::vector<std::string> args = kubeArgs();
  args.insert(args.end(), {"--remove-node-taint", "--node-taint-key", "example.com/mesh-not-ready"});
  ASSERT_NO_FATAL_FAILURE(startAgent(args));
  EXPECT_TRUE(eventually([&] {
    auto n = server_->object("nodes", "", "node-a");
    return n.ok() && n->has_value() && (**n)["spec"]["taints"].size() == 1;
  }, 30s)) << agent_->log();
  auto a = server_->object("nodes", "", "node-a");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((**a)["spec"]["taints"], json::array({taint(kTaint, "NoSchedule")}));
}

}  // namespace
}  // namespace sluice::test
