// Changing an enrolled pod's capture settings in place
// (Datapath::updatePodSettings): what the Kubernetes controller does when a
// pod's annotations change (ambient.istio.io/dns-capture,
// bypass-inbound-capture, istio.io/reroute-virtual-interfaces). The pod is
// never removed: its pod_config entry is replaced in one map update, so
// traffic is captured with the old settings or the new ones, never not at
// all, and connections already open keep working.
//
//   node netns                               pod netns
//   +---------------------------+  veth     +---------------------------------+
//   | UDP/TCP servers :53, :P   |<--------->| eth0 10.200.0.2 (programs)      |
//   | clients                   |  veth2    | eth1 10.200.7.2 (reroute later) |
//   |                           |<--------->| stand-in :15001 :15006 :15053   |
//   +---------------------------+           +---------------------------------+
#include <net/if.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "test/common/topology.h"

namespace sluice::test {
namespace {

class SettingsUpdate : public ::testing::TestWithParam<ModeParam> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = modeUnsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
    h_ = std::make_unique<PodHarness>(GetParam().tc, GetParam().capture);
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    Status st = h_->open();
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  void TearDown() override { h_.reset(); }

  Endpoint nodeEp(uint16_t port) const { return Endpoint::of(PodTopology::kNodeV4, port); }
  Endpoint podEp(uint16_t port) const { return Endpoint::of(PodTopology::kPodV4, port); }

  Result<PodInfo> update(const CaptureSettings& s) { return h_->datapath().updatePodSettings(h_->podId(), s); }

  /// What the programs read for the pod: pod_config at TC; captured at the
  /// socket, the socket programs read pod_sock, which must say the same.
  std::optional<sluice_pod_config> config() {
    auto cookie = h_->pod().cookie();
    if (!cookie.ok()) return std::nullopt;
    auto cfg = h_->datapath().programs().podConfig.lookup(*cookie);
    if (cfg && GetParam().capture == CaptureMode::Socket) {
      auto sock = h_->datapath().programs().podSock.lookup(*cookie);
      EXPECT_TRUE(sock) << "the pod has no pod_sock entry";
      if (!sock) return std::nullopt;
      EXPECT_EQ(sock->flags, cfg->flags) << "pod_sock and pod_config disagree";
      EXPECT_EQ(sock->reroute_count, cfg->reroute_count) << "pod_sock and pod_config disagree";
      EXPECT_EQ(std::memcmp(sock->reroute_ifindex, cfg->reroute_ifindex, sizeof(cfg->reroute_ifindex)), 0)
          << "pod_sock and pod_config disagree";
    }
    return cfg;
  }

  /// One UDP DNS query from the pod to the node's resolver: true when the
  /// stand-in answered it (captured), false when the node's server echoed
  /// it (not captured).
  bool dnsCaptured(uint16_t id) {
    std::string q = dnsQuery(id, "sluice.example.com", 1);
    auto reply = udpExchange(h_->pod(), nodeEp(53), q);
    EXPECT_TRUE(reply.ok()) << (reply.ok() ? "" : reply.error().message);
    if (!reply.ok()) return false;
    EXPECT_EQ(reply->from.str(), nodeEp(53).str()) << "the answer must come from the resolver queried";
    if (reply->payload == q) return false;  // the node's UDP server echoes
    auto answer = parseDnsAnswer(reply->payload);
    EXPECT_TRUE(answer && answer->response) << "neither an echo nor a DNS answer";
    return answer && answer->response;
  }

  std::unique_ptr<PodHarness> h_;
};

INSTANTIATE_TEST_SUITE_P(All, SettingsUpdate, ::testing::Values(kTcxMode, kLegacyMode, kSocketMode),
                         [](const auto& info) { return std::string(info.param.name); });

// DNS capture off, on, off again: each query goes where the settings of the
// moment say, a connection opened before the first change keeps echoing
// through every change, and the pod is never re-enrolled (same enrollment
// time, same attachments).
TEST_P(SettingsUpdate, DnsCaptureFlipsLiveAndOpenConnectionsKeepWorking) {
  auto udp53 = UdpServer::start(h_->node(), nodeEp(53));
  ASSERT_TRUE(udp53.ok()) << udp53.error().message;
  auto server = TcpServer::start(h_->node(), nodeEp(0));
  ASSERT_TRUE(server.ok()) << server.error().message;
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_TRUE(h_->startStandIn().ok());

  auto open = tcpConnect(h_->pod(), (*server)->local());
  ASSERT_TRUE(open.ok()) << open.error().message;
  ASSERT_EQ(echoOrError(open->get(), "before"), "before");
  EXPECT_TRUE(dnsCaptured(1));

  auto off = update({.dnsCapture = false, .inboundCapture = true, .rerouteIfaces = {}});
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_FALSE(off->dnsCapture);
  EXPECT_EQ(off->enrolledAtNs, info->enrolledAtNs) << "re-enrolled instead of changed in place";
  ASSERT_TRUE(config());
  EXPECT_EQ(config()->flags & SLUICE_POD_DNS_CAPTURE, 0u);
  EXPECT_FALSE(dnsCaptured(2));
  EXPECT_TRUE((*udp53)->waitForDatagrams(1, kIoTimeout));
  ASSERT_EQ(echoOrError(open->get(), "during"), "during");

  auto on = update({.dnsCapture = true, .inboundCapture = true, .rerouteIfaces = {}});
  ASSERT_TRUE(on.ok()) << on.error().message;
  EXPECT_TRUE(dnsCaptured(3));
  EXPECT_EQ((*udp53)->received().size(), 1u) << "a captured query reached the resolver";
  ASSERT_EQ(echoOrError(open->get(), "after"), "after");

  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_TRUE(pods[0].dnsCapture);
  EXPECT_EQ(pods[0].interfaces, info->interfaces);
  auto check = h_->datapath().checkPod(h_->podId());
  ASSERT_TRUE(check.ok());
  EXPECT_TRUE(check->problems.empty()) << check->problems.front();
  EXPECT_EQ(h_->events("dns-udp").size(), 2u) << describe(h_->events());
}

// Inbound capture (bypass-inbound-capture): a new inbound connection goes to
// the stand-in's 15006 while it is on and straight to the app while it is
// off; the connection accepted through the proxy before the change stays up.
TEST_P(SettingsUpdate, InboundCaptureFlipsLive) {
  auto app = TcpServer::start(h_->pod(), Endpoint::any(AF_INET));
  ASSERT_TRUE(app.ok()) << app.error().message;
  ASSERT_TRUE(h_->enroll().ok());
  ASSERT_TRUE(h_->startStandIn().ok());

  auto viaProxy = tcpConnect(h_->node(), podEp((*app)->port()));
  ASSERT_TRUE(viaProxy.ok()) << viaProxy.error().message;
  ASSERT_EQ(echoOrError(viaProxy->get(), "in-1"), "in-1");
  ASSERT_TRUE(h_->waitForEvent("inbound")) << describe(h_->events());

  ASSERT_TRUE(update({.dnsCapture = true, .inboundCapture = false, .rerouteIfaces = {}}).ok());
  auto direct = tcpConnect(h_->node(), podEp((*app)->port()));
  ASSERT_TRUE(direct.ok()) << direct.error().message;
  ASSERT_EQ(echoOrError(direct->get(), "in-2"), "in-2");
  EXPECT_EQ(h_->events("inbound").size(), 1u) << describe(h_->events());
  ASSERT_TRUE((*app)->waitForAccepts(2, kIoTimeout));
  EXPECT_EQ((*app)->peers().back().str(), localOf(direct->get()).str()) << "the app saw the proxy, not the client";
  ASSERT_EQ(echoOrError(viaProxy->get(), "in-1 again"), "in-1 again");

  ASSERT_TRUE(update({.dnsCapture = true, .inboundCapture = true, .rerouteIfaces = {}}).ok());
  auto again = tcpConnect(h_->node(), podEp((*app)->port()));
  ASSERT_TRUE(again.ok()) << again.error().message;
  ASSERT_EQ(echoOrError(again->get(), "in-3"), "in-3");
  EXPECT_TRUE(eventually([&] { return h_->events("inbound").size() == 2; }, kIoTimeout)) << describe(h_->events());
  ASSERT_EQ(echoOrError(direct->get(), "in-2 again"), "in-2 again");
}

// Reroute interfaces resolve to the ifindexes of the pod's attached
// interfaces; TCP arriving on one goes to the outbound listener (15001).
TEST_P(SettingsUpdate, RerouteInterfacesResolveInThePod) {
  ASSERT_TRUE(h_->topo().addVeth("eth1", "vethpod1", 7).ok());
  auto app = TcpServer::start(h_->pod(), Endpoint::any(AF_INET));
  ASSERT_TRUE(app.ok()) << app.error().message;
  ASSERT_TRUE(h_->enroll().ok());
  ASSERT_TRUE(h_->startStandIn().ok());

  auto r = update({.dnsCapture = true, .inboundCapture = true, .rerouteIfaces = {"eth1"}});
  if (GetParam().capture == CaptureMode::Socket) {
    // Captured at the socket, eth1 got no TC hook at enrollment (only the
    // reroute interfaces named then do), and one is not attached live yet:
    // refused, nothing changed.
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, EINVAL);
    EXPECT_EQ(r.error().message, "reroute interface 'eth1' of pod '" + h_->podId() +
                                     "' has no sluice programs (captured at the socket, only the reroute interfaces "
                                     "named at enrollment get them); remove and add the pod");
    ASSERT_TRUE(config());
    EXPECT_EQ(config()->reroute_count, 0u);
    return;
  }
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->rerouteIfaces, std::vector<std::string>{"eth1"});
  int eth1 = 0;
  ASSERT_TRUE(h_->pod().run([&]() -> Status {
    eth1 = static_cast<int>(if_nametoindex("eth1"));
    return {};
  }).ok());
  ASSERT_TRUE(config());
  EXPECT_EQ(config()->reroute_count, 1u);
  EXPECT_EQ(static_cast<int>(config()->reroute_ifindex[0]), eth1);

  auto c = tcpConnect(h_->node(), Endpoint::of("10.200.7.2", (*app)->port()));
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(echoOrError(c->get(), "rerouted"), "rerouted");
  auto ev = h_->waitForEvent("outbound");
  ASSERT_TRUE(ev) << describe(h_->events());
  EXPECT_EQ(ev->listenerPort, 15001);

  auto none = update({.dnsCapture = true, .inboundCapture = true, .rerouteIfaces = {}});
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->rerouteIfaces.empty());
  EXPECT_EQ(config()->reroute_count, 0u);
}

// Every refusal names its reason and changes nothing.
TEST_P(SettingsUpdate, RefusalsChangeNothing) {
  auto notYet = h_->datapath().updatePodSettings("nobody", {});
  ASSERT_FALSE(notYet.ok());
  EXPECT_EQ(notYet.error().code, ENOENT);
  EXPECT_EQ(notYet.error().message, "pod 'nobody' is not enrolled");

  ASSERT_TRUE(h_->enroll().ok());
  auto before = config();
  ASSERT_TRUE(before);
  auto missing = update({.dnsCapture = false, .inboundCapture = true, .rerouteIfaces = {"eth9"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ENODEV);
  EXPECT_EQ(missing.error().message, "reroute interface 'eth9' not found in netns " + h_->pod().path());

  // An interface that appeared after the enrollment has no programs.
  ASSERT_TRUE(h_->topo().addVeth("eth2", "vethpod2", 8).ok());
  auto late = update({.dnsCapture = false, .inboundCapture = true, .rerouteIfaces = {"eth2"}});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code, EINVAL);
  const std::string why = GetParam().capture == CaptureMode::Socket
                              ? "captured at the socket, only the reroute interfaces named at enrollment get them"
                              : "it appeared after the pod was enrolled";
  EXPECT_EQ(late.error().message,
            "reroute interface 'eth2' of pod '" + h_->podId() + "' has no sluice programs (" + why + "); remove and add the pod");

  std::vector<std::string> nine(9, "eth0");
  auto tooMany = update({.dnsCapture = true, .inboundCapture = true, .rerouteIfaces = nine});
  ASSERT_FALSE(tooMany.ok());
  EXPECT_EQ(tooMany.error().message, "at most 8 reroute interfaces");

  auto after = config();
  ASSERT_TRUE(after);
  EXPECT_EQ(std::memcmp(&*before, &*after, sizeof(*after)), 0) << "a refused update changed pod_config";
  auto pods = h_->datapath().listPods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_TRUE(pods[0].dnsCapture) << "a refused update changed the registry";
}

}  // namespace
}  // namespace sluice::test
