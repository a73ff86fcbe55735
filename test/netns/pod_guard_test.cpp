// Issue 27, items 1, 2 and 7: the pod guard (bpf/pod_guard.bpf.c, BPF LSM)
// in both capture modes. An app of an enrolled pod — its own cgroup,
// CAP_NET_RAW alone (test/common/pod_app.h) — gets no packet socket (its
// frames pass no cgroup hook, and with PACKET_QDISC_BYPASS no TC hook
// either), no XDP socket, and cannot bind the proxy's ports (a socket of the
// proxy's uid joining its reuseport group got a share of the inbound
// connections). A task with CAP_NET_ADMIN (the proxy, this test) and the
// apps of pods that are not enrolled are left alone.
#include <linux/if_ether.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "loader/pod_guard.h"
#include "test/common/pod_app.h"
#include "test/common/topology.h"

#ifndef AF_XDP
#define AF_XDP 44
#endif

namespace sluice::test {
namespace {

class PodGuard : public ::testing::TestWithParam<ModeParam> {
 protected:
  void SetUp() override {
    if (std::string why = podGuardUnsupported(); !why.empty())
      GTEST_SKIP() << "the pod guard cannot run here: " << why << " (its tests run in the 6.1 guest)";
    openHarness(h_, GetParam(), /*podGuard=*/true);
  }

  /// What socket(@p family, @p type, @p proto) gives the app: "ok" or the
  /// error's name.
  std::string appSocket(int family, int type, int proto) {
    auto r = runAsPodApp(h_->pod().path(), [&](std::string& out) {
      int fd = ::socket(family, type, proto);
      out = fd >= 0 ? "ok" : std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return 0;
    });
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r->out : "setup failed";
  }
  /// What binding @p at (TCP, SO_REUSEPORT, or UDP) gives the app.
  std::string appBind(const Endpoint& at, int type) {
    auto r = runAsPodApp(h_->pod().path(), [&](std::string& out) {
      int fd = ::socket(at.family(), type, 0);
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      int rc = ::bind(fd, at.raw(), at.len);
      out = rc == 0 ? "ok" : std::strerror(errno);
      ::close(fd);
      return 0;
    });
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r->out : "setup failed";
  }

  std::unique_ptr<PodHarness> h_;
};

INSTANTIATE_TEST_SUITE_P(Modes, PodGuard, ::testing::Values(kSocketMode, kTcxMode, kLegacyMode),
                         [](const auto& info) { return std::string(info.param.name); });

const std::string kRefused = std::strerror(EPERM);

TEST_P(PodGuard, PacketAndXdpSocketsAreRefusedToAnEnrolledPodsApps) {
  // Before enrollment the app may: the guard is the pod's, not the node's.
  ASSERT_EQ(appSocket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), "ok");
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(appSocket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), kRefused);
  EXPECT_EQ(appSocket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP)), kRefused);
  EXPECT_EQ(appSocket(AF_XDP, SOCK_RAW, 0), kRefused);
  // Raw IP sockets stay (ping): the capture modes judge their packets.
  EXPECT_EQ(appSocket(AF_INET, SOCK_RAW, IPPROTO_ICMP), "ok");
  // A task with CAP_NET_ADMIN (this test, as the proxy would be) may.
  auto own = h_->pod().run([]() -> Status {
    int fd = ::socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    if (fd < 0) return Error::fromErrno(errno, "packet socket");
    ::close(fd);
    return {};
  });
  EXPECT_TRUE(own.ok()) << own.error().message;
  // Removed, the pod's apps may again.
  ASSERT_TRUE(h_->unenroll().ok());
  EXPECT_EQ(appSocket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)), "ok");
}

TEST_P(PodGuard, ProxyPortsCannotBeBoundByAnEnrolledPodsApps) {
  auto info = h_->enroll();
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_TRUE(h_->startStandIn().ok());  // the proxy listens (SO_REUSEPORT): an app would join its groups
  for (uint16_t port : {15001, 15006, 15008}) {
    EXPECT_EQ(appBind(Endpoint::any(AF_INET6, port), SOCK_STREAM), kRefused) << "[::]:" << port;
    EXPECT_EQ(appBind(Endpoint::any(AF_INET, port), SOCK_STREAM), kRefused) << "0.0.0.0:" << port;
  }
  EXPECT_EQ(appBind(Endpoint::of("127.0.0.1", 15053), SOCK_DGRAM), kRefused);
  EXPECT_EQ(appBind(Endpoint::of("::1", 15053), SOCK_STREAM), kRefused);
  // Every other port is the app's.
  EXPECT_EQ(appBind(Endpoint::any(AF_INET6, 8080), SOCK_STREAM), "ok");
  EXPECT_EQ(appBind(Endpoint::of("127.0.0.1", 5353), SOCK_DGRAM), "ok");
  // Inbound still reaches the proxy (the stand-in bound its ports with
  // CAP_NET_ADMIN) and from there the app.
  auto app = TcpServer::start(h_->pod(), Endpoint::any(AF_INET));
  ASSERT_TRUE(app.ok());
  auto c = tcpConnect(h_->node(), Endpoint::of(PodTopology::podAddr(AF_INET), (*app)->port()));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(echoRoundTrip(c->get(), "guarded").ok());
  EXPECT_TRUE(h_->waitForEvent("inbound"));
}

TEST(PodGuardLsm, TheEnvironmentTurnsItOff) {
  const char* was = std::getenv("SLUICE_POD_GUARD");
  const std::string saved = was ? was : "";
  ::setenv("SLUICE_POD_GUARD", "off", 1);
  EXPECT_FALSE(podGuardWanted());
  EXPECT_FALSE(DatapathOptions{}.podGuard);
  ::setenv("SLUICE_POD_GUARD", "on", 1);
  EXPECT_TRUE(podGuardWanted());
  ::unsetenv("SLUICE_POD_GUARD");
  EXPECT_TRUE(podGuardWanted());
  if (was) ::setenv("SLUICE_POD_GUARD", saved.c_str(), 1);
}

TEST(PodGuardLsm, TheListNamesBpfOrNot) {
  EXPECT_TRUE(lsmListHasBpf("lockdown,capability,landlock,bpf"));
  EXPECT_TRUE(lsmListHasBpf("bpf\n"));
  EXPECT_TRUE(lsmListHasBpf("capability,bpf,landlock\n"));
  EXPECT_FALSE(lsmListHasBpf("lockdown,capability,landlock,yama,apparmor\n"));
  EXPECT_FALSE(lsmListHasBpf("bpffs,notbpf"));
  EXPECT_FALSE(lsmListHasBpf(""));
}

}  // namespace
}  // namespace sluice::test
