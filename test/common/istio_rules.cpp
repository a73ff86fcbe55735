#include "test/common/istio_rules.h"

#include "test/common/tempdir.h"

namespace sluice::test {
namespace {

std::string rulesDir() { return std::string(SLUICE_SOURCE_DIR) + "/test/bench/istio"; }

Status inNs(const TestNetns& ns, const std::string& command) {
  CommandResult r = sh("ip netns exec " + ns.name() + " sh -c '" + command + "'");
  if (r.exitCode != 0) return Error::msg(command + " in " + ns.name() + ": " + r.describe());
  return {};
}

// Istio 1.28's native tables, in the shape its nftables backend creates
// (cni/pkg/nftables): the same redirection in inet tables of its own.
const char* kNativeTables = R"(table inet istio-ambient-nat {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    meta l4proto tcp tcp dport != 15008 meta mark & 0xfff != 0x539 redirect to :15006
  }
  chain output {
    type nat hook output priority -100; policy accept;
    oifname != "lo" meta l4proto tcp meta mark & 0xfff != 0x539 redirect to :15001
  }
}
table inet istio-ambient-mangle {
  chain prerouting {
    type filter hook prerouting priority mangle; policy accept;
    meta mark & 0xfff == 0x539 ct mark set ct mark & 0xfffff000 | 0x111
  }
}
table inet istio-ambient-raw {
  chain output {
    type filter hook output priority raw; policy accept;
    udp dport 53 meta mark & 0xfff == 0x539 ct zone set 1
  }
}
)";

// istio-cni's AddInpodMarkIPRule and AddLoopbackRoutes
// (cni/pkg/iptables/iptables_linux.go): RuleAdd with EEXIST ignored, the
// routes replaced. Unlike istio-inpod-route.sh, an existing rule stays.
const char* kRouteAddIfMissing =
    "set -e; "
    "ip rule add fwmark 0x111/0xfff pref 32764 lookup 100 2>/dev/null || "
    "ip rule show | grep -q \"^32764:.*fwmark 0x111/0xfff lookup 100\"; "
    "ip route replace local 0.0.0.0/0 dev lo table 100; "
    "if [ \"$(cat /proc/sys/net/ipv6/conf/lo/disable_ipv6 2>/dev/null)\" = 0 ]; then "
    "ip -6 rule add fwmark 0x111/0xfff pref 32764 lookup 100 2>/dev/null || "
    "ip -6 rule show | grep -q \"^32764:.*fwmark 0x111/0xfff lookup 100\"; "
    "ip -6 route replace local ::/0 dev lo table 100; fi";

}  // namespace

Status applyIstioInpod(const TestNetns& ns, IstioBackend backend, bool ipv6, IstioRule rule) {
  const std::string dir = rulesDir();
  switch (backend) {
    case IstioBackend::IptablesNft:
    case IstioBackend::IptablesLegacy: {
      const std::string v = backend == IstioBackend::IptablesNft ? "nft" : "legacy";
      SLUICE_TRY(inNs(ns, "iptables-" + v + "-restore --noflush < " + dir + "/istio-inpod-v4.rules"));
      if (ipv6) SLUICE_TRY(inNs(ns, "ip6tables-" + v + "-restore --noflush < " + dir + "/istio-inpod-v6.rules"));
      break;
    }
    case IstioBackend::Nftables: {
      TempDir tmp("istio-nft");
      if (!writeTextFile(tmp.file("tables.nft"), kNativeTables)) return Error::msg("cannot write " + tmp.file("tables.nft"));
      CommandResult r = runCommand({"ip", "netns", "exec", ns.name(), "nft", "-f", tmp.file("tables.nft")});
      if (r.exitCode != 0) return Error::msg("nft -f (Istio's native tables): " + r.describe());
      break;
    }
  }
  if (rule == IstioRule::Replace) return inNs(ns, "sh " + dir + "/istio-inpod-route.sh");
  return inNs(ns, kRouteAddIfMissing);
}

Status applyIstioNode(const TestNetns& node, const std::vector<std::string>& podIps) {
  const std::string dir = rulesDir();
  SLUICE_TRY(inNs(node, "ipset create -exist istio-inpod-probes-v4 hash:ip"));
  SLUICE_TRY(inNs(node, "ipset create -exist istio-inpod-probes-v6 hash:ip family inet6"));
  for (const auto& ip : podIps)
    SLUICE_TRY(inNs(node, std::string("ipset add -exist istio-inpod-probes-") +
                              (ip.find(':') == std::string::npos ? "v4 " : "v6 ") + ip));
  SLUICE_TRY(inNs(node, "iptables-nft-restore --noflush < " + dir + "/istio-hostprobe-v4.rules"));
  return inNs(node, "ip6tables-nft-restore --noflush < " + dir + "/istio-hostprobe-v6.rules");
}

}  // namespace sluice::test
