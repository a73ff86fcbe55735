// The agent as ztunnel's node agent (issue 12): sluiced --ztunnel-socket
// hands every pod it enrolls to the node proxy over ZDS, in Istio's order,
// fails an enrollment the proxy does not take (retryably, leaving nothing),
// sends its snapshot to every (re)connecting proxy from the pinned registry,
// and keeps serving when a peer misbehaves. The node proxy is the stand-in
// in node-proxy mode (NodeProxyStandIn, in-process): it opens its listeners
// inside each pod from the netns fd it was handed.
//
//   test process                                 per pod: node netns  pod netns
//   +----------------------------------+         +-----------+ veth +-----------------+
//   | sluiced (child, --ztunnel-socket)|-enroll->| echo      |<---->| eth0, lo (tc)   |
//   |   TMP/zds.sock <-- NodeProxyStandIn --------------fd------------> listeners     |
//   | app sockets, connection loops    |         +-----------+      +-----------------+
#include <bpf/bpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <thread>

#include "loader/cgroup.h"
#include "enroll/datapath.h"
#include "base/fd.h"
#include "loader/sk_lookup_stubs.h"
#include "test/common/agent_process.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/common/zds_peers.h"
#include "userspace/agent/zds/wire.h"
#include "test/standin/node_proxy.h"
#include "userspace/sluicectl/cli.h"

namespace sluice::test {
namespace {

// Whether fd @p name of @p pid is a pod's sk_lookup program or its cookie
// array (loader/sk_lookup_stubs.h), by the BPF object id in its fdinfo.
bool isSkLookupStub(pid_t pid, const char* name) {
  std::ifstream info("/proc/" + std::to_string(pid) + "/fdinfo/" + name);
  for (std::string line; std::getline(info, line);) {
    unsigned id = 0;
    if (std::sscanf(line.c_str(), "prog_id: %u", &id) == 1) {
      Fd fd(bpf_prog_get_fd_by_id(id));
      bpf_prog_info pi{};
      __u32 len = sizeof(pi);
      return fd.valid() && bpf_obj_get_info_by_fd(fd.get(), &pi, &len) == 0 &&
             std::string(pi.name) == kSkLookupStubName;
    }
    if (std::sscanf(line.c_str(), "map_id: %u", &id) == 1) {
      Fd fd(bpf_map_get_fd_by_id(id));
      bpf_map_info mi{};
      __u32 len = sizeof(mi);
      return fd.valid() && bpf_obj_get_info_by_fd(fd.get(), &mi, &len) == 0 &&
             std::string(mi.name) == kSkLookupStubName;
    }
  }
  return false;
}

// The open fds of @p pid, apart from the pods' sk_lookup programs loaded
// ahead (an agent holds up to kSkLookupStubsAhead, two fds each, as many
// as its idle-priority refill has made by then): counted in @p stubs.
size_t fdCountOf(pid_t pid, size_t* stubs = nullptr) {
  size_t n = 0, s = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return 0;
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (isSkLookupStub(pid, e->d_name))
      s++;
    else
      n++;
  }
  ::closedir(d);
  if (stubs) *stubs = s;
  return n;
}

/// One pod of the modelled node: its own node/pod netns pair and a server
/// on its node side.
struct Pod {
  PodTopology topo;
  std::unique_ptr<TcpServer> server;
  std::string uid;

  explicit Pod(const std::string& uidIn) : uid(uidIn) {}
  Status startServer() {
    auto s = TcpServer::start(topo.node(), Endpoint::of(PodTopology::kNodeV4, 0));
    SLUICE_TRY(s);
    server = std::move(*s);
    return {};
  }
  /// With @p nodeSide, probe SNAT on the pod's node netns. Every Pod has the
  /// same addresses (PodTopology), so only one of several can have it.
  PodSpec spec(bool nodeSide = false) const {
    PodSpec s;
    s.netnsPath = topo.pod().path();
    if (nodeSide) s.nodeNetnsPath = topo.node().path();
    s.identity = {uid, "web-" + uid, "shop", "web"};
    return s;
  }
  /// One outbound connection through the redirect, echoed.
  Status connectOut() { return connectAndEcho(topo.pod(), server->local()); }
};

class HandOff : public ::testing::TestWithParam<TcMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(mode()); !why.empty()) GTEST_SKIP() << why;
    ASSERT_FALSE(tmp_.path().empty());
  }
  void TearDown() override {
    if (agent_)
      if (auto c = agent_->client(); c.ok())
        if (auto pods = c->listPods(); pods.ok())
          for (const auto& p : *pods) (void)c->removePod(p.id);
    proxies_.clear();
    agent_.reset();
  }
  TcMode mode() const { return GetParam(); }
  std::string zdsPath() const { return tmp_.file("zds.sock"); }

  void startAgent(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--capture", "tc", "--tc-mode", modeName(mode()), "--ztunnel-socket", zdsPath(),
                                     "--ztunnel-timeout-ms", "1000"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto a = AgentProcess::start(bpffs_.root(), args, tmp_.file("agent.sock"));
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }
  NodeProxyStandIn& startProxy() {
    auto p = NodeProxyStandIn::start(testNodeProxyConfig(zdsPath()));
    EXPECT_TRUE(p.ok()) << p.error().message;
    proxies_.push_back(std::move(*p));
    EXPECT_TRUE(proxies_.back()->waitForEvent("snapshot", "", 5s)) << "no snapshot from the agent\n" << agent_->log();
    return *proxies_.back();
  }
  agent::Client client() {
    auto c = agent_->client();
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }
  std::unique_ptr<Pod> makePod(const std::string& uid) {
    auto p = std::make_unique<Pod>(uid + "-" + std::to_string(::getpid()));
    EXPECT_TRUE(p->topo.ok()) << p->topo.error();
    Status st = p->startServer();
    EXPECT_TRUE(st.ok()) << st.error().message;
    return p;
  }
  /// Connections of the pod's proxy that the node proxy relayed.
  static size_t relayed(const NodeProxyStandIn& proxy, const Pod& pod) {
    size_t n = 0;
    for (const auto& e : proxy.events())
      if (e.type == "connection" && e.uid == pod.uid && e.proxy.listener == "outbound" && e.proxy.detail == "upstream ok")
        n++;
    return n;
  }

  TempDir tmp_{"handoff"};
  TestBpffs bpffs_;
  std::unique_ptr<AgentProcess> agent_;
  std::vector<std::unique_ptr<NodeProxyStandIn>> proxies_;
};

INSTANTIATE_TEST_SUITE_P(Modes, HandOff, ::testing::Values(TcMode::Tcx, TcMode::Legacy),
                         [](const auto& info) { return std::string(modeName(info.param)); });

// Add: redirection, AddWorkload, ack, probe SNAT — the node proxy opens the
// pod's listeners from the fd and the pod's traffic reaches them. Remove:
// DelWorkload, the listeners close.
TEST_P(HandOff, PodIsHandedToTheNodeProxyAndTakenBack) {
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  auto pod = makePod("a");
  auto info = client().addPod(pod->spec(true));
  ASSERT_TRUE(info.ok()) << info.error().message << "\n" << agent_->log();
  EXPECT_EQ(info->handoff, HandoffState::Acked);
  EXPECT_EQ(info->identity.uid, pod->uid);
  EXPECT_EQ(proxy.runningPods(), std::vector<std::string>{pod->uid});
  ASSERT_TRUE(pod->connectOut().ok());
  EXPECT_TRUE(proxy.waitFor([&](const NodeProxyEvent& e) { return e.type == "connection" && e.uid == pod->uid; }, 3s))
      << "the pod's connection did not reach the listener the node proxy opened";
  EXPECT_EQ(relayed(proxy, *pod), 1u);
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  ASSERT_EQ(pods->size(), 1u);
  EXPECT_EQ(pods->front().handoff, HandoffState::Acked);
  EXPECT_EQ(pods->front().identity.name, "web-" + pod->uid);
  std::string log = agent_->log();
  EXPECT_NE(log.find("node proxy pid " + std::to_string(::getpid()) + " runs in cgroup"), std::string::npos) << log;

  ASSERT_TRUE(client().removePod(info->id).ok());
  EXPECT_TRUE(proxy.waitForEvent("del", pod->uid, 3s));
  EXPECT_TRUE(proxy.runningPods().empty());
  auto direct = pod->connectOut();
  EXPECT_TRUE(direct.ok()) << "plain networking after removal: " << direct.error().message;
  EXPECT_EQ(relayed(proxy, *pod), 1u) << "a connection after removal went to the proxy";
}

// With ZDS on, a pod without a uid cannot be handed off: refused, nothing
// done.
TEST_P(HandOff, AddWithoutUidIsRefused) {
  startAgent();
  auto pod = makePod("nouid");
  PodSpec spec = pod->spec();
  spec.identity = {};
  auto info = client().addPod(spec);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code, EINVAL);
  EXPECT_EQ(info.error().message,
            "pod has no uid: this agent hands every pod to the node proxy (--ztunnel-socket), which needs the pod's "
            "Kubernetes uid (sluice-cni takes it from CNI_ARGS K8S_POD_UID; sluicectl: --uid)");
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());
}

// No node proxy connected: the enrollment fails retryably and is rolled
// back; it succeeds once one connects.
TEST_P(HandOff, NoNodeProxyFailsRetryablyAndLeavesNothing) {
  startAgent();
  auto pod = makePod("b");
  auto info = client().addPod(pod->spec());
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code, EAGAIN);
  EXPECT_NE(info.error().message.find("hand-off to the node proxy failed: no ztunnel connection"), std::string::npos)
      << info.error().message;
  EXPECT_NE(info.error().message.find("(retryable)"), std::string::npos) << info.error().message;
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());
  EXPECT_EQ(pod->topo.pod().ip("-4 rule show").out.find("fwmark 0x111"), std::string::npos);
  EXPECT_FALSE(pod->topo.pod().path().empty());
  auto direct = pod->connectOut();
  EXPECT_TRUE(direct.ok()) << "rolled back: plain networking: " << direct.error().message;
  // The runtime retries; now a node proxy is there.
  NodeProxyStandIn& proxy = startProxy();
  auto again = client().addPod(pod->spec());
  ASSERT_TRUE(again.ok()) << again.error().message;
  ASSERT_TRUE(pod->connectOut().ok());
  EXPECT_EQ(relayed(proxy, *pod), 1u);
}

// The node proxy refuses the pod (an app already holds 15001 in it without
// SO_REUSEPORT): the enrollment fails with its reason and leaves nothing;
// the proxy is told to forget the pod.
TEST_P(HandOff, ErrorAckFailsTheAddAndLeavesNothing) {
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  auto pod = makePod("c");
  int fd = -1;
  ASSERT_TRUE(pod->topo.pod()
                  .run([&]() -> Status {
                    fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
                    sockaddr_in6 a{};
                    a.sin6_family = AF_INET6;
                    a.sin6_port = htons(15001);
                    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 1) != 0)
                      return Error::fromErrno(errno, "bind 15001");
                    return {};
                  })
                  .ok());
  Fd app(fd);
  auto info = client().addPod(pod->spec());
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code, EAGAIN);
  EXPECT_NE(info.error().message.find("failure to start proxy"), std::string::npos) << info.error().message;
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());
  EXPECT_TRUE(proxy.waitForEvent("del", pod->uid, 3s)) << "the refused pod was not taken back";
  EXPECT_TRUE(proxy.pendingPods().empty());
  EXPECT_EQ(sh("tc -n " + pod->topo.pod().name() + " filter show dev eth0 ingress").out, "");
  // The app lets go of the port; the runtime's retry works.
  app.reset();
  auto again = client().addPod(pod->spec());
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->handoff, HandoffState::Acked);
}

// kill -9 of the agent: the data plane and the node proxy carry on; the
// restarted agent sends its snapshot from the pinned registry (the same
// netns: the proxy keeps its listeners). Then the node proxy is replaced as
// ztunnel's DaemonSet replaces it: the new one connects, gets its snapshot
// and opens its listeners beside the old one's (SO_REUSEPORT), then the old
// one stops. Traffic of every pod flows throughout.
TEST_P(HandOff, AgentAndNodeProxyRestartsLoseNothing) {
  startAgent();
  NodeProxyStandIn& first = startProxy();
  std::vector<std::unique_ptr<Pod>> pods;
  for (const char* u : {"d1", "d2"}) {
    pods.push_back(makePod(u));
    auto info = client().addPod(pods.back()->spec());
    ASSERT_TRUE(info.ok()) << info.error().message;
  }
  std::atomic<bool> stop{false};
  std::atomic<int> phase{0};
  // The phase of the connection the loop is making: a connection counts in
  // the phase it began in, so the node proxy's replacement waits until
  // the loop has begun one in phase 1 (the one of phase 0 in flight has
  // ended). Otherwise, where the old proxy goes first (before Linux 6.6),
  // it could reset a phase-0 connection still in flight and count it
  // against the agent's restart (seen under emulation, where a connection
  // takes long enough).
  std::atomic<int> loopPhase{0};
  std::atomic<size_t> ok[2] = {0, 0};
  std::vector<std::string> failures[2];
  std::thread loop([&] {
    while (!stop)
      for (auto& p : pods) {
        int ph = phase;
        loopPhase = ph;
        Status st = p->connectOut();
        if (st.ok())
          ok[ph]++;
        else
          failures[ph].push_back(p->uid + ": " + st.error().message);
      }
  });
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };
  pause();
  EXPECT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  EXPECT_TRUE(first.waitForEvent("disconnected", "", 3s));
  pause();
  std::vector<NodeProxyEvent> beforeRestart = first.events();
  first.clearEvents();
  startAgent();
  EXPECT_TRUE(first.waitForEvent("snapshot", "", 5s)) << "no snapshot after the agent's restart\n" << agent_->log();
  for (auto& p : pods) EXPECT_TRUE(first.waitForEvent("add", p->uid, 1s)) << p->uid << " missing from the snapshot";
  for (const auto& e : first.events())
    EXPECT_NE(e.type, "proxy-stopped") << "the snapshot named another netns for " << e.uid << ": proxy restarted";
  pause();
  phase = 1;
  EXPECT_TRUE(eventually([&] { return loopPhase == 1; }, 5s)) << "the connection loop is stuck";
  // The node proxy is replaced: the new one first, then the old one goes.
  // Before Linux 6.6 the stand-in runs without SO_REUSEPORT (the TC path
  // cannot assign such listeners), so the new one could not bind beside
  // the old: there the old one goes first.
  const bool overlap = kernelAssignsReuseport();
  if (!overlap) proxies_.front()->stop();
  auto next = NodeProxyStandIn::start(testNodeProxyConfig(zdsPath()));
  ASSERT_TRUE(next.ok()) << next.error().message;
  for (auto& p : pods) EXPECT_TRUE((*next)->waitForEvent("proxy-started", p->uid, 5s)) << p->uid;
  if (overlap) proxies_.front()->stop();
  pause();
  stop = true;
  loop.join();
  std::cout << "connections during the agent's kill and restart: " << ok[0] << " (" << failures[0].size()
            << " failed); during the node proxy's replacement: " << ok[1] << " (" << failures[1].size() << " failed)\n";
  // A failure names what the node proxy saw (a relay whose upstream failed
  // says why) and what the restarted agent did, so that a rare one explains
  // itself from the CI log.
  auto whatTheProxySaw = [&] {
    std::string out;
    std::vector<NodeProxyEvent> all = beforeRestart;
    for (auto& e : first.events()) all.push_back(std::move(e));
    for (const auto& e : all)
      if (e.type == "connection" && e.proxy.detail.rfind("upstream ok", 0) != 0)
        out += "  " + e.uid + " " + e.proxy.listener + " " + e.proxy.peer + " -> " + e.proxy.origDst + ": " +
               e.proxy.detail + "\n";
    return out.empty() ? std::string("  (no relay failed at the node proxy)\n") : out;
  };
  // The data plane's side: dropped_pkts counts a packet of a captured flow
  // that found no proxy socket (answered with a reset to the app).
  auto podCounters = [&] {
    std::string out;
    auto st = client().stats(std::nullopt);
    if (!st.ok()) return "  stats: " + st.error().message + "\n";
    for (const auto& c : *st)
      out += "  " + c.id + ": outbound_conns " + std::to_string(c.stats.outbound_conns) + ", owned_pkts " +
             std::to_string(c.stats.owned_pkts) + ", dropped_pkts " + std::to_string(c.stats.dropped_pkts) + "\n";
    return out;
  };
  EXPECT_TRUE(failures[0].empty()) << failures[0].size() << " failed, first: " << failures[0].front()
                                   << "\nnode proxy's relays not ok:\n" << whatTheProxySaw() << "pods' counters:\n"
                                   << podCounters() << "restarted agent's log:\n" << agent_->log();
  EXPECT_GE(ok[0].load(), 6u);
  if (kernelAssignsReuseport()) {
    // New connections always find a listener. What the old proxy had
    // accepted when it stopped is reset (the stand-in stops at once, where
    // ztunnel drains; and a closing reuseport listener resets its accept
    // queue unless net.ipv4.tcp_migrate_req is set in the pod): a reset
    // after the connect (the stand-in resets what it relays when it stops),
    // never a refusal, an EOF, a time-out or a bypass.
    for (const auto& f : failures[1])
      EXPECT_NE(f.find("Connection reset by peer"), std::string::npos) << "not the old proxy's reset: " << f;
    EXPECT_LE(failures[1].size() * 100, ok[1].load()) << "more than 1% of the connections were reset";
  } else {
    std::cout << "(Linux < 6.6: the new node proxy cannot share the old one's ports, so captured connections fail "
                 "closed until the old one is gone)\n";
  }
  for (auto& p : pods) {
    Status st = p->connectOut();
    EXPECT_TRUE(st.ok()) << p->uid << " after both restarts: " << st.error().message;
  }
  for (auto& p : pods) EXPECT_GE(relayed(**next, *p), 1u) << "the new node proxy relayed nothing of " << p->uid;
  auto list = client().listPods();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), pods.size()) << "a pod was lost";
  for (const auto& p : *list) EXPECT_EQ(p.handoff, HandoffState::Acked) << p.id;
  proxies_.push_back(std::move(*next));
}

// Agent restart alone, measured strictly: zero failed connections while the
// agent is killed and restarted with the node proxy up.
TEST_P(HandOff, AgentKillUnderConnectionLoopFailsNoConnection) {
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  auto pod = makePod("e");
  ASSERT_TRUE(client().addPod(pod->spec()).ok());
  std::atomic<bool> stop{false};
  std::atomic<size_t> ok{0};
  std::vector<std::string> failures;
  std::thread loop([&] {
    while (!stop) {
      Status st = pod->connectOut();
      if (st.ok())
        ok++;
      else
        failures.push_back(st.error().message);
    }
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  std::this_thread::sleep_for(300ms);
  startAgent();
  EXPECT_TRUE(proxy.waitForEvent("add", pod->uid, 5s));
  std::this_thread::sleep_for(300ms);
  stop = true;
  loop.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_GE(ok.load(), 5u);
  EXPECT_EQ(relayed(proxy, *pod), ok.load()) << "a connection went around the proxy";
}

// Two node proxies (a rolling upgrade): each gets its snapshot, adds go to
// the newest, removals to both, and adds fall back to the older one when
// the newest leaves.
TEST_P(HandOff, TwoNodeProxiesNewestGetsAddsBothGetDels) {
  startAgent();
  NodeProxyStandIn& older = startProxy();
  auto p1 = makePod("f1");
  ASSERT_TRUE(client().addPod(p1->spec()).ok());
  NodeProxyStandIn& newer = startProxy();
  EXPECT_TRUE(newer.waitForEvent("add", p1->uid, 2s)) << "the new connection's snapshot lacks the pod";
  auto p2 = makePod("f2");
  ASSERT_TRUE(client().addPod(p2->spec()).ok());
  EXPECT_TRUE(newer.waitForEvent("add", p2->uid, 2s));
  std::this_thread::sleep_for(100ms);
  for (const auto& e : older.events())
    EXPECT_FALSE(e.type == "add" && e.uid == p2->uid) << "an add went to the older connection";
  auto health = client().health();
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->ztunnelConnections, 2u);
  EXPECT_EQ(health->ztunnelSocket, zdsPath());
  ASSERT_TRUE(client().removePod(client().listPods()->front().id).ok());
  // Both were told (p1 or p2, whichever listed first).
  EXPECT_TRUE(older.waitForEvent("del", "", 2s));
  EXPECT_TRUE(newer.waitForEvent("del", "", 2s));
  // The newest leaves: the next add goes to the older one.
  proxies_.pop_back();
  auto p3 = makePod("f3");
  ASSERT_TRUE(eventually([&] { return client().health()->ztunnelConnections == 1; }, 7s));
  auto info = client().addPod(p3->spec());
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_TRUE(older.waitForEvent("add", p3->uid, 2s));
  ASSERT_TRUE(p3->connectOut().ok());
  EXPECT_EQ(relayed(older, *p3), 1u);
}

// Misbehaving peers lose their own connection only: garbage, an oversize
// datagram, an fd on a hello, silence past the deadline. The agent keeps
// serving the real node proxy and loses no pod.
TEST_P(HandOff, MisbehavingPeersAreDroppedAndTheAgentKeepsServing) {
  startAgent();
  NodeProxyStandIn& proxy = startProxy();
  auto pod = makePod("g");
  ASSERT_TRUE(client().addPod(pod->spec()).ok());
  {
    FakeZtunnel garbage(zdsPath());
    ASSERT_TRUE(garbage.ok());
    EXPECT_TRUE(garbage.sendRaw("\xff\xff\xff garbage"));
    FakeZtunnel oversize(zdsPath());
    ASSERT_TRUE(oversize.ok());
    EXPECT_TRUE(oversize.sendRaw(std::string(4096, 'x')));
    FakeZtunnel fdOnHello(zdsPath());
    ASSERT_TRUE(fdOnHello.ok());
    Fd anyFd(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    EXPECT_TRUE(fdOnHello.sendRaw(std::string("\x08\x01", 2), {anyFd.get()}));
    FakeZtunnel silent(zdsPath());
    ASSERT_TRUE(silent.ok());
    // Each is dropped: the agent closes its end (the silent one after the
    // 1 s hello deadline of this agent).
    for (FakeZtunnel* z : {&garbage, &oversize, &fdOnHello, &silent})
      EXPECT_TRUE(z->closedByServer(4s)) << "a misbehaving peer kept its connection";
  }
  // An unsolicited message after the snapshot: that connection goes too.
  FakeZtunnel chatty(zdsPath());
  ASSERT_TRUE(chatty.ok());
  auto snap = chatty.handshake();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  EXPECT_EQ(snap->size(), 1u) << "its snapshot names the enrolled pod";
  EXPECT_TRUE(chatty.sendRaw(std::string("\x0a\x00", 2)));
  EXPECT_TRUE(chatty.closedByServer(4s));
  // The real node proxy is still served, every pod still there.
  auto pod2 = makePod("g2");
  auto info = client().addPod(pod2->spec());
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(proxy.runningPods().size(), 2u);
  ASSERT_TRUE(pod->connectOut().ok());
  auto list = client().listPods();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
}

// Status shows the node proxy's identity: the mark counts only from its
// cgroup (here the test process's, where the in-process stand-in runs).
TEST_P(HandOff, StatusShowsTheNodeProxysCgroup) {
  startAgent();
  startProxy();
  auto self = cgroupIdOfPid(::getpid());
  ASSERT_TRUE(self.ok()) << self.error().message;
  auto r = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", tmp_.file("agent.sock"), "status"});
  EXPECT_NE(r.out.find("only from the node proxy's cgroups: " + std::to_string(*self) + " (pid " +
                       std::to_string(::getpid()) + ")"),
            std::string::npos)
      << r.describe();
  EXPECT_NE(r.out.find("1 connection(s) on " + zdsPath()), std::string::npos) << r.describe();
}

// Metrics: connected node proxies, requests by type and result, the ack
// latency histogram; one log line per hand-off.
TEST_P(HandOff, MetricsAndLogsCountHandOffs) {
  startAgent({"--metrics-address", "127.0.0.1:0"});
  startProxy();
  auto pod = makePod("h");
  auto info = client().addPod(pod->spec());
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_TRUE(client().removePod(info->id).ok());
  std::string log = agent_->log();
  auto at = log.find("metrics on http://127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << log;
  std::string port = log.substr(at + 28, log.find('/', at + 28) - at - 28);
  std::string m = httpGetLoopback(static_cast<uint16_t>(std::stoul(port)), "/metrics");
  EXPECT_NE(m.find("sluice_ztunnel_connections 1"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"add\",result=\"ok\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"del\",result=\"ok\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_ack_duration_seconds_count"), std::string::npos) << m;
  EXPECT_NE(log.find(pod->uid), std::string::npos) << "no log line names the pod handed off\n" << log;
}

// No fd leaks: 1,000 enroll/remove cycles through the API, each handed off
// and taken back (legacy attachment: a tcx attach waits for an RCU grace
// period, which would make this minutes long).
TEST(HandOffLeaks, ThousandCyclesLeakNoAgentFd) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
  TempDir tmp("handoff-leak");
  TestBpffs bpffs;
  auto agent = AgentProcess::start(bpffs.root(),
                                   {"--tc-mode", "legacy", "--ztunnel-socket", tmp.file("zds.sock")},
                                   tmp.file("agent.sock"));
  ASSERT_TRUE(agent.ok()) << agent.error().message;
  auto proxy = NodeProxyStandIn::start(testNodeProxyConfig(tmp.file("zds.sock")));
  ASSERT_TRUE(proxy.ok());
  ASSERT_TRUE((*proxy)->waitForEvent("snapshot", "", 5s));
  Pod pod("leak-" + std::to_string(::getpid()));
  ASSERT_TRUE(pod.topo.ok());
  auto c = (*agent)->client();
  ASSERT_TRUE(c.ok());
  // A first cycle warms up what stays (netlink caches, the first netns).
  ASSERT_TRUE(c->addPod(pod.spec()).ok());
  ASSERT_TRUE(c->removePod(pod.topo.pod().name()).ok());
  size_t before = fdCountOf((*agent)->pid());
  for (int i = 0; i < 1000; i++) {
    auto info = c->addPod(pod.spec());
    ASSERT_TRUE(info.ok()) << "cycle " << i << ": " << info.error().message;
    ASSERT_TRUE(c->removePod(info->id).ok()) << "cycle " << i;
  }
  size_t stubs = 0;
  size_t after = fdCountOf((*agent)->pid(), &stubs);
  EXPECT_EQ(after, before) << "the agent's open fds grew over 1,000 hand-offs";
  EXPECT_LE(stubs, 2 * kSkLookupStubsAhead) << "sk_lookup programs held beyond the pool";
  std::cout << "agent fds before/after 1,000 add/remove cycles with hand-off: " << before << "/" << after << "\n";
  EXPECT_TRUE((*proxy)->runningPods().empty());
}

// /healthz tells a wedged agent without waiting on it: an add waiting for a
// node proxy that never acks holds the datapath lock; past --wedged-after-ms
// /healthz answers 503 naming why, and ok again once the add gave up.
TEST_P(HandOff, HealthzFailsWhileTheAgentIsWedged) {
  uint16_t port = freeLoopbackPort();
  startAgent({"--metrics-address", "127.0.0.1:" + std::to_string(port), "--wedged-after-ms", "300"});
  FakeZtunnel mute(zdsPath());
  ASSERT_TRUE(mute.ok());
  ASSERT_TRUE(mute.handshake().ok());
  std::string h = httpGetLoopback(port, "/healthz");
  EXPECT_NE(h.find("200 OK"), std::string::npos) << h;
  auto pod = makePod("w");
  auto add = std::async(std::launch::async, [&] { return client().addPod(pod->spec()); });
  auto req = mute.request(3s);  // the add's AddWorkload, never acked
  ASSERT_TRUE(req.ok()) << req.error().message;
  std::this_thread::sleep_for(500ms);
  h = httpGetLoopback(port, "/healthz");
  EXPECT_NE(h.find("503 Service Unavailable"), std::string::npos) << h;
  EXPECT_NE(h.find("wedged: the datapath lock has been held for"), std::string::npos) << h;
  auto r = add.get();
  EXPECT_FALSE(r.ok()) << "an add the node proxy never acked succeeded";
  h = httpGetLoopback(port, "/healthz");
  EXPECT_NE(h.find("200 OK"), std::string::npos) << h;
}

}  // namespace
}  // namespace sluice::test
