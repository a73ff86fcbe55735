// Issue 27 in the socket mode, from outside the pod: inbound connections
// that reach an app's own listener around the proxy.
//
// Item 4, stale proxy_conns entries: the proxy relays an inbound connection
// to the app from the client's address and a port P' of its own, and
// pod_sockops files that tuple so that pod_sk_lookup lets the proxy's SYN
// through (rule 4). Once the connection is over, a SYN from the client's
// address and P' (which the app's answers told the client) must be the
// proxy's again, not the app's -- whichever end closed first, the app's end
// in TIME_WAIT included.
//
// Item 8, a forged own source: pod_sk_lookup lets a connection from the
// pod's own address through (rule 5, the pod calling itself over lo). A SYN
// from the node's side of the veth with that source (IPv6 accepts it; IPv4
// with accept_local) must not reach the app's listener.
//
//   node netns                              pod netns (enrolled, socket mode)
//   +------------------------------+        +-----------------------------------+
//   | client 10.200.0.1:P'         |  veth  | eth0  10.200.0.2 / fd00:200::2    |
//   |        fd00:200::1:P'        |<------>| stand-in: 15001 15006 15008 15053 |
//   | AF_PACKET on vethpod         |        | app listener [::]:Q / 0.0.0.0:Q   |
//   +------------------------------+        | tap on lo (the app's SYN-ACKs)    |
//                                           +-----------------------------------+
#include <bpf/bpf.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "maps/sluice_maps.h"
#include "test/common/packet.h"
#include "test/common/raw_link.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using namespace std::chrono_literals;

/// The states (ss's first column) of the pod's TCP sockets whose local
/// port is @p port, one per socket.
std::vector<std::string> socketStates(const TestNetns& ns, uint16_t port) {
  auto r = sh("ip netns exec " + ns.name() + " ss -Htan 'sport = :" + std::to_string(port) + "'");
  std::vector<std::string> states;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string state;
    if (words >> state) states.push_back(state);
  }
  return states;
}

/// How many proxy_conns entries (pinned under @p root) belong to the netns
/// with @p cookie; an error when the map cannot be read.
Result<size_t> proxyConnEntries(const std::string& root, uint64_t cookie) {
  const std::string path = root + "/" + SLUICE_PIN_PROXY_CONNS;
  Fd map(::bpf_obj_get(path.c_str()));
  if (!map.valid()) return Error::fromErrno(errno, "open " + path);
  size_t n = 0;
  sluice_conn_key key{}, next{};
  const void* prev = nullptr;
  while (::bpf_map_get_next_key(map.get(), prev, &next) == 0) {
    if (next.netns_cookie == cookie) n++;
    key = next;
    prev = &key;
  }
  return n;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// ---- Item 4 -------------------------------------------------------------------

// family, the proxy's cgroups known (the agent's proxy identity), the app
// closes first (its end in TIME_WAIT) or the client does.
using StaleParam = std::tuple<int, bool, bool>;

class StaleProxyConn : public ::testing::TestWithParam<StaleParam> {
 protected:
  void SetUp() override { openHarness(h_, kSocketMode); }
  int family() const { return std::get<0>(GetParam()); }
  bool identityKnown() const { return std::get<1>(GetParam()); }
  bool appClosesFirst() const { return std::get<2>(GetParam()); }
  Endpoint podEp(uint16_t port) const { return Endpoint::of(PodTopology::podAddr(family()), port); }
  std::string nodeIp() const { return PodTopology::nodeAddr(family()); }

  std::unique_ptr<PodHarness> h_;
};

INSTANTIATE_TEST_SUITE_P(Socket, StaleProxyConn,
                         ::testing::Combine(::testing::Values(AF_INET, AF_INET6), ::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(familyName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_proxy_cgroup" : "_mark_only") +
                                  (std::get<2>(info.param) ? "_app_closes_first" : "_client_closes_first");
                         });

//   node C:P --> pod A:Q   captured: stand-in --from C:P'--> app A:Q ... closed
//   node C:P' --> pod A:Q  must be the proxy's again (stand-in event, peer C:P')
TEST_P(StaleProxyConn, LaterSynFromTheRelaysClientPortIsCaptured) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()), appClosesFirst());
  ASSERT_TRUE(app.ok()) << app.error().message;
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_EQ(info->capture, "socket");
  Status st = h_->startStandIn();
  ASSERT_TRUE(st.ok()) << st.error().message;
  if (identityKnown()) {
    // The stand-in runs on threads of this process: its cgroup is the
    // proxy's. The app's sockets carry no mark, so it stays an app.
    auto id = h_->datapath().addProxyProcess(::getpid());
    ASSERT_TRUE(id.ok()) << id.error().message;
  }
  const uint16_t q = (*app)->port();

  // The relayed connection; the app's answer names P'.
  {
    auto c = tcpConnect(h_->node(), podEp(q));
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto echoed = echoRoundTrip(c->get(), "first");
    ASSERT_TRUE(echoed.ok()) << echoed.error().message;
    ASSERT_TRUE(h_->waitForEvent("inbound")) << describe(h_->events());
  }
  ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout));
  const Endpoint relayed = (*app)->peers().front();
  ASSERT_EQ(relayed.ip(), nodeIp()) << "rule 4: the app sees the client's address";
  const uint16_t pPrime = relayed.port();

  // Over on every side: the stand-in holds nothing, the app's end is gone
  // (the client closed first) or in TIME_WAIT (the app did).
  ASSERT_TRUE(h_->waitStandInIdle(scaledBound(5s)));
  const bool settled = eventually([&] {
    for (const auto& s : socketStates(h_->pod(), q))
      if (s != "LISTEN" && s != "TIME-WAIT") return false;
    return true;
  });
  ASSERT_TRUE(settled) << "the app's end did not close: " << join(socketStates(h_->pod(), q));
  const auto states = socketStates(h_->pod(), q);
  const bool appTimeWait = std::find(states.begin(), states.end(), "TIME-WAIT") != states.end();
  EXPECT_EQ(appTimeWait, appClosesFirst()) << join(states);

  // The attacker: the client's address and P'.
  // SO_REUSEADDR: P' may be the port of a connection of the node's that
  // is in TIME_WAIT (the kernel picked it in another netns).
  const size_t inboundBefore = h_->events("inbound").size();
  const Endpoint from = Endpoint::of(nodeIp(), pPrime), to = podEp(q);
  auto attacker = socketIn(h_->node(), family(), SOCK_STREAM);
  ASSERT_TRUE(attacker.ok()) << attacker.error().message;
  const int one = 1;
  ASSERT_EQ(::setsockopt(attacker->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0) << std::strerror(errno);
  ASSERT_EQ(::bind(attacker->get(), from.raw(), from.len), 0) << "bind " << from.str() << ": " << std::strerror(errno);
  ASSERT_EQ(::connect(attacker->get(), to.raw(), to.len), 0) << "connect " << to.str() << ": " << std::strerror(errno);
  auto echoed = echoRoundTrip(attacker->get(), "again");
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_TRUE(eventually([&] { return h_->events("inbound").size() > inboundBefore; }, 3s))
      << "the SYN from " << from.str() << " went around the proxy: " << describe(h_->events());
  auto events = h_->events("inbound");
  if (events.size() > inboundBefore) {
    EXPECT_EQ(events.back().peer, from.str());
  }
  ASSERT_TRUE((*app)->waitForAccepts(2, kIoTimeout));
  EXPECT_NE((*app)->peers().back().port(), pPrime)
      << "the app accepted the client's port P' itself: its listener, not the proxy, got the SYN";
}

// The entry behind the attack, directly: there while the relay is open,
// gone with it -- after a relay that ended, and after one whose connect to
// the app failed (nothing listens: the app's reset).
TEST_P(StaleProxyConn, EntriesLiveExactlyAsLongAsTheirConnections) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()), appClosesFirst());
  ASSERT_TRUE(app.ok()) << app.error().message;
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  // The relay to a closed port fails by the app's reset, or (where the
  // reset takes another way) by the connect's time-out: either way the
  // proxy's socket closes before it was ever connected.
  StandInConfig cfg;  // the harness keeps SO_REUSEPORT where the mode serves it
  cfg.upstreamConnectTimeout = std::chrono::milliseconds(1500);
  Status st = h_->startStandIn(cfg);
  ASSERT_TRUE(st.ok()) << st.error().message;
  if (identityKnown()) {
    auto id = h_->datapath().addProxyProcess(::getpid());
    ASSERT_TRUE(id.ok()) << id.error().message;
  }
  auto cookie = h_->pod().cookie();
  ASSERT_TRUE(cookie.ok()) << cookie.error().message;
  auto entries = [&] {
    auto n = proxyConnEntries(h_->bpffs().root(), *cookie);
    EXPECT_TRUE(n.ok()) << n.error().message;
    return n.ok() ? *n : size_t{1000};
  };
  ASSERT_EQ(entries(), 0u);
  {
    auto c = tcpConnect(h_->node(), podEp((*app)->port()));
    ASSERT_TRUE(c.ok()) << c.error().message;
    ASSERT_TRUE(echoRoundTrip(c->get(), "open").ok());
    ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout));
    // The app that closes first may have ended it already; the one that
    // echoes on holds it open until the client goes.
    if (!appClosesFirst()) {
      EXPECT_EQ(entries(), 1u) << "the open relay is not filed: the observation is broken";
    }
  }
  ASSERT_TRUE(h_->waitStandInIdle(scaledBound(5s)));
  EXPECT_TRUE(eventually([&] { return entries() == 0; })) << entries() << " entries after the relay ended";

  // A port nothing listens on: the proxy's connect to the app fails.
  uint16_t closedPort = 0;
  {
    auto probe = socketIn(h_->pod(), family(), SOCK_STREAM);
    ASSERT_TRUE(probe.ok());
    Endpoint any = Endpoint::any(family());
    ASSERT_EQ(::bind(probe->get(), any.raw(), any.len), 0) << std::strerror(errno);
    closedPort = localOf(probe->get()).port();
  }
  const size_t inboundBefore = h_->events("inbound").size();
  {
    auto c = tcpConnect(h_->node(), podEp(closedPort));
    ASSERT_TRUE(c.ok()) << c.error().message;  // the proxy accepts it
    (void)readSome(c->get(), 1);                // then resets it
  }
  ASSERT_TRUE(eventually([&] { return h_->events("inbound").size() > inboundBefore; }, 5s)) << describe(h_->events());
  EXPECT_EQ(h_->events("inbound").back().detail.rfind("upstream failed", 0), 0u) << describe(h_->events());
  ASSERT_TRUE(h_->waitStandInIdle(scaledBound(5s)));
  EXPECT_TRUE(eventually([&] { return entries() == 0; })) << entries() << " entries after the relay's connect failed";
}

// ---- Item 8 -------------------------------------------------------------------

constexpr uint16_t kForgedPort = 47321;  // the forged SYN's source port: its answers are recognised by it
constexpr uint32_t kForgedSeq = 0x4242;

class ForgedOwnSource : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { openHarness(h_, kSocketMode); }
  int family() const { return GetParam(); }
  std::string podIp() const { return PodTopology::podAddr(family()); }
  Endpoint podEp(uint16_t port) const { return Endpoint::of(podIp(), port); }

  std::unique_ptr<PodHarness> h_;
};

INSTANTIATE_TEST_SUITE_P(Socket, ForgedOwnSource, ::testing::Values(AF_INET, AF_INET6),
                         [](const auto& info) { return std::string(familyName(info.param)); });

//   node: AF_PACKET on vethpod --SYN pod:47321 -> pod:Q--> eth0 --X (dropped)
//   (had the app's listener got it: SYN-ACK pod:Q -> pod:47321 over lo)
TEST_P(ForgedOwnSource, SynFromOutsideWithThePodsOwnSourceNeverReachesTheApp) {
  if (family() == AF_INET) {
    // IPv4 drops a local source arriving on eth0 as a martian, unless the
    // interface accepts local sources: it does here, so the guard is what
    // is tested.
    Status st = h_->pod().setSysctl("net/ipv4/conf/eth0/accept_local", "1");
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  auto app = TcpServer::start(h_->pod(), Endpoint::any(family()));
  ASSERT_TRUE(app.ok()) << app.error().message;
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_EQ(info->capture, "socket");
  Status st = h_->startStandIn();
  ASSERT_TRUE(st.ok()) << st.error().message;
  const uint16_t q = (*app)->port();
  auto lo = RawLink::open(h_->pod(), "lo");
  ASSERT_TRUE(lo.ok()) << lo.error().message;
  auto veth = RawLink::open(h_->node(), "vethpod");
  ASSERT_TRUE(veth.ok()) << veth.error().message;
  auto podMac = linkMac(h_->pod(), "eth0");
  ASSERT_TRUE(podMac.ok()) << podMac.error().message;

  // The control, rule 5: the pod calling its own address reaches the app
  // directly, and its SYN-ACK shows on lo (the tap sees what it must).
  {
    auto c = tcpConnect(h_->pod(), podEp(q));
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto echoed = echoRoundTrip(c->get(), "self");
    ASSERT_TRUE(echoed.ok()) << echoed.error().message;
    const uint16_t own = localOf(c->get()).port();
    auto seen = (*lo)->waitFor(
        [&](const CapturedFrame& f) {
          return f.parsed.tcpFlags && *f.parsed.tcpFlags == (tcpflag::SYN | tcpflag::ACK) && f.parsed.dport &&
                 *f.parsed.dport == own;
        },
        kIoTimeout);
    ASSERT_TRUE(seen) << "the tap on lo saw no SYN-ACK of the pod's own connection";
  }
  ASSERT_TRUE((*app)->waitForAccepts(1, kIoTimeout));
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());

  const uint64_t before = h_->stats().dropped_pkts;
  Packet syn = Packet::tcp(podIp(), kForgedPort, podIp(), q).macs((*veth)->mac(), *podMac).seq(kForgedSeq);
  ASSERT_TRUE((*veth)->send(syn.bytes()).ok());
  auto answer = (*lo)->waitFor(
      [&](const CapturedFrame& f) {
        return f.parsed.sport && *f.parsed.sport == q && f.parsed.dport && *f.parsed.dport == kForgedPort;
      },
      1500ms);
  EXPECT_FALSE(answer) << "the app's listener answered the forged SYN: " << describeFrame(answer->bytes);
  EXPECT_EQ((*app)->accepted(), 1u);
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
  EXPECT_GT(h_->stats().dropped_pkts, before) << "the drop is counted";

  // Rule 5 still holds after the drop.
  auto again = tcpConnect(h_->pod(), podEp(q));
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_TRUE(echoRoundTrip(again->get(), "self").ok());
  EXPECT_TRUE(h_->events().empty()) << describe(h_->events());
}

}  // namespace
}  // namespace sluice::test
