// Taking a node over from Istio's node agent (istio-cni), live: what of its
// state sluice removes once its own redirection covers the same pods, and
// in what order (deploy/README.md, "Switching a cluster").
//
// In a pod (after sluice's redirection is in place): first everything that
// redirects or marks new connections — the raw chains, mangle's
// ISTIO_PRERT (the connmark 0x111 on the proxy's inbound connections) and
// the nat chains, in that order, in one iptables-restore per family
// (atomic per table). In socket mode what the connections opened under
// Istio's rules need stays until none is open: mangle's ISTIO_OUTPUT (the
// connmark restore routing the replies of the proxy's connections) and the
// nat chains, no longer jumped to (deleting a REDIRECT rule ends the
// translations it made, and the connections with them). The sweep asks
// again.
//
// A layout it does not know (an ISTIO_ chain jumped to from a chain that is
// not built in, a jump from an ISTIO_ chain to a chain not Istio's) is left
// exactly as it was, and the answer says why.
//
// The policy rule "fwmark 0x111/0xfff lookup 100" and table 100's local
// routes are sluice's return path too: never removed here.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice::istio {

/// What removing Istio's in-pod rules did in one netns.
struct PodRulesRemoval {
  std::vector<std::string> removed;  ///< "iptables-nft IPv4 nat: ISTIO_OUTPUT, ISTIO_PRERT", ...
  /// What stays for now, and why (one line each): the connmark restore while
  /// connections from before are open. The caller asks again later.
  std::vector<std::string> waiting;
  bool done() const { return waiting.empty(); }
};

/// Removes Istio's in-pod redirection in the calling thread's netns, as the
/// header says. @p socketCapture (the pod is captured at the socket): what
/// the connections opened under Istio's rules need stays until they close —
/// the connmark restore that routes the replies of the proxy's connections,
/// and the redirect rules (their jumps gone), since removing them ends the
/// translations they made. In tc mode everything goes at once: the kernel
/// loses tc mode's DNS answers while a REDIRECT rule exists in the netns,
/// and sluice's egress program hands packets of a flow a local socket owns
/// back to it; connections opened through Istio's REDIRECT end then.
/// Idempotent: nothing there, nothing done. Errors (an unknown layout, a
/// program failing): that backend and family left as they were.
Result<PodRulesRemoval> removePodRules(bool socketCapture);

/// TCP connections in the calling thread's netns whose conntrack entry has
/// connmark 0x111/0xfff and is not closing (TIME_WAIT, CLOSE): the proxy's
/// inbound connections that Istio's mangle rules mark.
Result<size_t> openReturnMarkedConnections();

/// TCP connections in the calling thread's netns a NAT translates (conntrack
/// status SRC_NAT or DST_NAT) that are not closing: Istio's REDIRECTs.
Result<size_t> openTranslatedConnections();

/// What removing Istio's node side did.
struct NodeRemoval {
  std::vector<std::string> removed;  ///< one line each
  std::vector<std::string> kept;     ///< left as they were, and why
};

/// Removes Istio's node side in the calling thread's netns (the node's):
/// ISTIO_POSTRT (its SNAT of kubelet probes) when every address of the
/// istio-inpod-probes sets is in @p covered (pods whose probes sluice's
/// node side translates now), then those sets; and, in @p cniConfDir
/// (when not empty), the istio-cni entry of every chain that also has
/// sluice-cni (a chain without it keeps istio-cni: a pod must never start
/// with neither). Idempotent.
Result<NodeRemoval> removeNodeState(const std::set<std::string>& covered, const std::string& cniConfDir);

/// Addresses in the node's istio-inpod-probes-v4/-v6 sets (empty when none).
Result<std::set<std::string>> probeSetAddresses();

/// Removes the plugin entries of @p type from every chain in @p cniConfDir
/// whose chain also has @p unless (empty: unconditionally) and keeps at
/// least one other plugin. Each file replaced atomically. The files
/// changed.
Result<std::vector<std::string>> removeCniEntries(const std::string& cniConfDir, const std::string& type,
                                                  const std::string& unless);

}  // namespace sluice::istio
