// The redirection contract (docs/redirection.md, rules 1-9 and the
// per-pod options) with real traffic through real namespaces, in every mode
// (captured at TC with tcx or legacy (clsact) attachment, and captured at the
// socket), over IPv4 and IPv6. The stand-in keeps ztunnel's SO_REUSEPORT
// wherever the mode can serve it (the socket mode on every kernel).
//
//   node netns                              pod netns (enrolled)
//   +------------------------------+        +-------------------------------------+
//   | servers / clients            |        | app sockets          stand-in:      |
//   | 10.200.0.1  fd00:200::1      |        | 10.200.0.2           [::]:15001 out  |
//   | (169.254.7.127, fd16:..:ffff |  veth  | fd00:200::2          [::]:15006 in   |
//   |  for the probe tests)        |<------>| eth0: pod_ingress    [::]:15008 hbone|
//   |                    vethpod   |        |       pod_egress     127.0.0.1/::1   |
//   +------------------------------+        | lo:   pod_lo_egress  :15053 DNS      |
//                                           +-------------------------------------+
//
// Each test gets its own namespaces, bpffs root, Datapath and stand-in
// (test/common/topology.h), so the cases are independent and can run in
// parallel. "No stand-in event" is how a test sees that a connection was not
// captured: the stand-in records every connection and query it receives.
#include <arpa/inet.h>
#include <fcntl.h>
#include <bpf/bpf.h>
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

#include "maps/sluice_maps.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

constexpr uint32_t kProxyMark = 0x539;

/// Attach mode, family, capture, and whether the proxy listens before the
/// pod is enrolled (as ztunnel does in every pod of a node Istio's agent
/// ran, and wherever it got the pod first): then no sock_ops hook of this
/// bpffs root existed when it called listen().
using RedirectParam = std::tuple<TcMode, int, CaptureMode, bool>;

std::string paramName(const ::testing::TestParamInfo<RedirectParam>& info) {
  std::string mode = std::get<2>(info.param) == CaptureMode::Socket ? "socket" : modeName(std::get<0>(info.param));
  return mode + "_" + familyName(std::get<1>(info.param)) + (std::get<3>(info.param) ? "_proxy_first" : "");
}

class Redirect : public ::testing::TestWithParam<RedirectParam> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = tcModeUnsupported(mode()); !why.empty()) GTEST_SKIP() << why;
    if (socketMode())
      if (std::string why = socketCaptureUnsupported(); !why.empty()) GTEST_SKIP() << why;
    h_ = std::make_unique<PodHarness>(mode(), std::get<2>(GetParam()));
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    Status st = h_->open();
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  void TearDown() override { h_.reset(); }

  TcMode mode() const { return std::get<0>(GetParam()); }
  int family() const { return std::get<1>(GetParam()); }
  /// Captured at the socket: no packet loops through TC, so the counters of
  /// later packets (owned_pkts) stay 0, and what the kernel refuses by
  /// itself (a connect() to a closed port) is not counted as dropped.
  bool socketMode() const { return std::get<2>(GetParam()) == CaptureMode::Socket; }
  std::string podIp() const { return PodTopology::podAddr(family()); }
  std::string nodeIp() const { return PodTopology::nodeAddr(family()); }
  Endpoint podEp(uint16_t port) const { return Endpoint::of(podIp(), port); }
  Endpoint nodeEp(uint16_t port) const { return Endpoint::of(nodeIp(), port); }

  bool proxyFirst() const { return std::get<3>(GetParam()); }

  /// Enrolls the pod and starts the stand-in inside it; in the proxy-first
  /// variant the stand-in listens first.
  void enrollWithProxy(PodSpec spec = {}) {
    if (proxyFirst()) {
      Status st = h_->startStandIn();
      ASSERT_TRUE(st.ok()) << st.error().message;
    }
    auto info = h_->enroll(spec);
    ASSERT_TRUE(info.ok()) << info.error().message;
    if (proxyFirst()) return;
    Status st = h_->startStandIn();
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  std::unique_ptr<TcpServer> tcpServer(TestNetns& ns, const Endpoint& at) {
    auto s = TcpServer::start(ns, at);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<UdpServer> udpServer(TestNetns& ns, const Endpoint& at) {
    auto s = UdpServer::start(ns, at);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::string dnsName() const { return "sluice.example.com"; }
  uint16_t dnsType() const { return family() == AF_INET ? 1 : 28; }
  std::string dnsAnswerAddr() const { return family() == AF_INET ? "10.96.0.99" : "fd00::99"; }

  std::unique_ptr<PodHarness> h_;
};

// ---- Rule 1: outbound TCP goes to the proxy's 15001 listener -------------------
//
//   pod app --SYN 10.200.0.1:P--> eth0 egress --loop--> eth0 ingress
//       --sk_assign--> stand-in :15001 (local addr = 10.200.0.1:P)
//       --relay, mark 0x539--> node server 10.200.0.1:P
TEST_P(Redirect, Rule1OutboundTcpIsRelayedByProxy) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(server);
  enrollWithProxy();

  auto c = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  // The app sees an ordinary connection to the server it dialled.
  EXPECT_EQ(peerOf(c->get()).str(), server->local().str());
  // Enough bytes for many segments: every later packet must follow the flow.
  std::string payload(96 * 1024, 'x');
  for (size_t i = 0; i < payload.size(); i++) payload[i] = static_cast<char>('a' + i % 26);
  auto echoed = echoRoundTrip(c->get(), payload);
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, payload);

  auto ev = h_->waitForEvent("outbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15001);
  EXPECT_EQ(ev->origDst, server->local().str());
  EXPECT_EQ(ev->peer, localOf(c->get()).str());
  EXPECT_EQ(ev->detail, "upstream ok");
  if (socketMode() && family() == AF_INET6) {
    // IPv6 at the socket: to a port of [::1] in the block that spreads a
    // pod's connections by destination, which pod_sk_lookup hands to the
    // proxy's outbound listener; [::1]:15001 would mean the listener was
    // never found (as when the proxy listened first and nobody looked).
    CommandResult ss = sh("ip netns exec " + h_->pod().name() + " ss -Htn6 state established src " +
                          localOf(c->get()).str());
    const auto at = ss.out.find("[::1]:");
    ASSERT_NE(at, std::string::npos) << ss.out;
    const unsigned port = std::stoul(ss.out.substr(at + 6));
    EXPECT_GE(port, SLUICE_PROXY_LO6_PORT_BASE) << ss.out;
    EXPECT_LT(port, SLUICE_PROXY_LO6_PORT_BASE + (1u << SLUICE_PROXY_LO6_PORT_BITS)) << ss.out;
  }
  // At TC the accepted socket's local address is the destination; at the
  // socket it is the proxy's own, and SO_ORIGINAL_DST (IPv6:
  // IP6T_SO_ORIGINAL_DST) answers as with Istio's REDIRECT; ztunnel asks
  // those first.
  EXPECT_EQ(ev->origDstFrom, !socketMode()          ? "local address"
                             : family() == AF_INET ? "SO_ORIGINAL_DST"
                                                   : "IP6T_SO_ORIGINAL_DST");
  EXPECT_TRUE(h_->events("inbound").empty()) << describe(h_->events());

  // The server got the proxy's connection (the pod's own address).
  ASSERT_TRUE(server->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(server->peers().front().ip(), podIp());
  auto st = h_->stats();
  EXPECT_GE(st.outbound_conns, 1u);
  if (!socketMode()) {
    EXPECT_GE(st.owned_pkts, 1u);
  }
  EXPECT_EQ(st.dropped_pkts, 0u);
}

// ---- Rule 2: TCP to port 53 goes to the DNS listener ----------------------------
//
//   pod app --SYN 10.200.0.1:53--> egress: DNAT to 10.200.0.2:15053, loop
//       --> stand-in 127.0.0.1:15053 (TCP) --answer--> lo egress: source
//       back to 10.200.0.1:53 --> app
TEST_P(Redirect, Rule2TcpDnsIsAnsweredByProxy) {
  enrollWithProxy();
  Endpoint resolver = nodeEp(53);  // nothing listens there: only the proxy can answer
  auto c = tcpConnect(h_->pod(), resolver);
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  EXPECT_EQ(peerOf(c->get()).str(), resolver.str());

  std::string q = dnsQuery(0x5151, dnsName(), dnsType());
  std::string framed;
  framed += static_cast<char>(q.size() >> 8);
  framed += static_cast<char>(q.size() & 0xff);
  framed += q;
  ASSERT_EQ(::send(c->get(), framed.data(), framed.size(), MSG_NOSIGNAL), static_cast<ssize_t>(framed.size()));
  auto lenBytes = readSome(c->get(), 2);
  ASSERT_TRUE(lenBytes.ok()) << lenBytes.error().message << describe(h_->events());
  ASSERT_EQ(lenBytes->size(), 2u);
  size_t len = static_cast<uint8_t>((*lenBytes)[0]) << 8 | static_cast<uint8_t>((*lenBytes)[1]);
  auto msg = readSome(c->get(), len);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  auto answer = parseDnsAnswer(*msg);
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->id, 0x5151);
  EXPECT_TRUE(answer->response);
  EXPECT_EQ(answer->question, dnsName());
  ASSERT_EQ(answer->addresses.size(), 1u);
  EXPECT_EQ(answer->addresses[0], dnsAnswerAddr());
  // Still connected to the resolver, as far as the app can tell.
  EXPECT_EQ(peerOf(c->get()).str(), resolver.str());

  auto ev = h_->waitForEvent("dns-tcp");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15053);
  EXPECT_TRUE(h_->events("outbound").empty()) << describe(h_->events());
  auto st = h_->stats();
  EXPECT_GE(st.dns_tcp_conns, 1u);
  // At the socket a TCP answer needs no translation (getpeername does it).
  if (!socketMode()) {
    EXPECT_GE(st.dns_answers, 1u);
  }
}

// ---- Rule 3: UDP to port 53 goes to the DNS listener, answers come from the ----
// ---- resolver's address --------------------------------------------------------
//
//   pod app (connected UDP) --10.200.0.1:53--> egress: DNAT, loop --> stand-in
//       127.0.0.1:15053 --answer--> lo egress: source = 10.200.0.1:53 --> app
TEST_P(Redirect, Rule3UdpDnsAnswerComesFromResolver) {
  enrollWithProxy();
  Endpoint resolver = nodeEp(53);
  for (bool connected : {true, false}) {
    SCOPED_TRACE(connected ? "connected UDP socket" : "unconnected UDP socket");
    uint16_t id = connected ? 0x0c0c : 0x0d0d;
    auto reply = udpExchange(h_->pod(), resolver, dnsQuery(id, dnsName(), dnsType()), connected);
    ASSERT_TRUE(reply.ok()) << reply.error().message << describe(h_->events());
    EXPECT_EQ(reply->from.str(), resolver.str());
    auto answer = parseDnsAnswer(reply->payload);
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->id, id);
    EXPECT_TRUE(answer->response);
    ASSERT_EQ(answer->addresses.size(), 1u);
    EXPECT_EQ(answer->addresses[0], dnsAnswerAddr());
  }
  auto events = h_->events("dns-udp");
  ASSERT_EQ(events.size(), 2u) << describe(h_->events());
  EXPECT_EQ(events[0].listenerPort, 15053);
  EXPECT_EQ(events[0].detail, dnsName() + (family() == AF_INET ? " A" : " AAAA"));
  auto st = h_->stats();
  EXPECT_GE(st.dns_udp_queries, 2u);
  EXPECT_GE(st.dns_answers, 2u);
}

// DNS capture off: rules 2 and 3 are off. UDP/53 reaches the real resolver;
// TCP/53 is ordinary outbound TCP (rule 1).
//
//   pod app --UDP 10.200.0.1:53--> node UDP server :53 (directly)
//   pod app --TCP 10.200.0.1:53--> stand-in :15001 --> node TCP server :53
TEST_P(Redirect, DnsCaptureOffLeavesDnsToResolver) {
  auto udp53 = udpServer(h_->node(), nodeEp(53));
  auto tcp53 = tcpServer(h_->node(), nodeEp(53));
  ASSERT_TRUE(udp53 && tcp53);
  PodSpec spec;
  spec.dnsCapture = false;
  enrollWithProxy(spec);

  std::string q = dnsQuery(0x0e0e, dnsName(), dnsType());
  auto reply = udpExchange(h_->pod(), nodeEp(53), q);
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  EXPECT_EQ(reply->payload, q);  // the node's server echoes
  ASSERT_TRUE(udp53->waitForDatagrams(1, kIoTimeout));
  EXPECT_EQ(udp53->received().front().from.ip(), podIp());
  EXPECT_EQ(udp53->received().front().payload, q);

  auto c = tcpConnect(h_->pod(), nodeEp(53));
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto echoed = echoRoundTrip(c->get(), "tcp53");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "tcp53");
  auto ev = h_->waitForEvent("outbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->origDst, nodeEp(53).str());

  EXPECT_TRUE(h_->events("dns-udp").empty()) << describe(h_->events());
  EXPECT_TRUE(h_->events("dns-tcp").empty()) << describe(h_->events());
  auto st = h_->stats();
  EXPECT_EQ(st.dns_udp_queries, 0u);
  EXPECT_EQ(st.dns_tcp_conns, 0u);
}

// ---- Rule 4 (and 6): inbound TCP goes to 15006; the proxy's spoofed -----------
// ---- connection to the app gets the app's replies back --------------------------
//
//   node client 10.200.0.1:C --SYN 10.200.0.2:P--> eth0 ingress --sk_assign-->
//       stand-in :15006 --connect from 10.200.0.1 (IP_TRANSPARENT, mark)-->
//       app 10.200.0.2:P (over lo); app replies to 10.200.0.1 leave by eth0
//       egress --> owned by the proxy socket --> looped back to it
TEST_P(Redirect, Rule4InboundIsRelayedWithClientAddress) {
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  enrollWithProxy();

  Endpoint target = podEp(app->port());
  auto c = tcpConnect(h_->node(), target);
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  std::string payload(32 * 1024, 'i');
  auto echoed = echoRoundTrip(c->get(), payload);
  ASSERT_TRUE(echoed.ok()) << echoed.error().message << describe(h_->events());
  EXPECT_EQ(*echoed, payload);

  auto ev = h_->waitForEvent("inbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15006);
  EXPECT_EQ(ev->origDst, target.str());
  EXPECT_EQ(ev->peer, localOf(c->get()).str());
  EXPECT_EQ(ev->detail, "upstream ok");

  // The app saw the real client's address (the spoofed source).
  ASSERT_TRUE(app->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(app->peers().front().ip(), nodeIp());
  EXPECT_TRUE(h_->events("outbound").empty()) << describe(h_->events());
  auto st = h_->stats();
  EXPECT_GE(st.inbound_conns, 1u);
  if (!socketMode()) {
    EXPECT_GE(st.owned_pkts, 1u);  // the app's replies, handed back to the proxy
  }
  EXPECT_EQ(st.dropped_pkts, 0u);
}

// ---- Rule 5: nothing else is touched --------------------------------------------

//   pod app --UDP 10.200.0.1:P--> node UDP echo server (no proxy)
TEST_P(Redirect, Rule5OtherUdpIsNotCaptured) {
  auto server = udpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(server);
  enrollWithProxy();
  auto reply = udpExchange(h_->pod(), server->local(), "plain-udp");
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  EXPECT_EQ(reply->payload, "plain-udp");
  EXPECT_EQ(reply->from.str(), server->local().str());
  ASSERT_TRUE(server->waitForDatagrams(1, kIoTimeout));
  EXPECT_EQ(server->received().front().from.ip(), podIp());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

//   pod app (SO_MARK 0x539) --SYN 10.200.0.1:P--> node server, directly
TEST_P(Redirect, Rule5ProxyMarkedTrafficIsNotCaptured) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(server);
  enrollWithProxy();
  ConnectOptions o;
  o.mark = kProxyMark;
  auto c = tcpConnect(h_->pod(), server->local(), o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  // Rule 6 too: the server's replies arrive at the pod and must reach this
  // socket, not the inbound listener.
  std::string payload(64 * 1024, 'm');
  auto echoed = echoRoundTrip(c->get(), payload);
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, payload);
  ASSERT_TRUE(server->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(server->peers().front().str(), localOf(c->get()).str());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  EXPECT_EQ(h_->stats().outbound_conns, 0u);
  EXPECT_EQ(h_->stats().inbound_conns, 0u);
}

//   pod app --> 10.200.0.2:P (its own address, over lo) --> pod server
TEST_P(Redirect, Rule5PodCallingItsOwnAddressIsNotCaptured) {
  auto server = tcpServer(h_->pod(), podEp(0));
  ASSERT_TRUE(server);
  enrollWithProxy();
  auto c = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto echoed = echoRoundTrip(c->get(), "self");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "self");
  ASSERT_TRUE(server->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(server->peers().front().str(), localOf(c->get()).str());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

//   pod app --> 127.0.0.1:P / [::1]:P --> pod server
TEST_P(Redirect, Rule5LoopbackIsNotCaptured) {
  std::string lo = family() == AF_INET ? "127.0.0.1" : "::1";
  auto server = tcpServer(h_->pod(), Endpoint::of(lo, 0));
  ASSERT_TRUE(server);
  enrollWithProxy();
  auto c = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto echoed = echoRoundTrip(c->get(), "loopback");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "loopback");
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

//   pod --ICMP echo--> node, node --ICMP echo--> pod
TEST_P(Redirect, Rule5IcmpIsNotTouched) {
  enrollWithProxy();
  Status out = icmpEcho(h_->pod(), nodeIp());
  EXPECT_TRUE(out.ok()) << out.error().message;
  Status in = icmpEcho(h_->node(), podIp());
  EXPECT_TRUE(in.ok()) << in.error().message;
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

// ---- Rules 6-8: inbound exceptions -----------------------------------------------

//   node client --SYN 10.200.0.2:15008--> stand-in's own hbone listener
TEST_P(Redirect, Rule7HbonePortIsDeliveredToProxyDirectly) {
  enrollWithProxy();
  auto c = tcpConnect(h_->node(), podEp(15008));
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto greeting = readSome(c->get(), 64);
  ASSERT_TRUE(greeting.ok()) << greeting.error().message;
  EXPECT_EQ(*greeting, "hbone\n");
  auto ev = h_->waitForEvent("hbone");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15008);
  EXPECT_EQ(ev->origDst, podEp(15008).str());
  EXPECT_EQ(ev->peer, localOf(c->get()).str());
  EXPECT_TRUE(h_->events("inbound").empty()) << describe(h_->events());
  EXPECT_EQ(h_->stats().inbound_conns, 0u);
}

//   node client bound to 169.254.7.127 / fd16:9254:7127:1337:ffff:ffff:ffff:ffff
//       --SYN 10.200.0.2:P--> app directly (kubelet probes are not captured)
TEST_P(Redirect, Rule8ProbeSourceReachesAppDirectly) {
  Status st = h_->topo().addProbeAddresses();
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  enrollWithProxy();

  ConnectOptions o;
  o.bind = Endpoint::of(PodTopology::probeAddr(family()), 0);
  auto c = tcpConnect(h_->node(), podEp(app->port()), o);
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  auto echoed = echoRoundTrip(c->get(), "probe");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "probe");
  ASSERT_TRUE(app->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(app->peers().front().str(), localOf(c->get()).str());
  EXPECT_EQ(app->peers().front().ip(), PodTopology::probeAddr(family()));
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());

  // The same app from the node's ordinary address is captured (control).
  auto c2 = tcpConnect(h_->node(), podEp(app->port()));
  ASSERT_TRUE(c2.ok()) << c2.error().message;
  EXPECT_TRUE(h_->waitForEvent("inbound")) << describe(h_->events());
}

// ---- Rule 9: non-TCP inbound is untouched --------------------------------------
//
//   node client --UDP 10.200.0.2:P--> pod UDP echo server
TEST_P(Redirect, Rule9InboundUdpReachesApp) {
  auto app = udpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  enrollWithProxy();
  auto reply = udpExchange(h_->node(), podEp(app->port()), "inbound-udp");
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  EXPECT_EQ(reply->payload, "inbound-udp");
  EXPECT_EQ(reply->from.str(), podEp(app->port()).str());
  ASSERT_TRUE(app->waitForDatagrams(1, kIoTimeout));
  EXPECT_EQ(app->received().front().from.ip(), nodeIp());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

// ---- Per-pod options ---------------------------------------------------------------

// Inbound capture off: inbound reaches the app directly; outbound is still
// captured.
//
//   node client --SYN 10.200.0.2:P--> app (no proxy)
//   pod app --SYN 10.200.0.1:Q--> stand-in :15001 --> node server
TEST_P(Redirect, InboundCaptureOffDeliversInboundDirectly) {
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  auto server = tcpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(app && server);
  PodSpec spec;
  spec.inboundCapture = false;
  enrollWithProxy(spec);

  auto in = tcpConnect(h_->node(), podEp(app->port()));
  ASSERT_TRUE(in.ok()) << in.error().message;
  auto echoed = echoRoundTrip(in->get(), "direct-in");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "direct-in");
  ASSERT_TRUE(app->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(app->peers().front().str(), localOf(in->get()).str());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());

  auto out = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(out.ok()) << out.error().message;
  echoed = echoRoundTrip(out->get(), "still-captured");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "still-captured");
  auto ev = h_->waitForEvent("outbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->origDst, server->local().str());
  EXPECT_TRUE(h_->events("inbound").empty()) << describe(h_->events());
  EXPECT_EQ(h_->stats().inbound_conns, 0u);
}

// Inbound capture off keeps rule 4: the proxy's own connection to the app,
// with the client's address as source, still gets the app's replies back.
// The client reaches the proxy's inbound listener directly (it is not
// captured), and the stand-in relays to the app (upstreamOverride).
//
//   node client --SYN 10.200.0.2:15006--> stand-in (direct, no capture)
//       --connect from 10.200.0.1 (spoofed)--> app 10.200.0.2:P
//   app replies to 10.200.0.1 --> eth0 egress --> proxy socket (not the node)
TEST_P(Redirect, InboundCaptureOffKeepsSpoofedReturnPath) {
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  PodSpec spec;
  spec.inboundCapture = false;
  auto info = h_->enroll(spec);
  ASSERT_TRUE(info.ok()) << info.error().message;
  StandInConfig cfg;  // the harness keeps SO_REUSEPORT where the mode serves it
  cfg.upstreamOverride = podEp(app->port()).str();
  cfg.upstreamConnectTimeout = std::chrono::milliseconds(1500);
  Status st = h_->startStandIn(cfg);
  ASSERT_TRUE(st.ok()) << st.error().message;

  auto c = tcpConnect(h_->node(), podEp(15006));
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto echoed = echoRoundTrip(c->get(), "spoofed");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message << describe(h_->events());
  EXPECT_EQ(*echoed, "spoofed");
  auto ev = h_->waitForEvent("inbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->detail, "upstream ok");
  ASSERT_TRUE(app->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(app->peers().front().ip(), nodeIp());
  if (!socketMode()) {
    EXPECT_GE(h_->stats().owned_pkts, 1u);
  }
  EXPECT_EQ(h_->stats().inbound_conns, 0u);
}

// Rule 1's exception: TCP to the probe SNAT address is not captured.
//
//   pod app --SYN 169.254.7.127:P--> node server bound to the probe address
TEST_P(Redirect, Rule1ProbeDestinationIsNotCaptured) {
  Status st = h_->topo().addProbeAddresses();
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto server = tcpServer(h_->node(), Endpoint::of(PodTopology::probeAddr(family()), 0));
  ASSERT_TRUE(server);
  enrollWithProxy();
  auto c = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto echoed = echoRoundTrip(c->get(), "to-probe");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "to-probe");
  ASSERT_TRUE(server->waitForAccepts(1, kIoTimeout));
  EXPECT_EQ(server->peers().front().str(), localOf(c->get()).str());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

// Virtual interfaces: TCP arriving on a reroute interface is outbound.
//
//   node netns                          pod netns
//   vethpod 10.200.0.1 <--------------> eth0 10.200.0.2
//   vethvif 10.200.1.1 <--------------> vif0 10.200.1.2   (reroute iface)
//   node client --SYN 10.200.1.2:P--> vif0 ingress --> stand-in :15001 --> app
TEST_P(Redirect, RerouteIfaceTrafficGoesToOutboundListener) {
  Status st = h_->topo().addVeth("vif0", "vethvif", 1);
  ASSERT_TRUE(st.ok()) << st.error().message;
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  PodSpec spec;
  spec.rerouteIfaces = {"vif0"};
  enrollWithProxy(spec);

  Endpoint viaVif = Endpoint::of(family() == AF_INET ? "10.200.1.2" : "fd00:200:1::2", app->port());
  auto c = tcpConnect(h_->node(), viaVif);
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  auto echoed = echoRoundTrip(c->get(), "virtual");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message << describe(h_->events());
  EXPECT_EQ(*echoed, "virtual");
  auto ev = h_->waitForEvent("outbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15001);
  EXPECT_EQ(ev->origDst, viaVif.str());
  EXPECT_EQ(ev->peer, localOf(c->get()).str());
  EXPECT_TRUE(h_->events("inbound").empty()) << describe(h_->events());

  // The same app through eth0 is ordinary inbound (control).
  h_->standIn().clearEvents();
  auto c2 = tcpConnect(h_->node(), podEp(app->port()));
  ASSERT_TRUE(c2.ok()) << c2.error().message;
  auto ev2 = h_->waitForEvent("inbound");
  ASSERT_TRUE(ev2) << describe(h_->events());
  EXPECT_EQ(ev2->origDst, podEp(app->port()).str());
}

// ---- Connection state ----------------------------------------------------------------

// Only connection set-up is captured (rule 6): connections that exist when
// the pod is enrolled keep working, in both directions, and are not handed
// to the proxy half way.
//
//   before enrollment:  pod app ==TCP==> node server,  node client ==TCP==> pod app
//   enroll + stand-in;  both connections carry on untouched
TEST_P(Redirect, EstablishedConnectionsSurviveEnrollment) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(server && app);
  auto out = tcpConnect(h_->pod(), server->local());
  auto in = tcpConnect(h_->node(), podEp(app->port()));
  ASSERT_TRUE(out.ok() && in.ok());
  ASSERT_TRUE(echoRoundTrip(out->get(), "pre").ok());
  ASSERT_TRUE(echoRoundTrip(in->get(), "pre").ok());

  enrollWithProxy();
  std::string payload(32 * 1024, 'e');
  auto o = echoRoundTrip(out->get(), payload);
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(*o, payload);
  auto i = echoRoundTrip(in->get(), payload);
  ASSERT_TRUE(i.ok()) << i.error().message;
  EXPECT_EQ(*i, payload);
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

// pod_egress remembers its decision on the app's socket (sock_verdict, BPF
// local storage keyed by the socket): a redirected connection's later
// packets go to the proxy without a socket-table lookup, a connection
// that existed before enrollment keeps passing. User space reads a
// socket's entry with the socket's fd as the key.
//
//   redirected:  app sock --SYN--> verdict OWNED (set at the capture)
//   pre-existing: app sock --data--> owner lookup: none --> verdict PASS
TEST_P(Redirect, DecisionIsRememberedOnTheAppSocket) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(server);
  auto before = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(before.ok()) << before.error().message;
  enrollWithProxy();
  auto after = tcpConnect(h_->pod(), server->local());
  ASSERT_TRUE(after.ok()) << after.error().message;
  std::string payload(64 * 1024, 'v');
  for (int fd : {before->get(), after->get()}) {
    auto e = echoRoundTrip(fd, payload);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(*e, payload);
  }
  if (socketMode()) {
    // At the socket the decision is taken once, at connect(): the original
    // destination stays on the captured socket (sock_orig), for its
    // getpeername and the proxy's SO_ORIGINAL_DST; the older one has none.
    const std::string pin = h_->bpffs().root() + "/" + SLUICE_PIN_SOCK_ORIG;
    Fd map(::bpf_obj_get(pin.c_str()));
    ASSERT_TRUE(map.valid()) << pin << ": " << std::strerror(errno);
    int fd = after->get();
    sluice_sock_orig o{};
    ASSERT_EQ(::bpf_map_lookup_elem(map.get(), &fd, &o), 0) << std::strerror(errno);
    EXPECT_EQ(o.kind, SLUICE_SOCK_OUTBOUND);
    EXPECT_EQ(o.family, family());
    EXPECT_EQ(ntohs(o.port), server->port());
    fd = before->get();
    EXPECT_NE(::bpf_map_lookup_elem(map.get(), &fd, &o), 0);
    EXPECT_EQ(errno, ENOENT);
    EXPECT_EQ(h_->events("outbound").size(), 1u) << describe(h_->events());
    EXPECT_EQ(h_->stats().dropped_pkts, 0u);
    return;
  }
  const std::string pin = h_->bpffs().root() + "/sock_verdict";
  Fd map(::bpf_obj_get(pin.c_str()));
  ASSERT_TRUE(map.valid()) << pin << ": " << std::strerror(errno);
  auto verdictOf = [&](int sockFd) -> int {
    sluice_sock_verdict v{};
    if (::bpf_map_lookup_elem(map.get(), &sockFd, &v) != 0) return -errno;
    return static_cast<int>(v.verdict);
  };
  EXPECT_EQ(verdictOf(after->get()), SLUICE_VERDICT_OWNED);
  EXPECT_EQ(verdictOf(before->get()), SLUICE_VERDICT_PASS);
  // Ten round trips in lockstep on the redirected connection: each is at
  // least one packet of its own whatever GSO/GRO make of the bulk echo
  // above (64 KB may be a handful of packets), so at least ten later
  // packets must have been handed to the proxy's socket.
  for (int i = 0; i < 10; i++) {
    auto e = echoRoundTrip(after->get(), "ping");
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(*e, "ping");
  }
  // Only the redirected connection went through the proxy.
  EXPECT_EQ(h_->events("outbound").size(), 1u) << describe(h_->events());
  EXPECT_GE(h_->stats().owned_pkts, 10u);
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

// The proxy's listeners are searched for in the socket table once and then
// kept in pod_listeners (SOCKHASH; key: netns cookie, port, family of the
// packets): a new connection costs one hash lookup. A listener leaves the
// map when the proxy closes it, a restarted proxy's listener is found and
// kept again, and removing the pod deletes its keys even while the proxy
// still runs.
//
//   out + in connection --> {(cookie, 15001, fam), (cookie, 15006, fam)}
//   proxy stops --> {} ; proxy again + out --> {(cookie, 15001, fam)}
//   pod removed --> {}
//
// At the socket the proxy's inbound and outbound listeners are kept when it
// starts listening (sock_listeners, filled by the sock_ops program: the
// sk_lookup program cannot search the socket table), under the socket's own
// family; the outbound one for IPv6 sent to [::1] in the port block.
TEST_P(Redirect, ProxyListenersAreKeptUntilClosed) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(server);
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  enrollWithProxy();
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok()) << cookie.error().message;
  if (socketMode()) {
    const auto& lmap = h_->datapath().programs().sockListeners;
    using Keys = std::set<std::pair<int, int>>;
    auto podKeys = [&] {
      Keys out;
      for (const auto& k : lmap.keys())
        if (k.netns_cookie == *cookie) out.insert({k.port, k.family});
      return out;
    };
    const Keys dualStack = {{15001, AF_INET6}, {15006, AF_INET6}};  // the stand-in's [::]:15001 and [::]:15006
    EXPECT_EQ(podKeys(), dualStack) << "kept from its listen(), before any connection";
    auto c = tcpConnect(h_->node(), podEp(app->port()));
    ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
    ASSERT_TRUE(echoRoundTrip(c->get(), "kept").ok());
    c->reset();
    ASSERT_TRUE(h_->waitStandInIdle()) << "relays still open";  // a graceful stop: nothing to reset
    h_->stopStandIn();
    EXPECT_EQ(podKeys(), Keys{}) << "a closed listener must leave the map";
    ASSERT_TRUE(h_->startStandIn().ok());
    EXPECT_EQ(podKeys(), dualStack);
    auto c2 = tcpConnect(h_->node(), podEp(app->port()));
    ASSERT_TRUE(c2.ok()) << c2.error().message << describe(h_->events());
    ASSERT_TRUE(echoRoundTrip(c2->get(), "again").ok());
    EXPECT_TRUE(h_->waitForEvent("inbound")) << "the restarted stand-in's " << describe(h_->events());
    EXPECT_EQ(h_->stats().dropped_pkts, 0u);
    return;
  }
  const std::string pin = h_->bpffs().root() + "/" + SLUICE_PIN_POD_LISTENERS;
  Fd pinned(::bpf_obj_get(pin.c_str()));
  ASSERT_TRUE(pinned.valid()) << pin << ": " << std::strerror(errno);
  const auto& map = h_->datapath().programs().podListeners;
  using Keys = std::set<std::pair<int, int>>;  // (port, family)
  auto podKeys = [&] {
    Keys out;
    for (const auto& k : map.keys())
      if (k.netns_cookie == *cookie) out.insert({k.port, k.family});
    return out;
  };
  auto roundTrip = [&](const TestNetns& from, const Endpoint& to) {
    auto c = tcpConnect(from, to);
    ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
    auto e = echoRoundTrip(c->get(), "kept");
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(*e, "kept");
  };
  EXPECT_EQ(podKeys(), Keys{}) << "nothing is kept before a connection needs it";
  for (int i = 0; i < 3; i++) roundTrip(h_->pod(), server->local());
  roundTrip(h_->node(), podEp(app->port()));
  EXPECT_EQ(podKeys(), (Keys{{15001, family()}, {15006, family()}}));
  // What `bpftool map dump` prints for a value: the socket's cookie.
  sluice_listener_key k{};
  k.netns_cookie = *cookie;
  k.port = 15001;
  k.family = static_cast<uint8_t>(family());
  auto sockCookie = map.lookup(k);
  ASSERT_TRUE(sockCookie.has_value());
  EXPECT_NE(*sockCookie, 0u);
  EXPECT_EQ(h_->events("outbound").size(), 3u) << describe(h_->events());
  EXPECT_EQ(h_->events("inbound").size(), 1u) << describe(h_->events());

  ASSERT_TRUE(h_->waitStandInIdle()) << "relays still open";  // a graceful stop: nothing to reset
  h_->stopStandIn();
  EXPECT_EQ(podKeys(), Keys{}) << "a closed listener must leave the map";
  ASSERT_TRUE(h_->startStandIn().ok());
  roundTrip(h_->pod(), server->local());
  EXPECT_EQ(podKeys(), (Keys{{15001, family()}}));
  EXPECT_EQ(h_->events("outbound").size(), 1u) << "the restarted stand-in's " << describe(h_->events());
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);

  ASSERT_TRUE(h_->unenroll().ok());
  EXPECT_EQ(podKeys(), Keys{}) << "pod removal must delete the pod's keys";
}

// Many connections at once all reach the proxy and their servers.
//
//   pod app x24 --SYN 10.200.0.1:P--> stand-in :15001 x24 --> node server
TEST_P(Redirect, ConcurrentOutboundConnectionsAreAllRelayed) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  ASSERT_TRUE(server);
  enrollWithProxy();
  constexpr int kConns = 24;
  std::vector<Fd> conns;
  for (int n = 0; n < kConns; n++) {
    auto c = tcpConnect(h_->pod(), server->local());
    ASSERT_TRUE(c.ok()) << "connection " << n << ": " << c.error().message;
    conns.push_back(std::move(*c));
  }
  for (int n = 0; n < kConns; n++) {
    std::string msg = "conn-" + std::to_string(n);
    auto e = echoRoundTrip(conns[static_cast<size_t>(n)].get(), msg);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(*e, msg);
  }
  EXPECT_EQ(h_->events("outbound").size(), static_cast<size_t>(kConns));
  EXPECT_EQ(h_->stats().outbound_conns, static_cast<uint64_t>(kConns));
}

// The proxy's accepted socket of a finished outbound connection lingers in
// TIME_WAIT (the server closed first). A new connection from the same source
// port to the same server must still reach the proxy's listener at once, as
// with Istio's REDIRECT (conntrack re-opens the flow) or iptables TPROXY
// (nf_tproxy_handle_time_wait hands the SYN to the listener).
//
//   pod app :C --> stand-in (accepted sock local=server, TIME_WAIT after close)
//   pod app :C again --SYN--> owner lookup finds the TIME_WAIT socket ...
TEST_P(Redirect, SourcePortReuseAfterProxyTimeWait) {
  auto server = TcpServer::start(h_->node(), nodeEp(0), /*closeAfterEcho=*/true);
  ASSERT_TRUE(server.ok()) << server.error().message;
  enrollWithProxy();
  uint16_t srcPort = 0;
  {
    ConnectOptions o;
    o.bind = podEp(0);
    auto c = tcpConnect(h_->pod(), (*server)->local(), o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    srcPort = localOf(c->get()).port();
    auto e = echoRoundTrip(c->get(), "first");
    ASSERT_TRUE(e.ok()) << e.error().message;
    auto eof = readSome(c->get(), 1);  // the server (then the proxy) closed first
    ASSERT_TRUE(eof.ok() && eof->empty()) << "expected EOF";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  // `ss -tan` in the pod now shows the proxy's accepted socket
  // (local = server, peer = app:C) in TIME-WAIT.
  int one = 1;
  Endpoint src = podEp(srcPort);
  auto fd = socketIn(h_->pod(), family(), SOCK_STREAM);
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
  ASSERT_EQ(::bind(fd->get(), src.raw(), src.len), 0) << std::strerror(errno);
  auto t0 = std::chrono::steady_clock::now();
  int rc = ::connect(fd->get(), (*server)->local().raw(), (*server)->local().len);
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  ASSERT_EQ(rc, 0) << "reconnect from port " << srcPort << ": " << std::strerror(errno) << describe(h_->events());
  EXPECT_LT(took.count(), 500) << "the SYN was not handed to the listener at once (took " << took.count()
                               << " ms: a retransmitted SYN got through)";
  auto e = echoRoundTrip(fd->get(), "second");
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(*e, "second");
  EXPECT_EQ(h_->events("outbound").size(), 2u) << describe(h_->events());
}

// ---- Fail closed ---------------------------------------------------------------------

// A captured connection without a proxy listener fails quickly and never
// reaches its destination around the proxy.
constexpr auto kFailTimeout = std::chrono::milliseconds(1200);

void expectConnectFails(const TestNetns& from, const Endpoint& to) {
  ConnectOptions o;
  o.timeout = kFailTimeout;
  auto t0 = std::chrono::steady_clock::now();
  auto c = tcpConnect(from, to, o);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(c.ok()) << "connect to " << to.str() << " succeeded without a proxy";
  if (!c.ok()) {
    EXPECT_TRUE(c.error().code == ETIMEDOUT || c.error().code == ECONNREFUSED || c.error().code == ECONNRESET)
        << c.error().message;
  }
  EXPECT_LE(took, std::chrono::milliseconds(2500));
}

//   pod app --SYN--> egress loop --> ingress: no 15001 listener --> drop
//   node client --SYN--> ingress: no 15006 listener --> drop
//   pod app --UDP :53--> egress loop --> ingress: no 15053 socket --> drop
TEST_P(Redirect, FailClosedWhenProxyNeverStarted) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  auto resolver = udpServer(h_->node(), nodeEp(53));
  ASSERT_TRUE(server && app && resolver);
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;

  expectConnectFails(h_->pod(), server->local());
  expectConnectFails(h_->node(), podEp(app->port()));
  auto reply = udpExchange(h_->pod(), nodeEp(53), dnsQuery(1, dnsName(), dnsType()), true, kFailTimeout);
  EXPECT_FALSE(reply.ok()) << "DNS answered without a proxy";

  EXPECT_EQ(server->accepted(), 0u);
  EXPECT_EQ(app->accepted(), 0u);
  EXPECT_TRUE(resolver->received().empty());
  // At the socket the outbound connect() and the DNS query are refused by
  // the kernel (nothing listens where they were sent); only the inbound SYN
  // is dropped by sluice.
  EXPECT_GE(h_->stats().dropped_pkts, socketMode() ? 1u : 3u);
}

//   as above, after a working round trip through the stand-in and its stop
TEST_P(Redirect, FailClosedAfterProxyStops) {
  auto server = tcpServer(h_->node(), nodeEp(0));
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(server && app);
  enrollWithProxy();
  {
    auto c = tcpConnect(h_->pod(), server->local());
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto echoed = echoRoundTrip(c->get(), "before-stop");
    ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  }
  ASSERT_TRUE(server->waitForAccepts(1, kIoTimeout));
  h_->stopStandIn();

  expectConnectFails(h_->pod(), server->local());
  expectConnectFails(h_->node(), podEp(app->port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(server->accepted(), 1u);  // only the one before the stop
  EXPECT_EQ(app->accepted(), 0u);
  EXPECT_GE(h_->stats().dropped_pkts, socketMode() ? 1u : 2u);
}

// The socket mode's own: where it keeps the proxy's listeners (at TC they
// are looked up in the socket table for each connection).
class SocketRedirect : public Redirect {};

// sock_listeners lost the proxy's listeners (a migration re-creates a
// pinned SOCKHASH empty: sockets cannot be copied from user space): check
// names each, inbound is refused (fail closed), and the sweep finds them
// in the pod's socket table and registers them again.
TEST_P(SocketRedirect, SweepRegistersListenersTheMapLost) {
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  enrollWithProxy();
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok()) << cookie.error().message;
  const auto& lmap = h_->datapath().programs().sockListeners;
  for (const auto& k : lmap.keys())
    if (k.netns_cookie == *cookie) {
      ASSERT_TRUE(lmap.erase(k).ok());
    }

  auto found = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(found.ok()) << found.error().message;
  std::string problems;
  for (const auto& p : found->problems) problems += p + "\n";
  EXPECT_NE(problems.find("the proxy's IPv6 listener on :15006"), std::string::npos) << problems;
  EXPECT_NE(problems.find("the proxy's IPv6 listener on :15001"), std::string::npos) << problems;
  expectConnectFails(h_->node(), podEp(app->port()));

  ReconcileReport r = h_->datapath().reconcile();
  EXPECT_TRUE(r.errors.empty()) << r.errors.front();
  ASSERT_EQ(r.repaired.size(), 1u);
  auto again = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->problems.empty()) << again->problems.front();
  auto c = tcpConnect(h_->node(), podEp(app->port()));
  ASSERT_TRUE(c.ok()) << c.error().message << describe(h_->events());
  ASSERT_TRUE(echoRoundTrip(c->get(), "found").ok());
  EXPECT_TRUE(h_->waitForEvent("inbound")) << describe(h_->events());
}

// The proxy listens as an SO_REUSEPORT group (ztunnel's; an old and a new
// proxy side by side during a hand-over), all opened before the pod was
// enrolled: every socket of the group is registered, each once, and every
// inbound connection reaches one of them.
TEST_P(SocketRedirect, ReuseportGroupOpenedFirstIsRegisteredWhole) {
  if (!h_->servesReuseport()) GTEST_SKIP() << "this kernel's capture cannot serve an SO_REUSEPORT proxy";
  auto app = tcpServer(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app);
  ASSERT_TRUE(h_->startStandIn().ok());
  // A second member of the stand-in's inbound group: same user, mark, port.
  auto second = socketIn(h_->pod(), AF_INET6, SOCK_STREAM);
  ASSERT_TRUE(second.ok()) << second.error().message;
  const int one = 1, zero = 0;
  ASSERT_EQ(::setsockopt(second->get(), SOL_SOCKET, SO_MARK, &kProxyMark, sizeof(kProxyMark)), 0);
  ASSERT_EQ(::setsockopt(second->get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)), 0);
  ASSERT_EQ(::setsockopt(second->get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)), 0);
  const Endpoint in = Endpoint::any(AF_INET6, 15006);
  ASSERT_EQ(::bind(second->get(), in.raw(), in.len), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(second->get(), 64), 0);
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;

  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok());
  std::multiset<uint64_t> inbound;
  const auto& lmap = h_->datapath().programs().sockListeners;
  for (const auto& k : lmap.keys())
    if (k.netns_cookie == *cookie && k.port == 15006)
      if (auto v = lmap.lookup(k)) inbound.insert(*v);
  EXPECT_EQ(inbound.size(), 2u) << "both sockets of the group, in a slot each";
  EXPECT_EQ(std::set<uint64_t>(inbound.begin(), inbound.end()).size(), inbound.size()) << "a socket in two slots";

  // Every connection is accepted, by the stand-in (relayed to the app) or
  // by the second member (counted here).
  ASSERT_EQ(::fcntl(second->get(), F_SETFL, O_NONBLOCK), 0);
  size_t bySecond = 0;
  auto drain = [&] {
    while (Fd(::accept4(second->get(), nullptr, nullptr, SOCK_CLOEXEC)).valid()) bySecond++;
  };
  constexpr size_t kConns = 20;
  std::vector<Fd> conns;
  for (size_t i = 0; i < kConns; i++) {
    auto c = tcpConnect(h_->node(), podEp(app->port()));
    ASSERT_TRUE(c.ok()) << "connection " << i << ": " << c.error().message;
    conns.push_back(std::move(*c));
    drain();
  }
  EXPECT_TRUE(eventually([&] {
    drain();
    return bySecond + h_->events("inbound").size() == kConns;
  })) << bySecond << " accepted by the second member, " << describe(h_->events());
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

INSTANTIATE_TEST_SUITE_P(All, Redirect,
                         ::testing::Combine(::testing::Values(TcMode::Tcx, TcMode::Legacy),
                                            ::testing::Values(AF_INET, AF_INET6), ::testing::Values(CaptureMode::Tc),
                                            ::testing::Values(false)),
                         paramName);
INSTANTIATE_TEST_SUITE_P(Socket, Redirect,
                         ::testing::Combine(::testing::Values(TcMode::Auto), ::testing::Values(AF_INET, AF_INET6),
                                            ::testing::Values(CaptureMode::Socket), ::testing::Values(false)),
                         paramName);
INSTANTIATE_TEST_SUITE_P(Socket, SocketRedirect,
                         ::testing::Combine(::testing::Values(TcMode::Auto), ::testing::Values(AF_INET, AF_INET6),
                                            ::testing::Values(CaptureMode::Socket), ::testing::Values(false)),
                         paramName);
// The proxy listens before the pod is enrolled: both families at the socket
// (its listeners must be found in the socket table), and at TC.
INSTANTIATE_TEST_SUITE_P(ProxyFirst, Redirect,
                         ::testing::Values(RedirectParam{TcMode::Auto, AF_INET, CaptureMode::Socket, true},
                                           RedirectParam{TcMode::Auto, AF_INET6, CaptureMode::Socket, true},
                                           RedirectParam{TcMode::Auto, AF_INET, CaptureMode::Tc, true}),
                         paramName);

}  // namespace
}  // namespace sluice::test
