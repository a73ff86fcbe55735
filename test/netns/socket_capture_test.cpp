// The socket mode's edges (issue 16, items 1 and 2), beyond the redirect
// suite it runs too: IPv4-mapped addresses on dual-stack sockets, TCP Fast
// Open, sockets bound to a source address, port, loopback or device,
// non-blocking connects, getpeername, unconnected UDP, raw sockets,
// reuseport groups of listeners, removal, a failed enrollment's roll-back,
// repairs of the node hooks, and the --cgroup option. The redirect suite's
// Socket/ instances cover the other edges: connect() to 127.0.0.1/::1
// (Rule5LoopbackIsNotCaptured) and to the pod's own address
// (Rule5PodCallingItsOwnAddressIsNotCaptured), UDP other than DNS
// (Rule5OtherUdpIsNotCaptured) and connections open before enrollment
// (EstablishedConnectionsSurviveEnrollment).
//
//   node netns                              pod netns (enrolled, socket mode)
//   +------------------------------+        +-------------------------------------+
//   | servers / clients            |  veth  | app sockets   cgroup hooks (node):  |
//   | 10.200.0.1  fd00:200::1      |<------>| eth0          connect, sendmsg, ... |
//   |                    vethpod   |        | 10.200.0.2    sk_lookup (netns)     |
//   +------------------------------+        | stand-in(s): [::]:15001 15006 15008 |
//                                           +-------------------------------------+
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "loader/cgroup.h"
#include "loader/sk_lookup_stubs.h"
#include "loader/sock_hooks.h"
#include "maps/sluice_maps.h"
#include "test/common/cgroup_scope.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

class SocketCapture : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { openHarness(h_, kSocketMode); }
  void enrollWithProxy() {
    auto info = h_->enroll();
    ASSERT_TRUE(info.ok()) << info.error().message;
    ASSERT_EQ(info->capture, "socket");
    Status st = h_->startStandIn();
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  int family() const { return GetParam(); }
  std::string podIp() const { return PodTopology::podAddr(family()); }
  Endpoint podEp(uint16_t port) const { return Endpoint::of(podIp(), port); }
  Endpoint nodeEp(uint16_t port) const { return Endpoint::of(PodTopology::nodeAddr(family()), port); }
  std::unique_ptr<TcpServer> server() {
    auto s = TcpServer::start(h_->node(), nodeEp(0));
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  /// How the proxy reads the original destination of this family.
  std::string soOriginalDst() const { return family() == AF_INET ? "SO_ORIGINAL_DST" : "IP6T_SO_ORIGINAL_DST"; }
  /// The one outbound event; fails the test when there is not exactly one.
  std::optional<ProxyEvent> outboundEvent() {
    auto ev = h_->waitForEvent("outbound");
    EXPECT_TRUE(ev) << describe(h_->events());
    EXPECT_EQ(h_->events("outbound").size(), 1u) << describe(h_->events());
    return ev;
  }

  /// A connection from the node to the pod's @p port, echoed through the
  /// proxy: its inbound event (none, with the test failed, when missing).
  std::optional<ProxyEvent> inboundRoundTrip(uint16_t port) {
    auto c = tcpConnect(h_->node(), podEp(port));
    EXPECT_TRUE(c.ok()) << c.error().message;
    if (!c.ok()) return std::nullopt;
    EXPECT_TRUE(echoRoundTrip(c->get(), "in").ok());
    auto ev = h_->waitForEvent("inbound");
    EXPECT_TRUE(ev) << describe(h_->events());
    return ev;
  }

  /// The test as the node proxy: a listener on the wildcard's 15001 of the
  /// family in the pod, with the proxy's mark, so that the sock_ops program
  /// keeps it for the sk_lookup program as it keeps the proxy's.
  Result<Fd> proxyListener() {
    auto fd = socketIn(h_->pod(), family(), SOCK_STREAM);
    SLUICE_TRY(fd);
    const int one = 1;
    const uint32_t mark = SLUICE_DEFAULT_PROXY_MARK;
    if (::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
      return Error::fromErrno(errno, "SO_REUSEADDR");
    if (::setsockopt(fd->get(), SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0) return Error::fromErrno(errno, "SO_MARK");
    const Endpoint at = Endpoint::any(family(), 15001);
    if (::bind(fd->get(), at.raw(), at.len) != 0) return Error::fromErrno(errno, "bind " + at.str());
    if (::listen(fd->get(), 8) != 0) return Error::fromErrno(errno, "listen");
    return fd;
  }

  std::unique_ptr<PodHarness> h_;
};

INSTANTIATE_TEST_SUITE_P(Family, SocketCapture, ::testing::Values(AF_INET, AF_INET6),
                         [](const auto& info) { return std::string(familyName(info.param)); });

// A non-blocking connect() is captured at the call: it completes later,
// connected to the proxy, and the app sees its real peer.
//
//   pod app O_NONBLOCK --connect 10.200.0.1:P--> EINPROGRESS ... writable
TEST_P(SocketCapture, NonBlockingConnectIsCaptured) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  auto fd = socketIn(h_->pod(), family(), SOCK_STREAM);
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) | O_NONBLOCK), 0);
  int rc = ::connect(fd->get(), srv->local().raw(), srv->local().len);
  ASSERT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
  pollfd p{fd->get(), POLLOUT, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  int err = -1;
  socklen_t len = sizeof(err);
  ASSERT_EQ(::getsockopt(fd->get(), SOL_SOCKET, SO_ERROR, &err, &len), 0);
  ASSERT_EQ(err, 0) << std::strerror(err);
  EXPECT_EQ(peerOf(fd->get()).str(), srv->local().str());
  ASSERT_EQ(::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) & ~O_NONBLOCK), 0);
  auto echoed = echoRoundTrip(fd->get(), "nonblocking");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(*echoed, "nonblocking");
  auto ev = outboundEvent();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->origDst, srv->local().str());
  EXPECT_EQ(ev->origDstFrom, soOriginalDst());
}

// An app that binds its source address and port first: the proxy sees it
// as the peer, and SO_ORIGINAL_DST (filed under that port) still answers.
TEST_P(SocketCapture, BoundSourceAddressAndPortAreKept) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  ConnectOptions o;
  o.bind = podEp(0);
  auto c = tcpConnect(h_->pod(), srv->local(), o);
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(echoRoundTrip(c->get(), "bound").ok());
  auto ev = outboundEvent();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->peer, localOf(c->get()).str());
  EXPECT_EQ(ev->origDst, srv->local().str());
  EXPECT_EQ(ev->origDstFrom, soOriginalDst());
  EXPECT_EQ(peerOf(c->get()).str(), srv->local().str());
}

// A connection the app closes first holds its port in TIME_WAIT for its
// destination, here the proxy's: over loopback the kernel reuses such a port
// after a second (net.ipv4.tcp_tw_reuse = 2, the default); sent to the pod's
// own address it would be held for 60 s. Each destination has a place on
// loopback (a port space) of its own: IPv4 an address of 127.1.0.0/16, IPv6
// a port of [::1] in the block. Here the pod has 10 ports: 10 connections
// the app closes, then 10 more within seconds, each from the pod's address.
// (The proxy's own connections to the servers get a port space per server:
// ten servers.)
//
//   pod app, ports 40000-40009 --x10--> lo:15001 (proxy) --> node servers x10
//   app closes first: 10 ports in TIME_WAIT ... 10 new connections
TEST_P(SocketCapture, PortsOfClosedConnectionsAreReusedWithinSeconds) {
  constexpr int kPorts = 10;
  std::vector<std::unique_ptr<TcpServer>> servers;
  for (int i = 0; i < kPorts; i++) {
    servers.push_back(server());
    ASSERT_TRUE(servers.back());
  }
  enrollWithProxy();
  ASSERT_TRUE(h_->pod().setSysctl("net/ipv4/ip_local_port_range", "40000 40009").ok());
  auto roundTrip = [&](const Fd& c, int i) {
    const Endpoint self = localOf(c.get());
    EXPECT_EQ(self.ip(), podIp()) << "the app's source must stay the pod's address";
    EXPECT_GE(self.port(), 40000);
    EXPECT_LE(self.port(), 40009);
    EXPECT_EQ(peerOf(c.get()).str(), servers[i]->local().str());
    auto echoed = echoRoundTrip(c.get(), "reuse");
    EXPECT_TRUE(echoed.ok()) << echoed.error().message << describe(h_->events());
  };
  for (int i = 0; i < kPorts; i++) {
    auto c = tcpConnect(h_->pod(), servers[i]->local());
    ASSERT_TRUE(c.ok()) << "connection " << i << ": " << c.error().message;
    roundTrip(*c, i);
  }  // each closed here, by the app first
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  int held = 0;
  for (int i = 0; i < kPorts; i++) {
    for (;;) {
      auto c = tcpConnect(h_->pod(), servers[i]->local());
      if (c.ok()) {
        roundTrip(*c, i);
        break;
      }
      ASSERT_EQ(c.error().code, EADDRNOTAVAIL) << c.error().message;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "second connection " << i << ": the ports of the app's closed connections are still held ("
          << c.error().message << ")";
      held++;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::cout << "[ info     ] connect() found every port held " << held << " time(s) before the kernel reused one\n";
  for (const auto& srv : servers) EXPECT_EQ(srv->accepted(), 2u);
  EXPECT_EQ(h_->events("outbound").size(), 2u * kPorts);
}

// Two connections of the app from the same address and port to different
// destinations, open at once (each destination has a port space of its own,
// as under REDIRECT: IPv4 at an address of 127.1.0.0/16, IPv6 at a port of
// [::1] in the block, both chosen by destination): the proxy's
// SO_ORIGINAL_DST tells them apart. Here the test is the proxy (marked as
// the proxy's, so that the sk_lookup program knows its IPv6 listener): it
// accepts both only after both connected, so neither entry is read before
// the other is filed.
//
//   pod app podIP:P --> D1:80 ---> lo 127.1.x.y:15001 / [::1]:Q1 -.
//   pod app podIP:P --> D2:80 ---> lo 127.1.z.w:15001 / [::1]:Q2 --+--> test's 15001: SO_ORIGINAL_DST x2
TEST_P(SocketCapture, ConnectionsSharingASourcePortKeepTheirOriginalDestinations) {
  enrollWithProxy();
  h_->stopStandIn();
  auto proxy = proxyListener();
  ASSERT_TRUE(proxy.ok()) << proxy.error().message;
  const int one = 1;

  const uint16_t port = 40123;
  auto appSocket = [&]() -> Result<Fd> {
    auto fd = socketIn(h_->pod(), family(), SOCK_STREAM);
    SLUICE_TRY(fd);
    if (::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
      return Error::fromErrno(errno, "SO_REUSEADDR");
    const Endpoint self = podEp(port);
    if (::bind(fd->get(), self.raw(), self.len) != 0) return Error::fromErrno(errno, "bind " + self.str());
    return fd;
  };
  std::vector<std::pair<Fd, Endpoint>> apps;
  // Two destinations whose places on loopback differ (one pair in 65,536
  // (IPv4) or 16,384 (IPv6) shares one: the second connect() then finds the
  // 4-tuple taken).
  for (int k = 1; k <= 4 && apps.size() < 2; k++) {
    const Endpoint dst = Endpoint::of(family() == AF_INET ? "192.0.2." + std::to_string(k)
                                                          : "2001:db8::" + std::to_string(k),
                                      80);
    auto fd = appSocket();
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    if (::connect(fd->get(), dst.raw(), dst.len) != 0) {
      ASSERT_EQ(errno, EADDRNOTAVAIL) << "connect to " << dst.str() << ": " << std::strerror(errno);
      continue;
    }
    EXPECT_EQ(peerOf(fd->get()).str(), dst.str());
    apps.emplace_back(std::move(*fd), dst);
  }
  ASSERT_EQ(apps.size(), 2u);
  for (auto& [fd, dst] : apps) ASSERT_EQ(::send(fd.get(), dst.str().data(), dst.str().size(), 0), (ssize_t)dst.str().size());

  std::set<std::string> proxyEnds;
  for (int i = 0; i < 2; i++) {
    Fd conn(::accept4(proxy->get(), nullptr, nullptr, SOCK_CLOEXEC));
    ASSERT_TRUE(conn.valid()) << std::strerror(errno);
    EXPECT_EQ(peerOf(conn.get()).str(), podEp(port).str());
    const Endpoint local = localOf(conn.get());
    proxyEnds.insert(local.str());
    if (family() == AF_INET) {
      EXPECT_EQ(local.ip().rfind("127.1.", 0), 0u) << local.str();
      EXPECT_EQ(local.port(), 15001);
    } else {
      EXPECT_EQ(local.ip(), "::1") << local.str();
      EXPECT_GE(local.port(), SLUICE_PROXY_LO6_PORT_BASE) << local.str();
      EXPECT_LT(local.port(), SLUICE_PROXY_LO6_PORT_BASE + (1u << SLUICE_PROXY_LO6_PORT_BITS)) << local.str();
    }
    sockaddr_storage orig{};
    socklen_t len = sizeof(orig);
    ASSERT_EQ(::getsockopt(conn.get(), family() == AF_INET ? SOL_IP : SOL_IPV6, 80 /* SO_ORIGINAL_DST */, &orig, &len),
              0)
        << soOriginalDst() << ": " << std::strerror(errno);
    const std::string origDst = Endpoint::fromSockaddr(reinterpret_cast<sockaddr*>(&orig), len).str();
    auto sent = readSome(conn.get(), origDst.size());
    ASSERT_TRUE(sent.ok()) << sent.error().message;
    EXPECT_EQ(origDst, *sent) << soOriginalDst() << " answered another connection's destination";
  }
  EXPECT_EQ(proxyEnds.size(), 2u) << "both connections reached the proxy at one place";
}

// IPv6: only a connection the programs sent to [::1] in the port block is
// handed to the proxy there. An app's own connection to such a port from
// the pod's address (loopback: not captured) reaches the app listening on
// it. And a captured connection whose proxy listener closed between its
// connect() and its SYN (a TCP_FASTOPEN_CONNECT socket sends its SYN at
// the first write) is dropped and counted, never left to that app.
//
//   pod app podIP --connect D:80--> [::1]:Q --> test's marked [::]:15001
//   pod app podIP --connect [::1]:Q--> app's own [::]:Q listener
//   pod app connect D:80 (to [::1]:Q) ; proxy closes ; write: SYN --> dropped
TEST_P(SocketCapture, OnlyCapturedConnectionsAreHandedOverAtTheLoopbackPortBlock) {
  if (family() != AF_INET6) GTEST_SKIP() << "IPv4 is sent to 127.1.0.0/16 at port 15001: no port block";
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  h_->stopStandIn();
  // Client side, without a cookie (0x4): connect() leaves the SYN to the
  // first write.
  ASSERT_TRUE(h_->pod().setSysctl("net/ipv4/tcp_fastopen", "5").ok());
  auto proxy = proxyListener();
  ASSERT_TRUE(proxy.ok()) << proxy.error().message;
  const int one = 1;

  // Where a captured connection to the server goes: Q.
  auto first = tcpConnect(h_->pod(), srv->local());
  ASSERT_TRUE(first.ok()) << first.error().message;
  Fd accepted(::accept4(proxy->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(accepted.valid()) << std::strerror(errno);
  const Endpoint q = localOf(accepted.get());
  ASSERT_EQ(q.ip(), "::1") << q.str();
  ASSERT_GE(q.port(), SLUICE_PROXY_LO6_PORT_BASE) << q.str();

  // The next one to the same server: connect() now, its SYN at the write.
  auto next = socketIn(h_->pod(), AF_INET6, SOCK_STREAM | SOCK_NONBLOCK);
  ASSERT_TRUE(next.ok()) << next.error().message;
  ASSERT_EQ(::setsockopt(next->get(), IPPROTO_TCP, TCP_FASTOPEN_CONNECT, &one, sizeof(one)), 0) << std::strerror(errno);
  ASSERT_EQ(::connect(next->get(), srv->local().raw(), srv->local().len), 0) << std::strerror(errno);

  // The proxy's listener closes; the app's own listener takes [::]:Q, and
  // the app's own connection to it from the pod's address gets there.
  proxy->reset();
  auto own = TcpServer::start(h_->pod(), Endpoint::any(AF_INET6, q.port()));
  ASSERT_TRUE(own.ok()) << own.error().message;
  ConnectOptions o;
  o.bind = podEp(0);
  auto mine = tcpConnect(h_->pod(), Endpoint::of("::1", q.port()), o);
  ASSERT_TRUE(mine.ok()) << mine.error().message;
  ASSERT_TRUE(echoRoundTrip(mine->get(), "mine").ok());
  EXPECT_EQ((*own)->accepted(), 1u);

  const uint64_t dropped = h_->stats().dropped_pkts;
  const std::string data = "captured";
  ssize_t n = ::send(next->get(), data.data(), data.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(n >= 0 || errno == EINPROGRESS || errno == EAGAIN) << std::strerror(errno);
  pollfd p{next->get(), POLLOUT, 0};
  int ready = ::poll(&p, 1, 1200);
  int err = 0;
  socklen_t len = sizeof(err);
  ASSERT_EQ(::getsockopt(next->get(), SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_TRUE(ready == 0 || err != 0) << "a captured connection connected without a proxy (poll " << ready << ")";
  EXPECT_EQ((*own)->accepted(), 1u) << "a captured connection reached the app's own listener on " << q.str();
  EXPECT_EQ(srv->accepted(), 0u) << "a captured connection reached its destination around the proxy";
  EXPECT_GT(h_->stats().dropped_pkts, dropped) << "the SYN to " << q.str() << " was not dropped and counted";
}

// An app socket bound to a device (SO_BINDTODEVICE eth0) is captured too:
// the kernel delivers to the pod's own address whatever the device.
TEST_P(SocketCapture, SocketBoundToDeviceIsCaptured) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  auto fd = socketIn(h_->pod(), family(), SOCK_STREAM);
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(::setsockopt(fd->get(), SOL_SOCKET, SO_BINDTODEVICE, "eth0", 5), 0) << std::strerror(errno);
  ASSERT_EQ(::connect(fd->get(), srv->local().raw(), srv->local().len), 0) << std::strerror(errno);
  auto echoed = echoRoundTrip(fd->get(), "device");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message << describe(h_->events());
  auto ev = outboundEvent();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->origDst, srv->local().str());
  EXPECT_EQ(peerOf(fd->get()).str(), srv->local().str());
}

// A socket bound to loopback cannot reach another host: it is left to the
// kernel, which refuses it as it would without sluice; nothing reaches the
// server or the proxy.
TEST_P(SocketCapture, SocketBoundToLoopbackIsLeftAlone) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  ConnectOptions o;
  o.bind = Endpoint::of(family() == AF_INET ? "127.0.0.1" : "::1", 0);
  o.timeout = std::chrono::milliseconds(800);
  auto c = tcpConnect(h_->pod(), srv->local(), o);
  EXPECT_FALSE(c.ok()) << "a loopback-bound socket reached another host";
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  EXPECT_EQ(srv->accepted(), 0u);
  EXPECT_EQ(h_->stats().outbound_conns, 0u);
}

// TCP Fast Open: sendto(MSG_FASTOPEN) connects on the way; it is captured
// as a connect() (the data goes to the proxy, which relays it).
TEST_P(SocketCapture, TcpFastOpenIsCaptured) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  ASSERT_TRUE(h_->pod().setSysctl("net/ipv4/tcp_fastopen", "1").ok());  // client side
  auto fd = socketIn(h_->pod(), family(), SOCK_STREAM);
  ASSERT_TRUE(fd.ok());
  const std::string payload = "fast open";
  ssize_t n = ::sendto(fd->get(), payload.data(), payload.size(), MSG_FASTOPEN, srv->local().raw(), srv->local().len);
  ASSERT_EQ(n, static_cast<ssize_t>(payload.size())) << std::strerror(errno);
  auto back = readSome(fd->get(), payload.size());
  ASSERT_TRUE(back.ok()) << back.error().message << describe(h_->events());
  EXPECT_EQ(*back, payload);
  auto ev = outboundEvent();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->origDst, srv->local().str());
  EXPECT_EQ(peerOf(fd->get()).str(), srv->local().str());
}

// DNS from a connected UDP socket: its peer is the resolver it asked; from
// an unconnected socket bound to the pod's address: the answer comes from
// the resolver. Other UDP from an unconnected socket is not captured.
TEST_P(SocketCapture, UdpSocketsSeeTheirResolver) {
  enrollWithProxy();
  Endpoint resolver = nodeEp(53);
  uint16_t type = family() == AF_INET ? 1 : 28;
  {
    auto fd = socketIn(h_->pod(), family(), SOCK_DGRAM);
    ASSERT_TRUE(fd.ok());
    ASSERT_EQ(::connect(fd->get(), resolver.raw(), resolver.len), 0);
    EXPECT_EQ(peerOf(fd->get()).str(), resolver.str());
    std::string q = dnsQuery(0x1111, "connected.example", type);
    ASSERT_EQ(::send(fd->get(), q.data(), q.size(), 0), static_cast<ssize_t>(q.size()));
    auto a = readSome(fd->get(), 512);
    ASSERT_TRUE(a.ok()) << a.error().message;
    auto ans = parseDnsAnswer(*a);
    ASSERT_TRUE(ans);
    EXPECT_EQ(ans->id, 0x1111);
  }
  {
    auto fd = socketIn(h_->pod(), family(), SOCK_DGRAM);
    ASSERT_TRUE(fd.ok());
    Endpoint self = podEp(0);
    ASSERT_EQ(::bind(fd->get(), self.raw(), self.len), 0);
    std::string q = dnsQuery(0x2222, "bound.example", type);
    ASSERT_EQ(::sendto(fd->get(), q.data(), q.size(), 0, resolver.raw(), resolver.len), static_cast<ssize_t>(q.size()));
    pollfd p{fd->get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 2000), 1) << describe(h_->events());
    char buf[512];
    Endpoint from;
    from.len = sizeof(from.ss);
    ssize_t n = ::recvfrom(fd->get(), buf, sizeof(buf), 0, from.raw(), &from.len);
    ASSERT_GT(n, 0);
    EXPECT_EQ(from.str(), resolver.str());
  }
  auto events = h_->events("dns-udp");
  ASSERT_EQ(events.size(), 2u) << describe(h_->events());
  EXPECT_EQ(events[1].peer.substr(0, events[1].peer.rfind(':')), family() == AF_INET ? podIp() : "[" + podIp() + "]");

  auto echo = UdpServer::start(h_->node(), nodeEp(0));
  ASSERT_TRUE(echo.ok());
  auto reply = udpExchange(h_->pod(), (*echo)->local(), "plain", /*connected=*/false);
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  EXPECT_EQ(reply->from.str(), (*echo)->local().str());
  EXPECT_EQ(h_->events().size(), 2u) << describe(h_->events());
}

// TCP built on a raw socket (CAP_NET_RAW) leaves no connect() to capture:
// it is dropped on its way out and counted. ICMP from raw sockets passes
// (Redirect.Rule5IcmpIsNotTouched), and so do the kernel's own resets
// (Redirect.FailClosed*: a refused connection).
//
//   pod app raw IPPROTO_TCP --SYN 10.200.0.1:P--> dropped (skb_egress)
//   node raw IPPROTO_TCP socket: sees nothing from the pod's port
TEST_P(SocketCapture, RawSocketTcpIsDropped) {
  enrollWithProxy();
  auto rawTcp = [&](const TestNetns& ns, Fd& out) {
    return ns.run([&]() -> Status {
      out = Fd(::socket(family(), SOCK_RAW | SOCK_CLOEXEC, IPPROTO_TCP));
      return out.valid() ? Status() : Error::fromErrno(errno, "raw socket");
    });
  };
  Fd watch, app;
  ASSERT_TRUE(rawTcp(h_->node(), watch).ok());
  ASSERT_TRUE(rawTcp(h_->pod(), app).ok());
  // A SYN from port 47999 to port 8: the TCP header alone (the kernel adds
  // the IP header; the checksum does not matter, it never leaves).
  uint8_t syn[20] = {0xbb, 0x7f, 0x00, 0x08, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0};
  Endpoint dst = nodeEp(0);
  ssize_t n = ::sendto(app.get(), syn, sizeof(syn), 0, dst.raw(), dst.len);
  EXPECT_TRUE(n < 0 && errno == EPERM) << "sendto: " << n << " " << std::strerror(errno);
  // Nothing from the pod's port 47999 reaches the node.
  pollfd p{watch.get(), POLLIN, 0};
  for (int i = 0; i < 10 && ::poll(&p, 1, 50) == 1; i++) {
    uint8_t buf[256];
    ssize_t m = ::recv(watch.get(), buf, sizeof(buf), MSG_DONTWAIT);
    size_t off = family() == AF_INET ? (buf[0] & 0xf) * 4u : 0;  // raw IPv4 sockets see the IP header
    if (m > static_cast<ssize_t>(off + 2)) {
      EXPECT_FALSE(buf[off] == 0xbb && buf[off + 1] == 0x7f) << "the raw SYN left the pod";
    }
  }
  EXPECT_GE(h_->stats().dropped_pkts, 1u);
}

// ztunnel's default listeners carry SO_REUSEPORT, so a new ztunnel can take
// over: two proxies listen side by side and the kernel spreads inbound
// connections over the group (the socket lookup hands them to the group);
// when either closes, the other serves alone.
//
//   node client x32 --> sk_lookup --> [::]:15006 of A or of B (reuseport)
//   A stops --> all to B
TEST_P(SocketCapture, ReuseportGroupsAreHonoured) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok());
  enrollWithProxy();
  StandInConfig second;
  second.netnsPath = h_->pod().path();
  auto b = ProxyStandIn::start(second);  // same ports, SO_REUSEPORT: joins the groups
  ASSERT_TRUE(b.ok()) << b.error().message;
  for (int i = 0; i < 32; i++) {
    auto c = tcpConnect(h_->node(), podEp((*app)->port()));
    ASSERT_TRUE(c.ok()) << "connection " << i << ": " << c.error().message;
    ASSERT_TRUE(echoRoundTrip(c->get(), "g").ok());
  }
  (*b)->waitForEvents(1, kIoTimeout);
  size_t onA = h_->events("inbound").size(), onB = 0;
  for (const auto& e : (*b)->events()) onB += e.listener == "inbound";
  EXPECT_EQ(onA + onB, 32u);
  EXPECT_GT(onA, 0u) << "the group's first proxy got nothing";
  EXPECT_GT(onB, 0u) << "the group's second proxy got nothing";

  h_->stopStandIn();  // A goes: B serves alone, whichever slot held whom
  (*b)->clearEvents();
  for (int i = 0; i < 8; i++) {
    auto c = tcpConnect(h_->node(), podEp((*app)->port()));
    ASSERT_TRUE(c.ok()) << "after A stopped, connection " << i << ": " << c.error().message;
    ASSERT_TRUE(echoRoundTrip(c->get(), "h").ok());
  }
  EXPECT_TRUE((*b)->waitForEvents(8, kIoTimeout)) << describe((*b)->events());
  EXPECT_EQ(h_->stats().dropped_pkts, 0u);
}

// The proxy's inbound connection reads no SO_ORIGINAL_DST (the socket
// lookup keeps the addresses): ztunnel falls back to the local address.
TEST_P(SocketCapture, InboundOriginalDestinationIsTheLocalAddress) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok());
  enrollWithProxy();
  auto ev = inboundRoundTrip((*app)->port());
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->origDst, podEp((*app)->port()).str());
  EXPECT_EQ(ev->origDstFrom, "local address");
}

// As the agent runs it: the pod's sk_lookup program was loaded ahead, so
// the enrollment only named it; it captures inbound like one loaded then,
// and the pool is refilled behind it.
TEST_P(SocketCapture, SkLookupProgramLoadedAheadCapturesInbound) {
  h_.reset();  // a harness whose Datapath keeps two loaded ahead
  h_ = std::make_unique<PodHarness>(TcMode::Auto, CaptureMode::Socket);
  ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
  h_->keepSkLookupStubs(2);
  ASSERT_TRUE(h_->open().ok());
  const SkLookupStubPool* pool = h_->datapath().programs().skLookupStubPool();
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->waitReady(2, 5000)) << pool->ready() << " ready";
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok());
  enrollWithProxy();
  EXPECT_EQ(pool->counts().ahead, 1u);
  EXPECT_EQ(pool->counts().inline_, 0u);
  auto ev = inboundRoundTrip((*app)->port());
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->origDst, podEp((*app)->port()).str());
  EXPECT_TRUE(pool->waitReady(2, 5000)) << "not refilled: " << pool->ready() << " ready";
  EXPECT_EQ(pool->counts().loadErrors, 0u);
}

// Removal restores plain networking at once and leaves nothing in the pod:
// no sk_lookup link, no policy rule, tcp_fwmark_accept as it was.
TEST_P(SocketCapture, RemovalLeavesNothingInThePod) {
  auto srv = server();
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(srv && app.ok());
  auto before = h_->pod().sysctl("net/ipv4/tcp_fwmark_accept");
  ASSERT_TRUE(before.ok());
  enrollWithProxy();
  const std::string pin = h_->bpffs().linkDir(h_->podId()) + "/sk_lookup";
  EXPECT_TRUE(podSkLookupAttached(pin));
  EXPECT_EQ(*h_->pod().sysctl("net/ipv4/tcp_fwmark_accept"), "1");
  ASSERT_TRUE(h_->unenroll().ok());

  EXPECT_FALSE(podSkLookupAttached(pin));
  struct stat st {};
  EXPECT_NE(::stat(h_->bpffs().linkDir(h_->podId()).c_str(), &st), 0) << "the pod's pins are still there";
  EXPECT_EQ(*h_->pod().sysctl("net/ipv4/tcp_fwmark_accept"), *before);
  EXPECT_EQ(h_->pod().ip("rule show").out.find("fwmark 0x111"), std::string::npos);
  auto out = tcpConnect(h_->pod(), srv->local());
  ASSERT_TRUE(out.ok()) << out.error().message;
  ASSERT_TRUE(echoRoundTrip(out->get(), "plain").ok());
  EXPECT_EQ(srv->peers().back().str(), localOf(out->get()).str());
  auto in = tcpConnect(h_->node(), podEp((*app)->port()));
  ASSERT_TRUE(in.ok()) << in.error().message;
  ASSERT_TRUE(echoRoundTrip(in->get(), "plain").ok());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

// A step that fails rolls back the ones done: the pod's sk_lookup pin is
// taken (a directory where the link must be pinned), so the enrollment
// fails with one line naming the step, and the pod is left as it was.
TEST_P(SocketCapture, FailedEnrollmentLeavesNothing) {
  const std::string dir = h_->bpffs().root() + "/" + SLUICE_PIN_LINKS_DIR;
  const std::string podDir = dir + "/" + h_->pod().name();
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << std::strerror(errno);
  ASSERT_EQ(::mkdir(podDir.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((podDir + "/sk_lookup").c_str(), 0700), 0);
  auto before = h_->pod().sysctl("net/ipv4/tcp_fwmark_accept");
  ASSERT_TRUE(before.ok());

  auto info = h_->enroll();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().message.rfind("sk_lookup program in the pod's netns: pin link at " + podDir + "/sk_lookup", 0),
            0u)
      << info.error().message;
  EXPECT_TRUE(h_->datapath().listPods().empty());
  EXPECT_EQ(*h_->pod().sysctl("net/ipv4/tcp_fwmark_accept"), *before);
  EXPECT_EQ(h_->pod().ip("rule show").out.find("fwmark 0x111"), std::string::npos);
  EXPECT_EQ(h_->pod().ip("-6 route show table 100").out, "");
  EXPECT_TRUE(h_->datapath().programs().podSock.keys().empty());
  struct stat st {};
  EXPECT_NE(::stat(podDir.c_str(), &st), 0) << "the pod's pin directory is still there";
}

// The node hooks are checked with every socket-mode pod and re-made by the
// reconciliation.
TEST_P(SocketCapture, MissingNodeHooksAreReportedAndRepaired) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  ASSERT_TRUE(removeNodeHooks(h_->bpffs().root()).ok());
  auto check = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(check.ok()) << check.error().message;
  bool named = false;
  for (const auto& p : check->problems) named = named || p == "node hook connect4 is not attached";
  EXPECT_TRUE(named) << ::testing::PrintToString(check->problems);
  // Without the connect hook nothing is captured (TC hooks there are none).
  auto direct = tcpConnect(h_->pod(), srv->local());
  ASSERT_TRUE(direct.ok());
  ASSERT_TRUE(echoRoundTrip(direct->get(), "x").ok());
  EXPECT_TRUE(h_->events("outbound").empty());

  auto report = h_->datapath().reconcile();
  EXPECT_TRUE(report.errors.empty()) << ::testing::PrintToString(report.errors);
  ASSERT_EQ(report.repaired.size(), 1u);
  EXPECT_EQ(report.repaired[0].problems[0], "13 socket mode node hook(s) missing");
  auto c = tcpConnect(h_->pod(), srv->local());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(echoRoundTrip(c->get(), "y").ok());
  EXPECT_TRUE(h_->waitForEvent("outbound")) << describe(h_->events());
}

// A Datapath checks its node hooks link by link once, then by listing
// their pins: a hook whose pin went away between two enrollments is put
// back by the second (here connect4, detached and unpinned on its own).
TEST_P(SocketCapture, NodeHookGoneBetweenEnrollmentsIsReattached) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  h_->stopStandIn();
  ASSERT_TRUE(h_->unenroll().ok());
  const std::string pin = h_->bpffs().root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/connect4";
  {
    Fd link(bpf_obj_get(pin.c_str()));
    ASSERT_TRUE(link.valid()) << pin << ": " << std::strerror(errno);
    ASSERT_EQ(bpf_link_detach(link.get()), 0) << std::strerror(errno);
    ASSERT_EQ(::unlink(pin.c_str()), 0);
  }
  ASSERT_FALSE(nodeHooksComplete(h_->bpffs().root(), h_->datapath().programs()));
  enrollWithProxy();
  EXPECT_TRUE(nodeHooksComplete(h_->bpffs().root(), h_->datapath().programs()));
  auto check = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_TRUE(check->problems.empty()) << ::testing::PrintToString(check->problems);
  if (family() == AF_INET) {  // connect4 is the hook that was gone
    auto c = tcpConnect(h_->pod(), srv->local());
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_TRUE(echoRoundTrip(c->get(), "back").ok());
    EXPECT_TRUE(h_->waitForEvent("outbound")) << describe(h_->events());
  }
}

// IPv4-mapped addresses on a dual-stack IPv6 socket: ::ffff:10.200.0.1 is
// IPv4 to the kernel, and to sluice. The proxy reads SO_ORIGINAL_DST (IPv4);
// the app gets its peer back v4-mapped; DNS answers too.
class SocketCaptureDualStack : public SocketCapture {};
INSTANTIATE_TEST_SUITE_P(Family, SocketCaptureDualStack, ::testing::Values(AF_INET),
                         [](const auto&) { return std::string("mapped"); });

TEST_P(SocketCaptureDualStack, MappedAddressesAreIpv4) {
  auto srv = server();
  ASSERT_TRUE(srv);
  enrollWithProxy();
  auto mapped = [](const Endpoint& v4) {
    return Endpoint::of("::ffff:" + v4.ip(), v4.port());
  };
  auto fd = socketIn(h_->pod(), AF_INET6, SOCK_STREAM);
  ASSERT_TRUE(fd.ok());
  int off = 0;
  ASSERT_EQ(::setsockopt(fd->get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)), 0);
  Endpoint dst = mapped(srv->local());
  ASSERT_EQ(::connect(fd->get(), dst.raw(), dst.len), 0) << std::strerror(errno) << describe(h_->events());
  Endpoint peer = peerOf(fd->get());
  EXPECT_EQ(peer.family(), AF_INET6);
  EXPECT_TRUE(IN6_IS_ADDR_V4MAPPED(&reinterpret_cast<sockaddr_in6*>(&peer.ss)->sin6_addr));
  EXPECT_EQ(peer.str(), srv->local().str());  // str() prints v4-mapped as IPv4
  ASSERT_TRUE(echoRoundTrip(fd->get(), "mapped").ok());
  auto ev = outboundEvent();
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->origDst, srv->local().str());
  EXPECT_EQ(ev->origDstFrom, "SO_ORIGINAL_DST");

  for (bool connected : {true, false}) {
    SCOPED_TRACE(connected ? "connected UDP" : "unconnected UDP");
    auto u = socketIn(h_->pod(), AF_INET6, SOCK_DGRAM);
    ASSERT_TRUE(u.ok());
    ASSERT_EQ(::setsockopt(u->get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)), 0);
    Endpoint resolver = mapped(nodeEp(53));
    std::string q = dnsQuery(connected ? 0x3333 : 0x4444, "mapped.example", 1);
    if (connected) {
      ASSERT_EQ(::connect(u->get(), resolver.raw(), resolver.len), 0);
      EXPECT_EQ(peerOf(u->get()).str(), nodeEp(53).str());
      ASSERT_EQ(::send(u->get(), q.data(), q.size(), 0), static_cast<ssize_t>(q.size()));
    } else {
      ASSERT_EQ(::sendto(u->get(), q.data(), q.size(), 0, resolver.raw(), resolver.len), static_cast<ssize_t>(q.size()));
    }
    pollfd p{u->get(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 2000), 1) << describe(h_->events());
    char buf[512];
    Endpoint from;
    from.len = sizeof(from.ss);
    ASSERT_GT(::recvfrom(u->get(), buf, sizeof(buf), 0, from.raw(), &from.len), 0);
    EXPECT_EQ(from.family(), AF_INET6);
    EXPECT_EQ(from.str(), nodeEp(53).str());
  }
}

// --cgroup: the node hooks attach at that cgroup (here one the test process
// moved into), and a directory that is no cgroup is refused in one line.
TEST_P(SocketCaptureDualStack, CgroupOptionPlacesTheNodeHooks) {
  CgroupScope scope("hooks");
  ASSERT_TRUE(scope.ok()) << scope.error();
  auto srv = server();
  ASSERT_TRUE(srv);
  TestBpffs bpffs;
  DatapathOptions o;
  o.bpffsRoot = bpffs.root();
  o.capture = CaptureMode::Socket;
  o.cgroupPath = "/tmp";
  auto bad = Datapath::open(o);
  ASSERT_TRUE(bad.ok()) << bad.error().message;
  PodSpec spec;
  spec.netnsPath = h_->pod().path();
  auto refused = (*bad)->addPod(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "cgroup /tmp is not a cgroup v2 directory");
  EXPECT_TRUE((*bad)->listPods().empty());
  bad->reset();

  o.cgroupPath = scope.path();
  auto dp = Datapath::open(o);
  ASSERT_TRUE(dp.ok()) << dp.error().message;
  auto info = (*dp)->addPod(spec);
  ASSERT_TRUE(info.ok()) << info.error().message;
  Fd link(bpf_obj_get((bpffs.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/connect4").c_str()));
  ASSERT_TRUE(link.valid());
  bpf_link_info li{};
  __u32 len = sizeof(li);
  ASSERT_EQ(bpf_obj_get_info_by_fd(link.get(), &li, &len), 0);
  auto want = cgroupIdOfPath(scope.path());
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(li.cgroup.cgroup_id, *want);
  auto standIn = ProxyStandIn::start([&] {
    StandInConfig c;
    c.netnsPath = h_->pod().path();
    return c;
  }());
  ASSERT_TRUE(standIn.ok()) << standIn.error().message;
  auto c = tcpConnect(h_->pod(), srv->local());
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(echoRoundTrip(c->get(), "scoped").ok());
  EXPECT_TRUE((*standIn)->waitForEvents(1, kIoTimeout)) << "a socket of the cgroup was not captured";
  (*standIn)->stop();
  ASSERT_TRUE((*dp)->removePod(info->id).ok());
}

// The pods' own sk_lookup programs (loader/sk_lookup_stubs.h), over the
// maps of a socket-mode Datapath.
class SkLookupStubs : public ::testing::Test {
 protected:
  void SetUp() override { openHarness(h_, kSocketMode); }
  PodPrograms& programs() { return h_->datapath().programs(); }
  std::unique_ptr<PodHarness> h_;
};

// Run with BPF_PROG_TEST_RUN: a stub whose cookie was never written drops
// every lookup (fail closed) where one that names a netns sluice does not
// know passes it (the shared program's answer); a named one cannot be
// renamed (its array is frozen).
TEST_F(SkLookupStubs, UnnamedDropsNamedPassesAndIsFrozen) {
  PodPrograms& p = programs();
  ASSERT_TRUE(p.socketLoaded()) << p.socketError();
  // The shared program sits in slot 0 once node hooks exist; put it there.
  ASSERT_TRUE(p.skLookupProg.update(0, static_cast<__u32>(p.socketPrograms().skLookup)).ok());
  auto run = [](const SkLookupStub& stub) -> int {
    struct bpf_sk_lookup ctx {};
    ctx.family = AF_INET;
    ctx.protocol = IPPROTO_TCP;
    ctx.remote_ip4 = htonl(0x0ac80001);
    ctx.remote_port = htons(40000);
    ctx.local_ip4 = htonl(0x0ac80002);
    ctx.local_port = 8080;
    LIBBPF_OPTS(bpf_test_run_opts, o, .ctx_in = &ctx, .ctx_size_in = sizeof(ctx));
    if (bpf_prog_test_run_opts(stub.prog.get(), &o) != 0) return -errno;
    return static_cast<int>(o.retval);
  };
  auto stub = loadSkLookupStub(p.skLookupPod.fd(), p.skLookupProg.fd());
  ASSERT_TRUE(stub.ok()) << stub.error().message;
  EXPECT_EQ(run(*stub), 0 /* SK_DROP */);
  ASSERT_TRUE(nameSkLookupStub(*stub, 0x5eed5eedull).ok());
  EXPECT_EQ(run(*stub), 1 /* SK_PASS */);
  Status again = nameSkLookupStub(*stub, 42);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().message, "write the pod's sk_lookup cookie: Operation not permitted");
}

// The pool: refilled behind each take; a load that fails pauses it until
// the next take, which then loads inline and returns the kernel's refusal.
TEST_F(SkLookupStubs, PoolRefillsAndReportsLoadErrors) {
  PodPrograms& p = programs();
  auto pool = SkLookupStubPool::start(p.skLookupPod.fd(), p.skLookupProg.fd(), 3);
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  ASSERT_TRUE((*pool)->waitReady(3, 5000));
  for (int i = 0; i < 3; i++) ASSERT_TRUE((*pool)->take(1000 + i).ok());
  EXPECT_EQ((*pool)->counts().ahead, 3u);
  EXPECT_TRUE((*pool)->waitReady(3, 5000)) << (*pool)->ready() << " ready";

  // The program array where the scratch must be: the verifier refuses the store.
  auto bad = SkLookupStubPool::start(p.skLookupProg.fd(), p.skLookupProg.fd(), 3);
  ASSERT_TRUE(bad.ok()) << bad.error().message;
  EXPECT_FALSE((*bad)->waitReady(1, 5000));
  EXPECT_EQ((*bad)->counts().loadErrors, 1u);
  auto fd = (*bad)->take(7);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().message.rfind("load the pod's sk_lookup program: ", 0), 0u) << fd.error().message;
  EXPECT_EQ((*bad)->counts().inline_, 1u);
}

}  // namespace
}  // namespace sluice::test
