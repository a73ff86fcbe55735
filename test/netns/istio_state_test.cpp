// Reading what Istio's node agent left on a node, made for real: its in-pod
// rules with each iptables backend and with its native nftables tables (its
// policy rule is sluice's too and tells nothing), and on the node its probe
// ipsets, SNAT chain and istio-cni entry in the CNI chain; what `sluicectl
// status` says of it.
//
//   node netns: ipset istio-inpod-probes-v4/-v6, nat ISTIO_POSTRT,
//               <tmp>/10-primary.conflist with istio-cni chained
//   pod netns:  nat/mangle/raw ISTIO_OUTPUT, ISTIO_PRERT (or inet
//               istio-ambient-*)
#include <gtest/gtest.h>

#include <string>

#include "istio/state.h"
#include "test/common/istio_node.h"
#include "test/common/istio_rules.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

struct BackendCase {
  IstioBackend backend;
  const char* name;
  const char* expect;  ///< the start of each line readPodRules finds
};

class IstioPodRules : public ::testing::TestWithParam<BackendCase> {};

Result<istio::PodRules> readIn(const TestNetns& ns) { return readIstioPodRules(ns); }

TEST_P(IstioPodRules, EachBackendIsFound) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter)";
  const BackendCase& c = GetParam();
  TestNetns pod("istio-pod");
  ASSERT_TRUE(pod.ok()) << pod.error();
  auto clean = readIn(pod);
  ASSERT_TRUE(clean.ok()) << clean.error().message;
  EXPECT_FALSE(clean->any()) << clean->describe();
  EXPECT_EQ(clean->describe(), "none");

  ASSERT_TRUE(applyIstioInpod(pod, c.backend, true).ok());
  auto found = readIn(pod);
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_TRUE(found->any());
  EXPECT_TRUE(found->rules.unreadable.empty()) << found->describe();
  const std::string d = found->describe();
  if (c.backend == IstioBackend::Nftables) {
    EXPECT_NE(d.find("nftables: inet istio-ambient-mangle, inet istio-ambient-nat, inet istio-ambient-raw"),
              std::string::npos)
        << d;
  } else {
    EXPECT_NE(d.find(std::string(c.expect) + " IPv4: ISTIO_OUTPUT, ISTIO_PRERT"), std::string::npos) << d;
    EXPECT_NE(d.find(std::string(c.expect) + " IPv6: ISTIO_OUTPUT, ISTIO_PRERT"), std::string::npos) << d;
  }
  // Only this netns: another one stays clean.
  TestNetns other("istio-other");
  ASSERT_TRUE(other.ok());
  auto elsewhere = readIn(other);
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_FALSE(elsewhere->any()) << elsewhere->describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, IstioPodRules,
                         ::testing::Values(BackendCase{IstioBackend::IptablesNft, "iptables_nft", "iptables-nft"},
                                           BackendCase{IstioBackend::IptablesLegacy, "iptables_legacy",
                                                       "iptables-legacy"},
                                           BackendCase{IstioBackend::Nftables, "nftables", "nftables"}),
                         [](const ::testing::TestParamInfo<BackendCase>& i) { return std::string(i.param.name); });

TEST(IstioNodeState, ProbeSetsSnatAndCniEntryAreFoundAndStatusSaysSo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, netfilter, ipset)";
  TestNetns node("istio-node");
  ASSERT_TRUE(node.ok()) << node.error();
  TempDir cni("istio-cni");
  ASSERT_FALSE(cni.path().empty());
  ASSERT_TRUE(writeTextFile(cni.file("10-primary.conflist"),
                            R"({"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"bridge"},)"
                            R"({"type":"portmap"}]})"));
  auto readNode = [&] {
    istio::NodeState n;
    EXPECT_TRUE(node.run([&]() -> Status {
                      n = istio::readNodeState(cni.path());
                      return {};
                    }).ok());
    return n;
  };
  istio::NodeState before = readNode();
  EXPECT_FALSE(before.any()) << before.describe();
  EXPECT_TRUE(before.unreadable.empty()) << before.describe();

  ASSERT_TRUE(applyIstioNode(node, {"10.244.1.5", "10.244.1.6", "fd00:244::5"}).ok());
  ASSERT_TRUE(writeTextFile(cni.file("10-primary.conflist"),
                            R"({"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"bridge"},)"
                            R"({"type":"portmap"},{"type":"istio-cni","kubeconfig":"/etc/cni/net.d/ZZZ"}]})"));
  istio::NodeState after = readNode();
  EXPECT_TRUE(after.any());
  const std::string d = after.describe();
  EXPECT_NE(d.find("iptables-nft IPv4: ISTIO_POSTRT"), std::string::npos) << d;
  EXPECT_NE(d.find("iptables-nft IPv6: ISTIO_POSTRT"), std::string::npos) << d;
  EXPECT_NE(d.find("istio-inpod-probes-v4: 2 address(es)"), std::string::npos) << d;
  EXPECT_NE(d.find("istio-inpod-probes-v6: 1 address(es)"), std::string::npos) << d;
  ASSERT_EQ(after.cniEntries.size(), 1u) << d;
  EXPECT_EQ(after.cniEntries[0], cni.file("10-primary.conflist"));

  // sluicectl status, run on that node, says so (text and JSON).
  CommandResult text = runCommand({"ip", "netns", "exec", node.name(), builtBinary("sluicectl"), "status",
                                   "--cni-conf-dir", cni.path()});
  EXPECT_EQ(text.exitCode, 0) << text.describe();
  EXPECT_NE(text.out.find("istio node agent   ITS STATE IS HERE: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("sluiced --istio-takeover would: wait while Istio's agent serves the ZDS socket"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("istio-cni in " + cni.file("10-primary.conflist")), std::string::npos) << text.out;
  CommandResult json = runCommand({"ip", "netns", "exec", node.name(), builtBinary("sluicectl"), "status", "--json",
                                   "--cni-conf-dir", cni.path()});
  EXPECT_EQ(json.exitCode, 0) << json.describe();
  EXPECT_NE(json.out.find("\"istio_node_agent\""), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"present\": true"), std::string::npos) << json.out;

  CommandResult bad = runCommand({builtBinary("sluicectl"), "status", "--cni-conf-dir", "relative"});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.err.find("--cni-conf-dir needs an absolute path"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace sluice::test
