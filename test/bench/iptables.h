// Istio's per-pod setup, the baseline: in the pod, the rule files of
// test/bench/istio/ applied with iptables-restore (nf_tables backend) or
// iptables-legacy-restore, plus its policy-route script; on the node, the
// pod's address in the probe ipset that Istio's SNAT rule matches. And the
// reverse, as Istio does when a pod leaves the mesh.
#pragma once

#include <string>

#include "base/result.h"
#include "test/bench/util.h"

namespace sluice::bench {

enum class IptFlavor { Nft, Legacy };
const char* iptFlavorName(IptFlavor f);

/// Paths of the rule files and scripts (the undo ones generated).
struct IstioRules {
  std::string v4, v6, route;              ///< from the rules directory
  std::string hostV4, hostV6;             ///< the node's probe SNAT rules (rules directory)
  std::string v4Undo, v6Undo, routeUndo;  ///< generated in a TempDir
};

/// Reads istio-inpod-v4.rules, istio-inpod-v6.rules, istio-inpod-route.sh and
/// istio-hostprobe-v{4,6}.rules from @p dir and writes their undo counterparts into @p tmp.
Result<IstioRules> loadIstioRules(const std::string& dir, TempDir& tmp);

/// The iptables-restore input that removes what @p rules installs: the jumps
/// from built-in chains deleted, the chains flushed and deleted.
std::string undoRules(const std::string& rules);

/// Time of each step, seconds.
struct IptTiming {
  double v4 = 0, v6 = 0, route = 0;
  double total() const { return v4 + v6 + route; }
};

/// Runs the three commands inside the netns @p nsfd (from a thread that
/// joined it, so the children are born there). Fails with the command's
/// output when one fails.
Result<IptTiming> applyIstioRules(int nsfd, IptFlavor flavor, const IstioRules& rules);
Result<IptTiming> removeIstioRules(int nsfd, IptFlavor flavor, const IstioRules& rules);

/// Istio's probe sets, as istio-cni's agent names them (cni/pkg/ipset).
inline constexpr const char* kIstioProbeSetV4 = "istio-inpod-probes-v4";
inline constexpr const char* kIstioProbeSetV6 = "istio-inpod-probes-v6";

/// Istio's node side as its agent sets it up once at start, in the node
/// netns @p nsfd (not timed): the sets istio-inpod-probes-v4 / -v6
/// (hash:ip with comments, families inet / inet6) and the probe SNAT rules
/// of istio-hostprobe-v{4,6}.rules that match them.
Status installIstioNode(int nsfd, IptFlavor flavor, const IstioRules& rules);

/// One pod's node part: its address @p ip added to (or deleted from) the set
/// of its family, in the node netns @p nsfd. Over netlink (nfnetlink's ipset
/// subsystem, a socket per request) as Istio's agent does it
/// (netlink.IpsetAdd with the pod's uid as the comment), timed from the
/// socket's creation to the kernel's ack. Seconds.
Result<double> istioIpsetNetlink(int nsfd, bool add, const std::string& ip, const std::string& comment);
/// The same with the `ipset` command: the process's time. Seconds.
Result<double> istioIpsetProcess(int nsfd, bool add, const std::string& ip, const std::string& comment);
/// Whether the set of @p ip's family holds @p ip (`ipset test`), for checks.
bool istioIpsetHas(int nsfd, const std::string& ip);

/// `iptables-save` (or -legacy-save) output of the netns, for checks.
Result<std::string> iptablesSave(int nsfd, IptFlavor flavor);

}  // namespace sluice::bench
