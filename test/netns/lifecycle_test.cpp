// Enrolling and removing pods (Datapath::addPod / removePod) with real
// namespaces: what an enrollment installs, that removal gives plain
// networking back and leaves nothing behind, the error cases (each of which
// must leave no state), and the counters. Each test runs with tcx and with
// legacy (clsact) attachment.
//
//   node netns                              pod netns
//   +------------------------------+        +----------------------------------+
//   | servers / clients            |  veth  | eth0 10.200.0.2 / fd00:200::2    |
//   | vethpod 10.200.0.1           |<------>| rule fwmark 0x111/0xfff lookup 100|
//   |         fd00:200::1          |        | table 100: local default dev lo  |
//   +------------------------------+        | eth0 accept_local=1              |
//                                           | tc: eth0 in/egress, lo egress    |
//   bpffs root /sys/fs/bpf/sluice-t-PID-N:  +----------------------------------+
//     settings pod_config pod_stats dns_nat pods links/<pod id>/<if>_<hook>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "loader/netns.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

std::string modeParamName(const ::testing::TestParamInfo<TcMode>& info) { return modeName(info.param); }

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

sluice_pod_id podKey(const std::string& id) {
  sluice_pod_id k{};
  std::strncpy(k.id, id.c_str(), sizeof(k.id) - 1);
  return k;
}


/// What an enrollment leaves in the pod netns, as the tools show it.
struct NetnsState {
  std::string rulesV4, rulesV6, table100V4, table100V6, qdiscEth0, qdiscLo;
};

NetnsState netnsState(const TestNetns& ns) {
  NetnsState s;
  s.rulesV4 = ns.ip("-4 rule show").out;
  s.rulesV6 = ns.ip("-6 rule show").out;
  s.table100V4 = ns.ip("-4 route show table 100").out;
  s.table100V6 = ns.ip("-6 route show table 100").out;
  s.qdiscEth0 = sh("tc -n " + ns.name() + " qdisc show dev eth0").out;
  s.qdiscLo = sh("tc -n " + ns.name() + " qdisc show dev lo").out;
  return s;
}

bool hasReturnRule(const std::string& rules) { return rules.find("fwmark 0x111") != std::string::npos; }

// Debian bookworm's uapi headers predate tcx (Linux 6.6): the fixed ABI value.
constexpr auto kTcxIngress = static_cast<enum bpf_attach_type>(46);

/// Another tool's TC program (a CNI's, say): returns TC_ACT_UNSPEC, so the
/// next filter / program still runs.
Result<Fd> loadForeignProgram() {
  struct bpf_insn insns[2] = {};
  insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;  // r0 = -1 (TC_ACT_UNSPEC)
  insns[0].dst_reg = BPF_REG_0;
  insns[0].imm = -1;
  insns[1].code = BPF_JMP | BPF_EXIT;
  int fd = bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "foreign", "GPL", insns, 2, nullptr);
  if (fd < 0) return Error::fromErrno(errno, "load foreign program");
  return Fd(fd);
}

/// Programs attached by tcx at the ingress of @p ifname in @p ns.
Result<uint32_t> tcxIngressCount(const TestNetns& ns, const std::string& ifname) {
  uint32_t count = 0;
  Status st = ns.run([&]() -> Status {
    int ifindex = static_cast<int>(if_nametoindex(ifname.c_str()));
    if (!ifindex) return Error::fromErrno(errno, ifname);
    LIBBPF_OPTS(bpf_prog_query_opts, q);
    if (bpf_prog_query_opts(ifindex, kTcxIngress, &q) != 0) return Error::fromErrno(errno, "query tcx");
    count = q.prog_cnt;
    return {};
  });
  SLUICE_TRY(st);
  return count;
}

class LifecycleBase : public ::testing::Test {
 protected:
  virtual TcMode mode() const = 0;

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(mode()); !why.empty()) GTEST_SKIP() << why;
    h_ = std::make_unique<PodHarness>(mode());
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    Status st = h_->open();
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  void TearDown() override { h_.reset(); }
  /// An enrollment whose node side fails after the hand-off returned
  /// @p handOffResult (Handoff::failureIsFatal = @p fatal).
  void expectNodeSideFailureUndoesHandOff(bool fatal, Status handOffResult);

  PodPrograms& maps() { return h_->datapath().programs(); }

  /// Nothing of pod @p id (netns cookie @p cookie) in the maps or pins, and,
  /// when @p ns is given, nothing in that netns.
  void expectNoPodState(const std::string& id, uint64_t cookie, const TestNetns* ns) {
    for (const auto& p : h_->datapath().listPods()) EXPECT_NE(p.id, id) << "pod still listed";
    EXPECT_FALSE(maps().pods.lookup(podKey(id))) << "pods map still has " << id;
    EXPECT_FALSE(maps().podConfig.lookup(cookie)) << "pod_config still has the netns cookie";
    EXPECT_TRUE(maps().podStats.lookupPerCpu(cookie).empty()) << "pod_stats still has the netns cookie";
    for (const auto& k : maps().dnsNat.keys()) EXPECT_NE(k.netns_cookie, cookie) << "dns_nat entry left";
    EXPECT_FALSE(pathExists(h_->bpffs().linkDir(id))) << h_->bpffs().linkDir(id) << " still exists";
    if (!ns) return;
    NetnsState s = netnsState(*ns);
    EXPECT_FALSE(hasReturnRule(s.rulesV4)) << s.rulesV4;
    EXPECT_FALSE(hasReturnRule(s.rulesV6)) << s.rulesV6;
    EXPECT_EQ(s.table100V4, "") << "v4 table 100 not empty";
    EXPECT_EQ(s.table100V6, "") << "v6 table 100 not empty";
    EXPECT_EQ(s.qdiscEth0.find("clsact"), std::string::npos) << s.qdiscEth0;
  }

  std::unique_ptr<PodHarness> h_;
};

class Lifecycle : public LifecycleBase, public ::testing::WithParamInterface<TcMode> {
 protected:
  TcMode mode() const override { return GetParam(); }
};

class LegacyLifecycle : public LifecycleBase {
 protected:
  TcMode mode() const override { return TcMode::Legacy; }
};

class TcxLifecycle : public LifecycleBase {
 protected:
  TcMode mode() const override { return TcMode::Tcx; }
};

// After removePod: plain networking at once (no capture, no stand-in event,
// the server sees the pod's own address) and no trace of the enrollment.
//
//   before: pod app --> eth0 egress --> stand-in :15001 --> node server
//   after:  pod app --> eth0 --> node server (directly)
TEST_P(Lifecycle, RemovePodRestoresPlainNetworkingAndLeavesNothing) {
  TestNetns& pod = h_->pod();
  ASSERT_TRUE(pod.setSysctl("net/ipv4/conf/eth0/accept_local", "0").ok());
  auto server4 = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  auto server6 = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV6, 0));
  ASSERT_TRUE(server4.ok() && server6.ok());
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  uint64_t cookie = info->netnsCookie;
  Status st = h_->startStandIn();
  ASSERT_TRUE(st.ok()) << st.error().message;

  // Captured while enrolled (and a DNS query, so dns_nat has an entry).
  for (auto* server : {server4->get(), server6->get()}) {
    auto c = tcpConnect(pod, server->local());
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_TRUE(echoRoundTrip(c->get(), "enrolled").ok());
  }
  ASSERT_TRUE(h_->waitForEvent("outbound"));
  auto dns = udpExchange(pod, Endpoint::of(PodTopology::kNodeV4, 53), dnsQuery(7, "x.example", 1));
  ASSERT_TRUE(dns.ok()) << dns.error().message;

  // What the enrollment installed.
  NetnsState on = netnsState(pod);
  EXPECT_TRUE(hasReturnRule(on.rulesV4)) << on.rulesV4;
  EXPECT_TRUE(hasReturnRule(on.rulesV6)) << on.rulesV6;
  EXPECT_NE(on.table100V4.find("local default dev lo"), std::string::npos) << on.table100V4;
  EXPECT_NE(on.table100V6.find("local default dev lo"), std::string::npos) << on.table100V6;
  EXPECT_EQ(pod.sysctl("net/ipv4/conf/eth0/accept_local").value(), "1");
  if (GetParam() == TcMode::Tcx) {
    for (const char* pin : {"eth0_ingress", "eth0_egress", "lo_egress"})
      EXPECT_TRUE(pathExists(h_->bpffs().linkDir(h_->podId()) + "/" + pin)) << pin;
  } else {
    EXPECT_NE(on.qdiscEth0.find("clsact"), std::string::npos) << on.qdiscEth0;
  }
  EXPECT_TRUE(maps().pods.lookup(podKey(h_->podId())));
  EXPECT_TRUE(maps().podConfig.lookup(cookie));
  EXPECT_FALSE(maps().podStats.lookupPerCpu(cookie).empty());

  st = h_->unenroll();
  ASSERT_TRUE(st.ok()) << st.error().message;

  // Plain networking, v4 and v6, with the stand-in still listening.
  h_->standIn().clearEvents();
  for (auto* server : {server4->get(), server6->get()}) {
    auto c = tcpConnect(pod, server->local());
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto echoed = echoRoundTrip(c->get(), "plain");
    ASSERT_TRUE(echoed.ok()) << echoed.error().message;
    EXPECT_EQ(*echoed, "plain");
    ASSERT_TRUE(server->waitForAccepts(2, kIoTimeout));
    EXPECT_EQ(server->peers().back().str(), localOf(c->get()).str());
  }
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());

  expectNoPodState(h_->podId(), cookie, &pod);
  EXPECT_EQ(pod.sysctl("net/ipv4/conf/eth0/accept_local").value(), "0");
}

// accept_local goes back to what it was, also when that was already 1.
TEST_P(Lifecycle, AcceptLocalKeepsAPreviousOne) {
  ASSERT_TRUE(h_->pod().setSysctl("net/ipv4/conf/eth0/accept_local", "1").ok());
  ASSERT_TRUE(h_->enroll().ok());
  ASSERT_TRUE(h_->unenroll().ok());
  EXPECT_EQ(h_->pod().sysctl("net/ipv4/conf/eth0/accept_local").value(), "1");
}

// Legacy attachment creates clsact on lo as well; removing the pod should
// not leave it behind (the brief's check is eth0; this is the same rule for lo).
TEST_F(LegacyLifecycle, RemovePodLeavesNoQdiscOnLoopback) {
  ASSERT_NE(netnsState(h_->pod()).qdiscLo.find("noqueue"), std::string::npos);
  ASSERT_TRUE(h_->enroll().ok());
  EXPECT_NE(netnsState(h_->pod()).qdiscLo.find("clsact"), std::string::npos);
  ASSERT_TRUE(h_->unenroll().ok());
  std::string lo = netnsState(h_->pod()).qdiscLo;
  EXPECT_EQ(lo.find("clsact"), std::string::npos) << "tc -n POD qdisc show dev lo:\n" << lo;
}

// Another tool's clsact qdisc and filter on eth0 stay when the pod goes.
//
//   pod eth0 ingress: clsact (foreign) -> pref 7 foreign bpf -> pref 0x51ce sluice
TEST_F(LegacyLifecycle, ForeignQdiscAndFilterSurviveRemoval) {
  auto prog = loadForeignProgram();
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  Status st = h_->pod().run([&]() -> Status {
    int ifindex = static_cast<int>(if_nametoindex("eth0"));
    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = BPF_TC_INGRESS);
    int err = bpf_tc_hook_create(&hook);
    if (err) return Error::fromErrno(err, "create clsact");
    LIBBPF_OPTS(bpf_tc_opts, o, .prog_fd = prog->get(), .handle = 7, .priority = 7);
    err = bpf_tc_attach(&hook, &o);
    if (err) return Error::fromErrno(err, "attach foreign filter");
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE(h_->enroll().ok());
  ASSERT_TRUE(h_->startStandIn().ok());
  auto c = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(h_->waitForEvent("outbound")) << describe(h_->events());

  ASSERT_TRUE(h_->unenroll().ok());
  auto q = sh("tc -n " + h_->pod().name() + " qdisc show dev eth0").out;
  EXPECT_NE(q.find("clsact"), std::string::npos) << q;
  auto f = sh("tc -n " + h_->pod().name() + " filter show dev eth0 ingress").out;
  EXPECT_NE(f.find("pref 7 "), std::string::npos) << f;
  EXPECT_EQ(f.find("pref 20942 "), std::string::npos) << f;
}

// Another tool's tcx program on eth0 stays when the pod goes.
TEST_F(TcxLifecycle, ForeignTcxProgramSurvivesRemoval) {
  auto prog = loadForeignProgram();
  ASSERT_TRUE(prog.ok()) << prog.error().message;
  Fd link;
  Status st = h_->pod().run([&]() -> Status {
    int ifindex = static_cast<int>(if_nametoindex("eth0"));
    int fd = bpf_link_create(prog->get(), ifindex, kTcxIngress, nullptr);
    if (fd < 0) return Error::fromErrno(errno, "tcx link");
    link = Fd(fd);
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_EQ(tcxIngressCount(h_->pod(), "eth0").value(), 1u);
  ASSERT_TRUE(h_->enroll().ok());
  EXPECT_EQ(tcxIngressCount(h_->pod(), "eth0").value(), 2u);
  ASSERT_TRUE(h_->unenroll().ok());
  EXPECT_EQ(tcxIngressCount(h_->pod(), "eth0").value(), 1u);
}

// IPv6 off on the pod's lo: only the v4 rule and route ("v6 only when lo
// has IPv6 enabled"); v4 is captured; removal leaves nothing.
TEST_P(Lifecycle, Ipv6DisabledOnLoopbackInstallsOnlyV4) {
  ASSERT_TRUE(h_->pod().setSysctl("net/ipv6/conf/lo/disable_ipv6", "1").ok());
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_FALSE(info->ipv6Routes);
  NetnsState s = netnsState(h_->pod());
  EXPECT_TRUE(hasReturnRule(s.rulesV4)) << s.rulesV4;
  EXPECT_FALSE(hasReturnRule(s.rulesV6)) << s.rulesV6;
  EXPECT_EQ(s.table100V6, "");
  StandInConfig cfg = testStandInConfig();
  cfg.ipv6 = false;
  ASSERT_TRUE(h_->startStandIn(cfg).ok());
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok());
  auto c = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(echoRoundTrip(c->get(), "v4-only").ok());
  EXPECT_TRUE(h_->waitForEvent("outbound")) << describe(h_->events());
  ASSERT_TRUE(h_->unenroll().ok());
  expectNoPodState(h_->podId(), info->netnsCookie, &h_->pod());
}

TEST_P(Lifecycle, AddPodTwiceWithSameSettingsSucceeds) {
  PodSpec spec;
  spec.dnsCapture = false;
  auto first = h_->enroll(spec);
  ASSERT_TRUE(first.ok()) << first.error().message;
  auto again = h_->enroll(spec);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->netnsCookie, first->netnsCookie);
  EXPECT_FALSE(again->dnsCapture);
  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].id, h_->podId());
  // Still exactly one return rule per family.
  std::string rules = h_->pod().ip("-4 rule show").out;
  EXPECT_EQ(rules.find("fwmark 0x111"), rules.rfind("fwmark 0x111")) << rules;
}

TEST_P(Lifecycle, AddPodWithOtherSettingsFails) {
  ASSERT_TRUE(h_->enroll().ok());
  PodSpec other;
  other.inboundCapture = false;
  auto again = h_->enroll(other);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("already enrolled with other settings"), std::string::npos)
      << again.error().message;
  // The first enrollment is untouched.
  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_TRUE(pods[0].inboundCapture);
}

// The pod's identity is recorded with it; the same pod with another
// identity is refused (a re-created sandbox gets a new netns, so this is a
// caller's mistake, not an update).
TEST_P(Lifecycle, IdentityIsRecordedAndAnotherOneIsRefused) {
  PodSpec spec;
  spec.identity = {"8b5c0d0e-4f0a-4b7e-9a51-0d5a5f1c2e3d", "web-0", "shop", "web"};
  auto info = h_->enroll(spec);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->identity, spec.identity);
  EXPECT_EQ(info->handoff, HandoffState::None);
  auto again = h_->enroll(spec);
  ASSERT_TRUE(again.ok()) << again.error().message;
  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].identity, spec.identity);
  spec.identity.uid = "another-uid";
  auto other = h_->enroll(spec);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code, EEXIST);
  EXPECT_EQ(other.error().message, "pod '" + h_->podId() +
                                       "' is already enrolled with another identity (uid "
                                       "'8b5c0d0e-4f0a-4b7e-9a51-0d5a5f1c2e3d', shop/web-0); remove it first");
  spec.identity.uid = "bad uid";
  auto bad = h_->enroll(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "uid has a character that is not printable ASCII (or a space)");
}

/// An Handoff that records what the data plane looked like when it ran.
struct RecordingHook {
  Handoff hook;
  int applied = 0, undone = 0;
  bool redirectionOn = false, probeAddressesIn = false, recordIn = false;
  Status result;
  /// apply returns `result` (changed by the test between adds), undo counts.
  explicit RecordingHook(Status first = {}, bool fatal = true) : result(std::move(first)) {
    hook.failureIsFatal = fatal;
    hook.apply = [this](const PodInfo&) {
      applied++;
      return result;
    };
    hook.undo = [this](const PodInfo&) { undone++; };
  }
  RecordingHook(const RecordingHook&) = delete;
  RecordingHook& operator=(const RecordingHook&) = delete;
};

// Istio's order: the hand-off runs once the redirection is in place and
// before the pod's addresses enter the probe SNAT set; its success is
// recorded in the registry.
TEST_P(Lifecycle, HandOffRunsBetweenRedirectionAndProbeSnat) {
  RecordingHook r;
  r.hook.apply = [&](const PodInfo& p) {
    r.applied++;
    r.redirectionOn = maps().podConfig.lookup(p.netnsCookie).has_value();
    r.recordIn = maps().pods.lookup(podKey(p.id)).has_value();
    for (const auto& k : maps().podAddrs.keys())
      if (maps().podAddrs.lookup(k)->netns_cookie == p.netnsCookie) r.probeAddressesIn = true;
    return r.result;
  };
  r.hook.undo = [&](const PodInfo&) { r.undone++; };
  PodSpec spec;
  spec.nodeNetnsPath = h_->node().path();
  auto info = h_->enroll(spec, &r.hook);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(r.applied, 1);
  EXPECT_TRUE(r.redirectionOn) << "handed off before the redirection was in place";
  EXPECT_TRUE(r.recordIn);
  EXPECT_FALSE(r.probeAddressesIn) << "probe SNAT before the hand-off";
  EXPECT_EQ(r.undone, 0);
  EXPECT_EQ(info->handoff, HandoffState::Acked);
  EXPECT_NE(info->handoffAtNs, 0u);
  EXPECT_FALSE(maps().podAddrs.keys().empty()) << "no probe SNAT after the hand-off";
  ASSERT_TRUE(h_->datapath().setHandoff(h_->podId(), HandoffState::Failed, "ztunnel said no").ok());
  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].handoff, HandoffState::Failed);
  EXPECT_EQ(pods[0].handoffError, "ztunnel said no");
  // Removed pods are not brought back by a late hand-off record.
  ASSERT_TRUE(h_->unenroll().ok());
  ASSERT_TRUE(h_->datapath().setHandoff(h_->podId(), HandoffState::Acked).ok());
  EXPECT_TRUE(h_->datapath().listPods().empty());
}

// A failed hand-off fails the enrollment and leaves nothing of it.
TEST_P(Lifecycle, FailedHandOffRollsBackEverything) {
  RecordingHook r(Error::msg("hand-off to the node proxy failed: no ztunnel connection (retryable)", EAGAIN));
  PodSpec spec;
  spec.nodeNetnsPath = h_->node().path();
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok());
  auto info = h_->enroll(spec, &r.hook);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code, EAGAIN);
  EXPECT_EQ(info.error().message, "hand-off to the node proxy failed: no ztunnel connection (retryable)");
  EXPECT_EQ(r.applied, 1);
  EXPECT_EQ(r.undone, 0) << "undo of a hand-off that did not happen";
  expectNoPodState(h_->pod().name(), *cookie, &h_->pod());
  EXPECT_TRUE(maps().podAddrs.keys().empty());
}

// A step after the hand-off fails (the node side: no host-side veth in the
// node netns given): the hand-off is undone with the rest — also after a
// hand-off that failed without being fatal (a running pod's), since it may
// have been half done.
void LifecycleBase::expectNodeSideFailureUndoesHandOff(bool fatal, Status handOffResult) {
  RecordingHook r(handOffResult, fatal);
  TestNetns elsewhere("node2");
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.error();
  PodSpec spec;
  spec.nodeNetnsPath = elsewhere.path();
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok());
  auto info = h_->enroll(spec, &r.hook);
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.error().message.find("no host-side veth"), std::string::npos) << info.error().message;
  EXPECT_EQ(r.applied, 1);
  EXPECT_EQ(r.undone, 1);
  expectNoPodState(h_->pod().name(), *cookie, &h_->pod());
}

TEST_P(Lifecycle, FailureAfterHandOffUndoesIt) { expectNodeSideFailureUndoesHandOff(true, Status()); }

TEST_P(Lifecycle, FailureAfterNonFatalHandOffFailureUndoesIt) {
  expectNodeSideFailureUndoesHandOff(false, Error::msg("hand-off failed", EAGAIN));
}

// Adding an enrolled pod again retries its hand-off; a failure then is
// reported and recorded but leaves the enrollment in place.
TEST_P(Lifecycle, RetriedAddRetriesTheHandOff) {
  RecordingHook r;
  r.hook.apply = [&](const PodInfo&) {
    r.applied++;
    return r.result;
  };
  ASSERT_TRUE(h_->enroll({}, &r.hook).ok());
  r.result = Error::msg("hand-off to the node proxy failed: ack time-out (retryable)", EAGAIN);
  auto again = h_->enroll({}, &r.hook);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, EAGAIN);
  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u) << "a failed retry removed the pod";
  EXPECT_EQ(pods[0].handoff, HandoffState::Failed);
  EXPECT_EQ(pods[0].handoffError, "hand-off to the node proxy failed: ack time-out (retryable)");
  r.result = Status();
  auto third = h_->enroll({}, &r.hook);
  ASSERT_TRUE(third.ok()) << third.error().message;
  EXPECT_EQ(third->handoff, HandoffState::Acked);
  EXPECT_EQ(r.applied, 3);
}

// A running pod enrolled by the Kubernetes controller: a hand-off failure
// is not fatal. The redirection and the node side stay, the failure is
// recorded, the add succeeds; a retried add hands it off.
TEST_P(Lifecycle, NonFatalHandOffFailureKeepsTheRedirection) {
  RecordingHook r(Error::msg("hand-off to the node proxy failed: no ztunnel connection (retryable)", EAGAIN), false);
  PodSpec spec;
  spec.nodeNetnsPath = h_->node().path();
  auto info = h_->enroll(spec, &r.hook);
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->handoff, HandoffState::Failed);
  EXPECT_EQ(info->handoffError, "hand-off to the node proxy failed: no ztunnel connection (retryable)");
  EXPECT_TRUE(maps().podConfig.lookup(info->netnsCookie)) << "redirection rolled back";
  EXPECT_FALSE(maps().podAddrs.keys().empty()) << "probe SNAT not in place";
  EXPECT_EQ(r.undone, 0);
  // Failing again is still not an error; then the node proxy takes it.
  auto again = h_->enroll(spec, &r.hook);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->handoff, HandoffState::Failed);
  r.result = Status();
  auto third = h_->enroll(spec, &r.hook);
  ASSERT_TRUE(third.ok()) << third.error().message;
  EXPECT_EQ(third->handoff, HandoffState::Acked);
  EXPECT_EQ(third->handoffError, "");
  EXPECT_EQ(r.applied, 3);
}


TEST_P(Lifecycle, SecondIdForSameNetnsFails) {
  ASSERT_TRUE(h_->enroll().ok());
  PodSpec spec;
  spec.netnsPath = h_->pod().path();
  spec.id = "second-id";
  auto r = h_->datapath().addPod(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("already enrolled as pod"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(h_->podId()), std::string::npos) << r.error().message;
  EXPECT_EQ(h_->datapath().listPods().size(), 1u);
  EXPECT_FALSE(pathExists(h_->bpffs().linkDir("second-id")));
  EXPECT_FALSE(maps().pods.lookup(podKey("second-id")));
}

TEST_P(Lifecycle, MissingNetnsFailsAndLeavesNoState) {
  std::string missing = "/run/netns/sluice-missing-" + std::to_string(::getpid());
  PodSpec spec;
  spec.netnsPath = missing;
  auto r = h_->datapath().addPod(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(missing), std::string::npos) << r.error().message;
  EXPECT_TRUE(h_->datapath().listPods().empty());
  EXPECT_TRUE(maps().pods.keys().empty());
  EXPECT_TRUE(maps().podConfig.keys().empty());
  EXPECT_TRUE(maps().podStats.keys().empty());
  EXPECT_FALSE(pathExists(h_->bpffs().linkDir(defaultPodId(missing))));
}

//   bare netns: lo only --> "no non-loopback interface", nothing installed
TEST_P(Lifecycle, NetnsWithOnlyLoopbackFailsAndLeavesNoState) {
  TestNetns bare("bare");
  ASSERT_TRUE(bare.ok()) << bare.error();
  auto cookie = bare.cookie();
  ASSERT_TRUE(cookie.ok());
  PodSpec spec;
  spec.netnsPath = bare.path();
  auto r = h_->datapath().addPod(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no non-loopback interface"), std::string::npos) << r.error().message;
  NetnsState s = netnsState(bare);
  EXPECT_FALSE(hasReturnRule(s.rulesV4)) << s.rulesV4;
  EXPECT_FALSE(hasReturnRule(s.rulesV6)) << s.rulesV6;
  EXPECT_EQ(s.table100V4, "");
  EXPECT_EQ(s.table100V6, "");
  EXPECT_EQ(s.qdiscLo.find("clsact"), std::string::npos) << s.qdiscLo;
  expectNoPodState(bare.name(), *cookie, nullptr);
}

TEST_P(Lifecycle, MissingRerouteIfaceFailsAndLeavesNoState) {
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok());
  PodSpec spec;
  spec.rerouteIfaces = {"nope0"};
  auto r = h_->enroll(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("nope0"), std::string::npos) << r.error().message;
  expectNoPodState(h_->pod().name(), *cookie, &h_->pod());
  EXPECT_EQ(h_->pod().sysctl("net/ipv4/conf/eth0/accept_local").value(), "0");
}

// A failure half way (the first tcx pin cannot be created) rolls back the
// sysctl, the rules and the routes made before it.
TEST_F(TcxLifecycle, FailedAttachRollsBackEverything) {
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok());
  // Occupy the pin path of the first attachment with a directory.
  std::string dir = h_->bpffs().linkDir(h_->pod().name());
  ASSERT_EQ(::mkdir((h_->bpffs().root() + "/links").c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(::mkdir((dir + "/eth0_ingress").c_str(), 0700), 0) << std::strerror(errno);

  auto r = h_->enroll();
  ASSERT_FALSE(r.ok()) << "addPod succeeded over an occupied pin path";
  NetnsState s = netnsState(h_->pod());
  EXPECT_FALSE(hasReturnRule(s.rulesV4)) << s.rulesV4;
  EXPECT_FALSE(hasReturnRule(s.rulesV6)) << s.rulesV6;
  EXPECT_EQ(s.table100V4, "");
  EXPECT_EQ(s.table100V6, "");
  EXPECT_EQ(h_->pod().sysctl("net/ipv4/conf/eth0/accept_local").value(), "0");
  EXPECT_TRUE(h_->datapath().listPods().empty());
  EXPECT_FALSE(maps().podConfig.lookup(*cookie));
  // Nothing attached: the pod's traffic flows as before.
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok());
  auto c = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(echoRoundTrip(c->get(), "unattached").ok());
}

TEST_P(Lifecycle, RemoveUnknownPodFails) {
  Status st = h_->datapath().removePod("no-such-pod");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("not enrolled"), std::string::npos) << st.error().message;
  auto stats = h_->datapath().stats(std::string("no-such-pod"));
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.error().message.find("not enrolled"), std::string::npos) << stats.error().message;
}

// The pod's netns is deleted first (the pod died): removal still succeeds
// and cleans the pins and map entries.
TEST_P(Lifecycle, RemovePodWhoseNetnsIsGone) {
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  std::string id = h_->podId();
  h_->pod().remove();
  ASSERT_FALSE(pathExists(h_->pod().path()));
  Status st = h_->unenroll();
  ASSERT_TRUE(st.ok()) << st.error().message;
  expectNoPodState(id, info->netnsCookie, nullptr);
}

// Counters: connections handed to the outbound and inbound listeners.
//
//   pod app --> stand-in :15001 --> node server      (outbound_conns)
//   node client --> stand-in :15006 --> pod app      (inbound_conns)
TEST_P(Lifecycle, StatsCountConnections) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  auto app = TcpServer::start(h_->pod(), Endpoint::any(AF_INET));
  ASSERT_TRUE(server.ok() && app.ok());
  ASSERT_TRUE(h_->enroll().ok());
  ASSERT_TRUE(h_->startStandIn().ok());
  auto zero = h_->stats();
  EXPECT_EQ(zero.outbound_conns, 0u);
  EXPECT_EQ(zero.inbound_conns, 0u);
  for (int i = 0; i < 2; i++) {
    auto out = tcpConnect(h_->pod(), (*server)->local());
    ASSERT_TRUE(out.ok()) << out.error().message;
    ASSERT_TRUE(echoRoundTrip(out->get(), "o").ok());
  }
  auto in = tcpConnect(h_->node(), Endpoint::of(PodTopology::kPodV4, (*app)->port()));
  ASSERT_TRUE(in.ok()) << in.error().message;
  ASSERT_TRUE(echoRoundTrip(in->get(), "i").ok());
  auto s = h_->stats();
  EXPECT_EQ(s.outbound_conns, 2u);
  EXPECT_EQ(s.inbound_conns, 1u);
  EXPECT_GT(s.owned_pkts, 0u);
  EXPECT_EQ(s.dropped_pkts, 0u);
  auto all = h_->datapath().stats(std::nullopt);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].id, h_->podId());
}

// Two pods on one Datapath share the programs and maps but not their
// settings, counters or DNS translations, even with identical addresses.
//
//   topology A (pod A, dns-capture off)     topology B (pod B, defaults)
//   node A 10.200.0.1 <--> pod A 10.200.0.2  node B 10.200.0.1 <--> pod B 10.200.0.2
//   stand-in A in pod A                      stand-in B in pod B
TEST_P(Lifecycle, TwoPodsAreKeptApart) {
  PodTopology b;
  ASSERT_TRUE(b.ok()) << b.error();
  PodSpec specA;
  specA.dnsCapture = false;
  ASSERT_TRUE(h_->enroll(specA).ok());
  PodSpec specB;
  specB.netnsPath = b.pod().path();
  specB.id = b.pod().name();
  auto infoB = h_->datapath().addPod(specB);
  ASSERT_TRUE(infoB.ok()) << infoB.error().message;
  ASSERT_TRUE(h_->startStandIn().ok());
  StandInConfig cfgB = testStandInConfig();
  cfgB.netnsPath = b.pod().path();
  auto standInB = ProxyStandIn::start(cfgB);
  ASSERT_TRUE(standInB.ok()) << standInB.error().message;

  Endpoint resolver = Endpoint::of(PodTopology::kNodeV4, 53);
  auto realResolverA = UdpServer::start(h_->node(), resolver);
  ASSERT_TRUE(realResolverA.ok());
  std::string q = dnsQuery(0x2222, "kept.apart", 1);
  // Pod A: not captured, the node's server echoes the query.
  auto ra = udpExchange(h_->pod(), resolver, q);
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  EXPECT_EQ(ra->payload, q);
  // Pod B: answered by its stand-in, from the resolver's address.
  auto rb = udpExchange(b.pod(), resolver, q);
  ASSERT_TRUE(rb.ok()) << rb.error().message;
  EXPECT_EQ(rb->from.str(), resolver.str());
  auto answer = parseDnsAnswer(rb->payload);
  ASSERT_TRUE(answer && answer->response);

  // Outbound TCP of each pod goes to its own stand-in.
  auto serverA = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  auto serverB = TcpServer::start(b.node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(serverA.ok() && serverB.ok());
  auto ca = tcpConnect(h_->pod(), (*serverA)->local());
  ASSERT_TRUE(ca.ok()) << ca.error().message;
  ASSERT_TRUE(echoRoundTrip(ca->get(), "a").ok());
  auto cb = tcpConnect(b.pod(), (*serverB)->local());
  ASSERT_TRUE(cb.ok()) << cb.error().message;
  ASSERT_TRUE(echoRoundTrip(cb->get(), "b").ok());
  EXPECT_EQ(h_->events("outbound").size(), 1u) << describe(h_->events());
  EXPECT_TRUE(h_->events("dns-udp").empty()) << describe(h_->events());
  auto eventsB = (*standInB)->events();
  ASSERT_EQ(eventsB.size(), 2u) << describe(eventsB);
  EXPECT_EQ(eventsB[0].listener, "dns-udp");
  EXPECT_EQ(eventsB[1].listener, "outbound");

  auto all = h_->datapath().stats(std::nullopt);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  for (const auto& c : *all) {
    EXPECT_EQ(c.stats.outbound_conns, 1u) << c.id;
    EXPECT_EQ(c.stats.dns_udp_queries, c.id == specB.id ? 1u : 0u) << c.id;
  }

  // Removing A leaves B captured.
  ASSERT_TRUE(h_->unenroll().ok());
  auto cb2 = tcpConnect(b.pod(), (*serverB)->local());
  ASSERT_TRUE(cb2.ok()) << cb2.error().message;
  ASSERT_TRUE(echoRoundTrip(cb2->get(), "b2").ok());
  EXPECT_EQ((*standInB)->events().size(), 3u) << describe((*standInB)->events());
  (*standInB)->stop();
  EXPECT_TRUE(h_->datapath().removePod(specB.id).ok());
}

INSTANTIATE_TEST_SUITE_P(All, Lifecycle, ::testing::Values(TcMode::Tcx, TcMode::Legacy), modeParamName);

}  // namespace
}  // namespace sluice::test
