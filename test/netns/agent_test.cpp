// sluiced end to end: the built agent binary as a separate process, talked
// to over its unix socket, killed, restarted and "upgraded" while a pod's
// traffic flows through the redirect, captured at TC (tcx, legacy) and at
// the socket.
//
//   test process                          node netns          pod netns
//   +---------------------------+         +-----------+  veth  +------------------+
//   | sluiced (child process)   |--enroll------------------------>| eth0, lo (tc)  |
//   |   --bpffs /sys/fs/bpf/... |         | echo      |<-------| stand-in :15001 |
//   | connection loop (thread)  |         | server    |        | app sockets     |
//   +---------------------------+         +-----------+        +------------------+
#include <bpf/bpf.h>
#include <dirent.h>
#include <net/if.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/un.h>

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "loader/bpffs.h"
#include "loader/netlink.h"
#include "loader/sock_hooks.h"
#include "loader/program_pins.h"
#include "loader/tc.h"
#include "test/common/agent_process.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using Clock = std::chrono::steady_clock;

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// Entries of a directory (names), empty when it does not exist.
std::vector<std::string> dirEntries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (auto* e = ::readdir(d))
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
  ::closedir(d);
  return out;
}

// The keys of a pinned map (none when it is not there).
std::vector<std::vector<uint8_t>> mapKeys(const std::string& pin, size_t keySize) {
  std::vector<std::vector<uint8_t>> keys;
  int fd = bpf_obj_get(pin.c_str());
  if (fd < 0) return keys;
  std::vector<uint8_t> next(keySize);
  while (bpf_map_get_next_key(fd, keys.empty() ? nullptr : keys.back().data(), next.data()) == 0) keys.push_back(next);
  ::close(fd);
  return keys;
}

// The id of the program a pinned link runs (0: none).
uint32_t linkProgramId(const std::string& pin) {
  int fd = bpf_obj_get(pin.c_str());
  if (fd < 0) return 0;
  bpf_link_info info{};
  __u32 len = sizeof(info);
  uint32_t id = bpf_obj_get_info_by_fd(fd, &info, &len) == 0 ? info.prog_id : 0;
  ::close(fd);
  return id;
}
// Number of keys in a pinned map.
size_t mapKeyCount(const std::string& pin, size_t keySize) { return mapKeys(pin, keySize).size(); }

// The program ids running at the pod's hooks (eth0 in/out, lo out), in
// that order; 0 where nothing is attached. Captured at the socket: the
// node hooks' programs and the shared sk_lookup program.
std::vector<uint32_t> podHookPrograms(const TestNetns& pod, const TestBpffs& bpffs, const std::string& id, TcMode mode,
                                      bool socket) {
  std::vector<uint32_t> ids;
  if (socket) {
    for (const char* h : {"connect4", "connect6", "sendmsg4", "sendmsg6", "recvmsg4", "recvmsg6", "getpeername4",
                          "getpeername6", "getsockopt", "sockops", "skb_ingress", "skb_egress", "sock_create"})
      ids.push_back(linkProgramId(bpffs.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/" + h));
    int progs = bpf_obj_get((bpffs.root() + "/" + SLUICE_PIN_SK_LOOKUP_PROG).c_str());
    __u32 zero = 0, shared = 0;
    if (progs >= 0) {
      (void)bpf_map_lookup_elem(progs, &zero, &shared);
      ::close(progs);
    }
    ids.push_back(shared);
    return ids;
  }
  if (mode == TcMode::Tcx) {
    for (const char* h : {"eth0_ingress", "eth0_egress", "lo_egress"})
      ids.push_back(tcxProgramId(bpffs.linkDir(id) + "/" + h));
    return ids;
  }
  (void)pod.run([&]() -> Status {
    int eth0 = static_cast<int>(if_nametoindex("eth0"));
    ids = {legacyProgramId(eth0, TcHook::Ingress), legacyProgramId(eth0, TcHook::Egress),
           legacyProgramId(1, TcHook::Egress)};
    return {};
  });
  return ids;
}

class Agent : public ::testing::TestWithParam<ModeParam> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    ASSERT_TRUE(pathExists(builtBinary("sluiced"))) << "sluiced not built";
    if (std::string why = modeUnsupported(agentMode()); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(topo_.ok()) << topo_.error();
    static std::atomic<int> n{0};
    socket_ = "/tmp/sluice-t-agent-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".sock";
  }
  void TearDown() override {
    standIn_.reset();
    if (agent_) {
      // Leave nothing: remove the pod through whatever agent runs.
      if (auto c = agent_->client(); c.ok()) (void)c->removePod(podId());
    }
    agent_.reset();
    ::unlink(socket_.c_str());
  }

  virtual ModeParam agentMode() const { return GetParam(); }
  TcMode mode() const { return agentMode().tc; }
  bool socket() const { return agentMode().capture == CaptureMode::Socket; }
  std::string podId() const { return topo_.pod().name(); }
  std::vector<std::string> modeArgs() const {
    if (socket()) return {"--capture", "socket"};
    return {"--capture", "tc", "--tc-mode", mode() == TcMode::Legacy ? "legacy" : "tcx"};
  }

  void startAgent(std::vector<std::string> extra = {}) {
    auto args = modeArgs();
    args.insert(args.end(), extra.begin(), extra.end());
    auto a = AgentProcess::start(bpffs_.root(), args, socket_);
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
  }

  agent::Client client() {
    auto c = agent_->client();
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }

  PodSpec spec() const {
    PodSpec s;
    s.netnsPath = topo_.pod().path();
    s.nodeNetnsPath = topo_.node().path();
    return s;
  }

  void enrollWithProxy() {
    auto info = client().addPod(spec());
    ASSERT_TRUE(info.ok()) << info.error().message << "\n" << agent_->log();
    StandInConfig cfg = testStandInConfig(agentMode().capture);
    cfg.netnsPath = topo_.pod().path();
    auto s = ProxyStandIn::start(cfg);
    ASSERT_TRUE(s.ok()) << s.error().message;
    standIn_ = std::move(*s);
  }

  size_t outboundEvents() const {
    size_t n = 0;
    for (const auto& e : standIn_->events())
      if (e.listener == "outbound" && e.detail == "upstream ok") n++;
    return n;
  }

  // One outbound connection through the redirect: connect, 1-byte echo,
  // close. Fails with what went wrong.
  Status oneConnection(const Endpoint& server) { return connectAndEcho(topo_.pod(), server); }

  TestBpffs bpffs_;
  PodTopology topo_;
  std::string socket_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<ProxyStandIn> standIn_;
};

INSTANTIATE_TEST_SUITE_P(Modes, Agent, ::testing::Values(kTcxMode, kLegacyMode, kSocketMode),
                         [](const auto& info) { return std::string(info.param.name); });

// Issue 4, "restart and upgrade without disruption": a client makes
// connections through the redirect in a loop while the agent is killed
// (SIGKILL), restarted, stopped (SIGTERM) and started again. The restart
// reuses the programs pinned with this build's identity (the hooks keep
// them); the last start finds no pinned programs (as a newer build finds
// none of its identity), loads its own and switches every hook to them in
// place. Zero connections may fail, and every one of them must have gone
// through the proxy.
TEST_P(Agent, KillRestartUpgradeUnderConnectionLoopLosesNothing) {
  auto server = TcpServer::start(topo_.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  startAgent();
  enrollWithProxy();
  auto before = podHookPrograms(topo_.pod(), bpffs_, podId(), mode(), socket());
  for (uint32_t id : before) ASSERT_NE(id, 0u);

  std::atomic<bool> stop{false};
  std::atomic<size_t> ok{0};
  std::vector<std::string> failures;
  std::thread loop([&] {
    while (!stop) {
      Status st = oneConnection((*server)->local());
      if (st.ok())
        ok++;
      else
        failures.push_back(st.error().message);
    }
  });
  auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); };
  std::vector<std::vector<uint32_t>> generations = {before};

  pause();
  EXPECT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  pause();  // no agent at all: the pinned links and maps carry on
  startAgent();
  generations.push_back(podHookPrograms(topo_.pod(), bpffs_, podId(), mode(), socket()));
  pause();
  EXPECT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  pause();
  // The "upgrade": no programs of this identity pinned, so the start loads
  // its own and takes over in place.
  ASSERT_TRUE(removeTree(programsDir(bpffs_.root())).ok());
  startAgent();
  generations.push_back(podHookPrograms(topo_.pod(), bpffs_, podId(), mode(), socket()));
  pause();
  stop = true;
  loop.join();

  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures.front();
  EXPECT_GE(ok.load(), 20u) << "too few connections to mean anything";
  RecordProperty("connections", static_cast<int>(ok.load()));
  std::cout << "connections through the redirect during kill/restart/upgrade: " << ok.load() << ", failed: "
            << failures.size() << "\n";
  // Every connection was redirected: the proxy relayed each one.
  EXPECT_TRUE(standIn_->waitForEvents(ok.load(), kIoTimeout));
  EXPECT_EQ(outboundEvents(), ok.load());
  // The restart kept the pinned programs; the upgrade switched all hooks.
  for (size_t g = 1; g < generations.size(); g++)
    for (size_t h = 0; h < before.size(); h++) {
      EXPECT_NE(generations[g][h], 0u) << "generation " << g << " hook " << h;
      if (g == 1)
        EXPECT_EQ(generations[g][h], generations[g - 1][h]) << "the restart replaced the pinned program of hook " << h;
      else
        EXPECT_NE(generations[g][h], generations[g - 1][h]) << "generation " << g << " hook " << h << " kept the old program";
    }
  // Pod side (eth0 in/out, lo out; socket: 13 node hooks and the shared
  // sk_lookup program). The node side has no hook of its own: the node's
  // probe hook runs the same instructions in both builds, so it stays.
  EXPECT_NE(agent_->log().find(socket() ? "switched 14 hook(s)" : "switched 3 hook(s)"), std::string::npos)
      << agent_->log();
}

// A restarted agent repairs what was damaged while it was down.
TEST_P(Agent, RestartRepairsDamagedPod) {
  auto server = TcpServer::start(topo_.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  startAgent();
  enrollWithProxy();
  ASSERT_TRUE(oneConnection((*server)->local()).ok());
  ASSERT_EQ(agent_->stop(SIGTERM), 0);

  // Damage: the egress hook, the policy rule, the v6 route, accept_local
  // and the pod's config entry (redirection off) are gone. Captured at the
  // socket: its sk_lookup program, the rule, the route, tcp_fwmark_accept
  // and its pod_sock entry.
  if (socket()) {
    ASSERT_TRUE(detachPodSkLookup(bpffs_.linkDir(podId()) + "/sk_lookup").ok());
    ASSERT_EQ(topo_.pod().ip("rule del fwmark 0x111/0xfff").exitCode, 0);
    ASSERT_EQ(topo_.pod().ip("-6 route del local ::/0 table 100").exitCode, 0);
    ASSERT_TRUE(topo_.pod().setSysctl("net/ipv4/tcp_fwmark_accept", "0").ok());
    auto cookie = topo_.pod().cookie();
    ASSERT_TRUE(cookie.ok());
    int m = bpf_obj_get((bpffs_.root() + "/" + SLUICE_PIN_POD_SOCK).c_str());
    ASSERT_GE(m, 0);
    ASSERT_EQ(bpf_map_delete_elem(m, &*cookie), 0);
    ::close(m);
    startAgent();
    auto check = client().check(podId());
    ASSERT_TRUE(check.ok()) << check.error().message;
    EXPECT_TRUE(check->intact) << nlohmann::json(check->problems).dump() << "\n" << agent_->log();
    for (const char* what : {"sk_lookup program in the pod's netns", "IPv4 policy rule", "IPv6 local default route",
                             "net.ipv4.tcp_fwmark_accept", "no entry in pod_sock"})
      EXPECT_NE(agent_->log().find(std::string("repaired: ") + what), std::string::npos) << what << "\n" << agent_->log();
    standIn_->clearEvents();
    ASSERT_TRUE(oneConnection((*server)->local()).ok());
    EXPECT_EQ(outboundEvents(), 1u);
    return;
  }
  if (mode() == TcMode::Tcx) {
    ASSERT_TRUE(detachTcx(bpffs_.linkDir(podId()) + "/eth0_egress").ok());
  } else {
    ASSERT_TRUE(topo_.pod()
                    .run([]() -> Status { return detachLegacy(static_cast<int>(if_nametoindex("eth0")), TcHook::Egress, false); })
                    .ok());
  }
  ASSERT_EQ(topo_.pod().ip("rule del fwmark 0x111/0xfff").exitCode, 0);
  ASSERT_EQ(topo_.pod().ip("-6 route del local ::/0 table 100").exitCode, 0);
  ASSERT_TRUE(topo_.pod().setSysctl("net/ipv4/conf/eth0/accept_local", "0").ok());
  auto cookie = topo_.pod().cookie();
  ASSERT_TRUE(cookie.ok());
  int cfg = bpf_obj_get((bpffs_.root() + "/pod_config").c_str());
  ASSERT_GE(cfg, 0);
  ASSERT_EQ(bpf_map_delete_elem(cfg, &*cookie), 0);
  ::close(cfg);

  startAgent();
  auto c = client();
  auto check = c.check(podId());
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_TRUE(check->intact) << nlohmann::json(check->problems).dump() << "\n" << agent_->log();
  for (const char* what : {"no program attached at eth0 egress", "IPv4 policy rule", "IPv6 local default route",
                           "accept_local is off on eth0", "no entry in pod_config"})
    EXPECT_NE(agent_->log().find(std::string("repaired: ") + what), std::string::npos) << what << "\n" << agent_->log();
  standIn_->clearEvents();
  ASSERT_TRUE(oneConnection((*server)->local()).ok());
  EXPECT_EQ(outboundEvents(), 1u);
}

// check reports damage without repairing it.
TEST_P(Agent, CheckReportsDamageWithoutRepairing) {
  startAgent();
  enrollWithProxy();
  auto c = client();
  auto clean = c.check(podId());
  ASSERT_TRUE(clean.ok()) << clean.error().message;
  EXPECT_TRUE(clean->intact);
  ASSERT_EQ(topo_.pod().ip("rule del fwmark 0x111/0xfff").exitCode, 0);
  auto damaged = c.check(podId());
  ASSERT_TRUE(damaged.ok());
  EXPECT_FALSE(damaged->intact);
  ASSERT_EQ(damaged->problems.size(), 1u) << nlohmann::json(damaged->problems).dump();
  EXPECT_NE(damaged->problems[0].find("IPv4 policy rule"), std::string::npos) << damaged->problems[0];
  // Still damaged: check changed nothing.
  auto exists = topo_.pod().ip("rule show fwmark 0x111/0xfff");
  EXPECT_EQ(exists.out.find("lookup 100"), std::string::npos) << exists.out;
}

// Pods whose netns went away while the agent was down are cleaned up on
// start, leaving no pins and no map entries.
TEST_P(Agent, StartRemovesPodsWhoseNetnsIsGone) {
  startAgent();
  auto info = client().addPod(spec());
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_EQ(agent_->stop(SIGKILL), 128 + SIGKILL);
  topo_.pod().remove();
  startAgent();
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());
  EXPECT_TRUE(dirEntries(bpffs_.linkDir(podId())).empty());
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/pod_config", 8), 0u);
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/pod_stats", 8), 0u);
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/" + SLUICE_PIN_POD_SOCK, 8), 0u);
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/pod_addrs", sizeof(sluice_pod_addr)), 0u);
  EXPECT_NE(agent_->log().find("is gone; removing the pod"), std::string::npos) << agent_->log();
}

// SIGTERM stops the agent cleanly: exit 0, socket gone, data plane kept.
TEST_P(Agent, SigtermLeavesDataPlaneInPlace) {
  auto server = TcpServer::start(topo_.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  startAgent();
  enrollWithProxy();
  EXPECT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  EXPECT_FALSE(pathExists(socket_));
  EXPECT_NE(agent_->log().find("the data plane stays in place"), std::string::npos);
  ASSERT_TRUE(oneConnection((*server)->local()).ok());
  EXPECT_EQ(outboundEvents(), 1u);
  startAgent();  // for TearDown's removal
}

// The API's answers do not depend on the mode: one run, in the mode this
// kernel prefers (at the socket; else tcx, or clsact before Linux 6.6).
class AgentApi : public Agent {
 protected:
  ModeParam agentMode() const override {
    if (socketCaptureUnsupported().empty()) return kSocketMode;
    return tcModeUnsupported(TcMode::Tcx).empty() ? kTcxMode : kLegacyMode;
  }
};
INSTANTIATE_TEST_SUITE_P(Preferred, AgentApi, ::testing::Values(kSocketMode),
                         [](const auto&) { return std::string("preferred"); });

// Malformed requests get a readable error each and change nothing.
TEST_P(AgentApi, MalformedRequestsAreRefusedReadably) {
  startAgent();
  auto c = client();
  struct Case {
    std::string line, code, text;
  } cases[] = {
      {"not json", "EINVAL", "not valid JSON"},
      {"[1,2]", "EINVAL", "a request must be a JSON object"},
      {R"({"op":"list"})", "EINVAL", "'version' is missing"},
      {R"({"version":7,"op":"list"})", "EPROTO", "unsupported protocol version 7"},
      {R"({"version":1})", "EINVAL", "'op' is missing"},
      {R"({"version":1,"op":"explode"})", "EINVAL", "unknown op 'explode'"},
      {R"({"version":1,"op":"list","colour":"red"})", "EINVAL", "unknown field 'colour'"},
      {R"({"version":1,"op":"add"})", "EINVAL", "add needs 'pod'"},
      {R"({"version":1,"op":"add","pod":{}})", "EINVAL", "'netns' is missing"},
      {R"({"version":1,"op":"add","pod":{"netns":"relative/path"}})", "EINVAL", "absolute path"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","dnsCapture":"yes"}})", "EINVAL", "'dnsCapture' must be true or false"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","id":"a b"}})", "EINVAL", "has characters other than"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","tcMode":"fast"}})", "EINVAL", "'pod.tcMode' must be"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","ips":[1]}})", "EINVAL", "'ips' must be an array of strings"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","ips":["300.1.1.1"]}})", "EINVAL", "invalid pod address"},
      {R"({"version":1,"op":"add","pod":{"netns":"/var/run/netns/sluice-no-such-netns"}})", "ENOENT", "sluice-no-such-netns"},
      {R"({"version":1,"op":"remove"})", "EINVAL", "exactly one of 'id' or 'netns'"},
      {R"({"version":1,"op":"remove","id":"nobody"})", "ENOENT", "pod 'nobody' is not enrolled"},
      {R"({"version":1,"op":"check"})", "EINVAL", "check needs 'id'"},
      {R"({"version":1,"op":"check","id":"nobody"})", "ENOENT", "pod 'nobody' is not enrolled"},
      {R"({"version":1,"op":"stats","id":"nobody"})", "ENOENT", "pod 'nobody' is not enrolled"},
  };
  for (const auto& k : cases) {
    auto raw = c.roundTrip(k.line);
    ASSERT_TRUE(raw.ok()) << k.line << ": " << raw.error().message;
    auto j = nlohmann::json::parse(*raw, nullptr, false);
    ASSERT_TRUE(j.is_object()) << *raw;
    EXPECT_EQ(j["version"], 1) << *raw;
    EXPECT_EQ(j["ok"], false) << k.line << " -> " << *raw;
    EXPECT_EQ(j["error"]["code"], k.code) << k.line << " -> " << *raw;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(k.text), std::string::npos) << k.line << " -> " << *raw;
  }
  // An oversized line: an error, then the connection is closed.
  auto big = agent_->client();
  ASSERT_TRUE(big.ok());
  auto raw = big->roundTrip(std::string(100 * 1024, 'x'));
  ASSERT_TRUE(raw.ok()) << raw.error().message;
  EXPECT_NE(raw->find("EMSGSIZE"), std::string::npos) << *raw;
  EXPECT_FALSE(big->health().ok());
  // Nothing changed; the agent still answers.
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());
  EXPECT_TRUE(dirEntries(bpffs_.root() + "/links").empty());
}

// Two adds of the same pod at once: both succeed (the second is the
// idempotent repeat), one pod is enrolled, once. Two ids for one netns at
// once: exactly one wins, the other is told why.
TEST_P(AgentApi, ConcurrentAddsOfOnePod) {
  startAgent();
  for (int round = 0; round < 3; round++) {
    std::vector<Result<PodInfo>> results(2, Error::msg("not run"));
    std::vector<std::thread> ts;
    for (int i = 0; i < 2; i++)
      ts.emplace_back([&, i] {
        auto c = agent_->client();
        results[i] = c.ok() ? c->addPod(spec()) : Result<PodInfo>(c.error());
      });
    for (auto& t : ts) t.join();
    for (auto& r : results) EXPECT_TRUE(r.ok()) << r.error().message;
    auto pods = client().listPods();
    ASSERT_TRUE(pods.ok());
    EXPECT_EQ(pods->size(), 1u);
    ASSERT_TRUE(client().removePod(podId()).ok());
  }
  std::vector<Result<PodInfo>> results(2, Error::msg("not run"));
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; i++)
    ts.emplace_back([&, i] {
      PodSpec s = spec();
      s.id = "twin-" + std::to_string(i);
      auto c = agent_->client();
      results[i] = c.ok() ? c->addPod(s) : Result<PodInfo>(c.error());
    });
  for (auto& t : ts) t.join();
  EXPECT_NE(results[0].ok(), results[1].ok());
  for (auto& r : results)
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, EEXIST);
      EXPECT_NE(r.error().message.find("is already enrolled as pod 'twin-"), std::string::npos) << r.error().message;
    }
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok());
  ASSERT_EQ(pods->size(), 1u);
  ASSERT_TRUE(client().removePod(pods->front().id).ok());
}

// A netns deleted while its add is under way: the add succeeds or fails
// with a readable error; either way, after the agent's sweep nothing of
// those pods is left (no pod, no pins, no map entries).
TEST_P(AgentApi, NetnsVanishingDuringAddLeavesConsistentState) {
  startAgent({"--reconcile-interval", "1"});
  std::mt19937 rng(42);
  int succeeded = 0, failed = 0;
  for (int i = 0; i < 12; i++) {
    TestNetns ns("vanish");
    ASSERT_TRUE(ns.ok()) << ns.error();
    ASSERT_EQ(ns.ip("link add eth0 type veth peer name eth1").exitCode, 0);
    ASSERT_EQ(ns.ip("link set eth0 up").exitCode, 0);
    PodSpec s;
    s.netnsPath = ns.path();
    Result<PodInfo> r = Error::msg("not run");
    std::thread adder([&] {
      auto c = agent_->client();
      r = c.ok() ? c->addPod(s) : Result<PodInfo>(c.error());
    });
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
    ns.remove();
    adder.join();
    if (r.ok()) {
      succeeded++;
    } else {
      failed++;
      EXPECT_FALSE(r.error().message.empty());
      EXPECT_EQ(r.error().message.find("Success"), std::string::npos) << r.error().message;
    }
  }
  // The sweep (every second) removes pods whose netns is gone.
  std::vector<PodInfo> left;
  for (int t = 0; t < 100; t++) {
    auto pods = client().listPods();
    ASSERT_TRUE(pods.ok());
    left = *pods;
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(left.empty()) << left.size() << " pods left; " << succeeded << " adds succeeded, " << failed << " failed";
  EXPECT_TRUE(dirEntries(bpffs_.root() + "/links").empty());
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/pod_config", 8), 0u);
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/pod_stats", 8), 0u);
  EXPECT_EQ(mapKeyCount(bpffs_.root() + "/" + SLUICE_PIN_POD_SOCK, 8), 0u);
}

// A second agent on the same socket refuses to start and says why.
TEST_P(AgentApi, SecondAgentOnSameSocketIsRefused) {
  startAgent();
  auto run = runAgentExpectingExit({"--bpffs", bpffs_.root(), "--socket", socket_, "--metrics-address", "off"});
  EXPECT_EQ(run.exitCode, 1) << run.log;
  EXPECT_NE(run.log.find("another agent is already listening on " + socket_), std::string::npos) << run.log;
  EXPECT_TRUE(client().health().ok());
}

// sluicectl goes through the agent that serves its bpffs root.
TEST_P(AgentApi, SluicectlUsesTheAgent) {
  startAgent();
  auto add = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", socket_, "pod", "add",
                         "--netns", topo_.pod().path(), "--node-netns", topo_.node().path()});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  EXPECT_NE(agent_->log().find("enrolled pod " + podId()), std::string::npos) << agent_->log();
  auto list = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", socket_, "pod", "list", "--json"});
  ASSERT_EQ(list.exitCode, 0) << list.describe();
  auto pods = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(pods.is_array() && pods.size() == 1) << list.out;
  EXPECT_EQ(pods[0]["id"], podId());
  // An error from the agent is printed like a direct one.
  auto again = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", socket_, "pod", "add",
                           "--netns", topo_.pod().path(), "--id", "other"});
  EXPECT_EQ(again.exitCode, 1);
  EXPECT_EQ(again.err, "sluicectl: netns " + topo_.pod().path() + " is already enrolled as pod '" + podId() + "'\n");
  auto rm = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", socket_, "pod", "remove",
                        "--netns", topo_.pod().path()});
  ASSERT_EQ(rm.exitCode, 0) << rm.describe();
  EXPECT_NE(agent_->log().find("removed pod " + podId()), std::string::npos) << agent_->log();
}

// Prometheus metrics over HTTP on loopback.
TEST_P(AgentApi, MetricsAreServedOnLoopback) {
  uint16_t port = freeLoopbackPort();
  ASSERT_NE(port, 0);
  auto server = TcpServer::start(topo_.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok());
  startAgent({"--metrics-address", "127.0.0.1:" + std::to_string(port)});
  enrollWithProxy();
  ASSERT_TRUE(oneConnection((*server)->local()).ok());
  ASSERT_TRUE(standIn_->waitForEvents(1, kIoTimeout));
  (void)client().listPods();
  (void)client().roundTrip("garbage");

  auto get = [&](const std::string& path) { return httpGetLoopback(port, path); };
  std::string page = get("/metrics");
  EXPECT_NE(page.find("HTTP/1.1 200 OK"), std::string::npos) << page;
  EXPECT_NE(page.find("text/plain; version=0.0.4"), std::string::npos);
  for (const std::string& line : std::vector<std::string>{
           "sluice_pods_enrolled 1", "sluice_agent_requests_total{op=\"add\",result=\"ok\"} 1",
        "sluice_agent_requests_total{op=\"invalid\",result=\"error\"} 1", "sluice_pod_add_duration_seconds_count 1",
        "sluice_pod_redirected_connections_total{pod=\"" + podId() + "\",direction=\"outbound\"} 1",
        "# TYPE sluice_pod_add_duration_seconds histogram", "sluice_pod_add_duration_seconds_bucket{le=\"+Inf\"} 1",
        "sluice_reconcile_runs_total 1"})
    EXPECT_NE(page.find(line + "\n"), std::string::npos) << line << "\n" << page;
  EXPECT_NE(get("/nope").find("404 Not Found"), std::string::npos);
  EXPECT_NE(get("/healthz").find("200 OK"), std::string::npos);
}

// ---- The agent under abuse (issue 13, item 5) ----

// A raw connection to the agent's unix socket (no client library: these
// tests send what a client would not).
Fd rawConnect(const std::string& path) {
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return Fd();
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// Everything the agent sends until it closes (or 5 s pass).
std::string readToEof(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// Connections beyond --max-connections are answered EBUSY at once and
// closed (no thread each); once one closes, a new one is served.
TEST_P(AgentApi, ConnectionsBeyondTheMaximumAreRefusedAtOnce) {
  uint16_t port = freeLoopbackPort();
  startAgent({"--max-connections", "3", "--metrics-address", "127.0.0.1:" + std::to_string(port)});
  std::vector<Fd> held;
  for (int i = 0; i < 3; i++) {
    held.push_back(rawConnect(socket_));
    ASSERT_TRUE(held.back().valid()) << std::strerror(errno);
    // Served: each answers a request (so the agent counts it as live).
    std::string req = R"({"version":1,"op":"list"})" "\n";
    ASSERT_EQ(::send(held.back().get(), req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    char buf[512];
    ASSERT_GT(::recv(held.back().get(), buf, sizeof(buf), 0), 0);
  }
  Fd extra = rawConnect(socket_);
  ASSERT_TRUE(extra.valid());
  std::string answer = readToEof(extra.get());
  auto j = nlohmann::json::parse(answer, nullptr, false);
  ASSERT_TRUE(j.is_object()) << answer;
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["error"]["code"], "EBUSY") << answer;
  EXPECT_EQ(j["error"]["message"], "too many connections (3 served at once); try again") << answer;
  held.pop_back();
  bool served = false;
  for (int i = 0; i < 50 && !served; i++) {
    auto c = agent_->client();
    served = c.ok() && c->listPods().ok();
    if (!served) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(served) << "no connection served after one of the three closed\n" << agent_->log();
  std::string page = httpGetLoopback(port, "/metrics");
  EXPECT_NE(page.find("sluice_agent_connections_refused_total{listener=\"api\"} "), std::string::npos) << page;
  EXPECT_EQ(page.find("sluice_agent_connections_refused_total{listener=\"api\"} 0\n"), std::string::npos) << page;
}

// A client trickling a request byte by byte cannot hold its thread: the
// whole request must arrive within --request-deadline-ms; it is told so and
// closed, while other clients are served meanwhile.
TEST_P(AgentApi, TricklingClientIsCutAtTheRequestDeadline) {
  startAgent({"--request-deadline-ms", "700"});
  Fd slow = rawConnect(socket_);
  ASSERT_TRUE(slow.valid());
  std::string partial = R"({"version":1,"op":"li)";
  auto start = std::chrono::steady_clock::now();
  bool cut = false;
  for (char ch : partial) {
    if (::send(slow.get(), &ch, 1, MSG_NOSIGNAL) != 1) {
      cut = true;
      break;
    }
    auto c = agent_->client();
    ASSERT_TRUE(c.ok()) << "another client was not served while one trickled";
    ASSERT_TRUE(c->listPods().ok());
    std::this_thread::sleep_for(100ms);
    if (std::chrono::steady_clock::now() - start > 3s) break;
  }
  std::string answer = readToEof(slow.get());
  auto j = nlohmann::json::parse(answer, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "cut=" << cut << " answer: " << answer;
  EXPECT_EQ(j["error"]["code"], "ETIMEDOUT") << answer;
  EXPECT_EQ(j["error"]["message"], "request not complete within 700 ms") << answer;
}

// Text that is not UTF-8 in any field: a request's strings, an interface
// name from the kernel. Answers stay valid JSON (U+FFFD for bad bytes),
// the agent stays up.
TEST_P(AgentApi, NonUtf8TextCrashesNothing) {
  startAgent();
  auto c = client();
  for (std::string line : {std::string("{\"version\":1,\"op\":\"remove\",\"id\":\"\xff\xfe\"}"),
                           std::string("{\"version\":1,\"op\":\"add\",\"pod\":{\"netns\":\"/x\xc3\x28\"}}"),
                           std::string("\xff\xff\xff\n"), std::string("{\"version\":1,\"op\":\"remove\",\"id\":\"a\\udc80\"}")}) {
    auto raw = c.roundTrip(line);
    ASSERT_TRUE(raw.ok()) << raw.error().message << "\n" << agent_->log();
    auto j = nlohmann::json::parse(*raw, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not JSON: " << *raw;
    EXPECT_EQ(j["ok"], false) << *raw;
  }
  // An interface of the pod whose name is not UTF-8 (the kernel allows it).
  std::string bad = "e\xff" "x";
  auto r = sh("ip -n " + topo_.pod().name() + " link add '" + bad + "' type veth peer name '" + bad + "y' && ip -n " +
              topo_.pod().name() + " link set '" + bad + "' up");
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto info = client().addPod(spec());
  ASSERT_TRUE(info.ok()) << info.error().message << "\n" << agent_->log();
  auto pods = client().listPods();
  ASSERT_TRUE(pods.ok()) << pods.error().message << "\n" << agent_->log();
  ASSERT_EQ(pods->size(), 1u);
  // Through the agent (same bpffs root): the listing holds the pod with the
  // non-UTF-8 interface name.
  auto cli = runCommand({builtBinary("sluicectl"), "--bpffs", bpffs_.root(), "--socket", socket_, "pod", "list", "--json"});
  EXPECT_EQ(cli.exitCode, 0) << cli.describe();
  auto listed = nlohmann::json::parse(cli.out, nullptr, false);
  ASSERT_TRUE(listed.is_array()) << cli.out;
  EXPECT_EQ(listed.size(), 1u) << cli.out;
  EXPECT_EQ(::kill(agent_->pid(), 0), 0) << "the agent died";
}

// ---- The agent under load (issue 13, item 5) ----

// How long the load test's clients hammer the agent: SLUICE_LOAD_SECONDS,
// 60 when unset (the issue's figure); 0 on a value that is not a whole
// number > 0.
int loadSeconds() {
  const char* v = std::getenv("SLUICE_LOAD_SECONDS");
  if (!v || !*v) return 60;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == '\0' && n > 0 && n <= 3600 ? static_cast<int>(n) : 0;
}

// The entries of /proc/PID/DIR ("fd", "task"), for the leak checks.
size_t procEntryCount(pid_t pid, const std::string& dir) {
  return dirEntries("/proc/" + std::to_string(pid) + "/" + dir).size();
}

// What each of the process's descriptors points at, sorted: printed when
// the fd count did not come back, so the leaked kind shows.
std::vector<std::string> fdTargets(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::vector<std::string> out;
  for (const auto& e : dirEntries(dir)) {
    char buf[512];
    ssize_t n = ::readlink((dir + "/" + e).c_str(), buf, sizeof(buf) - 1);
    out.push_back(n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?");
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One client of the load test: its own pods (netns with a veth eth0, no
// traffic), what it believes is enrolled, and what went wrong.
struct LoadClient {
  std::vector<std::unique_ptr<TestNetns>> pods;
  std::vector<bool> enrolled;
  std::vector<uint64_t> cookies;
  size_t requests = 0;
  size_t expectedErrors = 0;  ///< requests that must fail, refused with the right error
  size_t reconnects = 0;
  size_t failed = 0;
  std::vector<std::string> failures;                        ///< the first few
  std::map<std::string, std::pair<size_t, double>> slowest;  ///< per request kind: count, slowest ms

  const std::string& id(size_t k) const { return pods[k]->name(); }
  void fail(int client, const std::string& what) {
    if (failed++ < 5) failures.push_back("client " + std::to_string(client) + ": " + what);
  }
  void note(const std::string& op, double ms) {
    requests++;
    auto& [n, worst] = slowest[op];
    n++;
    worst = std::max(worst, ms);
  }
};

// 50 clients hammer a real sluiced (add, remove, list, stats, health,
// /metrics and requests that must fail) for SLUICE_LOAD_SECONDS while a pod
// enrolled through the same agent carries TCP connections through its
// proxy. No request that should succeed may fail, and none that should fail
// may succeed; the connection loop loses nothing; afterwards the registry
// is what the clients believe (list, check, pod_config, the tcx link pins)
// and the agent's descriptors and threads are back where they were.
TEST_P(AgentApi, FiftyClientsHammeringWhileTrafficFlows) {
  constexpr int kClients = 50;
  constexpr size_t kPodsPerClient = 2;
  const int seconds = loadSeconds();
  ASSERT_GT(seconds, 0) << "SLUICE_LOAD_SECONDS must be a whole number of seconds, 1-3600";
  uint16_t metricsPort = freeLoopbackPort();
  ASSERT_NE(metricsPort, 0);
  // The limit above the clients: each holds at most one connection at a
  // time, but one it closed still counts until the agent's thread has seen
  // the end, so 50 clients reconnecting can briefly hold more than 50. Here
  // every refusal would be a failure. The request deadline (also how long
  // an idle connection is kept) is raised: under emulation (the 6.1 guest)
  // a client thread starved of CPU sat more than the default 10 s between
  // two requests and found its connection closed; the deadline has its own
  // test (TricklingClientIsCutAtTheRequestDeadline).
  startAgent({"--max-connections", "128", "--request-deadline-ms", "120000", "--reconcile-interval", "1",
              "--metrics-address", "127.0.0.1:" + std::to_string(metricsPort)});
  auto server = TcpServer::start(topo_.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  enrollWithProxy();
  if (HasFatalFailure()) return;
  auto trafficCookie = topo_.pod().cookie();
  ASSERT_TRUE(trafficCookie.ok());

  std::vector<LoadClient> clients(kClients);
  {
    // Each client's pods, made by a few threads (one after another, 300
    // `ip` runs take minutes under emulation; all at once, each is slower
    // than its time-out there).
    std::atomic<size_t> next{0};
    std::vector<std::thread> makers;
    for (int t = 0; t < 4; t++)
      makers.emplace_back([&] {
        for (size_t i; (i = next++) < clients.size();) {
          LoadClient& lc = clients[i];
          for (size_t k = 0; k < kPodsPerClient; k++) {
            auto ns = std::make_unique<TestNetns>("load");
            if (!ns->ok()) {
              lc.failures.push_back("netns: " + ns->error());
              break;
            }
            if (auto r = ns->ip("link add eth0 up type veth peer name eth1"); r.exitCode != 0)
              lc.failures.push_back(r.describe());
            auto cookie = ns->cookie();
            lc.cookies.push_back(cookie.ok() ? *cookie : 0);
            lc.pods.push_back(std::move(ns));
            lc.enrolled.push_back(false);
          }
        }
      });
    for (auto& t : makers) t.join();
    for (const auto& lc : clients) ASSERT_TRUE(lc.failures.empty()) << lc.failures.front();
  }
  auto specOf = [](const LoadClient& lc, size_t k) {
    PodSpec s;
    s.netnsPath = lc.pods[k]->path();
    s.id = lc.id(k);
    return s;
  };

  // Warm-up, one of each request, so that whatever the agent opens once on
  // first use (and keeps) is in the baseline, then the baseline: a served
  // and closed connection the agent has not reaped yet is allowed on both
  // sides (it closes a finished connection's fd on its next accept).
  {
    auto c = client();
    ASSERT_TRUE(c.addPod(specOf(clients[0], 0)).ok());
    ASSERT_TRUE(c.stats(clients[0].id(0)).ok());
    ASSERT_TRUE(c.listPods().ok());
    ASSERT_TRUE(c.removePod(clients[0].id(0)).ok());
    ASSERT_NE(httpGetLoopback(metricsPort, "/metrics").find("200 OK"), std::string::npos);
  }
  auto settle = [&] {
    for (int i = 0; i < 3; i++) {
      if (auto c = agent_->client(); c.ok()) (void)c->health();
      std::this_thread::sleep_for(100ms);
    }
  };
  settle();
  const pid_t pid = agent_->pid();
  const size_t fdsBefore = procEntryCount(pid, "fd"), threadsBefore = procEntryCount(pid, "task");
  const auto fdListBefore = fdTargets(pid);

  // The traffic: connections through the enrolled pod's redirect, to the
  // node's echo server via the stand-in, for as long as the clients run.
  std::atomic<bool> stop{false};
  size_t conns = 0;
  std::vector<std::string> connFailures;
  std::thread traffic([&] {
    // Paced: each connection leaves two TIME_WAIT sockets in the pod netns
    // (the app's and the proxy's upstream) for 60 s on 28,232 ephemeral
    // ports; unpaced (~400/s here) the loop ran out of ports within a
    // minute and the proxy reset what it could not connect. At 100/s at
    // most 12,000 are held, however long the run.
    auto next = Clock::now();
    while (!stop) {
      std::this_thread::sleep_until(next);
      next += 10ms;
      Status st = oneConnection((*server)->local());
      if (st.ok())
        conns++;
      else
        connFailures.push_back(st.error().message);
    }
  });

  const auto start = Clock::now();
  const auto until = start + std::chrono::seconds(seconds);
  std::vector<std::thread> workers;
  for (int i = 0; i < kClients; i++)
    workers.emplace_back([&, i] {
      LoadClient& lc = clients[i];
      std::mt19937 rng(static_cast<uint32_t>(i) + 1);
      std::optional<agent::Client> conn;
      while (Clock::now() < until) {
        const size_t failedBefore = lc.failed;
        if (!conn || rng() % 64 == 0) {
          conn.reset();
          auto c = agent_->client();
          if (!c.ok()) {
            lc.fail(i, "connect: " + c.error().message);
            continue;
          }
          conn.emplace(std::move(*c));
          lc.reconnects++;
        }
        const size_t k = rng() % kPodsPerClient;
        const std::string& id = lc.id(k);
        const auto t0 = Clock::now();
        std::string op;
        Status st;                 // of a request that must succeed
        std::optional<Error> err;  // of a request that must fail, and the error it must get
        switch (rng() % 10) {
          case 0:
          case 1:
            if (lc.enrolled[k]) {
              op = "remove";
              st = conn->removePod(id);
              if (st.ok()) lc.enrolled[k] = false;
            } else {
              op = "add";
              auto info = conn->addPod(specOf(lc, k));
              if (!info.ok())
                st = info.error();
              else if (info->id != id || info->netnsCookie != lc.cookies[k])
                st = Error::msg("answered pod " + info->id + " cookie " + std::to_string(info->netnsCookie));
              else
                lc.enrolled[k] = true;
            }
            break;
          case 2:
            if (lc.enrolled[k]) {
              op = "add (repeated)";  // idempotent
              auto info = conn->addPod(specOf(lc, k));
              if (!info.ok()) st = info.error();
            } else {
              op = "remove (absent)";
              st = conn->removePod(id);
              err = Error::msg("pod '" + id + "' is not enrolled", ENOENT);
            }
            break;
          case 3:
          case 4: {
            op = "list";
            auto pods = conn->listPods();
            if (!pods.ok()) {
              st = pods.error();
              break;
            }
            // Only this client touches its pods: the listing must agree.
            for (size_t j = 0; j < kPodsPerClient; j++) {
              bool listed = std::any_of(pods->begin(), pods->end(), [&](const PodInfo& p) { return p.id == lc.id(j); });
              if (listed != lc.enrolled[j])
                st = Error::msg("pod " + lc.id(j) + (listed ? " listed but removed" : " enrolled but not listed"));
            }
            break;
          }
          case 5:
          case 6: {
            auto s = conn->stats(id);
            if (lc.enrolled[k]) {
              op = "stats";
              if (!s.ok())
                st = s.error();
              else if (s->size() != 1 || s->front().id != id)
                st = Error::msg("answered " + std::to_string(s->size()) + " pods");
            } else {
              op = "stats (absent)";
              st = s.ok() ? Status{} : Status(s.error());
              err = Error::msg("pod '" + id + "' is not enrolled", ENOENT);
            }
            break;
          }
          case 7: {
            // Requests that must fail, each with its code.
            static const std::pair<std::string, std::string> kBad[] = {
                {"not json", "EINVAL"},
                {R"({"version":1,"op":"explode"})", "EINVAL"},
                {R"({"version":7,"op":"list"})", "EPROTO"},
                {R"({"version":1,"op":"add","pod":{"netns":"relative"}})", "EINVAL"},
            };
            const auto& [line, code] = kBad[rng() % std::size(kBad)];
            op = "invalid";
            auto raw = conn->roundTrip(line);
            auto j = raw.ok() ? nlohmann::json::parse(*raw, nullptr, false) : nlohmann::json();
            if (!j.is_object() || j.value("ok", true) || j["error"].value("code", "") != code)
              st = Error::msg(line + " -> " + (raw.ok() ? *raw : raw.error().message));
            break;
          }
          case 8: {
            op = "health";
            auto h = conn->health();
            if (!h.ok()) st = h.error();
            break;
          }
          default: {
            // What is checked is that the page comes, not how fast: under
            // emulation an answer queued behind 50 clients took up to 17 s.
            op = "GET /metrics";
            std::string page = httpGetLoopback(metricsPort, "/metrics", 60s);
            if (page.find("HTTP/1.1 200 OK") == std::string::npos || page.find("sluice_pods_enrolled ") == std::string::npos)
              st = Error::msg(page.substr(0, 200));
            break;
          }
        }
        lc.note(op, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (err) {
          if (st.ok())
            lc.fail(i, op + " of " + id + " succeeded");
          else if (st.error().code != err->code || st.error().message.find(err->message) == std::string::npos)
            lc.fail(i, op + " of " + id + ": " + st.error().message);
          else
            lc.expectedErrors++;
        } else if (!st.ok()) {
          lc.fail(i, op + (op == "list" || op == "health" || op == "invalid" ? "" : " " + id) + ": " +
                         st.error().message);
        }
        if (lc.failed != failedBefore) conn.reset();  // the connection may be what broke
      }
    });
  for (auto& t : workers) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  stop = true;
  traffic.join();

  size_t requests = 0, expectedErrors = 0, reconnects = 0, failed = 0;
  std::string firstFailures;
  std::map<std::string, std::pair<size_t, double>> slowest;
  for (const auto& lc : clients) {
    requests += lc.requests;
    expectedErrors += lc.expectedErrors;
    reconnects += lc.reconnects;
    failed += lc.failed;
    for (const auto& f : lc.failures) firstFailures += "\n  " + f;
    for (const auto& [op, v] : lc.slowest) {
      slowest[op].first += v.first;
      slowest[op].second = std::max(slowest[op].second, v.second);
    }
  }
  std::cout << "[ load     ] " << kClients << " clients, " << seconds << " s (" << elapsed << " s): " << requests
            << " requests (" << static_cast<int>(requests / elapsed) << "/s), " << expectedErrors
            << " refused as they must be, " << failed << " failed; " << reconnects << " connections to the agent\n";
  for (const auto& [op, v] : slowest)
    std::cout << "[ load     ]   " << op << ": " << v.first << ", slowest " << static_cast<int>(v.second) << " ms\n";
  std::cout << "[ load     ] traffic: " << conns << " connections through the proxy, " << connFailures.size()
            << " failed\n";
  RecordProperty("requests", static_cast<int>(requests));
  RecordProperty("requests_per_second", static_cast<int>(requests / elapsed));
  RecordProperty("connections", static_cast<int>(conns));
  EXPECT_EQ(failed, 0u) << firstFailures;
  EXPECT_TRUE(connFailures.empty()) << connFailures.size() << " connections failed, first: " << connFailures.front();
  EXPECT_GE(conns, static_cast<size_t>(seconds)) << "too few connections to mean anything";
  // Enough to mean something, whatever the speed (22 requests/s under
  // emulation, 20 times more on the host): every kind of request, and a
  // few from each client on average.
  EXPECT_EQ(slowest.size(), 10u) << "not every kind of request was made";
  EXPECT_GE(requests, static_cast<size_t>(kClients) * 5) << "too few requests to mean anything";
  EXPECT_TRUE(standIn_->waitForEvents(conns, kIoTimeout));
  EXPECT_EQ(outboundEvents(), conns) << "every connection went through the proxy";

  // The registry afterwards: what the clients believe, in the listing, in
  // each pod's check, in pod_config (keyed by netns cookie) and, with tcx,
  // in the link pins (one directory per pod).
  std::set<std::string> believed = {podId()};
  std::set<uint64_t> believedCookies = {*trafficCookie};
  for (const auto& lc : clients)
    for (size_t k = 0; k < kPodsPerClient; k++)
      if (lc.enrolled[k]) {
        believed.insert(lc.id(k));
        believedCookies.insert(lc.cookies[k]);
      }
  {
    auto c = client();
    auto pods = c.listPods();
    ASSERT_TRUE(pods.ok()) << pods.error().message;
    std::set<std::string> listed;
    std::set<uint64_t> listedCookies;
    for (const auto& p : *pods) {
      listed.insert(p.id);
      listedCookies.insert(p.netnsCookie);
    }
    EXPECT_EQ(listed, believed);
    EXPECT_EQ(listedCookies, believedCookies);
    std::set<uint64_t> configured;
    for (const auto& key : mapKeys(bpffs_.root() + "/pod_config", sizeof(uint64_t))) {
      uint64_t cookie = 0;
      std::memcpy(&cookie, key.data(), sizeof(cookie));
      configured.insert(cookie);
    }
    EXPECT_EQ(configured, believedCookies) << "pod_config disagrees with the registry";
    if (mode() == TcMode::Tcx) {
      auto dirs = dirEntries(bpffs_.root() + "/links");
      EXPECT_EQ(std::set<std::string>(dirs.begin(), dirs.end()), believed) << "link pins disagree with the registry";
    }
    for (const auto& id : believed) {
      auto report = c.check(id);
      ASSERT_TRUE(report.ok()) << id << ": " << report.error().message;
      EXPECT_TRUE(report->intact) << id << ": " << nlohmann::json(report->problems).dump();
    }
    std::cout << "[ load     ] afterwards: " << believed.size() << " pods enrolled, as the clients believe\n";

    // The clients' pods removed, the agent is back to its baseline.
    for (const auto& lc : clients)
      for (size_t k = 0; k < kPodsPerClient; k++)
        if (lc.enrolled[k]) {
          EXPECT_TRUE(c.removePod(lc.id(k)).ok()) << lc.id(k);
        }
    EXPECT_EQ(mapKeyCount(bpffs_.root() + "/pod_config", sizeof(uint64_t)), 1u);
  }  // closed: the measurements below see no client of ours
  size_t fdsAfter = 0, threadsAfter = 0;
  // Finished connection threads end on their own; give them a moment.
  for (int i = 0; i < 50; i++) {
    settle();
    fdsAfter = procEntryCount(pid, "fd");
    threadsAfter = procEntryCount(pid, "task");
    if (fdsAfter <= fdsBefore + 1 && threadsAfter <= threadsBefore) break;
  }
  std::cout << "[ load     ] agent fds " << fdsBefore << " -> " << fdsAfter << ", threads " << threadsBefore << " -> "
            << threadsAfter << "\n";
  // One fd of slack: whether the last served connection was reaped yet.
  EXPECT_LE(fdsAfter, fdsBefore + 1) << "before:\n" << [&] {
    std::string s;
    for (const auto& t : fdListBefore) s += "  " + t + "\n";
    s += "after:\n";
    for (const auto& t : fdTargets(pid)) s += "  " + t + "\n";
    return s;
  }();
  EXPECT_LE(threadsAfter, threadsBefore);
}

// Bad flags: a usage error on stderr, exit 2, nothing started.
TEST(AgentCli, BadFlagsExitWithUsageError) {
  auto r = runCommand({builtBinary("sluiced"), "--metrics-address", "localhost"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.err, "sluiced: --metrics-address: invalid address 'localhost' (expected HOST:PORT, e.g. 127.0.0.1:9464) (see sluiced --help)\n");
  r = runCommand({builtBinary("sluiced"), "--max-connections", "0"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.err, "sluiced: invalid --max-connections '0' (expected a whole number > 0) (see sluiced --help)\n");
  r = runCommand({builtBinary("sluiced"), "--request-deadline-ms", "soon"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.err, "sluiced: invalid --request-deadline-ms 'soon' (expected whole milliseconds > 0) (see sluiced --help)\n");
  r = runCommand({builtBinary("sluiced"), "--wedged-after-ms", "0"});
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.err, "sluiced: invalid --wedged-after-ms '0' (expected whole milliseconds > 0) (see sluiced --help)\n");
  auto help = runCommand({builtBinary("sluiced"), "--help"});
  EXPECT_EQ(help.exitCode, 0);
  EXPECT_NE(help.out.find("usage: sluiced"), std::string::npos);
}

}  // namespace
}  // namespace sluice::test
