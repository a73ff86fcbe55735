// sluice-cni with the real plugins: Debian's containernetworking-plugins
// `bridge` + `host-local` create the pod network, then sluice-cni enrolls the
// pod through a real sluiced, each plugin run as a container runtime runs it
// (libcni's semantics: CNI_* environment, the network config on stdin with
// cniVersion, name and prevResult injected, the chain in conflist order on
// ADD/CHECK and in reverse order on DEL). The conflist is the one
// `sluice-cni install` writes.
//
//   test process                      node netns "sluice-cninode-P-N"
//   +-----------------------+         +-------------------------------------+
//   | the "runtime":        |-nsenter>| bridge / host-local / sluice-cni    |
//   |  conf dir, bin dir,   |         | sluiced (--socket TMP/agent.sock,   |
//   |  host-local dataDir   |         |   --bpffs /sys/fs/bpf/sluice-t-P-N) |
//   |  under /tmp (TempDir) |         | slbrN 10.231.N.1/24 (bridge, gw)    |
//   +-----------------------+         |   | port: vethXXXX (probe SNAT)      |
//                                     +---|---------------------------------+
//                                         | veth
//                                     +---|---------------------------------+
//                                     | eth0 10.231.N.2/24 (host-local)     |
//                                     | stand-in [::]:15001 ... (in-process)|
//                                     +-------------------------------------+
//                                       pod netns "sluice-cnipod-P-N"
//
// Everything (agent, namespaces, bridge, IPAM data, bpffs root) is private
// to the test and removed by RAII even when an assertion fails.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <climits>
#include <iostream>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "loader/probe_hook.h"
#include "enroll/datapath.h"
#include "test/common/agent_process.h"
#include "test/common/apiserver.h"
#include "test/common/cgroup_pod.h"
#include "test/common/cni_conf.h"
#include "test/common/cni_runtime.h"
#include "test/common/tcp_relay.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/common/zds_peers.h"
#include "userspace/api/client.h"
#include "userspace/cni/cni.h"
#include "test/standin/node_proxy.h"

namespace sluice::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::atomic<int> gCounter{0};

/// A CNI error as a runtime reads it: exit status non-zero, the error JSON
/// on stdout with the expected code, a readable message, and the plugin's
/// log on stderr.
void expectCniError(const CommandResult& r, int code, const std::string& msgPart) {
  EXPECT_NE(r.exitCode, 0) << r.describe();
  auto j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "stdout is not one JSON object: " << r.describe();
  EXPECT_TRUE(j["cniVersion"].is_string()) << r.out;
  EXPECT_EQ(j["code"], code) << r.out;
  ASSERT_TRUE(j["msg"].is_string()) << r.out;
  EXPECT_NE(j["msg"].get<std::string>().find(msgPart), std::string::npos) << "msg: " << j["msg"];
  EXPECT_NE(r.err.find(j["msg"].get<std::string>()), std::string::npos) << "stderr: " << r.err;
}

// ---- the fixture -----------------------------------------------------------------

class Cni : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    for (const char* p : {"bridge", "host-local"})
      if (!pathExists(std::string(kSystemCniDir) + "/" + p))
        GTEST_SKIP() << kSystemCniDir << "/" << p << " missing: install containernetworking-plugins";
    ASSERT_TRUE(pathExists(builtBinary("sluice-cni"))) << "sluice-cni not built";
    ASSERT_TRUE(pathExists(builtBinary("sluiced"))) << "sluiced not built";
    ASSERT_TRUE(node_.ok()) << node_.error();
    ASSERT_TRUE(pod_.ok()) << pod_.error();
    ASSERT_FALSE(work_.path().empty());
    for (const char* d : {"net.d", "bin", "ipam"}) ASSERT_TRUE(fs::create_directory(work_.file(d)));
    n_ = gCounter++ % 250;
    subnetPrefix_ = "10.231." + std::to_string(n_) + ".";
    bridge_ = "slbr" + std::to_string(::getpid() % 100000) + "-" + std::to_string(n_);
    network_ = "sluice-test-" + std::to_string(::getpid()) + "-" + std::to_string(n_);
    // 64 characters like a runtime's container ids: longer than a pod id
    // may be, so sluice-cni's hashed form is what gets enrolled.
    params_.containerId = "c" + std::to_string(::getpid()) + "x" + std::to_string(n_) + "x";
    params_.containerId += std::string(64 - params_.containerId.size(), 'f');
    params_.netns = pod_.path();
    params_.args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-" + std::to_string(n_);
    podId_ = cni::podIdForContainer(params_.containerId);
    installConflist();
  }

  void TearDown() override {
    // Take the pod out while the agent still runs; then the agent stops.
    if (agent_) {
      if (auto c = agent_->client(); c.ok()) (void)c->removePod(podId_);
      agent_.reset();
    }
  }

  /// The primary conflist (bridge + host-local), then `sluice-cni install`
  /// into it, the way the DaemonSet's init container does.
  void installConflist(const json& sluiceOptions = json::object()) {
    auto installed = installBridgeConflist({work_.file("net.d"), work_.file("bin"), "10-test.conflist", network_, bridge_,
                                            subnetPrefix_, work_.file("ipam"), socket()});
    ASSERT_TRUE(installed.ok()) << installed.error().message;
    list_ = *installed;
    for (const auto& [k, v] : sluiceOptions.items()) list_["plugins"][1][k] = v;
  }

  std::string socket() const { return work_.file("agent.sock"); }

  /// The pod's proxy stand-in (in its netns, with @p capture's socket
  /// contract) and a server on the node at the gateway, where the pod's
  /// outbound connections go (dst).
  struct ProxiedPod {
    std::unique_ptr<ProxyStandIn> standIn;
    std::unique_ptr<TcpServer> server;
    Endpoint dst;
  };
  void startProxyAndServer(CaptureMode capture, ProxiedPod& out) {
    StandInConfig cfg = testStandInConfig(capture);
    cfg.netnsPath = pod_.path();
    auto standIn = ProxyStandIn::start(cfg);
    ASSERT_TRUE(standIn.ok()) << standIn.error().message;
    out.standIn = std::move(*standIn);
    auto server = TcpServer::start(node_, Endpoint::of(gatewayIp(), 0));
    ASSERT_TRUE(server.ok()) << server.error().message;
    out.server = std::move(*server);
    out.dst = Endpoint::of(gatewayIp(), out.server->port());
  }
  std::string podIp() const { return subnetPrefix_ + "2"; }
  std::string gatewayIp() const { return subnetPrefix_ + "1"; }

  void startAgent(const std::vector<std::string>& extra = {}) {
    auto a = AgentProcess::start(bpffs_.root(), extra, socket(), node_.path());
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  // ---- with the hand-off to a node proxy (ZDS) ----

  std::string zdsPath() const { return work_.file("zds.sock"); }
  /// The agent with --ztunnel-socket (deadlines of 1 s).
  void startHandOffAgent() { startAgent({"--ztunnel-socket", zdsPath(), "--ztunnel-timeout-ms", "1000"}); }
  /// One node proxy serving every pod, as ztunnel does.
  std::unique_ptr<NodeProxyStandIn> startNodeProxy() {
    auto p = NodeProxyStandIn::start(testNodeProxyConfig(zdsPath()));
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (!p.ok()) return nullptr;
    EXPECT_TRUE((*p)->waitForEvent("snapshot", "", 5s)) << agent_->log();
    return std::move(*p);
  }
  /// CNI_ARGS as containerd passes them, with the pod's uid.
  static std::string cniArgs(const std::string& name, const std::string& uid) {
    return "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + name + ";K8S_POD_INFRA_CONTAINER_ID=" +
           std::string(64, 'a') + ";K8S_POD_UID=" + uid;
  }

  agent::Client client() {
    auto c = agent_->client();
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }

  std::vector<PodInfo> listPods() {
    auto pods = client().listPods();
    EXPECT_TRUE(pods.ok()) << pods.error().message;
    return pods.ok() ? *pods : std::vector<PodInfo>{};
  }

  /// Nothing of the pod in the agent's list, the pinned maps, the link pins
  /// or (while it exists) the pod netns.
  void expectNoPodState() {
    for (const auto& p : listPods()) EXPECT_NE(p.id, podId_) << "pod still listed";
    expectNoPinnedPodState();
  }

  /// The pinned state alone (works without a running agent).
  void expectNoPinnedPodState() {
    EXPECT_FALSE(pathExists(bpffs_.linkDir(podId_))) << bpffs_.linkDir(podId_) << " still exists";
    if (pathExists(bpffs_.root() + "/pods")) {
      DatapathOptions o;
      o.bpffsRoot = bpffs_.root();
      auto dp = Datapath::open(o);
      ASSERT_TRUE(dp.ok()) << dp.error().message;
      auto& m = (*dp)->programs();
      EXPECT_TRUE(m.pods.keys().empty()) << "pods map not empty";
      EXPECT_TRUE(m.podConfig.keys().empty()) << "pod_config not empty";
      EXPECT_TRUE(m.podAddrs.keys().empty()) << "pod_addrs not empty";
    }
    if (pod_.ok() && pathExists(pod_.path())) {
      EXPECT_EQ(pod_.ip("-4 rule show").out.find("fwmark 0x111"), std::string::npos) << pod_.ip("-4 rule show").out;
      EXPECT_EQ(pod_.ip("-4 route show table 100").out, "");
      EXPECT_EQ(sh("tc -n " + pod_.name() + " filter show dev eth0 ingress").out, "");
      EXPECT_EQ(sh("tc -n " + pod_.name() + " filter show dev eth0 egress").out, "");
      EXPECT_EQ(sh("tc -n " + pod_.name() + " qdisc show dev eth0").out.find("clsact"), std::string::npos);
    }
  }

  // Destroyed in reverse: the agent first, then the namespaces (with the
  // bridge and veths), the scratch dirs, and last the bpffs root.
  TestBpffs bpffs_;
  TempDir work_{"cni"};
  TestNetns node_{"cninode"};
  TestNetns pod_{"cnipod"};
  std::unique_ptr<AgentProcess> agent_;

  int n_ = 0;
  std::string subnetPrefix_, bridge_, network_, podId_;
  CniParams params_;
  json list_;
};

class CniMode : public Cni, public ::testing::WithParamInterface<std::string> {};

// The whole life of a pod: bridge + host-local + sluice-cni ADD, the pod is
// redirected (outbound TCP reaches the stand-in with its original
// destination; a node-local probe arrives from 169.254.7.127), CHECK passes
// and catches damage, DEL (reverse order) cleans everything, twice.
TEST_P(CniMode, BridgeThenSluiceRedirectsAndDelCleansUp) {
  const bool socket = GetParam() == "socket";
  if (GetParam() == "tcx")
    if (std::string why = tcModeUnsupported(TcMode::Tcx); !why.empty()) GTEST_SKIP() << why;
  if (socket)
    if (std::string why = socketCaptureUnsupported(); !why.empty()) GTEST_SKIP() << why;
  if (socket) {
    list_["plugins"][1]["capture"] = "socket";
  } else {
    list_["plugins"][1]["capture"] = "tc";
    list_["plugins"][1]["tcMode"] = GetParam();
  }
  startAgent();
  CniRuntime rt(node_, work_.file("bin"), work_.path());

  auto add = rt.add(list_, params_);
  ASSERT_TRUE(add.ok) << add.describe();
  ASSERT_EQ(add.runs.size(), 2u);
  // sluice-cni returns the bridge's result unchanged.
  EXPECT_EQ(add.result, json::parse(add.runs[0].result.out)) << add.describe();
  ASSERT_EQ(add.result["ips"].size(), 1u) << add.result;
  EXPECT_EQ(add.result["ips"][0]["address"], podIp() + "/24");
  EXPECT_NE(add.runs[1].result.err.find("enrolled pod " + podId_ + " (default/web-"), std::string::npos)
      << add.runs[1].result.err;

  // Enrolled as asked: the container's pod id, the pod's address from
  // prevResult, the bridge port found as its host-side veth.
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].id, podId_);
  EXPECT_EQ(pods[0].netnsPath, pod_.path());
  EXPECT_EQ(pods[0].capture, socket ? "socket" : "tc");
  if (!socket) {
    EXPECT_EQ(pods[0].tcMode, GetParam());
  }
  // Captured at the socket, no interface gets a hook.
  EXPECT_EQ(pods[0].interfaces, socket ? std::vector<std::string>{} : std::vector<std::string>{"eth0"});
  EXPECT_EQ(pods[0].ips, std::vector<std::string>{podIp()});
  EXPECT_EQ(pods[0].hostIface.rfind("veth", 0), 0u) << pods[0].hostIface;

  // Rule 1: outbound TCP goes to the proxy, which sees the original
  // destination and relays it on.
  ProxiedPod proxied;
  ASSERT_NO_FATAL_FAILURE(startProxyAndServer(socket ? CaptureMode::Socket : CaptureMode::Tc, proxied));
  auto& standIn = proxied.standIn;
  const Endpoint dst = proxied.dst;
  {
    auto conn = tcpConnect(pod_, dst);
    ASSERT_TRUE(conn.ok()) << conn.error().message;
    auto echo = echoRoundTrip(conn->get(), "through the proxy");
    ASSERT_TRUE(echo.ok()) << echo.error().message;
    EXPECT_EQ(*echo, "through the proxy");
  }
  ASSERT_TRUE(standIn->waitForEvents(1, kIoTimeout));
  auto ev = standIn->events();
  EXPECT_EQ(ev[0].listener, "outbound") << describe(ev);
  EXPECT_EQ(ev[0].origDst, dst.str()) << describe(ev);
  EXPECT_EQ(ev[0].detail, "upstream ok") << describe(ev);

  // Rule 10: a connection from a node-local socket to the pod arrives from
  // the probe address (bound to it at connect() by the node's probe hook).
  auto app = TcpServer::start(pod_, Endpoint::of(podIp(), 0));
  ASSERT_TRUE(app.ok()) << app.error().message;
  {
    auto probe = tcpConnect(node_, Endpoint::of(podIp(), (*app)->port()));
    ASSERT_TRUE(probe.ok()) << probe.error().message;
    auto echo = echoRoundTrip(probe->get(), "probe");
    ASSERT_TRUE(echo.ok()) << echo.error().message;
  }
  ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ((*app)->peers()[0].ip(), PodTopology::kProbeV4);

  // CHECK passes while intact; damage (the policy rule gone) is reported.
  auto check = rt.checkOrDel(list_, params_, "CHECK", add.result);
  EXPECT_TRUE(check.ok) << check.describe();
  ASSERT_EQ(pod_.ip("-4 rule del pref 32764").exitCode, 0);
  check = rt.checkOrDel(list_, params_, "CHECK", add.result);
  ASSERT_FALSE(check.ok) << check.describe();
  ASSERT_EQ(check.runs.back().type, "sluice-cni");
  expectCniError(check.runs.back().result, cni::kCniDamaged, "is enrolled but its redirection is damaged");
  ASSERT_TRUE(check.error["details"].is_string()) << check.error;
  const std::string details = check.error["details"];
  EXPECT_FALSE(details.empty());
  EXPECT_TRUE(check.error["msg"].get<std::string>().ends_with(": " + details)) << check.error;

  // DEL as the runtime runs the chain, in reverse: sluice-cni first. The
  // pod is back to plain networking at once (the stand-in, still
  // listening, sees nothing; the server sees the pod itself) ...
  auto delSluice = rt.invokePlugin(list_, list_["plugins"][1], "DEL", params_, add.result);
  ASSERT_EQ(delSluice.exitCode, 0) << delSluice.describe();
  EXPECT_EQ(delSluice.out, "");
  {
    auto conn = tcpConnect(pod_, dst);
    ASSERT_TRUE(conn.ok()) << conn.error().message;
    auto echo = echoRoundTrip(conn->get(), "direct");
    ASSERT_TRUE(echo.ok()) << echo.error().message;
  }
  ASSERT_TRUE(proxied.server->waitForAccepts(2, kIoTimeout));
  EXPECT_EQ(proxied.server->peers().back().ip(), podIp());
  EXPECT_EQ(standIn->events().size(), 1u) << describe(standIn->events());
  standIn->stop();
  // ... then the bridge releases the address and the veth.
  auto delBridge = rt.invokePlugin(list_, list_["plugins"][0], "DEL", params_, add.result);
  ASSERT_EQ(delBridge.exitCode, 0) << delBridge.describe();
  expectNoPodState();
  EXPECT_FALSE(pathExists(work_.file("ipam/" + network_ + "/" + podIp()))) << "host-local kept the address";
  EXPECT_EQ(node_.ip("link show " + pods[0].hostIface).exitCode, 1) << "host veth still there";

  // DEL again, and CHECK now says the pod is not enrolled.
  auto del = rt.checkOrDel(list_, params_, "DEL", add.result);
  EXPECT_TRUE(del.ok) << del.describe();
  auto check2 = rt.invokePlugin(list_, list_["plugins"][1], "CHECK", params_, add.result);
  expectCniError(check2, cni::kCniNotEnrolled, "is not enrolled in sluice");
}

INSTANTIATE_TEST_SUITE_P(All, CniMode, ::testing::Values("tcx", "legacy", "socket"),
                         [](const auto& info) { return info.param; });

// ---- the hand-off to the node proxy (ZDS), through CNI_ARGS ----

// No node proxy connected: ADD fails with CNI code 11 (try again later, the
// runtime retries the sandbox) and leaves nothing of the pod in sluice.
TEST_F(Cni, AddWithoutANodeProxyIsTryAgainLaterAndLeavesNothing) {
  startHandOffAgent();
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  params_.args = cniArgs("web-0", "uid-try-" + std::to_string(::getpid()));
  auto add = rt.add(list_, params_);
  ASSERT_FALSE(add.ok) << add.describe();
  ASSERT_EQ(add.runs.back().type, "sluice-cni");
  expectCniError(add.runs.back().result, cni::kCniTryAgainLater, "no ztunnel connection");
  expectNoPodState();
  // The runtime cleans up the failed sandbox (DEL in reverse order).
  auto del = rt.checkOrDel(list_, params_, "DEL", json());
  EXPECT_TRUE(del.ok) << del.describe();
}

// The node proxy refuses the pod (15001 already bound in it by an app):
// ADD fails retryably with its reason, nothing of it is left.
TEST_F(Cni, RefusedHandOffIsTryAgainLaterAndLeavesNothing) {
  startHandOffAgent();
  auto proxy = startNodeProxy();
  ASSERT_TRUE(proxy);
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  params_.args = cniArgs("web-0", "uid-refused-" + std::to_string(::getpid()));
  auto add = rt.add(list_, params_);
  ASSERT_TRUE(add.ok) << "first a pod that works: " << add.describe();
  ASSERT_TRUE(rt.checkOrDel(list_, params_, "DEL", add.result).ok);
  // The sandbox again, now with the port taken.
  Fd app;
  ASSERT_TRUE(pod_.run([&]() -> Status {
                    app = Fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
                    sockaddr_in6 a{};
                    a.sin6_family = AF_INET6;
                    a.sin6_port = htons(15001);
                    if (::bind(app.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(app.get(), 1) != 0)
                      return Error::fromErrno(errno, "bind 15001");
                    return {};
                  })
                  .ok());
  add = rt.add(list_, params_);
  ASSERT_FALSE(add.ok) << add.describe();
  expectCniError(add.runs.back().result, cni::kCniTryAgainLater, "failure to start proxy");
  expectNoPodState();
  ASSERT_TRUE(rt.checkOrDel(list_, params_, "DEL", json()).ok);
}

// With the hand-off on, a runtime that passes no K8S_POD_UID gets a clear
// refusal (not retryable: retrying cannot add a uid).
TEST_F(Cni, AddWithoutAUidIsRefusedWhenHandingOff) {
  startHandOffAgent();
  auto proxy = startNodeProxy();
  ASSERT_TRUE(proxy);
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  params_.args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
  auto add = rt.add(list_, params_);
  ASSERT_FALSE(add.ok);
  expectCniError(add.runs.back().result, cni::kCniAgentFailed, "pod has no uid");
  expectNoPodState();
  ASSERT_TRUE(rt.checkOrDel(list_, params_, "DEL", json()).ok);
}

// A node, modelled: one agent, one node proxy serving every pod over ZDS,
// pods made by the real bridge + host-local plugins and enrolled by
// sluice-cni with the runtime's CNI_ARGS. Every pod's traffic reaches the
// listeners the node proxy opened from the fd it was handed; the node
// proxy's replacement, the agent's kill -9 and pod churn lose nothing.
TEST_F(Cni, NodeModelOneNodeProxyServesEveryPod) {
  if (std::string why = tcModeUnsupported(TcMode::Tcx); !why.empty())
    std::cout << "(" << why << ": the agent attaches with clsact)\n";
  startHandOffAgent();
  auto proxy = startNodeProxy();
  ASSERT_TRUE(proxy);
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  std::unique_ptr<TcpServer> server;  // on the bridge's gateway address, once the bridge exists
  Endpoint dst;

  struct NodePod {
    std::unique_ptr<TestNetns> ns;
    CniParams params;
    json result;
    std::string uid, id;
  };
  std::vector<NodePod> pods;
  auto addPod = [&](int i) {
    NodePod p;
    p.ns = std::make_unique<TestNetns>("cninodepod");
    EXPECT_TRUE(p.ns->ok()) << p.ns->error();
    p.uid = "0c0ffee0-0000-4000-8000-" + std::to_string(100000000000LL + ::getpid() * 100 + i);
    p.params.containerId = "n" + std::to_string(::getpid()) + "x" + std::to_string(i) + std::string(50, 'e');
    p.params.netns = p.ns->path();
    p.params.args = cniArgs("web-" + std::to_string(i), p.uid);
    p.id = cni::podIdForContainer(p.params.containerId);
    auto add = rt.add(list_, p.params);
    EXPECT_TRUE(add.ok) << add.describe();
    p.result = add.result;
    pods.push_back(std::move(p));
  };
  auto connect = [&](NodePod& p) { return connectAndEcho(*p.ns, dst); };
  auto relayedFor = [&](NodeProxyStandIn& np, const std::string& uid) {
    size_t n = 0;
    for (const auto& e : np.events())
      if (e.type == "connection" && e.uid == uid && e.proxy.detail == "upstream ok" && e.proxy.origDst == dst.str()) n++;
    return n;
  };
  for (int i = 0; i < 3; i++) addPod(i);
  ASSERT_EQ(proxy->runningPods().size(), 3u);
  auto s = TcpServer::start(node_, Endpoint::of(gatewayIp(), 0));
  ASSERT_TRUE(s.ok()) << s.error().message;
  server = std::move(*s);
  dst = Endpoint::of(gatewayIp(), server->port());
  auto listed = listPods();
  ASSERT_EQ(listed.size(), 3u);
  for (const auto& l : listed) {
    EXPECT_EQ(l.handoff, HandoffState::Acked) << l.id;
    EXPECT_EQ(l.identity.ns, "default");
    EXPECT_FALSE(l.identity.uid.empty());
  }
  for (auto& p : pods) {
    ASSERT_TRUE(connect(p).ok()) << p.id;
    EXPECT_EQ(relayedFor(*proxy, p.uid), 1u) << "pod " << p.id << " did not reach its own listeners";
  }

  // Under a connection loop: the node proxy is replaced, the agent is
  // killed and restarted.
  std::atomic<bool> stop{false};
  std::atomic<size_t> ok{0};
  std::vector<std::string> failures;
  std::thread loop([&] {
    while (!stop)
      for (auto& p : pods) {
        Status st = connect(p);
        if (st.ok())
          ok++;
        else
          failures.push_back(p.id + ": " + st.error().message);
      }
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  std::this_thread::sleep_for(300ms);
  startHandOffAgent();
  EXPECT_TRUE(proxy->waitFor([&](const NodeProxyEvent& e) { return e.type == "snapshot" && e.connection > 1; }, 5s));
  std::this_thread::sleep_for(300ms);
  size_t atAgentRestart = ok.load();
  std::vector<std::string> agentFailures = failures;
  // ztunnel's DaemonSet replaces its pod: the new one beside the old
  // (before Linux 6.6, without SO_REUSEPORT, after it: see HandOff).
  const bool overlap = kernelAssignsReuseport();
  if (!overlap) proxy->stop();
  auto next = NodeProxyStandIn::start(testNodeProxyConfig(zdsPath()));
  ASSERT_TRUE(next.ok()) << next.error().message;
  for (auto& p : pods) EXPECT_TRUE((*next)->waitForEvent("proxy-started", p.uid, 5s)) << p.id;
  if (overlap) proxy->stop();
  std::this_thread::sleep_for(300ms);
  stop = true;
  loop.join();
  proxy = std::move(*next);
  EXPECT_TRUE(agentFailures.empty()) << agentFailures.size() << " failed across the agent's restart, first: "
                                     << agentFailures.front();
  EXPECT_GE(atAgentRestart, 6u);
  // The old proxy's connections in flight are reset when it stops (see
  // HandOff.AgentAndNodeProxyRestartsLoseNothing); nothing else may fail.
  for (size_t i = agentFailures.size(); i < failures.size(); i++) {
    if (kernelAssignsReuseport()) {
      EXPECT_NE(failures[i].find("Connection reset by peer"), std::string::npos) << failures[i];
    }
  }
  std::cout << "node model: " << ok.load() << " connections across the agent's kill -9 and the node proxy's "
            << "replacement, " << failures.size() << " reset by the old proxy's stop\n";

  // Churn: a pod leaves (DEL: its listeners close), a new one comes.
  auto gone = std::move(pods.front());
  pods.erase(pods.begin());
  auto del = rt.checkOrDel(list_, gone.params, "DEL", gone.result);
  ASSERT_TRUE(del.ok) << del.describe();
  EXPECT_TRUE(proxy->waitForEvent("del", gone.uid, 3s));
  addPod(7);
  for (auto& p : pods) {
    size_t before = relayedFor(*proxy, p.uid);
    ASSERT_TRUE(connect(p).ok()) << p.id;
    EXPECT_EQ(relayedFor(*proxy, p.uid), before + 1) << "pod " << p.id << " went around the proxy";
  }
  auto runningUids = proxy->runningPods();
  EXPECT_EQ(runningUids.size(), pods.size());
  EXPECT_EQ(std::count(runningUids.begin(), runningUids.end(), gone.uid), 0);
  listed = listPods();
  EXPECT_EQ(listed.size(), pods.size()) << "a pod was lost or left behind";

  for (auto& p : pods) ASSERT_TRUE(rt.checkOrDel(list_, p.params, "DEL", p.result).ok) << p.id;
  EXPECT_TRUE(listPods().empty());
  EXPECT_TRUE(eventually([&] { return proxy->runningPods().empty(); }, 3s));
}

// DEL of a container sluice-cni never saw, with and without a netns.
TEST_F(Cni, DelOfAnUnknownContainerSucceeds) {
  startAgent();
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  CniParams unknown = params_;
  unknown.containerId = "never-added-" + std::to_string(::getpid());
  auto r = rt.invokePlugin(list_, list_["plugins"][1], "DEL", unknown, json());
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("was not enrolled; nothing to remove"), std::string::npos) << r.err;
  unknown.netns.clear();
  r = rt.invokePlugin(list_, list_["plugins"][1], "DEL", unknown, json());
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(listPods().empty());
}

// DEL when the plugin finds no agent to ask, for any reason — here a
// socket of another type at the agent's path (EPROTOTYPE), not only
// "nobody listens": success, or the pod would hang in Terminating.
TEST_F(Cni, DelWithNoAgentToAskSucceeds) {
  Fd other(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(socket().size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, socket().data(), socket().size());
  ASSERT_EQ(::bind(other.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  auto r = rt.invokePlugin(list_, list_["plugins"][1], "DEL", params_, json());
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("left for the agent's reconciliation"), std::string::npos) << r.err;
  auto del = rt.checkOrDel(list_, params_, "DEL", json());
  EXPECT_TRUE(del.ok) << del.describe();
  ::unlink(socket().c_str());
}

// ---- SIGTERM: an update or an uninstall ------------------------------------------

/// The agent with Kubernetes — the test API server, which has its DaemonSet
/// sluice-system/sluice-node — and --daemonset. It runs in the test's netns
/// (the API server's loopback), so the pod's bridge port is not found and
/// no probe SNAT is attached (a warning), which is not what these are about.
/// Pods are enrolled as asked (no Kubernetes identity in CNI_ARGS).
class CniUninstall : public Cni {
 protected:
  void SetUp() override {
    Cni::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto s = TestApiServer::start();
    ASSERT_TRUE(s.ok()) << s.error().message;
    api_ = std::move(*s);
    ASSERT_TRUE(api_->createNodeAgentPod().ok());
    // The DaemonSet runs on the nodes labelled for it (deploy/README.md,
    // switching some nodes only); node-a is.
    json ds = {{"metadata", {{"name", "sluice-node"}, {"namespace", "sluice-system"}}},
               {"spec",
                {{"selector", {{"matchLabels", {{"app.kubernetes.io/name", "sluice"}}}}},
                 {"template", {{"spec", {{"nodeSelector", {{"mesh-node-agent", "sluice"}}}}}}}}}};
    json node = {{"metadata", {{"name", "node-a"}, {"labels", {{"mesh-node-agent", "sluice"}}}}}};
    ASSERT_TRUE(api_->apply(json::array({{{"op", "create"}, {"kind", "daemonsets"}, {"object", ds}},
                                         {{"op", "create"}, {"kind", "nodes"}, {"object", node}}}))
                    .ok());
    params_.args = "IgnoreUnknown=1";
  }

  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "---- agent log ----\n" << agent_->log() << "\n";
    Cni::TearDown();
  }

  void startKubeAgent(const std::string& daemonSet = "sluice-node", const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {
        "--kube-api", api_->url(), "--kube-token-file", api_->tokenFile(), "--kube-ca-file", api_->caFile(),
        "--node-name", "node-a", "--cni-conf-dir", work_.file("net.d"), "--cni-agent-socket", socket(), "--daemonset",
        daemonSet, "--daemonset-namespace", "sluice-system", "--cni-bin-dir", work_.file("bin"),
        "--host-probe-snat-ip", probeV4(), "--host-probe-snat-ipv6", probeV6()};
    args.insert(args.end(), more.begin(), more.end());
    auto a = AgentProcess::start(bpffs_.root(), args, socket());
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  std::string conflistPath() const { return work_.file("net.d") + "/10-test.conflist"; }

  /// The agent runs in the test's netns, where other tests' pods have their
  /// node side too: an uninstall removes its probe addresses from lo, so
  /// each test's agent has its own (169.254.128.0/17, by process).
  static std::string probeV4() {
    const unsigned p = static_cast<unsigned>(::getpid());
    return "169.254." + std::to_string(128 + (p >> 8) % 127) + "." + std::to_string(1 + p % 254);
  }
  static std::string probeV6() { return "fd16:9254:7127:1337::" + std::to_string(::getpid() % 10000 + 1); }

  /// Every pin under the bpffs root (paths relative to it).
  std::vector<std::string> pins() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(bpffs_.root(), ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      out.push_back(fs::relative(it->path(), bpffs_.root()).string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string binary() const { return work_.file("bin") + "/sluice-cni"; }

  Status removeDaemonSet(const std::string& how) {
    json op = {{"kind", "daemonsets"}, {"namespace", "sluice-system"}, {"name", "sluice-node"}};
    if (how == "unselected") {
      // The node's label moved to the other node agent: the DaemonSet stays,
      // but no longer selects node-a.
      op = {{"op", "patch"}, {"kind", "nodes"}, {"name", "node-a"},
            {"patch", {{"metadata", {{"labels", {{"mesh-node-agent", "istio"}}}}}}}};
    } else if (how == "deleted") {
      op["op"] = "delete";
    } else {
      // A deletion with a finalizer (kubectl delete --cascade=foreground):
      // the object stays, marked, until its pods are gone.
      op["op"] = "patch";
      op["patch"] = {{"metadata", {{"deletionTimestamp", "2026-12-07T06:00:00Z"},
                                   {"finalizers", json::array({"foregroundDeletion"})}}}};
    }
    SLUICE_TRY(api_->apply(json::array({op})));
    return {};
  }

  std::unique_ptr<TestApiServer> api_;
};

class CniUninstallWhen : public CniUninstall, public ::testing::WithParamInterface<std::string> {};

// SIGTERM with the DaemonSet still there (an update), gone (404), being
// deleted (deletionTimestamp), no longer selecting the node (its
// nodeSelector), or the API unreachable. An update and an
// unreachable API change nothing; an uninstall takes sluice-cni out of the
// chain and its binary away, the running pod keeps its redirection (its
// connections still reach its proxy) until it is removed, a new pod starts
// through the chain as it is now (the bridge alone), and both DELs succeed.
TEST_P(CniUninstallWhen, SigtermTellsAnUpdateFromAnUninstall) {
  const std::string how = GetParam();
  ASSERT_NO_FATAL_FAILURE(startKubeAgent());
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  auto add = rt.add(list_, params_);
  ASSERT_TRUE(add.ok) << add.describe();
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  ProxiedPod proxied;
  ASSERT_NO_FATAL_FAILURE(
      startProxyAndServer(pods[0].capture == "socket" ? CaptureMode::Socket : CaptureMode::Tc, proxied));
  auto& standIn = proxied.standIn;
  const Endpoint dst = proxied.dst;
  Status echo = connectAndEcho(pod_, dst);
  ASSERT_TRUE(echo.ok()) << echo.error().message;
  ASSERT_TRUE(standIn->waitForEvents(1, kIoTimeout));
  const std::string conflist = readTextFile(conflistPath());
  ASSERT_TRUE(pathExists(binary()));
  const std::vector<std::string> pinsBefore = pins();
  ASSERT_FALSE(pinsBefore.empty());

  if (how == "deleted" || how == "deleting" || how == "unselected") {
    Status st = removeDaemonSet(how);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  if (how == "unreachable") ASSERT_TRUE(api_->fault({{"down", true}}).ok());
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  const std::string log = agent_->log();

  // The pod is enrolled and captured whatever SIGTERM meant: every pin
  // stays (the pod needs the node's too).
  EXPECT_EQ(pins(), pinsBefore) << "the pinned state changed";
  EXPECT_TRUE(pathExists(bpffs_.linkDir(podId_))) << "the running pod's pins";
  echo = connectAndEcho(pod_, dst);
  EXPECT_TRUE(echo.ok()) << echo.error().message;
  EXPECT_TRUE(standIn->waitForEvents(2, kIoTimeout)) << "the running pod's connection did not reach its proxy";

  if (how == "present" || how == "unreachable") {
    EXPECT_NE(log.find(how == "present" ? "DaemonSet sluice-system/sluice-node is still there"
                                        : "cannot ask whether DaemonSet sluice-system/sluice-node is being removed"),
              std::string::npos)
        << log;
    EXPECT_EQ(log.find("uninstalling sluice"), std::string::npos) << log;
    EXPECT_EQ(log.find("uninstall: "), std::string::npos) << log;
    EXPECT_EQ(readTextFile(conflistPath()), conflist) << "the chain changed";
    EXPECT_TRUE(pathExists(binary()));
    return;
  }
  const char* why = how == "deleted"    ? "DaemonSet sluice-system/sluice-node is gone (404): uninstalling"
                    : how == "deleting" ? "is being deleted (deletionTimestamp 2026-12-07T06:00:00Z): uninstalling"
                                        : "DaemonSet sluice-system/sluice-node no longer selects node node-a (nodeSelector "
                                          "mesh-node-agent=sluice): uninstalling";
  EXPECT_NE(log.find(why), std::string::npos) << log;
  EXPECT_NE(log.find("uninstall: 1 pod(s) stay enrolled"), std::string::npos) << log;
  const json now = json::parse(readTextFile(conflistPath()), nullptr, false);
  ASSERT_TRUE(now.is_object());
  ASSERT_EQ(now["plugins"].size(), 1u) << now;
  EXPECT_EQ(now["plugins"][0]["type"], "bridge");
  EXPECT_FALSE(pathExists(binary()));

  // A new pod: the runtime runs the chain as it is now.
  TestNetns pod2{"cnipod"};
  ASSERT_TRUE(pod2.ok()) << pod2.error();
  CniParams p2 = params_;
  p2.containerId = "second-" + std::to_string(::getpid()) + "-" + std::to_string(n_);
  p2.netns = pod2.path();
  auto add2 = rt.add(now, p2);
  ASSERT_TRUE(add2.ok) << add2.describe();
  EXPECT_EQ(add2.runs.size(), 1u);
  echo = connectAndEcho(pod2, dst);
  EXPECT_TRUE(echo.ok()) << echo.error().message;

  // Both pods removed as the runtime does now: DEL succeeds.
  auto del = rt.checkOrDel(now, params_, "DEL", add.result);
  EXPECT_TRUE(del.ok) << del.describe();
  auto del2 = rt.checkOrDel(now, p2, "DEL", add2.result);
  EXPECT_TRUE(del2.ok) << del2.describe();
}

INSTANTIATE_TEST_SUITE_P(DaemonSet, CniUninstallWhen,
                         ::testing::Values("present", "deleted", "deleting", "unselected", "unreachable"),
                         [](const auto& info) { return info.param; });

// A --daemonset that names no DaemonSet while the agent runs is a wrong
// name, not an uninstall to come: said at start, and SIGTERM changes nothing.
TEST_F(CniUninstall, AMisnamedDaemonSetNeverUninstalls) {
  ASSERT_NO_FATAL_FAILURE(startKubeAgent("sluice-nodes"));
  EXPECT_NE(agent_->log().find("DaemonSet sluice-system/sluice-nodes (--daemonset) does not exist while this agent "
                               "runs: the name is wrong"),
            std::string::npos)
      << agent_->log();
  const std::string conflist = readTextFile(conflistPath());
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  EXPECT_NE(agent_->log().find("did not exist at start (a wrong --daemonset); not uninstalling"), std::string::npos)
      << agent_->log();
  EXPECT_EQ(readTextFile(conflistPath()), conflist);
  EXPECT_TRUE(pathExists(binary()));
}

// An uninstall with no pod enrolled takes the node's pinned state too
// (programs, maps, the socket mode's node hooks): nothing is left of sluice.
TEST_F(CniUninstall, UninstallWithNoPodEnrolledRemovesThePinnedState) {
  ASSERT_NO_FATAL_FAILURE(startKubeAgent());
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  auto add = rt.add(list_, params_);
  ASSERT_TRUE(add.ok) << add.describe();
  auto del = rt.checkOrDel(list_, params_, "DEL", add.result);
  ASSERT_TRUE(del.ok) << del.describe();
  ASSERT_TRUE(listPods().empty());
  ASSERT_TRUE(pathExists(bpffs_.root() + "/pods")) << "the pinned registry";
  // The probe addresses a pod's node side in the agent's netns adds (this
  // fixture's pods have theirs in node_, where nothing is attached).
  struct ProbeAddrsGuard {
    ~ProbeAddrsGuard() { (void)removeProbeAddrs(probeV4(), probeV6()); }
  } addrsGuard;
  ASSERT_TRUE(ensureProbeAddrs(probeV4(), probeV6()).ok());
  ASSERT_TRUE(checkProbeAddrs(probeV4(), probeV6()).empty());
  const auto defaultsBefore = checkProbeAddrs(SLUICE_DEFAULT_PROBE_V4, SLUICE_DEFAULT_PROBE_V6);
  Status st = removeDaemonSet("deleted");
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  const std::string log = agent_->log();
  EXPECT_NE(log.find("uninstall: no pod was enrolled; removed the node's pinned state " + bpffs_.root()),
            std::string::npos)
      << log;
  EXPECT_FALSE(pathExists(bpffs_.root())) << "pins left behind";
  EXPECT_EQ(checkProbeAddrs(probeV4(), probeV6()).size(), 2u) << "its probe addresses are left on lo";
  EXPECT_EQ(checkProbeAddrs(SLUICE_DEFAULT_PROBE_V4, SLUICE_DEFAULT_PROBE_V6), defaultsBefore)
      << "the default probe addresses (other pods' here) are not this agent's";
  EXPECT_FALSE(pathExists(binary()));
  const json now = json::parse(readTextFile(conflistPath()), nullptr, false);
  ASSERT_TRUE(now.is_object());
  EXPECT_EQ(now["plugins"].size(), 1u) << now;
}

// The agent's uninstall knows the layout it was given: an owned conflist
// by another name (--cni-owned-conflist-name) is deleted whole, the
// primary's file is left byte for byte, and the runtime's pick is the
// primary's again.
TEST_F(CniUninstall, UninstallDeletesTheOwnedConflistByItsGivenName) {
  // The primary's file as the primary CNI wrote it (without sluice-cni),
  // then the init step's install into sluice's own conflist.
  json primary = list_;
  primary["plugins"].erase(1);
  ASSERT_TRUE(writeTextFile(conflistPath(), primary.dump(2)));
  auto inst = runCommand({builtBinary("sluice-cni"), "install", "--cni-conf-dir", work_.file("net.d"), "--cni-bin-dir",
                          work_.file("bin"), "--agent-socket", socket(), "--cni-owned-conflist-name", "01-own.conflist"});
  ASSERT_EQ(inst.exitCode, 0) << inst.describe();
  const std::string owned = work_.file("net.d") + "/01-own.conflist";
  ASSERT_TRUE(pathExists(owned));
  const std::string primaryBytes = readTextFile(conflistPath());
  ASSERT_NO_FATAL_FAILURE(startKubeAgent("sluice-node", {"--cni-owned-conflist-name", "01-own.conflist"}));
  Status st = removeDaemonSet("deleted");
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  EXPECT_NE(agent_->log().find("uninstall: removed " + owned), std::string::npos) << agent_->log();
  EXPECT_FALSE(pathExists(owned)) << readTextFile(owned);
  EXPECT_EQ(readTextFile(conflistPath()), primaryBytes) << "the primary's file changed";
  EXPECT_FALSE(pathExists(binary()));
}

// The runtime deletes the netns before (or instead of) a clean DEL: DEL
// still succeeds and the agent removes everything of the pod. The network
// is an older spec version (0.4.0), whose results sluice-cni reads too.
TEST_F(Cni, DelAfterTheNetnsIsGoneCleansUp) {
  startAgent();
  list_["cniVersion"] = "0.4.0";
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  auto add = rt.add(list_, params_);
  ASSERT_TRUE(add.ok) << add.describe();
  EXPECT_EQ(add.result["cniVersion"], "0.4.0") << add.result;
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].ips, std::vector<std::string>{podIp()});
  pod_.remove();
  auto del = rt.checkOrDel(list_, params_, "DEL", add.result);
  ASSERT_TRUE(del.ok) << del.describe();
  expectNoPodState();
}

// A runtime that passes CNI_NETNS relative to its working directory: the
// agent gets (and records) the absolute path, so its sweep, which runs in
// another directory, finds the pod; DEL works the same way.
TEST_F(Cni, RelativeNetnsIsRecordedAbsolute) {
  startAgent();
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  rt.cwd = "/var/run/netns";
  CniParams p = params_;
  p.netns = pod_.name();
  auto add = rt.add(list_, p);
  ASSERT_TRUE(add.ok) << add.describe();
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  char real[PATH_MAX];
  ASSERT_TRUE(::realpath(rt.cwd.c_str(), real));
  EXPECT_EQ(pods[0].netnsPath, std::string(real) + "/" + pod_.name());
  auto check = client().check(podId_);
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_TRUE(check->intact) << check->problems.size();
  auto del = rt.checkOrDel(list_, p, "DEL", add.result);
  ASSERT_TRUE(del.ok) << del.describe();
  expectNoPodState();
}

// Fail closed: with the agent down and no Kubernetes credentials to judge
// the pod by (CniKube below has them), ADD is a CNI error ("try again
// later") and enrolls nothing; the runtime's clean-up DEL of the chain
// succeeds.
TEST_F(Cni, AddWithTheAgentDownFailsClosedAndLeavesNothing) {
  startAgent();
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  auto add = rt.add(list_, params_);
  ASSERT_FALSE(add.ok) << add.describe();
  ASSERT_EQ(add.runs.size(), 2u) << add.describe();
  expectCniError(add.runs[1].result, cni::kCniTryAgainLater, "the sluice agent is not running");
  EXPECT_NE(add.error["msg"].get<std::string>().find("not started (fail closed)"), std::string::npos) << add.error;
  expectNoPinnedPodState();

  // What containerd does after a failed ADD.
  auto del = rt.checkOrDel(list_, params_, "DEL", json());
  EXPECT_TRUE(del.ok) << del.describe();
  EXPECT_NE(del.runs[0].result.err.find("left for the agent's reconciliation"), std::string::npos)
      << del.runs[0].result.err;
  expectNoPinnedPodState();
}

// Bad input through the binary: each a CNI error with its code and a
// readable message; nothing enrolled, the agent unharmed.
TEST_F(Cni, BadInputIsACniErrorAndChangesNothing) {
  startAgent();
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  const std::string plugin = rt.pluginPath("sluice-cni");
  // The bridge's result, as the runtime would pass it on.
  auto bridgeAdd = rt.invokePlugin(list_, list_["plugins"][0], "ADD", params_, json());
  ASSERT_EQ(bridgeAdd.exitCode, 0) << bridgeAdd.describe();
  const json prev = json::parse(bridgeAdd.out);
  json conf = list_["plugins"][1];
  conf["cniVersion"] = "1.0.0";
  conf["name"] = network_;
  conf["prevResult"] = prev;

  expectCniError(rt.invoke(plugin, "ADD", params_, "{\"cniVersion\": \"1.0.0\", oops"), cni::kCniDecodeFailure,
                 "not valid JSON");
  expectCniError(rt.invoke(plugin, "ADD", params_, ""), cni::kCniDecodeFailure, "no network configuration on stdin");

  CniParams noNetns = params_;
  noNetns.netns.clear();
  expectCniError(rt.invoke(plugin, "ADD", noNetns, conf.dump()), cni::kCniInvalidEnvironment,
                 "CNI_NETNS is not set (required for ADD)");
  CniParams noId = params_;
  noId.containerId.clear();
  expectCniError(rt.invoke(plugin, "ADD", noId, conf.dump()), cni::kCniInvalidEnvironment,
                 "CNI_CONTAINERID is not set");
  expectCniError(rt.invoke(plugin, "REBOOT", params_, conf.dump()), cni::kCniInvalidEnvironment,
                 "unknown CNI_COMMAND 'REBOOT'");

  json v = conf;
  v["cniVersion"] = "9.9.9";
  expectCniError(rt.invoke(plugin, "ADD", params_, v.dump()), cni::kCniIncompatibleVersion,
                 "cniVersion 9.9.9 is not supported by sluice-cni");

  CniParams gone = params_;
  gone.netns = "/run/netns/sluice-cni-gone-" + std::to_string(::getpid());
  expectCniError(rt.invoke(plugin, "ADD", gone, conf.dump()), cni::kCniUnknownContainer,
                 "network namespace " + gone.netns + " does not exist");

  // A path that exists but is no netns: the agent's refusal, passed on.
  CniParams notNetns = params_;
  notNetns.netns = work_.file("net.d/10-test.conflist");
  expectCniError(rt.invoke(plugin, "ADD", notNetns, conf.dump()), cni::kCniAgentFailed,
                 "sluice agent could not enroll pod " + podId_);

  json bad = conf;
  bad["tcMode"] = "xdp";
  expectCniError(rt.invoke(plugin, "ADD", params_, bad.dump()), cni::kCniInvalidConfig,
                 "'tcMode' must be auto, tcx or legacy");
  bad = conf;
  bad.erase("prevResult");
  expectCniError(rt.invoke(plugin, "ADD", params_, bad.dump()), cni::kCniInvalidConfig, "prevResult is missing");
  bad = conf;
  bad["prevResult"]["ips"][0]["address"] = "10.0.0.300/24";
  expectCniError(rt.invoke(plugin, "ADD", params_, bad.dump()), cni::kCniInvalidConfig,
                 "is not an IP address in CIDR form");

  // Nothing got enrolled and the agent still answers.
  EXPECT_TRUE(listPods().empty());
  expectNoPinnedPodState();
  auto h = client().health();
  ASSERT_TRUE(h.ok()) << h.error().message;

  // The same ADD, well-formed, works afterwards; two at once (a runtime
  // retrying) enroll the pod once.
  std::vector<CommandResult> results(2);
  {
    std::thread t([&] { results[0] = rt.invoke(plugin, "ADD", params_, conf.dump()); });
    results[1] = rt.invoke(plugin, "ADD", params_, conf.dump());
    t.join();
  }
  for (const auto& r : results) {
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(json::parse(r.out, nullptr, false), prev) << r.out;
  }
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].id, podId_);
  auto del = rt.checkOrDel(list_, params_, "DEL", prev);
  EXPECT_TRUE(del.ok) << del.describe();
  expectNoPodState();
}

// VERSION and --help through the built binary.
TEST_F(Cni, VersionAndHelp) {
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  auto r = rt.invoke(rt.pluginPath("sluice-cni"), "VERSION", params_, R"({"cniVersion":"1.0.0"})");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto j = json::parse(r.out, nullptr, false);
  EXPECT_EQ(j["cniVersion"], "1.0.0") << r.out;
  EXPECT_EQ(j["supportedVersions"], json({"0.3.0", "0.3.1", "0.4.0", "1.0.0"})) << r.out;
  auto help = runCommand({rt.pluginPath("sluice-cni"), "--help"});
  EXPECT_EQ(help.exitCode, 0) << help.describe();
  EXPECT_NE(help.out.find("chained CNI plugin"), std::string::npos) << help.out;
}


// ---- the agent away: only the mesh waits (sluice-cni asks Kubernetes itself) ----
//
//   node netns                                   the test's netns
//   sluice-cni ──HTTPS──▶ 127.0.0.1:P (TcpRelay) ──▶ TestApiServer 127.0.0.1:P
//   sluiced (when started) ─────────────────────────┘
//
// The credentials are the kubeconfig `sluice-cni install --kubeconfig`
// writes from a service account directory (the test API server's token and
// CA) and KUBERNETES_SERVICE_HOST/PORT.
class CniKube : public Cni {
 protected:
  using Labels = std::map<std::string, std::string>;
  struct KubePod {
    std::unique_ptr<TestNetns> netns;
    CniParams params;
    std::string id;
    std::string uid;
  };

  void SetUp() override {
    Cni::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto s = TestApiServer::start();
    ASSERT_TRUE(s.ok()) << s.error().message;
    api_ = std::move(*s);
    ASSERT_TRUE(api_->createNamespace("shop").ok());
    ASSERT_TRUE(api_->createNamespace("mesh", {{"istio.io/dataplane-mode", "ambient"}}).ok());
    ASSERT_TRUE(api_->createNamespace("kube-system").ok());
    ASSERT_TRUE(api_->createNodeAgentPod().ok());
    auto relay = TcpRelay::start(node_, Endpoint::of("127.0.0.1", api_->port()), Endpoint::of("127.0.0.1", api_->port()));
    ASSERT_TRUE(relay.ok()) << relay.error().message;
    relay_ = std::move(*relay);
    ASSERT_NO_FATAL_FAILURE(install());
  }

  void TearDown() override {
    if (agent_ && HasFailure()) std::cerr << "---- agent log ----\n" << agent_->log() << "\n";
    if (agent_)
      if (auto c = agent_->client(); c.ok())
        if (auto pods = c->listPods(); pods.ok())
          for (const auto& p : *pods) (void)c->removePod(p.id);
    Cni::TearDown();
  }

  /// `sluice-cni install` again over the primary conflist, as the init
  /// container runs it in the DaemonSet: the kubeconfig from the service
  /// account, and @p extra flags.
  void install(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {"env", "KUBERNETES_SERVICE_HOST=127.0.0.1",
                                     "KUBERNETES_SERVICE_PORT=" + std::to_string(api_->port()), builtBinary("sluice-cni"),
                                     "install", "--cni-conf-dir", work_.file("net.d"), "--cni-bin-dir", work_.file("bin"),
                                     "--agent-socket", socket(), "--kubeconfig", kubeconfig(), "--service-account-dir",
                                     fs::path(api_->tokenFile()).parent_path().string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto r = runCommand(argv);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.out.find("wrote the Kubernetes credentials for the API at https://127.0.0.1:"), std::string::npos) << r.out;
    list_ = json::parse(readTextFile(work_.file("net.d/10-test.conflist")));
    ASSERT_EQ(list_["plugins"][1]["kubeconfig"], kubeconfig()) << list_;
    struct stat st {};
    ASSERT_EQ(::stat(kubeconfig().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }

  std::string kubeconfig() const { return work_.file("cni-kubeconfig"); }

  /// A pod in the API (on node-a) and its sandbox's netns, with the CNI
  /// parameters containerd passes for it.
  KubePod pod(const std::string& ns, const std::string& name, const Labels& labels = {}) {
    KubePod p;
    p.netns = std::make_unique<TestNetns>("cnik");
    EXPECT_TRUE(p.netns->ok()) << p.netns->error();
    TestPod tp;
    tp.namespaceName = ns;
    tp.name = name;
    tp.uid = randomPodUid();
    tp.labels = labels;
    EXPECT_TRUE(api_->createPod(tp).ok());
    p.uid = tp.uid;
    p.params.containerId = "k" + std::to_string(::getpid()) + "x" + std::to_string(gCounter++) + "x";
    p.params.containerId += std::string(64 - p.params.containerId.size(), 'e');
    p.params.netns = p.netns->path();
    p.params.args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name + ";K8S_POD_UID=" + tp.uid;
    p.id = cni::podIdForContainer(p.params.containerId);
    return p;
  }

  void startKubeAgent(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--kube-api", "https://127.0.0.1:" + std::to_string(api_->port()), "--kube-token-file",
                                     api_->tokenFile(), "--kube-ca-file", api_->caFile(), "--node-name", "node-a"};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_NO_FATAL_FAILURE(startAgent(args));
    ASSERT_TRUE(agent_->waitKubeSynced(15s)) << "the agent never synced with the API server";
  }

  /// ADD passed the pod through: exit 0 and the main plugin's result
  /// unchanged; sluice-cni's stderr says why.
  static void expectPassedThrough(const ChainOutcome& add, const std::string& why) {
    ASSERT_TRUE(add.ok) << add.describe();
    ASSERT_EQ(add.runs.size(), 2u);
    EXPECT_EQ(add.result, json::parse(add.runs[0].result.out)) << add.describe();
    EXPECT_NE(add.runs[1].result.err.find(why), std::string::npos) << add.runs[1].result.err;
  }

  /// The runtime tears a sandbox down (DEL, reverse order; after a failed
  /// ADD without a cached result).
  void del(const CniRuntime& rt, const KubePod& p, const json& cached = nullptr) {
    auto d = rt.checkOrDel(list_, p.params, "DEL", cached);
    EXPECT_TRUE(d.ok) << d.describe();
  }

  std::unique_ptr<TestApiServer> api_;
  std::unique_ptr<TcpRelay> relay_;
};

// The issue's "done means": sluiced stopped, a kube-system pod and a pod of
// a namespace outside the mesh start (the first without any API request),
// a mesh pod fails with code 11 and starts once the agent is back.
TEST_F(CniKube, AgentDownOnlyTheMeshWaits) {
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  KubePod sys = pod("kube-system", "coredns-1");
  KubePod plain = pod("shop", "web");
  KubePod meshPod = pod("mesh", "app");
  auto gets = api_->countRequests("get");
  ASSERT_TRUE(gets.ok());

  auto a = rt.add(list_, sys.params);
  expectPassedThrough(a, "is not in the mesh (namespace kube-system is excluded); passed through without the agent");
  EXPECT_EQ(*api_->countRequests("get"), *gets) << "asked the API about an excluded namespace's pod";

  auto b = rt.add(list_, plain.params);
  expectPassedThrough(b, "(shop/web) is not in the mesh (neither the pod nor namespace shop is labelled "
                         "istio.io/dataplane-mode=ambient); passed through without the agent");
  EXPECT_GE(*api_->countRequests("get", "/namespaces/shop/pods/web"), 1);

  auto m = rt.add(list_, meshPod.params);
  ASSERT_FALSE(m.ok) << m.describe();
  ASSERT_EQ(m.runs.size(), 2u);
  expectCniError(m.runs[1].result, cni::kCniTryAgainLater,
                 "(mesh/app) is in the ambient mesh (namespace labelled istio.io/dataplane-mode=ambient) and the sluice "
                 "agent is not running");
  del(rt, meshPod);

  // The agent back: the runtime's retry enrolls the pod.
  ASSERT_NO_FATAL_FAILURE(startKubeAgent());
  m = rt.add(list_, meshPod.params);
  ASSERT_TRUE(m.ok) << m.describe();
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].id, meshPod.id);
  EXPECT_EQ(pods[0].identity.uid, meshPod.uid);
  EXPECT_EQ(pods[0].netnsPath, meshPod.netns->path());

  del(rt, meshPod, m.result);
  EXPECT_TRUE(listPods().empty());
  del(rt, plain, b.result);
  del(rt, sys, a.result);
}

// The API server unreachable: no guess for a pod it would have to judge
// (code 11), while an excluded namespace's pod still starts.
TEST_F(CniKube, ApiUnreachableFailsEveryPodButTheExcludedOnes) {
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  KubePod sys = pod("kube-system", "coredns-2");
  KubePod plain = pod("shop", "web");
  ASSERT_TRUE(api_->fault({{"down", true}}).ok());
  auto a = rt.add(list_, sys.params);
  expectPassedThrough(a, "namespace kube-system is excluded");
  auto b = rt.add(list_, plain.params);
  ASSERT_FALSE(b.ok) << b.describe();
  expectCniError(b.runs.back().result, cni::kCniTryAgainLater,
                 "and the Kubernetes API cannot tell whether pod " + plain.id + " (shop/web) is in the mesh");
  ASSERT_TRUE(api_->fault({{"up", true}}).ok());
  del(rt, plain);
  del(rt, sys, a.result);
}

// Credentials the API refuses (401): code 11, in one line.
TEST_F(CniKube, RefusedCredentialsAreTryAgainLaterInOneLine) {
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  KubePod plain = pod("shop", "web");
  ASSERT_TRUE(api_->rotateToken("a-token-the-kubeconfig-does-not-have").ok());
  auto b = rt.add(list_, plain.params);
  ASSERT_FALSE(b.ok) << b.describe();
  expectCniError(b.runs.back().result, cni::kCniTryAgainLater, ": 401 ");
  const std::string msg = b.error["msg"];
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find("GET /api/v1/namespaces/shop/pods/web: 401"), std::string::npos) << msg;
  del(rt, plain);
}

// Operators' own selection (Istio's ambient.enablementSelectors): the same
// selector in the agent (flag) and the plugin (install's flag into its
// entry) enrolls a pod the default would not, and leaves alone a pod the
// default would enroll — with the agent and without it alike.
TEST_F(CniKube, EnablementSelectorsJudgeAlikeInTheAgentAndThePlugin) {
  const std::string selector = "- podSelector:\n    matchLabels:\n      app: picked\n";
  ASSERT_NO_FATAL_FAILURE(install({"--ambient-enablement-selector", selector}));
  EXPECT_EQ(list_["plugins"][1]["enablementSelectors"], json::parse(R"([{"podSelector":{"matchLabels":{"app":"picked"}}}])"))
      << list_;
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  KubePod picked = pod("shop", "picked", {{"app", "picked"}});
  KubePod skipped = pod("mesh", "skipped");

  // Without the agent: the plugin's own judgement.
  auto p = rt.add(list_, picked.params);
  ASSERT_FALSE(p.ok) << p.describe();
  expectCniError(p.runs.back().result, cni::kCniTryAgainLater,
                 "is in the ambient mesh (selected by enablement selector 0 (pods: app=picked; namespaces: everything))");
  del(rt, picked);
  auto s = rt.add(list_, skipped.params);
  expectPassedThrough(s, "is not in the mesh (no enablement selector selects it (namespace mesh))");
  del(rt, skipped, s.result);
  // The entry as the agent puts it back after the primary CNI rewrote its
  // file (no rules in it): the rules install wrote beside the credentials
  // still apply.
  json bare = list_;
  bare["plugins"][1].erase("enablementSelectors");
  p = rt.add(bare, picked.params);
  ASSERT_FALSE(p.ok) << p.describe();
  expectCniError(p.runs.back().result, cni::kCniTryAgainLater, "is in the ambient mesh (selected by enablement selector 0");
  del(rt, picked);

  // With the agent given the same selector.
  ASSERT_NO_FATAL_FAILURE(startKubeAgent({"--ambient-enablement-selector", selector}));
  p = rt.add(list_, picked.params);
  ASSERT_TRUE(p.ok) << p.describe();
  s = rt.add(list_, skipped.params);
  expectPassedThrough(s, "is not in the mesh (not in the ambient mesh: no enablement selector selects it");
  auto pods = listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].identity.uid, picked.uid);
  del(rt, picked, p.result);
  del(rt, skipped, s.result);
}

// The plugin's outcome of each command is a line of the agent's log, where
// `kubectl logs` of the agent shows it.
TEST_F(CniKube, ThePluginsLinesAreInTheAgentsLog) {
  ASSERT_NO_FATAL_FAILURE(startKubeAgent());
  CniRuntime rt(node_, work_.file("bin"), work_.path());
  KubePod plain = pod("shop", "web");
  KubePod meshPod = pod("mesh", "app");
  auto b = rt.add(list_, plain.params);
  ASSERT_TRUE(b.ok) << b.describe();
  auto m = rt.add(list_, meshPod.params);
  ASSERT_TRUE(m.ok) << m.describe();
  del(rt, meshPod, m.result);
  del(rt, plain, b.result);
  const std::string log = agent_->log();
  const std::string plainPod = "pod " + plain.id + " (shop/web)";
  const std::string meshName = "pod " + meshPod.id + " (mesh/app)";
  EXPECT_NE(log.find("sluice-cni: ADD " + plainPod + ": " + plainPod + " is not in the mesh (not in the ambient mesh: "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("sluice-cni: ADD " + meshName + ": enrolled " + meshName + " (netns "), std::string::npos) << log;
  EXPECT_NE(log.find("sluice-cni: DEL " + meshName + ": removed " + meshName + "\n"), std::string::npos) << log;
  EXPECT_NE(log.find("sluice-cni: DEL " + plainPod + ": " + plainPod + " was not enrolled; nothing to remove\n"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace sluice::test
