// ZDS with real network namespaces: the fds zds::Server hands over are the
// pods' namespaces, and the node proxy stand-in (NodeProxyStandIn and
// `sluice-standin --zds`) opens ztunnel's listeners inside the namespace it
// was handed, closes them on Del, reconciles at each snapshot, retries a pod
// whose ports are taken, and moves a pod's proxy when its netns changes.
//
//   test process (its own netns: nothing listens here)
//   +-------------------------------------------------------------------+
//   |  zds::Server  <---- /tmp/sluice-zdsn-XXXX/zds.sock ---->  stand-in |
//   |   snapshot / add(fd) / del                     (node proxy)      |
//   +-------------------------------------------------------------------+
//          | netns fd (SCM_RIGHTS)                   | setns + listeners
//          v                                         v
//   pod netns "sluice-zpod-<pid>-<n>" (lo only):
//     [::]:15001 [::]:15006 [::]:15008 (dual-stack), 127.0.0.1:15053 and
//     [::1]:15053 (UDP + TCP), every socket SO_MARK 0x539, backlog 128
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "test/common/zds_peers.h"
#include "userspace/agent/zds/server.h"
#include "test/standin/node_proxy.h"

namespace sluice::test {
namespace {

using zds::Server;
using zds::ServerOptions;
using zds::SnapshotEntry;
using zds::WorkloadInfo;

zds::WorkloadInfo pod(const std::string& uid) { return {uid, "name-" + uid, "ns-" + uid, "sa-" + uid}; }

Fd openNetns(const TestNetns& ns) { return Fd(::open(ns.path().c_str(), O_RDONLY | O_CLOEXEC)); }

/// Whether something listens on ip:port inside @p ns: a TCP connect from
/// there is not refused. (The stand-in resets a direct connection to its own
/// relay listener, sometimes before connect() reports success: a reset means
/// a listener too.)
bool listening(const TestNetns& ns, const std::string& ip, uint16_t port) {
  auto r = tcpConnect(ns, Endpoint::of(ip, port), {.timeout = 500ms});
  return r.ok() || r.error().code == ECONNRESET;
}

/// The HBONE listener answers "hbone\n": the stand-in's own, not any socket.
bool hboneAnswers(const TestNetns& ns, const std::string& ip) {
  auto fd = tcpConnect(ns, Endpoint::of(ip, 15008), {.timeout = 500ms});
  if (!fd) return false;
  auto got = readSome(fd->get(), 16, 500ms);
  return got.ok() && *got == "hbone\n";
}

/// Listening sockets in @p ns as `ss -lneH` prints them (tcp or udp).
std::string ssListening(const TestNetns& ns, const char* proto) {
  return runCommand({"ip", "netns", "exec", ns.name(), "ss", std::string("-") + proto + "lneH"}).out;
}

/// The line of @p text that contains @p needle ("" when none does).
std::string lineWith(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (l.find(needle) != std::string::npos) return l;
  return "";
}

std::string describe(const std::vector<NodeProxyEvent>& events) {
  std::string s;
  for (const auto& e : events) s += "\n  " + e.type + " conn=" + std::to_string(e.connection) + " uid=" + e.uid + " " + e.detail;
  return s.empty() ? "(no events)" : s;
}

/// Whether @p events has one of @p type for @p uid (with @p detail, when given).
bool hasEvent(const std::vector<NodeProxyEvent>& events, const std::string& type, const std::string& uid,
              const std::optional<std::string>& detail = std::nullopt) {
  return std::any_of(events.begin(), events.end(), [&](const NodeProxyEvent& e) {
    return e.type == type && e.uid == uid && (!detail || e.detail == *detail);
  });
}

/// Whether a thread can setns() into @p fd and then finds itself in @p want.
bool enters(int fd, std::pair<dev_t, ino_t> want) {
  bool ok = false;
  std::thread t([&] { ok = ::setns(fd, CLONE_NEWNET) == 0 && fileIdOf("/proc/thread-self/ns/net") == want; });
  t.join();
  return ok;
}

class Zds : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_TRUE(podA_.ok()) << podA_.error();
    ASSERT_TRUE(podB_.ok()) << podB_.error();
  }

  std::string path() const { return dir_.file("zds.sock"); }

  /// A server whose snapshot is the pods in registry_ (netns reopened each time).
  std::unique_ptr<Server> startServer() {
    auto o = testServerOptions(path(), 2s);
    o.snapshot = [this] {
      std::lock_guard lock(mu_);
      std::vector<SnapshotEntry> v;
      for (const auto& [uid, ns] : registry_) v.push_back({pod(uid), openNetns(*ns)});
      return v;
    };
    auto s = Server::start(o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<NodeProxyStandIn> startNode() {
    auto c = testNodeProxyConfig(path());
    // No data plane in these tests, so the kernel's reuseport assignment
    // limit (< 6.6) does not apply; two node proxies share ports with it.
    c.proxy.reuseport = true;
    auto n = NodeProxyStandIn::start(c);
    EXPECT_TRUE(n.ok()) << n.error().message;
    return n.ok() ? std::move(*n) : nullptr;
  }

  /// Waits until @p connections stand-ins are connected, the newest with its
  /// snapshot acked.
  bool ready(size_t connections = 1) {
    return eventually([&] {
      auto p = server_->peers();
      return p.size() == connections && p.back().snapshotDone;
    }, 3s);
  }

  /// server_ and node_ up, the node's snapshot acked.
  ::testing::AssertionResult up() {
    server_ = startServer();
    if (!server_) return ::testing::AssertionFailure() << "server did not start";
    node_ = startNode();
    if (!node_) return ::testing::AssertionFailure() << "node proxy did not start";
    if (!ready()) return ::testing::AssertionFailure() << "no acked snapshot" << describe(node_->events());
    return ::testing::AssertionSuccess();
  }

  /// Enrolls like the agent will: registry entry, then add() with the netns.
  Status enroll(const std::string& uid, const TestNetns& ns) {
    {
      std::lock_guard lock(mu_);
      registry_[uid] = &ns;
    }
    Fd fd = openNetns(ns);
    Status st = server_->add(pod(uid), fd.get());
    if (!st) {
      std::lock_guard lock(mu_);
      registry_.erase(uid);
    }
    return st;
  }

  Status unenroll(const std::string& uid) {
    {
      std::lock_guard lock(mu_);
      registry_.erase(uid);
    }
    return server_->del(uid);
  }

  TempDir dir_{"zdsn"};
  TestNetns podA_{"zpod"};
  TestNetns podB_{"zpod"};
  std::mutex mu_;
  std::map<std::string, const TestNetns*> registry_;
  // Destroyed first: the proxies close before the namespaces go.
  std::unique_ptr<Server> server_;
  std::unique_ptr<NodeProxyStandIn> node_;
};

// ---- The server's fds are the pods' namespaces -------------------------------------

TEST_F(Zds, SnapshotFdsAreThePodsNamespacesOnEveryConnection) {
  {
    std::lock_guard lock(mu_);
    registry_["a"] = &podA_;
    registry_["b"] = &podB_;
  }
  server_ = startServer();
  ASSERT_TRUE(server_);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("connection " + std::to_string(round + 1));
    FakeZtunnel peer(path());
    auto snap = peer.handshake();
    ASSERT_TRUE(snap.ok()) << snap.error().message;
    ASSERT_EQ(snap->size(), 2u);
    std::map<std::string, std::pair<dev_t, ino_t>> got;
    for (const auto& r : *snap) {
      ASSERT_EQ(r.fds.size(), 1u);
      got[r.request.workload.uid] = fileIdOf(r.fds[0].get());
    }
    EXPECT_EQ(got["a"], fileIdOf(podA_.path()));
    EXPECT_EQ(got["b"], fileIdOf(podB_.path()));
    EXPECT_NE(got["a"], got["b"]);
    // It is a netns a thread can enter, and then is in that pod.
    for (const auto& r : *snap) {
      EXPECT_TRUE(enters(r.fds[0].get(), got[r.request.workload.uid])) << r.request.workload.uid;
    }
  }
}

TEST_F(Zds, AddHandsThePodsNamespace) {
  server_ = startServer();
  ASSERT_TRUE(server_);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  Fd ns = openNetns(podB_);
  std::thread ztunnel([&] {
    auto r = peer.request();
    if (r.ok() && r->fds.size() == 1 && fileIdOf(r->fds[0].get()) == fileIdOf(podB_.path())) peer.ack();
    else peer.ack("wrong namespace");
  });
  Status st = server_->add(pod("b"), ns.get());
  ztunnel.join();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

// ---- The node proxy stand-in ---------------------------------------------------------

TEST_F(Zds, AddOpensZtunnelsListenersInsideThePodAndDelClosesThem) {
  ASSERT_TRUE(up());
  EXPECT_FALSE(listening(podA_, "127.0.0.1", 15008));

  Status st = enroll("a", podA_);
  ASSERT_TRUE(st.ok()) << st.error().message << describe(node_->events());
  EXPECT_EQ(node_->runningPods(), std::vector<std::string>{"a"});
  // Dual-stack HBONE/inbound/outbound, DNS on both loopbacks.
  EXPECT_TRUE(hboneAnswers(podA_, "127.0.0.1"));
  EXPECT_TRUE(hboneAnswers(podA_, "::1"));
  EXPECT_TRUE(listening(podA_, "127.0.0.1", 15001));
  EXPECT_TRUE(listening(podA_, "::1", 15006));
  EXPECT_TRUE(listening(podA_, "127.0.0.1", 15053));
  EXPECT_TRUE(listening(podA_, "::1", 15053));
  auto dns = udpExchange(podA_, Endpoint::of("127.0.0.1", 15053), dnsQuery(7, "zds.example", 1));
  ASSERT_TRUE(dns.ok()) << dns.error().message;
  auto answer = parseDnsAnswer(dns->payload);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->question, "zds.example");
  // ztunnel's socket contract, as the kernel reports it: backlog 128 and
  // mark 0x539 on every listener, [::] not v6only.
  std::string tcp = ssListening(podA_, "t");
  for (const char* port : {"*:15001 ", "*:15006 ", "*:15008 "}) {
    std::string line = lineWith(tcp, port);
    ASSERT_FALSE(line.empty()) << port << " not listening:\n" << tcp;
    EXPECT_NE(line.find(" 128 "), std::string::npos) << line;
    EXPECT_NE(line.find("fwmark:0x539"), std::string::npos) << line;
    EXPECT_NE(line.find("v6only:0"), std::string::npos) << line;
  }
  std::string udp = ssListening(podA_, "u");
  EXPECT_NE(udp.find("127.0.0.1:15053"), std::string::npos) << udp;
  EXPECT_NE(udp.find("[::1]:15053"), std::string::npos) << udp;
  EXPECT_EQ(std::count(udp.begin(), udp.end(), '\n'), 2) << udp;
  EXPECT_NE(udp.find("fwmark:0x539"), std::string::npos) << udp;
  // Nothing in the other pod, nothing in the test's own namespace.
  EXPECT_FALSE(listening(podB_, "127.0.0.1", 15008));
  EXPECT_TRUE(node_->waitForEvent("proxy-started", "a", 1s)) << describe(node_->events());

  st = unenroll("a");
  ASSERT_TRUE(st.ok()) << st.error().message;
  // Closed at once: by the time the Del is acked.
  EXPECT_FALSE(listening(podA_, "127.0.0.1", 15008));
  EXPECT_FALSE(listening(podA_, "::1", 15001));
  EXPECT_TRUE(node_->runningPods().empty());
  EXPECT_TRUE(node_->waitForEvent("proxy-stopped", "a", 1s));
}

TEST_F(Zds, PodWithoutIpv6GetsIpv4ListenersOnly) {
  ASSERT_EQ(podA_.setSysctl("net/ipv6/conf/all/disable_ipv6", "1").ok(), true);
  ASSERT_EQ(podA_.setSysctl("net/ipv6/conf/lo/disable_ipv6", "1").ok(), true);
  ASSERT_TRUE(up());
  Status st = enroll("a", podA_);
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(hboneAnswers(podA_, "127.0.0.1"));
  std::string udp = ssListening(podA_, "u");
  EXPECT_NE(udp.find("127.0.0.1:15053"), std::string::npos) << udp;
  EXPECT_EQ(udp.find("[::1]"), std::string::npos) << udp;
}

TEST_F(Zds, SnapshotAfterReconnectStopsProxiesItDoesNotName) {
  ASSERT_TRUE(up());
  ASSERT_TRUE(enroll("a", podA_).ok());
  ASSERT_TRUE(enroll("b", podB_).ok());
  EXPECT_TRUE(hboneAnswers(podB_, "127.0.0.1"));

  // The agent goes away; meanwhile pod b is removed (no Del reaches ztunnel).
  server_.reset();
  {
    std::lock_guard lock(mu_);
    registry_.erase("b");
  }
  EXPECT_TRUE(hboneAnswers(podB_, "127.0.0.1"));  // proxies survive a lost connection
  node_->clearEvents();
  server_ = startServer();
  ASSERT_TRUE(server_);
  ASSERT_TRUE(ready());
  ASSERT_TRUE(node_->waitForEvent("snapshot", "", 2s)) << describe(node_->events());
  EXPECT_FALSE(listening(podB_, "127.0.0.1", 15008));
  EXPECT_TRUE(hboneAnswers(podA_, "127.0.0.1"));
  EXPECT_EQ(node_->runningPods(), std::vector<std::string>{"a"});
  // a was named again with the same netns: left running, not restarted.
  auto ev = node_->events();
  EXPECT_FALSE(hasEvent(ev, "proxy-started", "a") || hasEvent(ev, "proxy-stopped", "a")) << describe(ev);
  EXPECT_TRUE(hasEvent(ev, "proxy-stopped", "b", "not in the snapshot")) << describe(ev);
}

TEST_F(Zds, PortTakenInThePodFailsTheAddThenTheProxyStartsOnRetry) {
  ASSERT_TRUE(up());
  // An app in the pod holds 15001 without SO_REUSEPORT.
  auto app = socketIn(podA_, AF_INET, SOCK_STREAM);
  ASSERT_TRUE(app.ok());
  auto any = Endpoint::of("0.0.0.0", 15001);
  ASSERT_EQ(::bind(app->get(), any.raw(), any.len), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(app->get(), 8), 0);

  Status st = enroll("a", podA_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EPROTO);
  EXPECT_NE(st.error().message.find("on connection 1: failure to start proxy : outbound listener [::]:15001: bind: "
                                    "Address already in use"),
            std::string::npos)
      << st.error().message;
  EXPECT_EQ(node_->pendingPods(), std::vector<std::string>{"a"});
  EXPECT_FALSE(listening(podA_, "127.0.0.1", 15008));  // nothing half-opened
  EXPECT_EQ(server_->peers().size(), 1u);               // the connection stays

  // ztunnel retries the pod on its own once the port is free.
  app->reset();
  EXPECT_TRUE(node_->waitFor([](const NodeProxyEvent& e) { return e.type == "proxy-started" && e.detail == "retry"; },
                            3s))
      << describe(node_->events());
  EXPECT_TRUE(hboneAnswers(podA_, "127.0.0.1"));
  EXPECT_TRUE(node_->pendingPods().empty());
  // The agent's retry of the add is now a no-op success.
  st = enroll("a", podA_);
  EXPECT_TRUE(st.ok()) << st.error().message;
}

TEST_F(Zds, SameUidInAnotherNetnsMovesTheProxy) {
  ASSERT_TRUE(up());
  ASSERT_TRUE(enroll("u", podA_).ok());
  EXPECT_TRUE(hboneAnswers(podA_, "127.0.0.1"));
  // Same uid, same netns again: success, nothing done.
  node_->clearEvents();
  ASSERT_TRUE(enroll("u", podA_).ok());
  auto ev = node_->events();
  EXPECT_TRUE(std::none_of(ev.begin(), ev.end(), [](const NodeProxyEvent& e) { return e.type.rfind("proxy-", 0) == 0; }))
      << describe(ev);
  // The sandbox was re-created: same uid, another netns.
  ASSERT_TRUE(enroll("u", podB_).ok());
  EXPECT_TRUE(hboneAnswers(podB_, "127.0.0.1"));
  EXPECT_FALSE(listening(podA_, "127.0.0.1", 15008));
  ev = node_->events();
  EXPECT_TRUE(hasEvent(ev, "proxy-stopped", "u", "netns changed")) << describe(ev);
}

TEST_F(Zds, TwoNodeProxiesAddsGoToTheNewestDelsToBoth) {
  server_ = startServer();
  ASSERT_TRUE(server_);
  node_ = startNode();  // the old ztunnel
  ASSERT_TRUE(node_);
  ASSERT_TRUE(ready(1));
  ASSERT_TRUE(enroll("a", podA_).ok());
  // A new ztunnel starts (a rolling upgrade): it gets a's pod in its snapshot
  // and shares a's ports through SO_REUSEPORT.
  auto newNode = startNode();
  ASSERT_TRUE(newNode);
  ASSERT_TRUE(ready(2));
  EXPECT_EQ(newNode->runningPods(), std::vector<std::string>{"a"});
  ASSERT_TRUE(enroll("b", podB_).ok());
  EXPECT_EQ(newNode->runningPods(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(node_->runningPods(), std::vector<std::string>{"a"});
  ASSERT_TRUE(unenroll("a").ok());
  EXPECT_TRUE(node_->runningPods().empty());
  EXPECT_EQ(newNode->runningPods(), std::vector<std::string>{"b"});
  EXPECT_FALSE(listening(podA_, "127.0.0.1", 15008));
  // The newest leaves: adds go to the old one again.
  newNode.reset();
  Status st = enroll("a", podA_);
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(node_->runningPods(), std::vector<std::string>{"a"});
}

TEST_F(Zds, NoStandInConnectedAddFailsRetryably) {
  server_ = startServer();
  ASSERT_TRUE(server_);
  Status st = enroll("a", podA_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EAGAIN);
  EXPECT_EQ(st.error().message, "no ztunnel connection");
  // The stand-in comes up: the agent's retry works.
  node_ = startNode();
  ASSERT_TRUE(node_);
  ASSERT_TRUE(ready());
  st = enroll("a", podA_);
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(hboneAnswers(podA_, "127.0.0.1"));
}

// ---- The binary ------------------------------------------------------------------

TEST_F(Zds, StandInBinaryServesPodsOverZds) {
  server_ = startServer();
  ASSERT_TRUE(server_);
  auto child = Subprocess::start({builtBinary("sluice-standin"), "--zds", path(), "--retry-interval", "200"});
  ASSERT_TRUE(child.ok()) << child.error().message;
  ASSERT_TRUE(ready());
  Status st = enroll("a", podA_);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto fd = tcpConnect(podA_, Endpoint::of("127.0.0.1", 15008));
  ASSERT_TRUE(fd.ok()) << fd.error().message;
  auto hbone = readSome(fd->get(), 16);
  ASSERT_TRUE(hbone.ok());
  EXPECT_EQ(*hbone, "hbone\n");
  ASSERT_TRUE(unenroll("a").ok());
  EXPECT_FALSE(listening(podA_, "127.0.0.1", 15008));
  (*child)->signal(SIGTERM);
  auto r = (*child)->wait(5s);
  EXPECT_EQ(r.exitCode, 0) << r.describe();

  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  auto has = [&](const std::string& want) {
    return std::find(lines.begin(), lines.end(), want) != lines.end();
  };
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "{\"ready\":true}");
  EXPECT_TRUE(has("{\"event\":\"connected\",\"connection\":1,\"detail\":\"\"}")) << r.out;
  EXPECT_TRUE(has("{\"event\":\"snapshot\",\"connection\":1,\"detail\":\"stopped 0 proxies not in the snapshot\"}")) << r.out;
  EXPECT_TRUE(has("{\"event\":\"proxy-started\",\"uid\":\"a\",\"name\":\"name-a\",\"namespace\":\"ns-a\",\"detail\":\"\"}")) << r.out;
  EXPECT_TRUE(has("{\"event\":\"add\",\"connection\":1,\"uid\":\"a\",\"name\":\"name-a\",\"namespace\":\"ns-a\",\"detail\":\"\"}")) << r.out;
  EXPECT_TRUE(has("{\"uid\":\"a\",\"listener\":\"hbone\",\"port\":15008,\"orig_dst\":\"127.0.0.1:15008\","
                  "\"orig_dst_from\":\"local address\",\"peer\":\"" +
                  localOf(fd->get()).str() + "\",\"detail\":\"\"}")) << r.out;
  EXPECT_TRUE(has("{\"event\":\"proxy-stopped\",\"uid\":\"a\",\"name\":\"name-a\",\"namespace\":\"ns-a\",\"detail\":\"deleted\"}")) << r.out;
  EXPECT_TRUE(has("{\"event\":\"del\",\"connection\":1,\"uid\":\"a\",\"name\":\"\",\"namespace\":\"\",\"detail\":\"\"}")) << r.out;
}

TEST_F(Zds, StandInBinaryUsageErrors) {
  auto both = runCommand({builtBinary("sluice-standin"), "--zds", path(), "--netns", podA_.path()});
  EXPECT_EQ(both.exitCode, 2);
  EXPECT_EQ(both.err,
            "sluice-standin: --zds and --netns exclude each other (the node proxy gets each pod's netns over ZDS)\n"
            "Try 'sluice-standin --help'.\n");
  auto badRetry = runCommand({builtBinary("sluice-standin"), "--zds", path(), "--retry-interval", "0"});
  EXPECT_EQ(badRetry.exitCode, 2);
  EXPECT_EQ(badRetry.err,
            "sluice-standin: invalid retry interval '0' (milliseconds, 1..3600000)\nTry 'sluice-standin --help'.\n");
}

}  // namespace
}  // namespace sluice::test
