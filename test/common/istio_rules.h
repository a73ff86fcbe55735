// Istio's node agent's state, made for real in test namespaces from the
// rule sets in test/bench/istio/ (Istio's own golden files): its in-pod
// redirection with either iptables backend or its native nftables tables,
// its policy rule and route, and on the node the probe ipsets and SNAT rules.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "test/common/topology.h"

namespace sluice::test {

enum class IstioBackend { IptablesNft, IptablesLegacy, Nftables };

/// How the policy rule of table 100 is written.
enum class IstioRule {
  /// test/bench/istio/istio-inpod-route.sh: deleted, then added (a moment
  /// without it; fine on a pod nothing serves yet).
  Replace,
  /// istio-cni's own way (netlink RuleAdd, EEXIST ignored; routes replaced):
  /// a rule already there, sluice's included, is never gone for a moment.
  AddIfMissing,
};

/// Istio's in-pod rules in @p ns (IPv6 too when @p ipv6), and its policy
/// rule and local routes of table 100, as istio-cni writes them.
Status applyIstioInpod(const TestNetns& ns, IstioBackend backend, bool ipv6, IstioRule rule = IstioRule::Replace);

/// Istio's node side in @p node: the probe ipsets with @p podIps and the
/// ISTIO_POSTRT SNAT rules (iptables-nft), as istio-cni keeps them.
Status applyIstioNode(const TestNetns& node, const std::vector<std::string>& podIps);

}  // namespace sluice::test
