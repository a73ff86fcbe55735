// Issue 27: an app of an enrolled pod trying to get traffic out of the pod
// around the proxy in the socket mode, as an attacker would — from a cgroup
// of its own, holding CAP_NET_RAW alone (test/common/pod_app.h) — and what
// stops it: the guard at the pod's interfaces (pod_skb_egress). Each test
// watches the node's end of the veth (an AF_PACKET tap, which sees frames
// before anything on the node could drop them) and fails if the crafted
// traffic gets there.
//
//   node netns                              pod netns (enrolled, socket mode)
//   +------------------------------+        +-----------------------------------+
//   | tap on vethpod   10.200.0.1  |  veth  | attacker: own cgroup, CAP_NET_RAW |
//   | resolver :53     fd00:200::1 |<------>| eth0  10.200.0.2 / fd00:200::2    |
//   +------------------------------+        | stand-in: 15001 15006 15008 15053 |
//                                           +-----------------------------------+
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/ip6.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <string>

#include "maps/sluice_maps.h"
#include "test/common/pod_app.h"
#include "test/common/raw_link.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

constexpr uint16_t kMarkPort = 47998;  // the attacker's source port: its frames are recognised by it

class Bypass : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { openHarness(h_, kSocketMode); }
  void enrollWithProxy() {
    auto info = h_->enroll();
    ASSERT_TRUE(info.ok()) << info.error().message;
    ASSERT_EQ(info->capture, "socket");
    Status st = h_->startStandIn();
    ASSERT_TRUE(st.ok()) << st.error().message;
    auto tap = RawLink::open(h_->node(), "vethpod");
    ASSERT_TRUE(tap.ok()) << tap.error().message;
    tap_ = std::move(*tap);
  }
  int family() const { return GetParam(); }
  Endpoint nodeEp(uint16_t port) const { return Endpoint::of(PodTopology::nodeAddr(family()), port); }

  /// Fails the test if a frame from the attacker's port reached the node.
  void expectNothingFromTheAttacker(const std::string& what) {
    auto got = tap_->waitFor(
        [](const CapturedFrame& f) { return !f.outgoing && f.parsed.sport && *f.parsed.sport == kMarkPort; },
        std::chrono::milliseconds(600));
    EXPECT_FALSE(got) << what << " left the pod: " << describeFrame(got->bytes);
  }
  /// Runs @p fn as the attacker and fails the test on a set-up error or a
  /// non-zero exit (fn's own failures are its messages).
  void attack(const std::function<int(std::string&)>& fn) {
    auto r = runAsPodApp(h_->pod().path(), fn);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->exitCode, 0) << r->out;
  }

  std::unique_ptr<PodHarness> h_;
  std::unique_ptr<RawLink> tap_;
};

INSTANTIATE_TEST_SUITE_P(Socket, Bypass, ::testing::Values(AF_INET, AF_INET6),
                         [](const auto& info) { return std::string(familyName(info.param)); });

// A DNS query (12-byte header, one question: "a." A IN).
const uint8_t kQuery[] = {0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0, 0, 1, 0, 1};

std::string udpDatagram(uint16_t sport, uint16_t dport) {
  std::string d(8 + sizeof(kQuery), '\0');
  uint16_t v[4] = {htons(sport), htons(dport), htons(static_cast<uint16_t>(d.size())), 0};
  std::memcpy(d.data(), v, 8);
  std::memcpy(d.data() + 8, kQuery, sizeof(kQuery));
  return d;
}

// Item 3: DNS over a raw UDP socket. The socket hooks never see it (no
// connect, no sendmsg of a UDP socket); the resolver would answer it.
//
//   attacker SOCK_RAW/IPPROTO_UDP --UDP 47998 -> node:53--X (dropped at eth0)
TEST_P(Bypass, RawUdpDnsNeverLeavesThePod) {
  enrollWithProxy();
  const uint64_t before = h_->stats().dropped_pkts;
  const Endpoint dst = nodeEp(0);  // raw sockets take no port
  attack([&](std::string& out) {
    int fd = ::socket(family(), SOCK_RAW, IPPROTO_UDP);
    if (fd < 0) return out = std::string("raw socket: ") + std::strerror(errno), 1;
    if (family() == AF_INET6) {
      int off = 6;  // the kernel computes the UDP checksum: the resolver would take it
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_CHECKSUM, &off, sizeof(off));
    }
    std::string d = udpDatagram(kMarkPort, 53);
    ssize_t n = ::sendto(fd, d.data(), d.size(), 0, dst.raw(), dst.len);
    out = "sendto: " + std::to_string(n) + " " + std::strerror(errno);
    ::close(fd);
    return 0;
  });
  expectNothingFromTheAttacker("a raw UDP DNS query");
  EXPECT_GT(h_->stats().dropped_pkts, before);
}

// Item 3, IPPROTO_RAW: the app writes the IP header itself, UDP to :53 and
// TCP (a SYN) alike.
TEST_P(Bypass, HeaderIncludedDnsAndTcpNeverLeaveThePod) {
  if (family() != AF_INET) GTEST_SKIP() << "IPPROTO_RAW with a hand-built header: the IPv4 test covers it";
  enrollWithProxy();
  const uint64_t before = h_->stats().dropped_pkts;
  attack([&](std::string& out) {
    int fd = ::socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
    if (fd < 0) return out = std::string("raw socket: ") + std::strerror(errno), 1;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    ::inet_pton(AF_INET, PodTopology::kNodeV4, &to.sin_addr);
    for (uint8_t proto : {uint8_t{IPPROTO_UDP}, uint8_t{IPPROTO_TCP}}) {
      std::string l4;
      if (proto == IPPROTO_UDP) {
        l4 = udpDatagram(kMarkPort, 53);
      } else {
        uint8_t syn[20] = {0xbb, 0x7e, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0};
        const uint16_t sport = htons(kMarkPort);
        std::memcpy(syn, &sport, 2);
        l4.assign(reinterpret_cast<char*>(syn), sizeof(syn));
      }
      std::string pkt(20, '\0');
      struct iphdr ip {};
      ip.version = 4;
      ip.ihl = 5;
      ip.ttl = 64;
      ip.protocol = proto;
      ip.tot_len = htons(static_cast<uint16_t>(20 + l4.size()));
      ::inet_pton(AF_INET, PodTopology::kPodV4, &ip.saddr);
      ip.daddr = to.sin_addr.s_addr;
      std::memcpy(pkt.data(), &ip, 20);
      pkt += l4;
      ssize_t n = ::sendto(fd, pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to));
      out += "proto " + std::to_string(proto) + ": sendto " + std::to_string(n) + " " + std::strerror(errno) + "\n";
    }
    ::close(fd);
    return 0;
  });
  expectNothingFromTheAttacker("a header-included packet");
  EXPECT_GE(h_->stats().dropped_pkts, before + 2);
}

// Item 8: a source route. The socket hooks judge the address given to
// connect()/sendto() — loopback, left alone — while the packet goes to the
// route's first hop, out of the pod. IPv4: IP_OPTIONS with a loose source
// route; IPv6: a segment routing header through the node.
TEST_P(Bypass, SourceRoutedPacketsNeverLeaveThePod) {
  enrollWithProxy();
  const uint64_t before = h_->stats().dropped_pkts;
  attack([&](std::string& out) {
    for (int type : {SOCK_DGRAM, SOCK_STREAM}) {
      int fd = ::socket(family(), type | SOCK_NONBLOCK, 0);
      if (fd < 0) return out = std::string("socket: ") + std::strerror(errno), 1;
      int rc;
      if (family() == AF_INET) {
        // NOP, LSRR (len 7, pointer 4) through the node.
        uint8_t opt[8] = {1, 0x83, 7, 4, 0, 0, 0, 0};
        ::inet_pton(AF_INET, PodTopology::kNodeV4, opt + 4);
        rc = ::setsockopt(fd, IPPROTO_IP, IP_OPTIONS, opt, sizeof(opt));
      } else {
        // A segment routing header (type 4: what the kernel takes without
        // Mobile IPv6): length 4, segments left 1, last entry 1; segment 0
        // is the final destination (the kernel writes the address given to
        // connect/sendto there), segment 1 the first hop: the node.
        uint8_t rh[40] = {0, 4, 4, 1, 1};
        ::inet_pton(AF_INET6, PodTopology::kNodeV6, rh + 24);
        rc = ::setsockopt(fd, IPPROTO_IPV6, IPV6_RTHDR, rh, sizeof(rh));
      }
      out += "option: " + std::to_string(rc) + " " + std::strerror(errno) + "\n";
      Endpoint bindTo = Endpoint::any(family(), kMarkPort);
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      ::bind(fd, bindTo.raw(), bindTo.len);
      Endpoint lo = Endpoint::of(family() == AF_INET ? "127.0.0.1" : "::1", type == SOCK_DGRAM ? 53 : 80);
      if (type == SOCK_DGRAM)
        rc = static_cast<int>(::sendto(fd, kQuery, sizeof(kQuery), 0, lo.raw(), lo.len));
      else
        rc = ::connect(fd, lo.raw(), lo.len);
      out += "send/connect: " + std::to_string(rc) + " " + std::strerror(errno) + "\n";
      ::usleep(100000);
      ::close(fd);
    }
    return 0;
  });
  expectNothingFromTheAttacker("a source-routed packet");
  (void)before;
}

// Item 8: a socket bound to loopback connecting out. pod_connect leaves a
// loopback-bound socket alone (it cannot reach another host, or so the
// decision assumed); IPv6 sends its SYN out of eth0 from ::1 all the same.
TEST_P(Bypass, LoopbackBoundSocketNeverLeavesThePod) {
  enrollWithProxy();
  auto server = TcpServer::start(h_->node(), nodeEp(0));
  ASSERT_TRUE(server.ok());
  const Endpoint dst = nodeEp((*server)->port());
  attack([&](std::string& out) {
    int fd = ::socket(family(), SOCK_STREAM, 0);
    Endpoint lo = Endpoint::of(family() == AF_INET ? "127.0.0.1" : "::1", kMarkPort);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, lo.raw(), lo.len) != 0) return out = std::string("bind: ") + std::strerror(errno), 1;
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int rc = ::connect(fd, dst.raw(), dst.len);
    out = "connect: " + std::to_string(rc) + " " + std::strerror(errno);
    ::close(fd);
    return 0;
  });
  expectNothingFromTheAttacker("a loopback-bound connection");
  EXPECT_EQ((*server)->accepted(), 0u);
}

// Item 8: a UDP socket connected to the resolver before the pod was
// enrolled. Its send() passes no sendmsg hook (the kernel runs it only for
// a datagram with an address): after enrollment its queries must not reach
// the resolver around the DNS proxy.
TEST_P(Bypass, DnsSocketConnectedBeforeEnrollmentNoLongerReachesTheResolver) {
  auto resolver = UdpServer::start(h_->node(), nodeEp(53));
  ASSERT_TRUE(resolver.ok()) << resolver.error().message;
  auto fd = socketIn(h_->pod(), family(), SOCK_DGRAM);
  ASSERT_TRUE(fd.ok());
  Endpoint src = Endpoint::any(family(), kMarkPort), dst = nodeEp(53);
  ASSERT_EQ(::bind(fd->get(), src.raw(), src.len), 0) << std::strerror(errno);
  ASSERT_EQ(::connect(fd->get(), dst.raw(), dst.len), 0) << std::strerror(errno);
  ASSERT_EQ(::send(fd->get(), kQuery, sizeof(kQuery), 0), static_cast<ssize_t>(sizeof(kQuery)));
  ASSERT_TRUE((*resolver)->waitForDatagrams(1, kIoTimeout)) << "the control query before enrollment";
  enrollWithProxy();
  const uint64_t before = h_->stats().dropped_pkts;
  (void)::send(fd->get(), kQuery, sizeof(kQuery), 0);
  expectNothingFromTheAttacker("a query of a socket connected before enrollment");
  EXPECT_EQ((*resolver)->received().size(), 1u);
  EXPECT_GT(h_->stats().dropped_pkts, before);
}

// Item 5: with the mark alone (no proxy identity: the agent has no ZDS
// connection), an app marks a socket as the proxy's (SO_MARK 0x539 and
// IP_TRANSPARENT need only CAP_NET_RAW) and connects to its own listener
// from REMOTE:Q, which pod_sockops files as a rule-4 connection of the
// proxy's. Once that connection is over, REMOTE's own connections from
// port Q must be captured again: the entry lives as long as the socket that
// filed it (and while it lives, that connection holds the tuple).
//
//   attacker: mark, transparent, bind node:47998 --connect--> pod:Q (its own listener), closed
//   node:47998 --connect--> pod:Q   must reach the proxy (inbound event)
TEST_P(Bypass, TupleFiledByAnAppDoesNotLetARemoteInLater) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok()) << app.error().message;
  enrollWithProxy();
  const Endpoint target = Endpoint::of(PodTopology::podAddr(family()), (*app)->port());
  const Endpoint spoofed = nodeEp(kMarkPort);
  attack([&](std::string& out) {
    int fd = ::socket(family(), SOCK_STREAM, 0);
    const uint32_t mark = SLUICE_DEFAULT_PROXY_MARK;
    int one = 1;
    if (::setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0)
      return out = std::string("SO_MARK: ") + std::strerror(errno), 1;
    if (::setsockopt(fd, family() == AF_INET ? SOL_IP : SOL_IPV6,
                     family() == AF_INET ? IP_TRANSPARENT : IPV6_TRANSPARENT, &one, sizeof(one)) != 0)
      return out = std::string("IP_TRANSPARENT: ") + std::strerror(errno), 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, spoofed.raw(), spoofed.len) != 0) return out = std::string("bind: ") + std::strerror(errno), 1;
    if (::connect(fd, target.raw(), target.len) != 0) return out = std::string("connect: ") + std::strerror(errno), 1;
    ::close(fd);
    return 0;
  });
  ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout)) << "the attacker's own connection, the attack's premise";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the app's end closes too
  ConnectOptions from;
  from.bind = spoofed;
  auto c = tcpConnect(h_->node(), target, from);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(echoRoundTrip(c->get(), "later").ok());
  EXPECT_TRUE(h_->waitForEvent("inbound")) << "the remote's connection from the filed port reached the app around the proxy: "
                                           << describe(h_->events());
}

// Already holding, kept tested: sendmmsg hands the kernel several
// datagrams in one call, and the sendmsg hook judges each of them — a
// batch mixing DNS with other UDP gets only its DNS datagrams to the proxy.
TEST_P(Bypass, SendmmsgQueriesAreEachCaptured) {
  auto resolver = UdpServer::start(h_->node(), nodeEp(53));
  ASSERT_TRUE(resolver.ok()) << resolver.error().message;
  auto other = UdpServer::start(h_->node(), nodeEp(0));
  ASSERT_TRUE(other.ok()) << other.error().message;
  enrollWithProxy();
  const Endpoint dns = nodeEp(53), plain = (*other)->local();
  attack([&](std::string& out) {
    int fd = ::socket(family(), SOCK_DGRAM, 0);
    std::string q = dnsQuery(0x3333, "batch.example", family() == AF_INET ? 1 : 28);
    iovec iov{q.data(), q.size()};
    mmsghdr msgs[3]{};
    const Endpoint* to[3] = {&dns, &plain, &dns};
    for (int i = 0; i < 3; i++) {
      msgs[i].msg_hdr.msg_name = const_cast<sockaddr*>(to[i]->raw());
      msgs[i].msg_hdr.msg_namelen = to[i]->len;
      msgs[i].msg_hdr.msg_iov = &iov;
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = ::sendmmsg(fd, msgs, 3, 0);
    out = "sendmmsg: " + std::to_string(n) + " " + std::strerror(errno);
    ::usleep(200000);
    ::close(fd);
    return n == 3 ? 0 : 1;
  });
  EXPECT_TRUE((*other)->waitForDatagrams(1, kIoTimeout)) << "the batch's plain datagram";
  EXPECT_TRUE((*resolver)->received().empty()) << "a batched query reached the resolver around the proxy";
  EXPECT_EQ(h_->events("dns-udp").size(), 2u) << describe(h_->events());
}

// Already holding, kept tested: an MPTCP socket starts as TCP and is
// captured at connect() like one (the proxy's listener takes it as TCP).
TEST_P(Bypass, MptcpConnectionIsCaptured) {
  auto server = TcpServer::start(h_->node(), nodeEp(0));
  ASSERT_TRUE(server.ok());
  enrollWithProxy();
  const Endpoint dst = nodeEp((*server)->port());
  auto r = runAsPodApp(h_->pod().path(), [&](std::string& out) {
    int fd = ::socket(family(), SOCK_STREAM, 262 /* IPPROTO_MPTCP */);
    if (fd < 0) return out = std::string("unsupported: ") + std::strerror(errno), 2;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::connect(fd, dst.raw(), dst.len) != 0) return out = std::string("connect: ") + std::strerror(errno), 1;
    auto echoed = echoRoundTrip(fd, "mptcp");
    out = echoed.ok() ? *echoed : echoed.error().message;
    ::close(fd);
    return echoed.ok() ? 0 : 1;
  });
  ASSERT_TRUE(r.ok()) << r.error().message;
  if (r->exitCode == 2) GTEST_SKIP() << "this kernel has no MPTCP sockets for the app: " << r->out;
  EXPECT_EQ(r->exitCode, 0) << r->out;
  EXPECT_TRUE(h_->waitForEvent("outbound")) << "the MPTCP connection went around the proxy: " << describe(h_->events());
}

}  // namespace
}  // namespace sluice::test
