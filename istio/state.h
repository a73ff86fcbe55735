// What Istio's node agent (istio-cni) leaves on a node it runs, read
// without changing anything: in each ambient pod's netns its redirection
// rules (iptables, legacy or nft backend, or from 1.28 its native nftables
// tables `inet istio-ambient-{nat,mangle,raw}`); on the node the
// kubelet-probe ipsets `istio-inpod-probes-v4/-v6`, the `ISTIO_POSTRT`
// SNAT chain, and the `istio-cni` entry in the CNI chain. `sluicectl
// status` and `pod list` show it.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"

namespace sluice::istio {

/// Whether the calling thread's netns uses legacy iptables tables of a
/// family at all (@p procFile "ip_tables_names" / "ip6_tables_names": the
/// kernel lists them once a table was loaded).
bool legacyTablesInUse(const char* procFile);

/// Where Istio's chains are in one netns: "iptables-nft IPv4: ISTIO_OUTPUT,
/// ISTIO_PRERT", "nftables: inet istio-ambient-nat", ...
struct Netfilter {
  std::vector<std::string> found;       ///< one line per backend and family
  std::vector<std::string> unreadable;  ///< what could not be read, one line each
};

/// Istio's in-pod redirection, read in the calling thread's netns. Its
/// policy rule (fwmark 0x111/0xfff, priority 32764, table 100, and the
/// table's local routes) is not Istio's alone: sluice's return path is the
/// same rule (maps/sluice_maps.h), so it tells nothing and is never
/// Istio's to remove while sluice serves the pod.
struct PodRules {
  Netfilter rules;
  bool any() const { return !rules.found.empty(); }
  /// "none", or what is there, "; "-separated.
  std::string describe() const;
};
Result<PodRules> readPodRules();

/// Istio's node side, read in the calling thread's netns (the node's).
struct NodeState {
  Netfilter snat;                       ///< the ISTIO_POSTRT chains
  std::vector<std::string> probeSets;   ///< "istio-inpod-probes-v4: 12 addresses"
  std::vector<std::string> cniEntries;  ///< CNI config files whose chain has istio-cni
  std::vector<std::string> unreadable;  ///< ipset or the CNI dir, when they could not be read
  bool any() const { return !snat.found.empty() || !probeSets.empty() || !cniEntries.empty(); }
  std::string describe() const;
};
/// @p cniConfDir: where the CNI chain lives ("" : not looked at).
NodeState readNodeState(const std::string& cniConfDir);

}  // namespace sluice::istio
