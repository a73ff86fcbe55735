// SYN cookies in tc mode (issue 27, item 6; docs/redirection.md, rule 6):
// the ACK that completes a handshake the proxy's 15006 listener answered
// with a cookie finds no request socket, so it must be handed to that
// listener like the SYN was. Left to the stack, it reaches whatever listens
// on the destination port -- the app's listener, which accepts the proxy's
// cookie when it overflowed recently itself (the cookie secret is per host):
// a connection around the proxy. Without such an app, every cookie
// handshake is reset.
//
//   node netns                                  pod netns (enrolled, tc mode,
//   client 10.200.0.1 / fd00:200::1             net.ipv4.tcp_syncookies=2:
//   attacker 10.200.0.66 / fd00:200::66 on      every SYN answered with a cookie)
//   vethpod (AF_PACKET)          <---->  eth0   stand-in [::]:15006, app [::]:P
//
// Cookies are forced with tcp_syncookies=2 (namespaced) instead of a SYN
// flood: deterministic, and the cookie path is the same. A listener that
// sends a cookie stamps itself "recently overflowed", which is what makes
// it accept cookies; the app gets that stamp by connecting to itself over
// loopback, which any app may do.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "test/common/packet.h"
#include "test/common/pod_app.h"
#include "test/common/raw_link.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using namespace std::chrono_literals;

constexpr uint16_t kAttackerPort = 41100;
constexpr uint32_t kSynSeq = 0x2000;
constexpr auto kAnswerTimeout = 1500ms;

using SynCookieParam = std::tuple<TcMode, int>;

class SynCookie : public ::testing::TestWithParam<SynCookieParam> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF, AF_PACKET)";
    if (std::string why = tcModeUnsupported(mode()); !why.empty()) GTEST_SKIP() << why;
    h_ = std::make_unique<PodHarness>(mode());
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    Status st = h_->open();
    ASSERT_TRUE(st.ok()) << st.error().message;
    // Every SYN the pod's listeners get is answered with a cookie, and no
    // request socket is kept (IPv6 follows the IPv4 key).
    st = h_->pod().setSysctl("net/ipv4/tcp_syncookies", "2");
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  void TearDown() override { h_.reset(); }

  TcMode mode() const { return std::get<0>(GetParam()); }
  int family() const { return std::get<1>(GetParam()); }
  std::string podIp() const { return PodTopology::podAddr(family()); }
  std::string nodeIp() const { return PodTopology::nodeAddr(family()); }
  std::string loopback() const { return family() == AF_INET ? "127.0.0.1" : "::1"; }
  std::string attacker() const { return family() == AF_INET ? "10.200.0.66" : "fd00:200::66"; }

  void enrollWithProxy(PodSpec spec = {}) {
    auto info = h_->enroll(spec);
    ASSERT_TRUE(info.ok()) << info.error().message;
    Status st = h_->startStandIn(testStandInConfig());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  /// The app's listener sends a cookie of its own (to the app itself, over
  /// loopback, which is not captured), so that it accepts cookies for a
  /// while. Done as a pod's app would: its own cgroup, CAP_NET_RAW alone.
  void appOverflowsItsOwnListener(TcpServer& app) {
    const Endpoint self = Endpoint::of(loopback(), app.port());
    const int fam = family();
    auto r = runAsPodApp(h_->pod().path(), [&](std::string& out) {
      int fd = ::socket(fam, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return 1;
      sockaddr_storage ss{};
      socklen_t len = 0;
      if (fam == AF_INET) {
        auto* a = reinterpret_cast<sockaddr_in*>(&ss);
        a->sin_family = AF_INET;
        a->sin_port = htons(self.port());
        ::inet_pton(AF_INET, self.ip().c_str(), &a->sin_addr);
        len = sizeof(*a);
      } else {
        auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(self.port());
        ::inet_pton(AF_INET6, self.ip().c_str(), &a->sin6_addr);
        len = sizeof(*a);
      }
      if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
        out = std::string("connect: ") + std::strerror(errno);
        return 2;
      }
      // The handshake completed with the app's own cookie; the echo proves
      // the connection is the listener's.
      const char ping[] = "self";
      if (::send(fd, ping, 4, MSG_NOSIGNAL) != 4) return 3;
      char buf[4];
      if (::recv(fd, buf, sizeof(buf), MSG_WAITALL) != 4) return 4;
      ::close(fd);
      return 0;
    });
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->exitCode, 0) << r->out;
    ASSERT_TRUE(app.waitForAccepts(1, kIoTimeout));
  }

  /// One inbound connection from the node, completed with a cookie and
  /// used; the stand-in must have relayed it.
  void connectThroughProxy(const Endpoint& target, std::set<std::string>& peers) {
    auto c = tcpConnect(h_->node(), target);
    ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
    auto echoed = echoRoundTrip(c->get(), "cookie " + localOf(c->get()).str());
    ASSERT_TRUE(echoed.ok()) << echoed.error().message << describe(h_->events());
    EXPECT_EQ(*echoed, "cookie " + localOf(c->get()).str());
    peers.insert(localOf(c->get()).str());
  }

  std::set<std::string> inboundPeers() {
    std::set<std::string> s;
    for (const auto& ev : h_->events("inbound")) s.insert(ev.peer);
    return s;
  }

  std::unique_ptr<PodHarness> h_;
};

// A legitimate client while cookies are in play: its ACK must reach the
// listener that issued the cookie. Fails before the fix: the ACK went to the
// app's listener, which had sent no cookie and answered with a reset.
TEST_P(SynCookie, CookieHandshakeIsCompletedByProxy) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok()) << app.error().message;
  ASSERT_NO_FATAL_FAILURE(enrollWithProxy());
  const Endpoint target = Endpoint::of(podIp(), (*app)->port());

  std::set<std::string> peers;
  ASSERT_NO_FATAL_FAILURE(connectThroughProxy(target, peers));
  auto ev = h_->waitForEvent("inbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15006);
  EXPECT_EQ(ev->origDst, target.str());
  EXPECT_EQ(peers, std::set<std::string>{ev->peer});
  EXPECT_EQ(ev->detail, "upstream ok");
  ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout)) << "the proxy relays to the app";
  EXPECT_EQ((*app)->peers().front().ip(), nodeIp());
  auto st = h_->stats();
  EXPECT_GE(st.inbound_conns, 1u);
  EXPECT_GE(st.owned_pkts, 1u);  // the cookie ACK, among others
  EXPECT_EQ(st.dropped_pkts, 0u);
}

// The attack: the app makes its own listener accept cookies (a
// connection to itself over loopback), then three connections from the
// remote are answered with the proxy's cookies. Before the fix their ACKs
// went to the app's listener, which accepted all three: the proxy never saw
// them. Now each is the proxy's, relayed to the app.
TEST_P(SynCookie, AppCannotTakeConnectionsThroughTheProxysCookies) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok()) << app.error().message;
  ASSERT_NO_FATAL_FAILURE(enrollWithProxy());
  ASSERT_NO_FATAL_FAILURE(appOverflowsItsOwnListener(**app));
  const Endpoint target = Endpoint::of(podIp(), (*app)->port());

  std::set<std::string> peers;
  for (int i = 0; i < 3; i++) ASSERT_NO_FATAL_FAILURE(connectThroughProxy(target, peers));
  ASSERT_EQ(peers.size(), 3u);
  ASSERT_TRUE(eventually([&] { return h_->events("inbound").size() >= 3; }, kIoTimeout))
      << "connections the proxy never saw:" << describe(h_->events());
  EXPECT_EQ(inboundPeers(), peers) << describe(h_->events());
  // The loopback one and the proxy's three relays.
  ASSERT_TRUE((*app)->waitForAccepts(4, kIoTimeout));
  EXPECT_EQ((*app)->accepted(), 4u);
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

// Fail closed: a valid cookie (issued by the proxy's listener, which then
// went away) whose ACK arrives when the proxy has no listener is dropped and
// counted; the app's listener, which accepts cookies, never gets it. Before
// the fix the app accepted the connection.
TEST_P(SynCookie, CookieAckWithoutProxyListenerIsDropped) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok()) << app.error().message;
  ASSERT_NO_FATAL_FAILURE(enrollWithProxy());
  ASSERT_NO_FATAL_FAILURE(appOverflowsItsOwnListener(**app));

  // Answers to the attacker's address leave on the veth, where the
  // AF_PACKET socket captures them, and die at the node (no forwarding).
  auto podMac = linkMac(h_->pod(), "eth0");
  auto nodeMac = linkMac(h_->node(), "vethpod");
  ASSERT_TRUE(podMac.ok() && nodeMac.ok());
  for (const TestNetns* ns : {&h_->pod(), &h_->node()}) {
    Status off = ns->setSysctl("net/ipv4/ip_forward", "0");
    ASSERT_TRUE(off.ok()) << off.error().message;
  }
  for (auto [ns, dev, mac] : {std::tuple{&h_->pod(), "eth0", &*nodeMac}, std::tuple{&h_->node(), "vethpod", &*podMac}}) {
    char m[32];
    const Mac& a = *mac;
    std::snprintf(m, sizeof(m), "%02x:%02x:%02x:%02x:%02x:%02x", a[0], a[1], a[2], a[3], a[4], a[5]);
    auto r = ns->ip(std::string("neigh replace ") + attacker() + " lladdr " + m + " dev " + dev + " nud permanent");
    ASSERT_EQ(r.exitCode, 0) << r.describe();
  }
  auto link = RawLink::open(h_->node(), "vethpod");
  ASSERT_TRUE(link.ok()) << link.error().message;

  // The SYN: captured, answered by the proxy's 15006 with a cookie.
  const uint16_t port = (*app)->port();
  Packet syn = Packet::tcp(attacker(), kAttackerPort, podIp(), port).macs(*nodeMac, *podMac).seq(kSynSeq);
  ASSERT_TRUE((*link)->send(syn.bytes()).ok());
  const IpAddr pod = IpAddr::parse(podIp()), att = IpAddr::parse(attacker());
  auto synAck = (*link)->waitFor(
      [&](const CapturedFrame& f) {
        const ParsedPacket& p = f.parsed;
        return p.proto == IPPROTO_TCP && p.tcpFlags &&
               (*p.tcpFlags & (tcpflag::SYN | tcpflag::ACK)) == (tcpflag::SYN | tcpflag::ACK) && p.src == pod &&
               p.dst == att && p.sport == port && p.dport == kAttackerPort;
      },
      kAnswerTimeout);
  ASSERT_TRUE(synAck) << "no SYN|ACK from the proxy: the observation is broken";
  const Bytes& b = synAck->bytes;
  const size_t off = synAck->parsed.l4Off;
  const uint32_t cookie = static_cast<uint32_t>(b[off + 4]) << 24 | static_cast<uint32_t>(b[off + 5]) << 16 |
                          static_cast<uint32_t>(b[off + 6]) << 8 | b[off + 7];

  // The proxy goes away; its cookie stays valid (stateless, per host).
  h_->stopStandIn();
  const uint64_t droppedBefore = h_->stats().dropped_pkts;
  Packet ack = Packet::tcp(attacker(), kAttackerPort, podIp(), port, tcpflag::ACK)
                   .macs(*nodeMac, *podMac)
                   .seq(kSynSeq + 1, cookie + 1);
  ASSERT_TRUE((*link)->send(ack.bytes()).ok());
  EXPECT_TRUE(eventually([&] { return h_->stats().dropped_pkts > droppedBefore; }, kIoTimeout))
      << "the cookie ACK was not dropped";
  std::this_thread::sleep_for(200ms);  // an accept, had the ACK completed a connection
  EXPECT_EQ((*app)->accepted(), 1u) << "the app's own listener accepted the proxy's cookie";
  for (const auto& p : (*app)->peers()) EXPECT_NE(p.ip(), attacker());
}

// The near-miss: with inbound capture off the SYN is the app's, and so is
// the cookie ACK (the app's listener issued the cookie and accepts it); the
// proxy sees nothing, nothing is dropped.
TEST_P(SynCookie, InboundCaptureOffLeavesCookieHandshakeToTheApp) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok()) << app.error().message;
  PodSpec spec;
  spec.inboundCapture = false;
  ASSERT_NO_FATAL_FAILURE(enrollWithProxy(spec));

  auto c = tcpConnect(h_->node(), Endpoint::of(podIp(), (*app)->port()));
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto echoed = echoRoundTrip(c->get(), "direct cookie");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "direct cookie");
  ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ((*app)->peers().front().str(), localOf(c->get()).str());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

INSTANTIATE_TEST_SUITE_P(All, SynCookie,
                         ::testing::Combine(::testing::Values(TcMode::Tcx, TcMode::Legacy),
                                            ::testing::Values(AF_INET, AF_INET6)),
                         modeFamilyName);

}  // namespace
}  // namespace sluice::test
