// Taking Istio's node agent's state away (istio/takeover.h), made for real:
// its in-pod rules with each iptables backend and its native nftables
// tables, the connmark restore kept while a connection the proxy opened
// under Istio's rules is open, a layout it does not know left as it was;
// on the node its probe SNAT and sets only when sluice covers every
// address in them, istio-cni only from a chain that has sluice-cni.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include "istio/state.h"
#include "istio/takeover.h"
#include "test/common/istio_node.h"
#include "test/common/istio_rules.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

template <typename T>
Result<T> inNetns(const TestNetns& ns, const std::function<Result<T>()>& fn) {
  Result<T> out = Error::msg("not run");
  Status st = ns.run([&]() -> Status {
    out = fn();
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

istio::PodRules podRules(const TestNetns& ns) {
  auto r = readIstioPodRules(ns);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : istio::PodRules{};
}

Result<istio::PodRulesRemoval> removeIn(const TestNetns& ns, bool socketCapture = true) {
  return inNetns<istio::PodRulesRemoval>(ns, [&] { return istio::removePodRules(socketCapture); });
}

std::string save(const TestNetns& ns, const char* program) {
  return runCommand({"ip", "netns", "exec", ns.name(), program}).out;
}

// The shared return path: "fwmark 0x111/0xfff lookup 100", both families.
bool returnRuleThere(const TestNetns& ns) {
  CommandResult v4 = runCommand({"ip", "netns", "exec", ns.name(), "ip", "rule", "show", "pref", "32764"});
  CommandResult v6 = runCommand({"ip", "netns", "exec", ns.name(), "ip", "-6", "rule", "show", "pref", "32764"});
  return v4.out.find("fwmark 0x111/0xfff lookup 100") != std::string::npos &&
         v6.out.find("fwmark 0x111/0xfff lookup 100") != std::string::npos;
}

// A connection the proxy opens to an app in @p pod under Istio's rules:
// marked 0x539 (mangle gives its conntrack entry connmark 0x111), to
// 127.0.0.1:@p port, one echo done.
Result<Fd> proxiedConnection(const TestNetns& pod, uint16_t port) {
  auto fd = socketIn(pod, AF_INET, SOCK_STREAM);
  SLUICE_TRY(fd);
  const int mark = 0x539;
  if (::setsockopt(fd->get(), SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0) return Error::fromErrno(errno, "SO_MARK");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd->get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) return Error::fromErrno(errno, "connect");
  auto echoed = echoRoundTrip(fd->get(), "x");
  SLUICE_TRY(echoed);
  if (*echoed != "x") return Error::msg("echo returned '" + *echoed + "'");
  return std::move(*fd);
}

class IstioTakeoverRules : public ::testing::TestWithParam<IstioBackend> {};

TEST_P(IstioTakeoverRules, EveryRuleGoesTheReturnPathStaysAndASecondRunDoesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter)";
  TestNetns pod("istio-take");
  ASSERT_TRUE(pod.ok()) << pod.error();
  ASSERT_TRUE(applyIstioInpod(pod, GetParam(), true).ok());
  ASSERT_TRUE(podRules(pod).any());

  auto first = removeIn(pod);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_TRUE(first->done()) << first->waiting.front();
  EXPECT_FALSE(first->removed.empty());
  istio::PodRules after = podRules(pod);
  EXPECT_FALSE(after.any()) << after.describe();
  EXPECT_TRUE(returnRuleThere(pod)) << "the policy rule is sluice's return path too";

  auto second = removeIn(pod);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_TRUE(second->removed.empty()) << second->removed.front();
  EXPECT_TRUE(second->done());
}

INSTANTIATE_TEST_SUITE_P(Backends, IstioTakeoverRules,
                         ::testing::Values(IstioBackend::IptablesNft, IstioBackend::IptablesLegacy,
                                           IstioBackend::Nftables),
                         [](const ::testing::TestParamInfo<IstioBackend>& i) -> std::string {
                           switch (i.param) {
                             case IstioBackend::IptablesNft: return "iptables_nft";
                             case IstioBackend::IptablesLegacy: return "iptables_legacy";
                             default: return "nftables";
                           }
                         });

// A connection the proxy opened to an app under Istio's rules (marked
// 0x539: mangle gives its conntrack entry connmark 0x111, whose restore
// routes the app's replies back to the proxy): the restore stays while it
// is open, everything that redirects goes at once, and the restore goes
// on the first try after it closed.
TEST(IstioTakeoverRules, TheConnmarkRestoreStaysWhileAProxiedConnectionIsOpen) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter)";
  TestNetns pod("istio-ct");
  ASSERT_TRUE(pod.ok()) << pod.error();
  ASSERT_TRUE(applyIstioInpod(pod, IstioBackend::IptablesNft, false).ok());
  auto app = TcpServer::start(pod, Endpoint::of("127.0.0.1", 0));
  ASSERT_TRUE(app.ok()) << app.error().message;
  auto none = inNetns<size_t>(pod, [] { return istio::openReturnMarkedConnections(); });
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_EQ(*none, 0u);

  {
    auto proxySide = proxiedConnection(pod, (*app)->local().port());
    ASSERT_TRUE(proxySide.ok()) << proxySide.error().message;
    auto open = inNetns<size_t>(pod, [] { return istio::openReturnMarkedConnections(); });
    ASSERT_TRUE(open.ok()) << open.error().message;
    EXPECT_EQ(*open, 1u);

    const std::string mangleBefore = save(pod, "iptables-nft-save");
    auto r = removeIn(pod);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_FALSE(r->done());
    EXPECT_NE(r->waiting[0].find("connmark restore kept (iptables-nft IPv4 mangle: ISTIO_OUTPUT): 1 connection(s)"),
              std::string::npos)
        << r->waiting[0];
    const std::string during = save(pod, "iptables-nft-save");
    EXPECT_EQ(during.find("REDIRECT"), std::string::npos) << during;
    EXPECT_EQ(during.find("ISTIO_PRERT"), std::string::npos) << during;
    EXPECT_NE(during.find("-A OUTPUT -j ISTIO_OUTPUT"), std::string::npos) << during;
    EXPECT_NE(during.find("--restore-mark"), std::string::npos) << during;
    EXPECT_NE(mangleBefore, during);
    auto echoed = echoRoundTrip(proxySide->get(), "y");
    ASSERT_TRUE(echoed.ok() && *echoed == "y") << "the open connection keeps working";
  }
  // Closed (the client's end first: its entry goes to TIME_WAIT).
  ASSERT_TRUE(eventually([&] {
    auto n = inNetns<size_t>(pod, [] { return istio::openReturnMarkedConnections(); });
    return n.ok() && *n == 0;
  }, 5s));
  auto r = removeIn(pod);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->done()) << r->waiting.front();
  EXPECT_FALSE(podRules(pod).any()) << podRules(pod).describe();
}

// A table that holds someone else's rule too keeps it: only Istio's chains
// and jumps leave.
TEST(IstioTakeoverRules, AnotherRuleInTheTableStays) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter)";
  TestNetns pod("istio-other");
  ASSERT_TRUE(pod.ok()) << pod.error();
  ASSERT_TRUE(applyIstioInpod(pod, IstioBackend::IptablesNft, false).ok());
  CommandResult add = runCommand({"ip", "netns", "exec", pod.name(), "iptables-nft", "-t", "nat", "-A", "OUTPUT", "-p",
                                  "tcp", "--dport", "9", "-j", "ACCEPT"});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  auto r = removeIn(pod);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->done());
  const std::string after = save(pod, "iptables-nft-save");
  EXPECT_EQ(after.find("ISTIO_"), std::string::npos) << after;
  EXPECT_NE(after.find("-A OUTPUT -p tcp -m tcp --dport 9 -j ACCEPT"), std::string::npos) << after;
}

// tc mode hands any packet of a flow a local socket owns back to it: the
// restore goes at once, open connection or not.
TEST(IstioTakeoverRules, WithoutTheNeedForTheRestoreEverythingGoesAtOnce) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter)";
  TestNetns pod("istio-ct-tc");
  ASSERT_TRUE(pod.ok()) << pod.error();
  ASSERT_TRUE(applyIstioInpod(pod, IstioBackend::IptablesNft, false).ok());
  auto app = TcpServer::start(pod, Endpoint::of("127.0.0.1", 0));
  ASSERT_TRUE(app.ok()) << app.error().message;
  auto proxySide = proxiedConnection(pod, (*app)->local().port());
  ASSERT_TRUE(proxySide.ok()) << proxySide.error().message;
  auto r = removeIn(pod, false);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->done()) << r->waiting.front();
  EXPECT_FALSE(podRules(pod).any()) << podRules(pod).describe();
}

TEST(IstioTakeoverRules, ALayoutItDoesNotKnowIsLeftAsItWas) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter)";
  TestNetns pod("istio-odd");
  ASSERT_TRUE(pod.ok()) << pod.error();
  ASSERT_TRUE(applyIstioInpod(pod, IstioBackend::IptablesNft, false).ok());
  // Someone else's chain jumps into Istio's.
  CommandResult add = runCommand({"ip", "netns", "exec", pod.name(), "sh", "-c",
                                  "iptables-nft -t nat -N MESH_EXTRA && iptables-nft -t nat -A MESH_EXTRA -j ISTIO_OUTPUT"});
  ASSERT_EQ(add.exitCode, 0) << add.describe();
  const std::string before = save(pod, "iptables-nft-save");
  auto r = removeIn(pod);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("ISTIO_OUTPUT is jumped to from MESH_EXTRA, not from a built-in chain: left as it is"),
            std::string::npos)
      << r.error().message;
  // Counters aside, every table as it was.
  auto strip = [](std::string s) {
    std::string out;
    std::istringstream in(s);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty() && line[0] != '#' && line[0] != ':') out += line + "\n";
    return out;
  };
  EXPECT_EQ(strip(save(pod, "iptables-nft-save")), strip(before));
}

TEST(IstioTakeoverNode, ProbeSnatGoesOnlyWhenCoveredAndIstioCniOnlyBesideSluiceCni) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter, ipset)";
  TestNetns node("istio-tnode");
  ASSERT_TRUE(node.ok()) << node.error();
  TempDir cni("istio-tcni");
  ASSERT_FALSE(cni.path().empty());
  const std::string withSluice = cni.file("10-primary.conflist"), without = cni.file("20-other.conflist");
  ASSERT_TRUE(writeTextFile(withSluice, R"({"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},)"
                                        R"({"type":"istio-cni","kubeconfig":"x"},{"type":"sluice-cni"}]})"));
  ASSERT_TRUE(writeTextFile(without, R"({"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"},)"
                                     R"({"type":"istio-cni"}]})"));
  ASSERT_TRUE(applyIstioNode(node, {"10.244.1.5", "fd00:244::5"}).ok());
  auto addrs = inNetns<std::set<std::string>>(node, [] { return istio::probeSetAddresses(); });
  ASSERT_TRUE(addrs.ok()) << addrs.error().message;
  EXPECT_EQ(*addrs, (std::set<std::string>{"10.244.1.5", "fd00:244::5"}));

  auto removeNode = [&](std::set<std::string> covered) {
    return inNetns<istio::NodeRemoval>(node, [&] { return istio::removeNodeState(covered, cni.path()); });
  };
  auto partly = removeNode({"10.244.1.5"});
  ASSERT_TRUE(partly.ok()) << partly.error().message;
  ASSERT_FALSE(partly->kept.empty());
  EXPECT_NE(partly->kept[0].find("does not translate the probes of 1 of their address(es) yet (fd00:244::5"),
            std::string::npos)
      << partly->kept[0];
  EXPECT_NE(save(node, "iptables-nft-save").find("ISTIO_POSTRT"), std::string::npos);

  auto all = removeNode({"10.244.1.5", "fd00:244::5"});
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(save(node, "iptables-nft-save").find("ISTIO_POSTRT"), std::string::npos);
  EXPECT_EQ(save(node, "ip6tables-nft-save").find("ISTIO_POSTRT"), std::string::npos);
  auto state = inNetns<istio::NodeState>(node, [&]() -> Result<istio::NodeState> { return istio::readNodeState(cni.path()); });
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE(state->probeSets.empty()) << state->describe();
  EXPECT_TRUE(state->snat.found.empty()) << state->describe();
  // The chain without sluice-cni keeps istio-cni, and says why.
  EXPECT_EQ(state->cniEntries, std::vector<std::string>{without});
  ASSERT_EQ(all->kept.size(), 1u);
  EXPECT_NE(all->kept[0].find("istio-cni in " + without + ": sluice-cni is not in that chain"), std::string::npos)
      << all->kept[0];
  const std::string primary = readTextFile(withSluice);
  EXPECT_EQ(primary.find("istio-cni"), std::string::npos) << primary;
  EXPECT_NE(primary.find("bridge"), std::string::npos) << primary;
  EXPECT_NE(primary.find("sluice-cni"), std::string::npos) << primary;
}

}  // namespace
}  // namespace sluice::test
