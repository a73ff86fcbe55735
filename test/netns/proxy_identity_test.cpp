// The node proxy's identity beyond its mark (issue 12, item 5): an app in
// the pod that sets SO_MARK 0x539 itself (CAP_NET_RAW is enough since Linux
// 5.17, and runtimes grant it) leaves the mesh under Istio's rule; once the
// proxy's cgroup is known, only sockets of that cgroup are exempt.
//
//   test process (its own cgroup)           node netns       pod netns
//   +------------------------------+        +----------+     +-----------------------+
//   | app sockets, SO_MARK 0x539   |--------------------------> eth0 (tc)            |
//   +------------------------------+        | echo     |<----| sluice-standin        |
//   cgroup v2 <mount>/sluice-t-PID-N:       | server   |     |  (child process in    |
//     the stand-in process                  +----------+     |   the proxy cgroup)   |
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "loader/cgroup.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

/// A cgroup v2 of the test's own, removed (after its processes) at the end.
class TestCgroup {
 public:
  TestCgroup() {
    auto mount = cgroup2Mount();
    if (!mount.ok()) {
      error_ = mount.error().message;
      return;
    }
    static std::atomic<int> n{0};
    path_ = *mount + "/sluice-t-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    if (::mkdir(path_.c_str(), 0755) != 0) error_ = "mkdir " + path_ + ": " + strerror(errno);
  }
  ~TestCgroup() {
    if (path_.empty()) return;
    // rmdir fails while a process is still in it: wait for the kill.
    for (int i = 0; i < 200 && ::rmdir(path_.c_str()) != 0 && errno == EBUSY; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_, error_;
};

class ProxyIdentityTest : public ::testing::TestWithParam<TcMode> {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF, cgroups)";
    if (std::string why = tcModeUnsupported(GetParam()); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(cgroup_.error().empty()) << "cgroup v2: " << cgroup_.error();
    h_ = std::make_unique<PodHarness>(GetParam());
    ASSERT_TRUE(h_->topo().ok()) << h_->topo().error();
    PodSpec spec;
    spec.nodeNetnsPath = h_->node().path();
    auto info = h_->enroll(spec);
    ASSERT_TRUE(info.ok()) << info.error().message;
    // The node proxy: a separate process that enters its cgroup before it
    // creates any socket (a socket's cgroup is its creator's).
    std::string cmd = "echo $$ > " + cgroup_.path() + "/cgroup.procs && exec " + builtBinary("sluice-standin") +
                      " --netns " + h_->pod().path() + (kernelAssignsReuseport() ? "" : " --no-reuseport");
    auto p = Subprocess::start({"/bin/sh", "-c", cmd});
    ASSERT_TRUE(p.ok()) << p.error().message;
    proxy_ = std::move(*p);
    for (int i = 0; i < 500; i++) {
      if (!sh("ip netns exec " + h_->pod().name() + " ss -Hltn 'sport = :15001'").out.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_FALSE(sh("ip netns exec " + h_->pod().name() + " ss -Hltn 'sport = :15001'").out.empty())
        << "the stand-in process did not start listening";
    auto server = TcpServer::start(h_->node(), Endpoint::of(PodTopology::kNodeV4, 0));
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(*server);
  }
  void TearDown() override {
    proxy_.reset();  // killed before its cgroup goes
    server_.reset();
    h_.reset();
  }

  /// Connects from the pod with @p mark and echoes a byte: true when the
  /// server saw the app's own source port (it went around the proxy),
  /// false when it saw another one (the proxy's relay).
  Result<bool> wentDirect(uint32_t mark) {
    auto c = tcpConnect(h_->pod(), server_->local(), ConnectOptions{std::chrono::seconds(3), mark});
    SLUICE_TRY(c);
    auto e = echoRoundTrip(c->get(), "x", std::chrono::seconds(3));
    SLUICE_TRY(e);
    Endpoint local = localOf(c->get());
    auto peers = server_->peers();
    if (peers.empty()) return Error::msg("the server saw no connection", EIO);
    return peers.back().port() == local.port();
  }

  TestCgroup cgroup_;
  std::unique_ptr<PodHarness> h_;
  std::unique_ptr<Subprocess> proxy_;
  std::unique_ptr<TcpServer> server_;
};

INSTANTIATE_TEST_SUITE_P(Modes, ProxyIdentityTest, ::testing::Values(TcMode::Tcx, TcMode::Legacy),
                         [](const auto& info) { return std::string(modeName(info.param)); });

TEST_P(ProxyIdentityTest, MarkedAppIsCapturedOnceTheProxyCgroupIsKnown) {
  Datapath& dp = h_->datapath();
  EXPECT_FALSE(dp.proxyIdentity().cgroupCheck);
  // Istio's rule, the mark alone: the app that sets it leaves the mesh.
  auto before = wentDirect(SLUICE_DEFAULT_PROXY_MARK);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_TRUE(*before) << "with the mark alone a marked app socket is exempt (Istio's behaviour)";

  auto id = dp.addProxyProcess(proxy_->pid());
  ASSERT_TRUE(id.ok()) << id.error().message;
  auto want = cgroupIdOfPath(cgroup_.path());
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(*id, *want);
  ProxyIdentity pi = dp.proxyIdentity();
  EXPECT_TRUE(pi.cgroupCheck);
  ASSERT_EQ(pi.cgroups.size(), 1u);
  EXPECT_EQ(pi.cgroups[0].id, *want);
  EXPECT_EQ(pi.cgroups[0].pid, static_cast<uint32_t>(proxy_->pid()));

  // The same app socket with the mark is now captured, and the proxy's own
  // marked connection upstream is not (else it would loop into itself).
  auto marked = wentDirect(SLUICE_DEFAULT_PROXY_MARK);
  ASSERT_TRUE(marked.ok()) << marked.error().message;
  EXPECT_FALSE(*marked) << "an app that set the proxy mark went around the proxy";
  auto plain = wentDirect(0);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_FALSE(*plain);
  // Mark 0x1539 is the proxy mark under the 0xfff mask: the same rule.
  auto masked = wentDirect(0x1539);
  ASSERT_TRUE(masked.ok()) << masked.error().message;
  EXPECT_FALSE(*masked);

  // The proxy goes away with its cgroup: forgotten; the check stays on.
  proxy_.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int i = 0; i < 200 && ::rmdir(cgroup_.path().c_str()) != 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(dp.pruneProxyCgroups(), 1u);
  pi = dp.proxyIdentity();
  EXPECT_TRUE(pi.cgroupCheck);
  EXPECT_TRUE(pi.cgroups.empty());
  ASSERT_TRUE(dp.clearProxyIdentity().ok());
  EXPECT_FALSE(dp.proxyIdentity().cgroupCheck);
}

TEST(ProxyCgroups, ErrorsNameTheProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  auto gone = cgroupIdOfPid(999999999);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().message, "process 999999999 is gone (/proc/999999999/cgroup)");
  auto self = cgroupIdOfPid(::getpid());
  ASSERT_TRUE(self.ok()) << self.error().message;
  auto exists = cgroupExists(*self);
  ASSERT_TRUE(exists.ok()) << exists.error().message;
  EXPECT_TRUE(*exists);
  auto never = cgroupExists(0x7fffffffffffull);
  ASSERT_TRUE(never.ok()) << never.error().message;
  EXPECT_FALSE(*never);
}

}  // namespace
}  // namespace sluice::test
