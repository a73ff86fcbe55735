// Dual-stack app sockets (AF_INET6 reaching IPv4 destinations through
// v4-mapped addresses, Java's default) through an enrolled pod, tcx and
// legacy. Their packets are IPv4 while the socket is IPv6: pod_egress must
// still recognise the socket as the packet's own and remember its decision
// there (sock_verdict), or a connection whose proxy socket is gone leaves
// the pod in clear instead of being reset.
//
//   pod app AF_INET6 --[::ffff:10.200.0.1]:P--> eth0 egress --> stand-in :15001 --> node server
//   pod app AF_INET6 --[::ffff:10.200.0.1]:53 (UDP, TCP)--> stand-in DNS 127.0.0.1:15053
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

#include "maps/sluice_maps.h"
#include "test/common/raw_link.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using namespace std::chrono_literals;

std::string mapped(const std::string& v4) { return "::ffff:" + v4; }

class DualStack : public ::testing::TestWithParam<TcMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
    h_ = std::make_unique<PodHarness>(GetParam());
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    ASSERT_TRUE(h_->open().ok());
  }
  void TearDown() override { h_.reset(); }

  void enrollWithProxy() {
    auto info = h_->enroll();
    ASSERT_TRUE(info.ok()) << info.error().message;
    Status st = h_->startStandIn(testStandInConfig());
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  /// pod_egress's decision on an app socket (enum sluice_verdict), read
  /// with the socket's fd as the key; -errno when there is none.
  int verdictOf(int sockFd) {
    const std::string pin = h_->bpffs().root() + "/sock_verdict";
    Fd map(::bpf_obj_get(pin.c_str()));
    if (!map.valid()) return -errno;
    sluice_sock_verdict v{};
    if (::bpf_map_lookup_elem(map.get(), &sockFd, &v) != 0) return -errno;
    return static_cast<int>(v.verdict);
  }

  std::unique_ptr<PodHarness> h_;
};

// Rule 1 from a dual-stack socket: relayed by the proxy, the original
// destination is the IPv4 one, and the decision is kept on the socket.
// Fails on main: no verdict (-ENOENT) on the AF_INET6 socket.
TEST_P(DualStack, OutboundToIpv4IsRelayedAndRemembered) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  enrollWithProxy();
  Endpoint dst = Endpoint::of(mapped(PodTopology::kNodeV4), (*server)->port());
  auto c = tcpConnect(h_->pod(), dst);
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  ASSERT_EQ(localOf(c->get()).family(), AF_INET6);
  std::string payload(64 * 1024, 'd');
  auto echoed = echoRoundTrip(c->get(), payload);
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, payload);
  auto ev = h_->waitForEvent("outbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->origDst, (*server)->local().str());
  ASSERT_TRUE((*server)->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ((*server)->peers().front().ip(), PodTopology::kPodV4);
  EXPECT_EQ(verdictOf(c->get()), SLUICE_VERDICT_OWNED) << "the decision was not remembered on the socket";
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

// A dual-stack socket that existed before enrollment: its decision (pass)
// is remembered too, and it keeps working.
TEST_P(DualStack, ConnectionFromBeforeEnrollmentPassesAndIsRemembered) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  auto c = tcpConnect(h_->pod(), Endpoint::of(mapped(PodTopology::kNodeV4), (*server)->port()));
  ASSERT_TRUE(c.ok()) << c.error().message;
  enrollWithProxy();
  auto echoed = echoRoundTrip(c->get(), "before");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "before");
  EXPECT_EQ(verdictOf(c->get()), SLUICE_VERDICT_PASS);
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

// Rules 2 and 3 from dual-stack sockets: the answers come from the
// resolver's address as the app's socket knows it.
TEST_P(DualStack, DnsOverUdpAndTcpIsAnsweredByProxy) {
  enrollWithProxy();
  Endpoint resolver = Endpoint::of(mapped(PodTopology::kNodeV4), 53);
  for (bool connected : {true, false}) {
    SCOPED_TRACE(connected ? "connected UDP socket" : "unconnected UDP socket");
    auto reply = udpExchange(h_->pod(), resolver, dnsQuery(0x0a0a, "sluice.example.com", 1), connected);
    ASSERT_TRUE(reply.ok()) << reply.error().message << describe(h_->events());
    EXPECT_EQ(reply->from.str(), resolver.str());
    auto answer = parseDnsAnswer(reply->payload);
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->id, 0x0a0a);
  }
  EXPECT_EQ(h_->events("dns-udp").size(), 2u) << describe(h_->events());

  auto c = tcpConnect(h_->pod(), resolver);
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  std::string q = dnsQuery(0x0b0b, "sluice.example.com", 1);
  std::string framed = std::string(1, static_cast<char>(q.size() >> 8)) + static_cast<char>(q.size() & 0xff) + q;
  ASSERT_EQ(::send(c->get(), framed.data(), framed.size(), MSG_NOSIGNAL), static_cast<ssize_t>(framed.size()));
  auto len = readSome(c->get(), 2);
  ASSERT_TRUE(len.ok() && len->size() == 2) << describe(h_->events());
  size_t n = static_cast<uint8_t>((*len)[0]) << 8 | static_cast<uint8_t>((*len)[1]);
  auto msg = readSome(c->get(), n);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  auto answer = parseDnsAnswer(*msg);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->id, 0x0b0b);
  EXPECT_EQ(peerOf(c->get()).str(), resolver.str());
  EXPECT_TRUE(h_->waitForEvent("dns-tcp")) << describe(h_->events());
  EXPECT_TRUE(h_->events("outbound").empty()) << describe(h_->events());
}

// The proxy goes away mid-connection: the app sees a reset and the
// destination sees nothing of what the app sends afterwards. A proxy socket
// that closed (FIN) would linger as a FIN_WAIT2 time-wait socket for
// tcp_fin_timeout (1 s here); after that nothing in the pod owns the flow.
// Fails on main for the dual-stack socket: without a remembered decision
// its data went out to the server in clear (a v4 socket was reset).
TEST_P(DualStack, ProxyGoneMidConnectionResetsAppAndLeaksNothing) {
  auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  ASSERT_TRUE(h_->pod().setSysctl("net/ipv4/tcp_fin_timeout", "1").ok());
  enrollWithProxy();
  auto watch = RawLink::open(h_->node(), "vethpod");
  ASSERT_TRUE(watch.ok()) << watch.error().message;

  for (std::string dstIp : {mapped(PodTopology::kNodeV4), std::string(PodTopology::kNodeV4)}) {
    SCOPED_TRACE(dstIp == PodTopology::kNodeV4 ? "AF_INET socket" : "dual-stack AF_INET6 socket");
    auto c = tcpConnect(h_->pod(), Endpoint::of(dstIp, (*server)->port()));
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto echoed = echoRoundTrip(c->get(), "hello");
    ASSERT_TRUE(echoed.ok() && *echoed == "hello");
    const uint16_t appPort = localOf(c->get()).port();

    h_->stopStandIn();
    // The stopping stand-in resets the connections it relays, as a killed
    // proxy's are; an EOF (a proxy that closed) leads to the same below.
    auto gone = readSome(c->get(), 1);
    ASSERT_TRUE((gone.ok() && gone->empty()) || (!gone.ok() && gone.error().code == ECONNRESET))
        << "expected a reset or EOF from the proxy: " << (gone.ok() ? "data" : gone.error().message);
    std::this_thread::sleep_for(2500ms);  // the proxy's time-wait socket expires

    const std::string secret = "secret-after-the-proxy-went-away";
    bool reset = false;
    for (int i = 0; i < 20 && !reset; i++) {
      if (::send(c->get(), secret.data(), secret.size(), MSG_NOSIGNAL) < 0)
        reset = errno == EPIPE || errno == ECONNRESET;
      else
        std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(reset) << "the app's writes kept succeeding";
    auto leaked = (*watch)->captured([&](const CapturedFrame& f) {
      return !f.outgoing && f.parsed.proto == IPPROTO_TCP && f.parsed.sport == appPort;
    });
    EXPECT_TRUE(leaked.empty()) << leaked.size() << " packet(s) of the app's connection left the pod, first: "
                                << leaked.front().parsed.describe();
    ASSERT_TRUE(h_->startStandIn(testStandInConfig()).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(All, DualStack, ::testing::Values(TcMode::Tcx, TcMode::Legacy),
                         [](const ::testing::TestParamInfo<TcMode>& i) { return std::string(modeName(i.param)); });

}  // namespace
}  // namespace sluice::test
