// Whole stories of sluiced deciding from Kubernetes which pods are in the
// ambient mesh (issue 14): a real sluiced with --kube-api against the test
// API server (test/apiserver), running pods made of real processes in
// cgroups named as kubelet names them (both drivers) living in real pod
// network namespaces, and the node proxy stand-in taking them over ZDS.
//
//   test API server (127.0.0.1, TLS, token) ◀──list/watch, pods/status──┐
//                                                                       │
//   test process                                       sluiced (child, --kube-api, --ztunnel-socket)
//   ├─ NodeProxyStandIn ◀──────── ZDS (TMP/zds.sock) ──────────────────┤
//   └─ per pod: node netns ── veth ── pod netns ◀── /proc scan ─────────┘
//               TcpServer             eth0 10.200.0.2, a process in
//                                     <cgroup>/kubepods…/pod<uid>/…
//
// The agent runs in the test's own netns: the pods' host-side veths are in
// their own node netns, so no probe SNAT is attached (a warning), which is
// not what these stories are about.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <set>
#include <thread>

#include "test/common/agent_process.h"
#include "test/common/apiserver.h"
#include "test/common/cgroup_pod.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/common/zds_peers.h"
#include "test/standin/node_proxy.h"

namespace sluice::test {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;

const Labels kAmbient{{"istio.io/dataplane-mode", "ambient"}};
constexpr const char* kRedirection = "ambient.istio.io/redirection";


/// A pod running on the node: its network (PodTopology), a process of it in
/// a kubelet-named cgroup inside the pod netns, and a server on its node
/// side that outbound connections go to.
struct RunningPod {
  std::string ns;
  std::string name;
  std::string uid;
  PodTopology topo;
  std::unique_ptr<TestPodProcess> process;
  std::unique_ptr<TcpServer> server;

  /// One outbound connection, echoed.
  Status connectOut() const { return connectAndEcho(topo.pod(), server->local()); }
};

class KubeAgent : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (cgroups, network namespaces, BPF)";
    if (cgroups_.unavailable()) GTEST_SKIP() << cgroups_.error();
    ASSERT_TRUE(cgroups_.ok()) << cgroups_.error();
    ASSERT_FALSE(tmp_.path().empty());
    auto s = TestApiServer::start();
    ASSERT_TRUE(s.ok()) << s.error().message;
    server_ = std::move(*s);
    ASSERT_TRUE(server_->createNamespace("shop").ok());
    ASSERT_TRUE(server_->createNamespace("istio-system", kAmbient).ok());
    ASSERT_TRUE(server_->createNodeAgentPod().ok());
  }

  void TearDown() override {
    if (agent_) {
      if (HasFailure()) std::cerr << "---- agent log ----\n" << agent_->log() << "\n---- API server log ----\n" << server_->log();
      if (auto c = agent_->client(); c.ok())
        if (auto pods = c->listPods(); pods.ok())
          for (const auto& p : *pods) (void)c->removePod(p.id);
    }
    proxies_.clear();
    agent_.reset();
    pods_.clear();
  }

  std::string zdsPath() const { return tmp_.file("zds.sock"); }

  std::vector<std::string> agentArgs() const {
    return {"--kube-api", server_->url(), "--kube-token-file", server_->tokenFile(), "--kube-ca-file",
            server_->caFile(), "--node-name", "node-a", "--ztunnel-socket", zdsPath(), "--ztunnel-timeout-ms", "1000",
            "--reconcile-interval", "1"};
  }

  void startAgent() {
    auto a = AgentProcess::start(bpffs_.root(), agentArgs(), tmp_.file("agent.sock"));
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
    ASSERT_TRUE(agent_->waitKubeSynced(15s)) << "the agent never synced with the API server";
  }

  NodeProxyStandIn& startProxy() {
    auto p = NodeProxyStandIn::start(testNodeProxyConfig(zdsPath()));
    EXPECT_TRUE(p.ok()) << p.error().message;
    proxies_.push_back(std::move(*p));
    EXPECT_TRUE(proxies_.back()->waitForEvent("snapshot", "", scaledBound(5s))) << "no snapshot from the agent";
    return *proxies_.back();
  }

  agent::Client client() {
    auto c = agent_->client();
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }

  /// A running pod of this node in the API (with its uid, IP 10.200.0.2 —
  /// every pod's network is a PodTopology) and on the node.
  RunningPod& runningPod(const std::string& ns, const std::string& name, Labels labels = {}, Labels annotations = {},
                         bool hostNetwork = false) {
    auto p = sandbox(ns, name);
    auto proc = TestPodProcess::start(
        cgroups_, {.uid = p->uid,
                   .driver = pods_.size() % 2 ? CgroupDriver::Systemd : CgroupDriver::Cgroupfs,
                   .joinNetns = p->topo.pod().path()});
    EXPECT_TRUE(proc.ok()) << proc.error().message;
    if (proc.ok()) p->process = std::move(*proc);
    auto srv = TcpServer::start(p->topo.node(), Endpoint::of(PodTopology::kNodeV4, 0));
    EXPECT_TRUE(srv.ok()) << srv.error().message;
    if (srv.ok()) p->server = std::move(*srv);
    TestPod tp;
    tp.namespaceName = ns;
    tp.name = name;
    tp.uid = p->uid;
    tp.ips = {PodTopology::kPodV4};
    tp.labels = std::move(labels);
    tp.annotations = std::move(annotations);
    tp.hostNetwork = hostNetwork;
    auto r = server_->createPod(tp);
    EXPECT_TRUE(r.ok()) << r.error().message;
    pods_.push_back(std::move(p));
    return *pods_.back();
  }

  /// A pod whose sandbox (network) the runtime is making: no process yet,
  /// not in the API (apiPod() puts it there).
  static std::unique_ptr<RunningPod> sandbox(const std::string& ns, const std::string& name) {
    auto p = std::make_unique<RunningPod>();
    p->ns = ns;
    p->name = name;
    p->uid = randomPodUid();
    EXPECT_TRUE(p->topo.ok()) << p->topo.error();
    return p;
  }
  /// The Pod object of @p pod (running, on node-a, IP 10.200.0.2).
  Status apiPod(const RunningPod& pod) {
    TestPod tp;
    tp.namespaceName = pod.ns;
    tp.name = pod.name;
    tp.uid = pod.uid;
    tp.ips = {PodTopology::kPodV4};
    SLUICE_TRY(server_->createPod(tp));
    return {};
  }

  /// The agent's registry entry of @p pod (by uid).
  std::optional<PodInfo> enrollment(const RunningPod& pod) {
    auto list = client().listPods();
    if (!list.ok()) return std::nullopt;
    for (const auto& p : *list)
      if (p.identity.uid == pod.uid) return p;
    return std::nullopt;
  }
  bool enrolled(const RunningPod& pod) { return enrollment(pod).has_value(); }
  std::set<std::string> enrolledNames() {
    std::set<std::string> out;
    auto list = client().listPods();
    if (list.ok())
      for (const auto& p : *list) out.insert(p.identity.ns + "/" + p.identity.name);
    return out;
  }

  /// The pod's ambient.istio.io/redirection annotation in the API.
  std::optional<std::string> redirection(const RunningPod& pod) {
    return server_->podAnnotation(pod.ns, pod.name, kRedirection);
  }

  /// @p pod enrolled with its hand-off failed (annotated "pending"); then a
  /// node proxy connects, gets it, and the annotation becomes "enabled".
  /// That node proxy.
  NodeProxyStandIn& pendingUntilAProxyConnects(const RunningPod& pod) {
    EXPECT_TRUE(eventually([&] { return enrolled(pod) && redirection(pod) == "pending"; }, 15s));
    auto info = enrollment(pod);
    EXPECT_TRUE(info && info->handoff == HandoffState::Failed);
    NodeProxyStandIn& proxy = startProxy();
    EXPECT_TRUE(eventually([&] { return redirection(pod) == "enabled"; }, 15s));
    EXPECT_EQ(proxy.runningPods(), std::vector<std::string>{pod.uid});
    return proxy;
  }

  /// sluice-cni run as a runtime runs it for @p pod: CNI_ARGS with its
  /// namespace, name and uid, a prevResult naming its eth0 and IP.
  CommandResult cni(const std::string& command, const RunningPod& pod, const std::string& containerId) {
    json prev = {{"cniVersion", "1.0.0"},
                 {"interfaces", {{{"name", "eth0"}, {"sandbox", pod.topo.pod().path()}}}},
                 {"ips", {{{"interface", 0}, {"address", std::string(PodTopology::kPodV4) + "/24"}}}}};
    json conf = {{"cniVersion", "1.0.0"}, {"name", "kube-test"}, {"type", "sluice-cni"},
                 {"agentSocket", agent_->socket()}, {"prevResult", prev}};
    std::string in = tmp_.file("cni-" + containerId + "-" + command + ".json");
    EXPECT_TRUE(writeTextFile(in, conf.dump()));
    return sh("env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin CNI_COMMAND=" + command + " CNI_CONTAINERID=" + containerId +
              " CNI_NETNS=" + pod.topo.pod().path() +
              " CNI_IFNAME=eth0 CNI_PATH=/opt/cni/bin 'CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + pod.ns +
              ";K8S_POD_NAME=" + pod.name + ";K8S_POD_UID=" + pod.uid + "' " + builtBinary("sluice-cni") + " < " + in);
  }

  /// One DNS query from @p pod to its node's resolver (a UDP server there
  /// that echoes): "captured" when the node proxy answered, "echoed" when the
  /// query reached the resolver, else what went wrong.
  static std::string dnsPath(const RunningPod& pod, uint16_t id) {
    std::string q = dnsQuery(id, "sluice.example.com", 1);
    auto reply = udpExchange(pod.topo.pod(), Endpoint::of(PodTopology::kNodeV4, 53), q, true, scaledBound(kIoTimeout));
    if (!reply.ok()) return "error: " + reply.error().message;
    if (reply->payload == q) return "echoed";
    auto answer = parseDnsAnswer(reply->payload);
    return answer && answer->response ? "captured" : "neither an echo nor a DNS answer";
  }

  /// Outbound connections of @p pod the node proxy relayed.
  static size_t relayed(const NodeProxyStandIn& proxy, const RunningPod& pod) { return proxy.relayed(pod.uid); }

  TempDir tmp_{"kubeagent"};
  TestBpffs bpffs_;
  TestCgroupRoot cgroups_;
  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<AgentProcess> agent_;
  std::vector<std::unique_ptr<NodeProxyStandIn>> proxies_;
  std::vector<std::unique_ptr<RunningPod>> pods_;
};

// The headline story: a namespace labelled ambient while its pods run. The
// selected ones are enrolled live, handed to the node proxy and annotated
// "enabled"; the opted-out pod, the sidecar pod, the hostNetwork pod and
// ztunnel's own pod are never touched. A connection open before the label
// keeps working through the enrollment and through the removal when the
// label goes, and new connections go through the proxy only in between.
TEST_F(KubeAgent, NamespaceLabelledEnrollsItsRunningPodsAndUnlabelledRemovesThem) {
  RunningPod& a = runningPod("shop", "web-a");
  RunningPod& b = runningPod("shop", "web-b");
  RunningPod& optOut = runningPod("shop", "opt-out", {{"istio.io/dataplane-mode", "none"}});
  RunningPod& sidecar = runningPod("shop", "sidecar", {}, {{"sidecar.istio.io/status", "{\"containers\":[\"istio-proxy\"]}"}});
  RunningPod& host = runningPod("shop", "host", {}, {}, true);
  RunningPod& ztunnel = runningPod("istio-system", "ztunnel-x", {{"app", "ztunnel"}});
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  EXPECT_TRUE(enrolledNames().empty()) << "nothing is in the mesh yet";

  auto before = tcpConnect(a.topo.pod(), a.server->local());
  ASSERT_TRUE(before.ok()) << before.error().message;
  ASSERT_EQ(echoOrError(before->get(), "before"), "before");

  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  ASSERT_TRUE(eventually([&] { return enrolled(a) && enrolled(b); }, 15s));
  ASSERT_TRUE(eventually([&] { return redirection(a) == "enabled" && redirection(b) == "enabled"; }, 10s));
  std::this_thread::sleep_for(1s);  // time to do anything wrong
  EXPECT_EQ(enrolledNames(), (std::set<std::string>{"shop/web-a", "shop/web-b"}));
  std::vector<std::string> expectRunning{a.uid, b.uid};
  std::sort(expectRunning.begin(), expectRunning.end());
  EXPECT_EQ(proxy.runningPods(), expectRunning);
  for (const RunningPod* p : {&optOut, &sidecar, &host, &ztunnel}) EXPECT_EQ(redirection(*p), std::nullopt) << p->name;
  auto info = enrollment(a);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->handoff, HandoffState::Acked);
  EXPECT_EQ(info->identity.ns, "shop");
  EXPECT_EQ(info->identity.name, "web-a");
  EXPECT_EQ(info->identity.serviceAccount, "default");

  EXPECT_EQ(echoOrError(before->get(), "during"), "during") << "enrollment broke an open connection";
  ASSERT_TRUE(a.connectOut().ok());
  ASSERT_TRUE(b.connectOut().ok());
  EXPECT_TRUE(eventually([&] { return relayed(proxy, a) == 1 && relayed(proxy, b) == 1; }, 3s))
      << "new connections did not go through the node proxy";
  ASSERT_TRUE(optOut.connectOut().ok());
  ASSERT_TRUE(sidecar.connectOut().ok());
  EXPECT_EQ(relayed(proxy, optOut) + relayed(proxy, sidecar), 0u);

  ASSERT_TRUE(server_->setNamespaceLabels("shop", {}).ok());
  ASSERT_TRUE(eventually([&] { return !enrolled(a) && !enrolled(b); }, 15s));
  ASSERT_TRUE(eventually([&] { return !redirection(a) && !redirection(b); }, 10s)) << "annotation left behind";
  EXPECT_TRUE(proxy.waitForEvent("del", a.uid, scaledBound(3s)));
  EXPECT_EQ(echoOrError(before->get(), "after"), "after") << "removal broke an open connection";
  ASSERT_TRUE(a.connectOut().ok());
  EXPECT_EQ(relayed(proxy, a), 1u) << "a connection after the removal went to the proxy";
  EXPECT_TRUE(enrolledNames().empty());
}

// A pod opts in by its own label in an unlabelled namespace, and out again
// by dropping it while it runs.
TEST_F(KubeAgent, PodLabelEnrollsAndRemovesLive) {
  RunningPod& a = runningPod("shop", "web-a");
  startAgent();
  startProxy();
  ASSERT_TRUE(server_->patchPod("shop", "web-a", {{"metadata", {{"labels", kAmbient}}}}).ok());
  ASSERT_TRUE(eventually([&] { return enrolled(a) && redirection(a) == "enabled"; }, 15s));
  ASSERT_TRUE(server_->patchPod("shop", "web-a", {{"metadata", {{"labels", {{"istio.io/dataplane-mode", nullptr}}}}}}).ok());
  ASSERT_TRUE(eventually([&] { return !enrolled(a) && !redirection(a); }, 15s));
}

// ambient.istio.io/dns-capture and bypass-inbound-capture changed on a
// running enrolled pod: applied in place (the enrollment is the same one:
// no gap in capture) and back.
TEST_F(KubeAgent, AnnotationsChangeSettingsInPlace) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  RunningPod& a = runningPod("shop", "web-a", {}, {{"ambient.istio.io/dns-capture", "false"}});
  auto resolver = UdpServer::start(a.topo.node(), Endpoint::of(PodTopology::kNodeV4, 53));
  ASSERT_TRUE(resolver.ok()) << resolver.error().message;
  startAgent();
  startProxy();
  ASSERT_TRUE(eventually([&] { return enrolled(a); }, 15s));
  EXPECT_EQ(dnsPath(a, 1), "echoed");
  auto first = enrollment(a);
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->dnsCapture) << "the annotation's setting at enrollment";
  EXPECT_TRUE(first->inboundCapture);

  ASSERT_TRUE(server_->patchPod("shop", "web-a",
                                {{"metadata",
                                  {{"annotations",
                                    {{"ambient.istio.io/dns-capture", "T"},
                                     {"ambient.istio.io/bypass-inbound-capture", "1"}}}}}})
                  .ok());
  ASSERT_TRUE(eventually([&] {
    auto e = enrollment(a);
    return e && e->dnsCapture && !e->inboundCapture;
  }, 10s));
  auto second = enrollment(a);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->id, first->id);
  EXPECT_EQ(second->enrolledAtNs, first->enrolledAtNs) << "re-enrolled instead of changed in place";
  EXPECT_EQ(dnsPath(a, 2), "captured");

  // Removed: back to the node default (DNS on) and inbound capture on.
  ASSERT_TRUE(server_->patchPod("shop", "web-a",
                                {{"metadata",
                                  {{"annotations",
                                    {{"ambient.istio.io/dns-capture", "false"},
                                     {"ambient.istio.io/bypass-inbound-capture", nullptr}}}}}})
                  .ok());
  ASSERT_TRUE(eventually([&] {
    auto e = enrollment(a);
    return e && !e->dnsCapture && e->inboundCapture;
  }, 10s));
  EXPECT_EQ(enrollment(a)->enrolledAtNs, first->enrolledAtNs);
  EXPECT_EQ(dnsPath(a, 3), "echoed");
  EXPECT_EQ((*resolver)->received().size(), 2u) << "the captured query reached the resolver";
  EXPECT_TRUE(eventually([&] { return redirection(a) == "enabled"; }, 10s)) << "the status annotation is patched after the change";
}

// Deleted, or finished (Succeeded): removed while the process still runs.
TEST_F(KubeAgent, DeletedOrFinishedPodsAreRemoved) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  RunningPod& gone = runningPod("shop", "gone");
  RunningPod& job = runningPod("shop", "job");
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  ASSERT_TRUE(eventually([&] { return enrolled(gone) && enrolled(job); }, 15s));
  ASSERT_TRUE(server_->deletePod("shop", "gone").ok());
  ASSERT_TRUE(eventually([&] { return !enrolled(gone); }, 10s));
  EXPECT_TRUE(proxy.waitForEvent("del", gone.uid, scaledBound(3s)));
  ASSERT_TRUE(eventually([&] { return redirection(job) == "enabled"; }, 10s));
  ASSERT_TRUE(server_->patchPod("shop", "job", {{"status", {{"phase", "Succeeded"}}}}).ok());
  ASSERT_TRUE(eventually([&] { return !enrolled(job) && !redirection(job); }, 10s));
}

// No node proxy connected: the running pod is enrolled anyway (its traffic
// must not pass the proxy) and annotated "pending"; when the node proxy
// comes, the agent hands it over and the annotation becomes "enabled".
TEST_F(KubeAgent, FailedHandOffKeepsTheRedirectionAsPending) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  RunningPod& a = runningPod("shop", "web-a");
  startAgent();
  NodeProxyStandIn& proxy = pendingUntilAProxyConnects(a);
  EXPECT_EQ(enrollment(a)->handoff, HandoffState::Acked);
  ASSERT_TRUE(a.connectOut().ok());
  EXPECT_TRUE(eventually([&] { return relayed(proxy, a) == 1; }, 3s));
}

// A ztunnel that takes the pod and never acks (hung, or crash-looping mid
// exchange): the agent drops it at the ZDS deadline and reports what
// Istio's agent reports for a hand-off that failed after the redirection
// was in place — the pod annotated "pending", retried — and a well-behaved
// ztunnel then gets it and the annotation becomes "enabled".
TEST_F(KubeAgent, ZtunnelThatNeverAcksLeavesThePodPendingUntilOneDoes) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  startAgent();
  FakeZtunnel hung(zdsPath());
  auto snap = hung.handshake();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  RunningPod& a = runningPod("shop", "web-a");
  auto add = hung.request(scaledBound(10s));  // taken, never acked
  ASSERT_TRUE(add.ok()) << add.error().message;
  EXPECT_EQ(add->request.workload.uid, a.uid);
  EXPECT_TRUE(hung.closedByServer(scaledBound(5s))) << "not dropped at the deadline (--ztunnel-timeout-ms 1000)";
  pendingUntilAProxyConnects(a);
}

// The API server away for a while: nothing is removed on a guess, and what
// changed meanwhile (a pod deleted, a pod created) is caught up when it is
// back.
TEST_F(KubeAgent, ApiServerAwayRemovesNothingThenCatchesUp) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  RunningPod& a = runningPod("shop", "web-a");
  RunningPod& b = runningPod("shop", "web-b");
  startAgent();
  startProxy();
  ASSERT_TRUE(eventually([&] { return enrolled(a) && enrolled(b); }, 15s));
  ASSERT_TRUE(server_->fault({{"down", true}}).ok());
  ASSERT_TRUE(server_->deletePod("shop", "web-b").ok());  // while the agent cannot see it
  RunningPod& c = runningPod("shop", "web-c");
  std::this_thread::sleep_for(3s);  // several sweeps and resyncs
  EXPECT_TRUE(enrolled(a));
  EXPECT_TRUE(enrolled(b)) << "removed while the API server was away";
  EXPECT_FALSE(enrolled(c));
  ASSERT_TRUE(server_->fault({{"up", true}}).ok());
  ASSERT_TRUE(eventually([&] { return !enrolled(b) && enrolled(c); }, 20s));
  EXPECT_TRUE(enrolled(a));
  EXPECT_TRUE(eventually([&] { return redirection(c) == "enabled"; }, 10s));
}

// The agent stopped while the cluster changes, then started again: the
// start-up reconciliation removes the pod that left the mesh meanwhile
// (and its annotation), enrolls the one that joined, keeps the rest, and
// the data plane stayed in place while it was down.
TEST_F(KubeAgent, AgentRestartedInBetweenReconciles) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  RunningPod& stays = runningPod("shop", "stays");
  RunningPod& leaves = runningPod("shop", "leaves");
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  ASSERT_TRUE(eventually([&] { return enrolled(stays) && enrolled(leaves); }, 15s));
  ASSERT_TRUE(eventually([&] { return redirection(leaves) == "enabled"; }, 10s));
  auto stayedAt = enrollment(stays)->enrolledAtNs;
  ASSERT_EQ(agent_->stop(SIGTERM), 0);
  agent_.reset();

  ASSERT_TRUE(server_->patchPod("shop", "leaves", {{"metadata", {{"labels", {{"istio.io/dataplane-mode", "none"}}}}}}).ok());
  RunningPod& joins = runningPod("shop", "joins");
  ASSERT_TRUE(stays.connectOut().ok());
  EXPECT_TRUE(eventually([&] { return relayed(proxy, stays) == 1; }, 3s)) << "capture stopped with the agent";

  startAgent();
  ASSERT_TRUE(eventually([&] { return enrolled(joins) && !enrolled(leaves); }, 15s));
  EXPECT_TRUE(enrolled(stays));
  EXPECT_EQ(enrollment(stays)->enrolledAtNs, stayedAt) << "a kept pod was enrolled again";
  EXPECT_TRUE(eventually([&] { return !redirection(leaves) && redirection(joins) == "enabled"; }, 10s));
}


// The CNI path: ADD asks the agent, which decides from its cache. A pod not
// in the mesh: sluice-cni prints prevResult unchanged and nothing in the pod
// is touched (no programs on its interfaces, not in the registry). A pod in
// the mesh: enrolled under the container id with its annotations' settings,
// handed off and annotated, and not enrolled a second time by the
// controller; DEL removes it.
TEST_F(KubeAgent, CniAddAsksTheAgent) {
  ASSERT_TRUE(server_->createNamespace("mesh", kAmbient).ok());
  RunningPod& outside = runningPod("shop", "outside");
  RunningPod& inside = runningPod("mesh", "inside", {}, {{"ambient.istio.io/dns-capture", "false"}});
  inside.process->kill();  // its sandbox is being made: no process runs in it yet
  startAgent();
  NodeProxyStandIn& proxy = startProxy();

  auto r = cni("ADD", outside, "c0ffee-outside");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto out = json::parse(r.out, nullptr, false);
  EXPECT_EQ(out["ips"][0]["address"], std::string(PodTopology::kPodV4) + "/24") << r.out;
  EXPECT_EQ(out["interfaces"][0]["sandbox"], outside.topo.pod().path()) << r.out;
  EXPECT_NE(r.err.find("is not in the mesh"), std::string::npos) << r.err;
  EXPECT_FALSE(enrolled(outside));
  EXPECT_EQ(redirection(outside), std::nullopt);
  auto tc = sh("ip netns exec " + outside.topo.pod().name() + " tc filter show dev eth0 egress; ip netns exec " +
               outside.topo.pod().name() + " bpftool net show");
  EXPECT_EQ(tc.out.find("sluice"), std::string::npos) << "programs attached to a pod not in the mesh:\n" << tc.out;

  r = cni("ADD", inside, "c0ffee-inside");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto info = enrollment(inside);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->id, "c0ffee-inside");
  EXPECT_FALSE(info->dnsCapture) << "the annotation's setting";
  EXPECT_EQ(info->handoff, HandoffState::Acked);
  EXPECT_EQ(proxy.runningPods(), std::vector<std::string>{inside.uid});
  EXPECT_TRUE(eventually([&] { return redirection(inside) == "enabled"; }, 10s));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(enrolledNames(), std::set<std::string>{"mesh/inside"}) << "enrolled twice (CNI and controller)";

  // The pod deleted: kubelet tears the sandbox down with DEL, whichever of
  // the watch event and the DEL reaches the agent first.
  ASSERT_TRUE(server_->deletePod("mesh", "inside").ok());
  r = cni("DEL", inside, "c0ffee-inside");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_FALSE(enrolled(inside));
  EXPECT_TRUE(proxy.waitForEvent("del", inside.uid, scaledBound(3s)));
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(enrolledNames().empty());
}

// A pod the watch has not delivered when its ADD comes (the runtime is fast,
// the API server slow): the agent waits for it briefly.
TEST_F(KubeAgent, CniAddWaitsForAPodNotYetWatched) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  startAgent();
  startProxy();
  auto late = sandbox("shop", "late");
  const RunningPod& pod = *late;
  std::thread creator([&] {
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(apiPod(pod).ok());
  });
  auto r = cni("ADD", pod, "c0ffee-late");
  creator.join();
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(enrolled(pod));
  EXPECT_TRUE(client().removePod("c0ffee-late").ok());
}

// The API server unreachable and the pod unknown: the ADD fails retryably
// (CNI code 11) and nothing is enrolled on a guess.
TEST_F(KubeAgent, CniAddWithoutAnAnswerFailsRetryably) {
  startAgent();
  ASSERT_TRUE(server_->fault({{"down", true}}).ok());
  RunningPod& pod = runningPod("shop", "unknown-yet");
  auto r = cni("ADD", pod, "c0ffee-unknown");
  EXPECT_NE(r.exitCode, 0) << r.describe();
  auto out = json::parse(r.out, nullptr, false);
  EXPECT_EQ(out["code"], 11) << r.out;
  EXPECT_NE(out.value("msg", "").find("cannot tell from Kubernetes whether the pod is in the mesh"), std::string::npos)
      << r.out;
  EXPECT_FALSE(enrolled(pod));
  ASSERT_TRUE(server_->fault({{"up", true}}).ok());
}


// health and sluicectl status say where the agent's Kubernetes is and
// whether it synced.
TEST_F(KubeAgent, StatusReportsKubernetes) {
  startAgent();
  auto h = client().health();
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->kubeApi, server_->url());
  EXPECT_TRUE(h->kubeSynced);
  CommandResult st =
      runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", agent_->socket(), "status"});
  EXPECT_EQ(st.exitCode, 0) << st.describe();
  EXPECT_NE(st.out.find("kubernetes         " + server_->url() +
                        ", synced: the agent enrolls the pods in the ambient mesh\n"),
            std::string::npos)
      << st.out;
  st = runCommand(
      {builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", agent_->socket(), "status", "--json"});
  EXPECT_EQ(st.exitCode, 0) << st.describe();
  auto j = json::parse(st.out, nullptr, false);
  EXPECT_EQ(j["agent"]["kube_api"], server_->url()) << st.out;
  EXPECT_EQ(j["agent"]["kube_synced"], true) << st.out;

  // Without Kubernetes.
  ASSERT_EQ(agent_->stop(SIGTERM), 0);
  agent_.reset();
  auto off = AgentProcess::start(bpffs_.root(), {"--kube", "off"}, tmp_.file("agent.sock"));
  ASSERT_TRUE(off.ok()) << off.error().message;
  st = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", (*off)->socket(), "status"});
  EXPECT_NE(st.out.find("kubernetes         off: the agent enrolls every pod it is asked to\n"), std::string::npos)
      << st.out;
}


// The agent's Kubernetes files are read before anything is loaded: a
// missing token or CA file is a one-line error and leaves no state.
TEST_F(KubeAgent, UnreadableCredentialsFailTheStartAndLeaveNothing) {
  std::string root = bpffs_.root() + "-never";
  for (const auto& [flag, file] : std::vector<std::pair<std::string, std::string>>{
           {"--kube-token-file", tmp_.file("no-token")}, {"--kube-ca-file", tmp_.file("no-ca.crt")}}) {
    std::vector<std::string> args = {"--bpffs", root, "--socket", tmp_.file("never.sock"), "--metrics-address", "off",
                                     "--kube-api", server_->url(), "--node-name", "node-a", flag, file};
    AgentRun r = runAgentExpectingExit(args);
    EXPECT_EQ(r.exitCode, 1) << r.log;
    std::string what = flag == "--kube-token-file" ? "token" : "CA";
    EXPECT_NE(r.log.find("error sluiced: Kubernetes " + what + " file " + file + ": No such file or directory\n"),
              std::string::npos)
        << r.log;
    struct stat st {};
    EXPECT_NE(::stat(root.c_str(), &st), 0) << root << " was created";
  }
}


// A selector that does not parse (flag or Istio's environment variable)
// stops the agent at start with one line naming it: never a silently empty
// or match-all selection.
TEST_F(KubeAgent, UnparsableEnablementSelectorStopsTheStart) {
  std::string root = bpffs_.root() + "-never";
  std::vector<std::string> base = {"--bpffs", root, "--socket", tmp_.file("never.sock"), "--metrics-address", "off",
                                   "--kube-api", server_->url(), "--kube-token-file", server_->tokenFile(),
                                   "--kube-ca-file", server_->caFile(), "--node-name", "node-a"};
  auto flag = base;
  flag.insert(flag.end(), {"--ambient-enablement-selector", "- podselector: {matchLabels: {app: x}}"});
  AgentRun r = runAgentExpectingExit(flag);
  EXPECT_NE(r.exitCode, 0) << r.log;
  EXPECT_NE(r.log.find("invalid --ambient-enablement-selector: enablement selector [0]: unknown key \"podselector\""),
            std::string::npos)
      << r.log;
  AgentRun e = runAgentExpectingExit(base, std::chrono::seconds(20), {"/usr/bin/env", "AMBIENT_ENABLEMENT_SELECTOR=[]"});
  EXPECT_NE(e.exitCode, 0) << e.log;
  EXPECT_NE(e.log.find("invalid AMBIENT_ENABLEMENT_SELECTOR: enablement selectors: the list is empty"), std::string::npos)
      << e.log;
  struct stat st {};
  EXPECT_NE(::stat(root.c_str(), &st), 0) << root << " was created";
}

// Istio's environment variable as its chart writes it selects like the
// flag: a pod the default selectors would not enroll is enrolled live.
TEST_F(KubeAgent, EnablementSelectorFromIstiosEnvironmentVariable) {
  RunningPod& picked = runningPod("shop", "picked", {{"app", "picked"}});
  auto a = AgentProcess::start(bpffs_.root(), agentArgs(), tmp_.file("agent.sock"), "", "",
                               {"/usr/bin/env", "AMBIENT_ENABLEMENT_SELECTOR=- podSelector:\n    matchLabels:\n      app: picked\n"});
  ASSERT_TRUE(a.ok()) << a.error().message;
  agent_ = std::move(*a);
  startProxy();
  EXPECT_TRUE(eventually([&] { return enrolled(picked); }, 15s)) << agent_->log();
  EXPECT_TRUE(eventually([&] { return redirection(picked) == "enabled"; }, 10s));
}

// The watch silent (the API server keeps it open and sends nothing): the
// ADD of a pod it never delivered is answered, after the brief wait, from
// one direct GET of the pod — the last resort.
TEST_F(KubeAgent, CniAddAsksTheApiServerWhenTheWatchIsSilent) {
  ASSERT_TRUE(server_->setNamespaceLabels("shop", kAmbient).ok());
  startAgent();
  startProxy();
  ASSERT_TRUE(server_->fault({{"stall", "all"}}).ok());
  auto unwatched = sandbox("shop", "unwatched");
  const RunningPod& pod = *unwatched;
  ASSERT_TRUE(apiPod(pod).ok());
  auto r = cni("ADD", pod, "c0ffee-unwatched");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(enrolled(pod));
  auto gets = server_->countRequests("get", "/namespaces/shop/pods/unwatched");
  ASSERT_TRUE(gets.ok()) << gets.error().message;
  EXPECT_EQ(*gets, 1);
  EXPECT_TRUE(client().removePod("c0ffee-unwatched").ok());
}

}  // namespace
}  // namespace sluice::test
