// A node reboot loses nothing (issue 30): pods enrolled through sluiced —
// the Kubernetes controller against the test API server, the node proxy
// stand-in over ZDS, the real bridge + host-local plugins with sluice-cni
// chained in — then a simulated reboot: the agent and the node proxy killed,
// every pinned object gone (the test's bpffs root), every pod netns gone
// with its processes, the bridge too. Then the node comes back: the agent
// and the node proxy start again; the "runtime" re-creates the sandboxes
// (new netns, new addresses: host-local's reservations survive on disk as
// they do on a node), re-running ADD through the conflist for most of them
// and only the primary's plugins for one (its sandbox was made before
// sluice-cni was back in the chain: the controller must find it by its
// netns). Meanwhile the cluster moved on: one pod left the mesh, one was
// deleted. Every pod still carries `ambient.istio.io/redirection: enabled`
// from before — Istio's #55968 (redirection missing after a reboot),
// #57285 (annotation "enabled" without ztunnel's sockets) and #60882
// (traffic bypassing ztunnel after a reboot without drain) are this story
// going wrong; each has an assertion below.
//
//   test API server ◀──────── list/watch, pods/status ────── sluiced (test netns, --kube-api, --ztunnel-socket)
//   NodeProxyStandIn ◀──────── ZDS (TMP/zds.sock) ─────────────┘     ▲ agent API (TMP/agent.sock)
//                                                                     │
//   node netns "sluice-rbnode-P-N": rbbrN 10.233.N.1/24 ── veth ── pod netns (eth0 10.233.N.x, host-local)
//     TcpServer :PORT (outbound target)   bridge / host-local / sluice-cni run there (nsenter), as a runtime
//                                         process in <cgroup>/kubepods…/pod<uid>/…, app TcpServer :8080
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <thread>

#include "test/common/agent_process.h"
#include "test/common/apiserver.h"
#include "test/common/cgroup_pod.h"
#include "test/common/cni_conf.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/standin/node_proxy.h"
#include "userspace/cni/cni.h"

namespace sluice::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;

const Labels kAmbient{{"istio.io/dataplane-mode", "ambient"}};
constexpr const char* kRedirection = "ambient.istio.io/redirection";
constexpr const char* kSystemCniDir = "/usr/lib/cni";
constexpr uint16_t kAppPort = 8080;

std::atomic<int> gCounter{0};

/// One pod sandbox as the runtime made it.
struct Sandbox {
  std::unique_ptr<TestNetns> netns;
  std::string containerId;
  std::string ip;  ///< eth0's address (host-local's choice)
  std::unique_ptr<TestPodProcess> process;
  std::unique_ptr<TcpServer> app;  ///< in the pod, :8080
};

struct Pod {
  std::string name;
  std::string uid;
  Sandbox sandbox;
};

class NodeReboot : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups, network namespaces, BPF)";
    for (const char* p : {"bridge", "host-local"})
      if (!std::filesystem::exists(std::string(kSystemCniDir) + "/" + p))
        GTEST_SKIP() << kSystemCniDir << "/" << p << " missing: install containernetworking-plugins";
    if (cgroups_.unavailable()) GTEST_SKIP() << cgroups_.error();
    ASSERT_TRUE(cgroups_.ok()) << cgroups_.error();
    ASSERT_TRUE(node_.ok()) << node_.error();
    ASSERT_FALSE(tmp_.path().empty());
    for (const char* d : {"net.d", "bin", "ipam"}) ASSERT_TRUE(std::filesystem::create_directory(tmp_.file(d)));
    n_ = gCounter++ % 250;
    subnetPrefix_ = "10.233." + std::to_string((::getpid() + n_) % 250) + ".";
    bridge_ = "rbbr" + std::to_string(::getpid() % 100000) + "-" + std::to_string(n_);
    auto list = installBridgeConflist({tmp_.file("net.d"), tmp_.file("bin"), "10-test.conflist",
                                       "sluice-reboot-" + std::to_string(::getpid()) + "-" + std::to_string(n_), bridge_,
                                       subnetPrefix_, tmp_.file("ipam"), tmp_.file("agent.sock")});
    ASSERT_TRUE(list.ok()) << list.error().message;
    list_ = *list;
    auto s = TestApiServer::start();
    ASSERT_TRUE(s.ok()) << s.error().message;
    api_ = std::move(*s);
    ASSERT_TRUE(api_->createNamespace("shop", kAmbient).ok());
    ASSERT_TRUE(api_->createNamespace("istio-system").ok());
    ASSERT_TRUE(api_->createNodeAgentPod().ok());
  }

  void TearDown() override {
    if (agent_) {
      if (HasFailure()) std::cerr << "---- agent log ----\n" << agent_->log();
      if (auto c = agent_->client(); c.ok())
        if (auto pods = c->listPods(); pods.ok())
          for (const auto& p : *pods) (void)c->removePod(p.id);
    }
    proxy_.reset();
    agent_.reset();
    pods_.clear();
  }

  void startAgent() {
    auto a = AgentProcess::start(
        bpffs_.root(),
        {"--kube-api", api_->url(), "--kube-token-file", api_->tokenFile(), "--kube-ca-file", api_->caFile(),
         "--node-name", "node-a", "--ztunnel-socket", tmp_.file("zds.sock"), "--ztunnel-timeout-ms", "1000",
         "--reconcile-interval", "1"},
        tmp_.file("agent.sock"));
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
    ASSERT_TRUE(agent_->waitKubeSynced()) << "the agent never synced with the API server";
  }

  void startProxy() {
    auto p = NodeProxyStandIn::start(testNodeProxyConfig(tmp_.file("zds.sock")));
    ASSERT_TRUE(p.ok()) << p.error().message;
    proxy_ = std::move(*p);
    ASSERT_TRUE(proxy_->waitForEvent("snapshot", "", scaledBound(5s))) << "no snapshot from the agent";
  }

  /// The pod in the API: running on node-a, no IP yet (the kubelet reports
  /// it once the sandbox is up).
  Pod& apiPod(const std::string& name, Labels labels = {}) {
    auto p = std::make_unique<Pod>();
    p->name = name;
    p->uid = randomPodUid();
    TestPod tp;
    tp.namespaceName = "shop";
    tp.name = name;
    tp.uid = p->uid;
    tp.labels = std::move(labels);
    auto r = api_->createPod(tp);
    EXPECT_TRUE(r.ok()) << r.error().message;
    pods_.push_back(std::move(p));
    return *pods_.back();
  }

  /// One plugin of the conflist run from the node netns as libcni runs it:
  /// CNI_* in a clean environment, the list's cniVersion and name (and the
  /// previous result) injected into its config on stdin.
  CommandResult runPlugin(const json& plugin, const std::string& command, const Pod& pod, const json& prev) {
    json conf = plugin;
    conf["cniVersion"] = list_["cniVersion"];
    conf["name"] = list_["name"];
    if (!prev.is_null()) conf["prevResult"] = prev;
    const std::string type = plugin["type"];
    std::string in = tmp_.file("stdin-" + std::to_string(gCounter++) + ".json");
    EXPECT_TRUE(writeTextFile(in, conf.dump()));
    std::string bin = type == "sluice-cni" ? tmp_.file("bin/sluice-cni") : std::string(kSystemCniDir) + "/" + type;
    return sh("nsenter --net=" + node_.path() + " env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin CNI_COMMAND=" + command +
              " CNI_CONTAINERID=" + pod.sandbox.containerId + " CNI_NETNS=" + pod.sandbox.netns->path() +
              " CNI_IFNAME=eth0 CNI_PATH=" + tmp_.file("bin") + ":" + kSystemCniDir +
              " 'CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=" + pod.name + ";K8S_POD_UID=" + pod.uid +
              "' " + bin + " < " + in);
  }

  /// The runtime makes @p pod's sandbox: a new netns, ADD through the
  /// conflist (@p withSluice false: the primary's plugins only, as when the
  /// chain did not hold sluice-cni yet), then the pod's container (a process
  /// in its kubelet-named cgroup, an app on :8080), then the kubelet reports
  /// the IP. The ADD's plugin runs, for the failure message.
  std::string makeSandbox(Pod& pod, bool withSluice) {
    Sandbox& sb = pod.sandbox;
    sb = Sandbox{};
    sb.netns = std::make_unique<TestNetns>("rbpod");
    EXPECT_TRUE(sb.netns->ok()) << sb.netns->error();
    sb.containerId = "rb" + std::to_string(::getpid()) + "x" + std::to_string(gCounter++) + "x" + pod.name;
    json prev;
    std::string runs;
    for (const auto& plugin : list_["plugins"]) {
      if (!withSluice && plugin["type"] == "sluice-cni") continue;
      auto r = runPlugin(plugin, "ADD", pod, prev);
      runs += "[" + plugin["type"].get<std::string>() + ": " + r.describe() + "] ";
      if (r.exitCode != 0) return runs;
      prev = json::parse(r.out, nullptr, false);
    }
    std::string cidr = prev["ips"][0]["address"];
    sb.ip = cidr.substr(0, cidr.find('/'));
    auto proc = TestPodProcess::start(cgroups_, {.uid = pod.uid,
                                                 .driver = gCounter % 2 ? CgroupDriver::Systemd : CgroupDriver::Cgroupfs,
                                                 .joinNetns = sb.netns->path()});
    EXPECT_TRUE(proc.ok()) << proc.error().message;
    if (proc.ok()) sb.process = std::move(*proc);
    auto app = TcpServer::start(*sb.netns, Endpoint::of(sb.ip, kAppPort));
    EXPECT_TRUE(app.ok()) << app.error().message;
    if (app.ok()) sb.app = std::move(*app);
    EXPECT_TRUE(api_->patchPod("shop", pod.name, {{"status", {{"podIP", sb.ip}, {"podIPs", {{{"ip", sb.ip}}}}}}}).ok());
    return "";
  }

  /// The reboot, for one pod: its processes and its netns gone.
  static void loseSandbox(Pod& pod) { pod.sandbox = Sandbox{}; }

  std::optional<PodInfo> enrollment(const Pod& pod) {
    auto c = agent_->client();
    if (!c.ok()) return std::nullopt;
    auto list = c->listPods();
    if (!list.ok()) return std::nullopt;
    for (const auto& p : *list)
      if (p.identity.uid == pod.uid) return p;
    return std::nullopt;
  }

  /// Enrolled in the pod's current netns and acked by the node proxy.
  bool handedOff(const Pod& pod) {
    auto e = enrollment(pod);
    if (!e || !pod.sandbox.netns) return false;
    auto cookie = pod.sandbox.netns->cookie();
    return cookie.ok() && e->netnsCookie == *cookie && e->handoff == HandoffState::Acked;
  }

  std::vector<std::string> registry() {
    std::vector<std::string> out;
    auto c = agent_->client();
    if (!c.ok()) return out;
    if (auto list = c->listPods(); list.ok())
      for (const auto& p : *list) out.push_back(p.identity.name + " " + p.id);
    std::sort(out.begin(), out.end());
    return out;
  }

  std::optional<std::string> redirection(const Pod& pod) {
    return api_->podAnnotation("shop", pod.name, kRedirection);
  }

  /// Connections of @p pod the node proxy relayed on @p listener.
  size_t relayed(const Pod& pod, const std::string& listener) const { return proxy_->relayed(pod.uid, listener); }

  /// One connection out of the pod (to a server on the node) and one into
  /// it (from the node to its app): both must pass the node proxy.
  void expectTrafficThroughTheProxy(const Pod& pod, const TcpServer& nodeServer) {
    SCOPED_TRACE(pod.name);
    const size_t out = relayed(pod, "outbound"), in = relayed(pod, "inbound");
    const size_t direct = nodeServer.accepted();
    Status o = connectAndEcho(*pod.sandbox.netns, nodeServer.local());
    EXPECT_TRUE(o.ok()) << o.error().message;
    Status i = connectAndEcho(node_, Endpoint::of(pod.sandbox.ip, kAppPort));
    EXPECT_TRUE(i.ok()) << i.error().message;
    EXPECT_TRUE(eventually([&] { return relayed(pod, "outbound") == out + 1; }, 3s))
        << "outbound did not go through the node proxy (#60882)";
    EXPECT_TRUE(eventually([&] { return relayed(pod, "inbound") == in + 1; }, 3s))
        << "inbound did not go through the node proxy (#55968)";
    EXPECT_EQ(nodeServer.accepted(), direct + 1) << "one connection reached the node server, the proxy's";
  }

  // Destroyed in reverse: the pods (processes, netns), the node proxy, the
  // agent, the API server, the node netns (bridge), the dirs, bpffs last.
  TestBpffs bpffs_;
  TempDir tmp_{"reboot"};
  TestNetns node_{"rbnode"};
  TestCgroupRoot cgroups_;
  std::unique_ptr<TestApiServer> api_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<NodeProxyStandIn> proxy_;
  std::vector<std::unique_ptr<Pod>> pods_;
  int n_ = 0;
  std::string subnetPrefix_, bridge_;
  json list_;
};

TEST_F(NodeReboot, EveryPodIsEnrolledAgainAndNothingStaleRemains) {
  startAgent();
  startProxy();
  Pod& web = apiPod("web");
  Pod& api = apiPod("api");
  Pod& late = apiPod("late");      // after the reboot: its sandbox made without sluice-cni
  Pod& leaves = apiPod("leaves");  // labelled out of the mesh while the node is down
  Pod& gone = apiPod("gone");      // deleted while the node is down
  Pod& optOut = apiPod("opt-out", {{"istio.io/dataplane-mode", "none"}});
  for (Pod* p : {&web, &api, &late, &leaves, &gone, &optOut}) ASSERT_EQ(makeSandbox(*p, true), "") << p->name;
  for (Pod* p : {&web, &api, &late, &leaves, &gone}) {
    ASSERT_TRUE(eventually([&] { return handedOff(*p) && redirection(*p) == "enabled"; }, 15s)) << p->name;
  }
  EXPECT_FALSE(enrollment(optOut));
  auto nodeServer = TcpServer::start(node_, Endpoint::of(subnetPrefix_ + "1", 0));
  ASSERT_TRUE(nodeServer.ok()) << nodeServer.error().message;
  expectTrafficThroughTheProxy(web, **nodeServer);
  std::map<std::string, std::string> oldIps;
  for (const auto& p : pods_) oldIps[p->name] = p->sandbox.ip;
  const std::vector<std::string> before = registry();
  ASSERT_EQ(before.size(), 5u) << ::testing::PrintToString(before);
  nodeServer->reset();

  // ---- the reboot ----
  ASSERT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  agent_.reset();
  proxy_.reset();
  for (auto& p : pods_) loseSandbox(*p);
  ASSERT_EQ(node_.ip("link del " + bridge_).exitCode, 0);
  std::filesystem::remove_all(bpffs_.root());
  ASSERT_FALSE(std::filesystem::exists(bpffs_.root()));
  // The cluster meanwhile.
  ASSERT_TRUE(api_->patchPod("shop", "leaves", {{"metadata", {{"labels", {{"istio.io/dataplane-mode", "none"}}}}}}).ok());
  ASSERT_TRUE(api_->deletePod("shop", "gone").ok());
  for (Pod* p : {&web, &api, &late, &leaves}) EXPECT_EQ(redirection(*p), "enabled") << "the annotation survives the node";

  // ---- the node comes back ----
  startAgent();
  startProxy();
  // Before any sandbox exists again, no pod may be said to be captured
  // (#57285: "enabled" without ztunnel's sockets).
  for (Pod* p : {&web, &api, &late}) {
    EXPECT_TRUE(eventually([&] { return redirection(*p) != "enabled"; }, 15s))
        << p->name << " still annotated enabled while nothing of it exists";
  }
  EXPECT_TRUE(registry().empty()) << "registry entries without a pod netns";
  for (Pod* p : {&web, &api}) ASSERT_EQ(makeSandbox(*p, true), "") << p->name;
  ASSERT_EQ(makeSandbox(late, false), "");
  ASSERT_EQ(makeSandbox(leaves, true), "");
  ASSERT_EQ(makeSandbox(optOut, true), "");

  for (Pod* p : {&web, &api, &late}) {
    SCOPED_TRACE(p->name);
    EXPECT_NE(p->sandbox.ip, oldIps[p->name]) << "host-local kept its reservations: a new address";
    ASSERT_TRUE(eventually([&] { return handedOff(*p) && redirection(*p) == "enabled"; }, 20s))
        << "not enrolled again in its new netns";
  }
  nodeServer = TcpServer::start(node_, Endpoint::of(subnetPrefix_ + "1", 0));
  ASSERT_TRUE(nodeServer.ok()) << nodeServer.error().message;
  for (Pod* p : {&web, &api, &late}) expectTrafficThroughTheProxy(*p, **nodeServer);

  // The proxy runs exactly the mesh's pods, each in its new netns (#57285).
  std::vector<std::string> want{web.uid, api.uid, late.uid};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(proxy_->runningPods(), want);
  // The registry: those three, in their new sandboxes; nothing of the rest.
  EXPECT_TRUE(eventually([&] { return !redirection(leaves); }, 10s)) << "a pod that left the mesh is still annotated";
  std::this_thread::sleep_for(1s);  // a sweep and a resync: time to do anything wrong
  auto reg = registry();
  ASSERT_EQ(reg.size(), 3u) << ::testing::PrintToString(reg);
  for (const auto& r : reg)
    EXPECT_EQ(std::find(before.begin(), before.end(), r), before.end()) << "an enrollment from before the reboot: " << r;
  for (Pod* p : {&web, &api, &late}) {
    auto e = enrollment(*p);
    ASSERT_TRUE(e) << p->name;
    EXPECT_EQ(e->netnsCookie, *p->sandbox.netns->cookie()) << p->name;
  }
  // Each by the way it came back: the re-run ADD (the new container's id),
  // or the controller finding its netns.
  for (Pod* p : {&web, &api}) EXPECT_EQ(enrollment(*p)->id, cni::podIdForContainer(p->sandbox.containerId)) << p->name;
  EXPECT_EQ(enrollment(late)->id, "k8s-" + late.uid);
  for (Pod* p : {&leaves, &gone, &optOut}) EXPECT_FALSE(enrollment(*p)) << p->name;
  EXPECT_EQ(redirection(optOut), std::nullopt);
  auto ps = api_->object("pods", "shop", "gone");
  ASSERT_TRUE(ps.ok());
  EXPECT_FALSE(ps->has_value());
  // A pod outside the mesh talks directly.
  Status direct = connectAndEcho(*optOut.sandbox.netns, (*nodeServer)->local());
  EXPECT_TRUE(direct.ok()) << direct.error().message;
  EXPECT_EQ(relayed(optOut, "outbound"), 0u);
}

}  // namespace
}  // namespace sluice::test
