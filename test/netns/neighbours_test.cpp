// sluice among other programs on the same hooks (loader/tc.h,
// bpf/lib/verdict.h), tcx and legacy, IPv4 and IPv6: a foreign program of
// the test's own (foreign_tc.bpf.c: counts what it sees by protocol and
// ports) on every TC hook sluice uses -- the pod's eth0 ingress and egress
// and its lo egress. The host-side veth has none of sluice's (the node's
// probes get their source at connect(), bpf/node_probe.bpf.c).
//
//   node netns                       pod netns (enrolled, stand-in, app)
//   vethpod  ------------------>  eth0 ingress: [sluice][foreign]
//           <------------------   eth0 egress:  [sluice][foreign]
//                                 lo egress:    [sluice][foreign]
//
// - A foreign program attached *before* enrollment that ends the chain (as a
//   CNI that passes what it allows) must not keep sluice from running:
//   sluice's programs go to the front.
// - A foreign program attached *after* sluice must see every packet sluice
//   does not keep for itself: what it leaves alone, what it only translated
//   (probe SNAT, DNS answers), and inbound connection set-up handed to the
//   proxy; not the app's outbound packets sluice loops to the proxy.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>

#include "foreign_tc.skel.h"
#include "enroll/datapath.h"
#include "loader/tc.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using namespace std::chrono_literals;

constexpr int kPass = 0;   // TC_ACT_OK / TCX_PASS: ends the chain
constexpr int kNext = -1;  // TCX_NEXT / TC_ACT_UNSPEC: hands on

/// One foreign program attached at one hook; detached by the destructor.
class ForeignProgram {
 public:
  /// tcx: appended, or at the front with @p front (BPF_F_BEFORE, no
  /// anchor). clsact: at @p legacyPriority, handle the same.
  static Result<std::unique_ptr<ForeignProgram>> attach(const TestNetns& ns, const std::string& ifname, TcHook hook,
                                                        TcMode mode, int verdict, uint32_t legacyPriority,
                                                        bool front = false) {
    std::unique_ptr<ForeignProgram> p(new ForeignProgram());
    p->ns_ = &ns;
    p->hook_ = hook;
    p->mode_ = mode;
    p->priority_ = legacyPriority;
    p->skel_ = foreign_tc__open();
    if (!p->skel_) return Error::fromErrno(errno, "open foreign_tc");
    p->skel_->rodata->verdict = verdict;
    if (int err = foreign_tc__load(p->skel_); err != 0) return Error::fromErrno(err, "load foreign_tc");
    int progFd = bpf_program__fd(p->skel_->progs.foreign);
    SLUICE_TRY(ns.run([&]() -> Status {
      p->ifindex_ = static_cast<int>(::if_nametoindex(ifname.c_str()));
      if (!p->ifindex_) return Error::fromErrno(errno, "no " + ifname + " in " + ns.name());
      if (mode == TcMode::Tcx) {
        LIBBPF_OPTS(bpf_link_create_opts, o, .flags = front ? 1U << 3 : 0);  // BPF_F_BEFORE
        int fd = bpf_link_create(progFd, p->ifindex_, static_cast<enum bpf_attach_type>(hook == TcHook::Ingress ? 46 : 47),
                                 &o);
        if (fd < 0) return Error::fromErrno(errno, "attach the foreign program (tcx) to " + ifname);
        p->link_ = Fd(fd);
        return {};
      }
      LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = p->ifindex_,
                  .attach_point = hook == TcHook::Ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS);
      int err = bpf_tc_hook_create(&h);
      if (err != 0 && err != -EEXIST) return Error::fromErrno(err, "clsact on " + ifname);
      LIBBPF_OPTS(bpf_tc_opts, o, .prog_fd = progFd, .handle = legacyPriority, .priority = legacyPriority);
      if ((err = bpf_tc_attach(&h, &o)) != 0) return Error::fromErrno(err, "attach the foreign filter to " + ifname);
      return {};
    }));
    return p;
  }

  ~ForeignProgram() {
    link_ = Fd();  // a tcx link not pinned anywhere is detached when closed
    if (mode_ == TcMode::Legacy && ifindex_)
      (void)ns_->run([&]() -> Status {
        LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex_,
                    .attach_point = hook_ == TcHook::Ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS);
        LIBBPF_OPTS(bpf_tc_opts, o, .handle = priority_, .priority = priority_);
        (void)bpf_tc_detach(&h, &o);
        return {};
      });
    if (skel_) foreign_tc__destroy(skel_);
  }

  /// Packets seen of protocol @p proto with these ports (0: any port).
  uint64_t seen(uint8_t proto, uint16_t sport, uint16_t dport) const {
    int map = bpf_map__fd(skel_->maps.seen);
    struct Key {
      uint8_t proto, pad;
      uint16_t sport, dport, pad2;
    } k{}, next{};
    uint64_t total = 0;
    void* prev = nullptr;
    while (bpf_map_get_next_key(map, prev, &next) == 0) {
      uint64_t n = 0;
      if (bpf_map_lookup_elem(map, &next, &n) == 0 && next.proto == proto && (!sport || ntohs(next.sport) == sport) &&
          (!dport || ntohs(next.dport) == dport))
        total += n;
      k = next;
      prev = &k;
    }
    return total;
  }

 private:
  ForeignProgram() = default;
  const TestNetns* ns_ = nullptr;
  TcHook hook_ = TcHook::Ingress;
  TcMode mode_ = TcMode::Tcx;
  uint32_t priority_ = 0;
  int ifindex_ = 0;
  Fd link_;
  foreign_tc* skel_ = nullptr;
};

using NeighbourParam = std::tuple<TcMode, int>;

class Neighbours : public ::testing::TestWithParam<NeighbourParam> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(mode()); !why.empty()) GTEST_SKIP() << why;
    h_ = std::make_unique<PodHarness>(mode());
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    ASSERT_TRUE(h_->open().ok());
  }
  void TearDown() override {
    foreign_.clear();
    h_.reset();
  }

  TcMode mode() const { return std::get<0>(GetParam()); }
  int family() const { return std::get<1>(GetParam()); }
  std::string podIp() const { return PodTopology::podAddr(family()); }
  std::string nodeIp() const { return PodTopology::nodeAddr(family()); }

  /// The five hooks sluice uses, by name.
  struct Hook {
    const char* name;
    bool inPod;
    const char* ifname;
    TcHook hook;
  };
  static constexpr Hook kHooks[] = {{"pod eth0 ingress", true, "eth0", TcHook::Ingress},
                                    {"pod eth0 egress", true, "eth0", TcHook::Egress},
                                    {"pod lo egress", true, "lo", TcHook::Egress}};

  /// A foreign program on every hook. legacyPriority 1 with handle 1 is
  /// what Cilium uses (sluice then shares priority 1 with it).
  void attachForeign(int verdict, uint32_t legacyPriority, bool front = false) {
    for (const Hook& hk : kHooks) {
      auto p = ForeignProgram::attach(hk.inPod ? h_->pod() : h_->node(), hk.ifname, hk.hook, mode(), verdict,
                                      legacyPriority, front);
      ASSERT_TRUE(p.ok()) << hk.name << ": " << p.error().message;
      foreign_[hk.name] = std::move(*p);
    }
  }

  int otherFamily() const { return family() == AF_INET ? AF_INET6 : AF_INET; }

  /// Enrolls the pod with its node side and starts the stand-in. The probe
  /// source is registered for the pod's address of the other family only:
  /// every socket of the node is a prober to the addresses registered, so
  /// the node reaches the proxy's inbound capture through this family and
  /// the probe path through the other one (both cross the same hooks).
  void enrollWithProxy() {
    PodSpec spec;
    spec.nodeNetnsPath = h_->node().path();
    spec.ips = {PodTopology::podAddr(otherFamily())};
    auto info = h_->enroll(spec);
    ASSERT_TRUE(info.ok()) << info.error().message;
    ASSERT_FALSE(info->hostIface.empty()) << "no node side";
    Status st = h_->startStandIn(testStandInConfig());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  const ForeignProgram& at(const char* hook) { return *foreign_.at(hook); }

  std::unique_ptr<PodHarness> h_;
  std::map<std::string, std::unique_ptr<ForeignProgram>> foreign_;
};

// A foreign program that ends the chain, attached first on every hook:
// sluice's programs are put in front of it, so capture, DNS and probe SNAT
// work as without it. Fails on main: sluice's links were appended (tcx) and
// its filter had priority 0x51ce (clsact), after the foreign one, which
// passed every packet before sluice saw it.
TEST_P(Neighbours, ForeignProgramAttachedFirstDoesNotSkipSluice) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(nodeIp(), 0));
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  auto probeApp = TcpServer::start(h_->pod(), Endpoint::any(otherFamily()));
  ASSERT_TRUE(server.ok() && app.ok() && probeApp.ok());
  attachForeign(kPass, 1);
  if (HasFatalFailure()) return;
  enrollWithProxy();
  if (HasFatalFailure()) return;

  auto out = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_TRUE(echoRoundTrip(out->get(), "out").ok());
  EXPECT_TRUE(h_->waitForEvent("outbound")) << "outbound capture skipped: " << describe(h_->events());

  auto in = tcpConnect(h_->node(), Endpoint::of(podIp(), (*app)->port()));
  ASSERT_TRUE(in.ok()) << in.error().message;
  ASSERT_TRUE(echoRoundTrip(in->get(), "in").ok());
  EXPECT_TRUE(h_->waitForEvent("inbound")) << "inbound capture skipped: " << describe(h_->events());

  auto dns = udpExchange(h_->pod(), Endpoint::of(nodeIp(), 53), dnsQuery(0x3131, "sluice.example.com", 1));
  ASSERT_TRUE(dns.ok()) << "DNS capture or its answer's translation skipped: " << dns.error().message;
  EXPECT_EQ(dns->from.str(), Endpoint::of(nodeIp(), 53).str());

  // The probe (other family): the node's own socket, SNATed on vethpod,
  // the replies translated back.
  h_->standIn().clearEvents();
  auto probe = tcpConnect(h_->node(), Endpoint::of(PodTopology::podAddr(otherFamily()), (*probeApp)->port()));
  ASSERT_TRUE(probe.ok()) << "probe SNAT skipped: " << probe.error().message;
  ASSERT_TRUE(echoRoundTrip(probe->get(), "probe").ok());
  ASSERT_TRUE((*probeApp)->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ((*probeApp)->peers().back().ip(), PodTopology::probeAddr(otherFamily()))
      << "the app saw the node's address";
  EXPECT_TRUE(h_->events("inbound").empty()) << "a probe must reach the app directly: " << describe(h_->events());
}

// A foreign program that hands on, attached after sluice on every hook,
// sees what sluice passes or only translates; it does not see the app's
// packets sluice loops to the proxy. Fails on main: sluice ended the chain
// (TC_ACT_OK) for every packet it let through, so the foreign program saw
// nothing at all.
TEST_P(Neighbours, ForeignProgramAfterSluiceSeesWhatSluicePasses) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(nodeIp(), 0));
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  auto udpEcho = UdpServer::start(h_->node(), Endpoint::of(nodeIp(), 0));
  auto probeApp = TcpServer::start(h_->pod(), Endpoint::any(otherFamily()));
  ASSERT_TRUE(server.ok() && app.ok() && udpEcho.ok() && probeApp.ok());
  enrollWithProxy();
  if (HasFatalFailure()) return;
  attachForeign(kNext, 2);
  if (HasFatalFailure()) return;
  const uint8_t udp = IPPROTO_UDP, tcp = IPPROTO_TCP;
  const uint16_t udpPort = (*udpEcho)->port(), appPort = (*app)->port(), serverPort = (*server)->port();

  // Rule 5: other UDP, left alone both ways.
  ASSERT_TRUE(udpExchange(h_->pod(), (*udpEcho)->local(), "plain").ok());
  EXPECT_GE(at("pod eth0 egress").seen(udp, 0, udpPort), 1u);
  EXPECT_GE(at("pod eth0 ingress").seen(udp, udpPort, 0), 1u);

  // Rule 3: the DNS answer, translated on lo, goes on to the next program
  // with the resolver's port as its source.
  ASSERT_TRUE(udpExchange(h_->pod(), Endpoint::of(nodeIp(), 53), dnsQuery(0x3232, "sluice.example.com", 1)).ok());
  EXPECT_GE(at("pod lo egress").seen(udp, 53, 0), 1u) << "the translated DNS answer";

  // Rule 6: inbound set-up handed to the proxy goes on (the foreign program
  // sees the SYN as it would before Istio's TPROXY rule).
  auto in = tcpConnect(h_->node(), Endpoint::of(podIp(), appPort));
  ASSERT_TRUE(in.ok()) << in.error().message;
  ASSERT_TRUE(echoRoundTrip(in->get(), "in").ok());
  ASSERT_TRUE(h_->waitForEvent("inbound")) << describe(h_->events());
  EXPECT_GE(at("pod eth0 ingress").seen(tcp, 0, appPort), 1u) << "inbound connection set-up";

  // Rule 1: the app's outbound packets are sluice's (looped to the proxy);
  // the proxy's own connection to the server leaves through the chain.
  auto out = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_TRUE(echoRoundTrip(out->get(), "out").ok());
  ASSERT_TRUE(h_->waitForEvent("outbound")) << describe(h_->events());
  const uint16_t appSport = localOf(out->get()).port();
  EXPECT_EQ(at("pod eth0 egress").seen(tcp, appSport, serverPort), 0u) << "a looped packet reached the next program";
  EXPECT_GE(at("pod eth0 egress").seen(tcp, 0, serverPort), 1u) << "the proxy's own connection";

  // Rule 10 (other family): the probe, from the probe address (bound at
  // connect()), passes the pod's hooks on to the next program both ways.
  const uint16_t probePort = (*probeApp)->port();
  auto probe = tcpConnect(h_->node(), Endpoint::of(PodTopology::podAddr(otherFamily()), probePort));
  ASSERT_TRUE(probe.ok()) << probe.error().message;
  ASSERT_TRUE(echoRoundTrip(probe->get(), "probe").ok());
  ASSERT_TRUE((*probeApp)->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ((*probeApp)->peers().back().ip(), PodTopology::probeAddr(otherFamily()));
  const uint16_t proberPort = localOf(probe->get()).port();
  EXPECT_GE(at("pod eth0 ingress").seen(tcp, proberPort, probePort), 1u) << "the probe";
  EXPECT_GE(at("pod eth0 egress").seen(tcp, probePort, proberPort), 1u) << "the reply";
}

// Someone puts a program that ends the chain in front of sluice's after
// enrollment (tcx: BPF_F_BEFORE), or an earlier sluice build left its
// filters at priority 0x51ce behind another filter (clsact): outbound
// capture is skipped until the sweep moves sluice's programs to the front
// again, with no gap (the new attachment comes first, the old one goes).
TEST_P(Neighbours, SweepPutsSluiceFirstAgain) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(nodeIp(), 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  enrollWithProxy();
  if (HasFatalFailure()) return;
  PodPrograms& progs = h_->datapath().programs();
  const int progOf[] = {progs.ingressFd(), progs.egressFd(), progs.loEgressFd()};
  if (mode() == TcMode::Tcx) {
    attachForeign(kPass, 0, /*front=*/true);
  } else {
    // What an earlier build left: sluice at priority 0x51ce, another filter
    // at a smaller number before it.
    for (size_t i = 0; i < std::size(kHooks); i++) {
      const Hook& hk = kHooks[i];
      Status st = (hk.inPod ? h_->pod() : h_->node()).run([&]() -> Status {
        int ifindex = static_cast<int>(::if_nametoindex(hk.ifname));
        SLUICE_TRY(detachLegacy(ifindex, hk.hook, false));
        LIBBPF_OPTS(bpf_tc_hook, th, .ifindex = ifindex,
                    .attach_point = hk.hook == TcHook::Ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS);
        LIBBPF_OPTS(bpf_tc_opts, o, .prog_fd = progOf[i], .handle = 0x51ce, .priority = 0x51ce);
        if (int err = bpf_tc_attach(&th, &o); err != 0) return Error::fromErrno(err, "old-priority filter");
        return {};
      });
      ASSERT_TRUE(st.ok()) << hk.name << ": " << st.error().message;
    }
    attachForeign(kPass, 2);
  }
  if (HasFatalFailure()) return;
  {
    ConnectOptions o;
    o.timeout = 600ms;
    auto c = tcpConnect(h_->pod(), (*server)->local(), o);
    ASSERT_TRUE(c.ok()) << c.error().message;  // straight to the server: not captured
    EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  }

  auto check = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_EQ(check->problems.size(), std::size(kHooks)) << ::testing::PrintToString(check->problems);
  ReconcileReport r = h_->datapath().reconcile();
  EXPECT_TRUE(r.errors.empty()) << ::testing::PrintToString(r.errors);
  ASSERT_EQ(r.repaired.size(), 1u);
  EXPECT_EQ(r.repaired.front().repaired.size(), std::size(kHooks)) << ::testing::PrintToString(r.repaired.front().problems);
  auto again = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->problems.empty()) << ::testing::PrintToString(again->problems);

  auto c = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(echoRoundTrip(c->get(), "first-again").ok());
  EXPECT_TRUE(h_->waitForEvent("outbound")) << "still skipped: " << describe(h_->events());
  if (mode() == TcMode::Legacy) {
    for (size_t i = 0; i < std::size(kHooks); i++) {
      const Hook& hk = kHooks[i];
      (void)(hk.inPod ? h_->pod() : h_->node()).run([&]() -> Status {
        EXPECT_FALSE(legacyAtOldPriority(static_cast<int>(::if_nametoindex(hk.ifname)), hk.hook)) << hk.name;
        return {};
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Neighbours,
                         ::testing::Combine(::testing::Values(TcMode::Tcx, TcMode::Legacy),
                                            ::testing::Values(AF_INET, AF_INET6)),
                         modeFamilyName);

}  // namespace
}  // namespace sluice::test
