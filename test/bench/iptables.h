// Istio's in-pod netfilter setup, the baseline: the rule files of
// test/bench/istio/ applied with iptables-restore (nf_tables backend) or
// iptables-legacy-restore, plus its policy-route script, inside a pod
// netns; and the reverse (rules and route removed), as Istio does when a
// pod leaves the mesh.
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
  std::string v4Undo, v6Undo, routeUndo;  ///< generated in a TempDir
};

/// Reads istio-inpod-v4.rules, istio-inpod-v6.rules and istio-inpod-route.sh
/// from @p dir and writes their undo counterparts into @p tmp.
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

/// `iptables-save` (or -legacy-save) output of the netns, for checks.
Result<std::string> iptablesSave(int nsfd, IptFlavor flavor);

}  // namespace sluice::bench
