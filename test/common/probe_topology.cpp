#include "test/common/probe_topology.h"

#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/fd.h"

namespace sluice::test {

namespace {

/// One step of a set-up script: `ip -n NS -batch` lines (ns != "") or a
/// shell command line (ns == "").
struct Step {
  std::string ns;
  std::string line;
};

/// Runs the steps with one shell, consecutive `ip` lines of one namespace
/// as one `ip -batch` (an `ip` process costs tens of milliseconds), and
/// stops at the first failure.
Status script(const std::vector<Step>& steps) {
  std::string s = "set -e\n";
  for (size_t i = 0; i < steps.size();) {
    if (steps[i].ns.empty()) {
      s += steps[i++].line + "\n";
      continue;
    }
    const std::string& ns = steps[i].ns;
    s += "ip -n " + ns + " -batch - <<'SLUICE_EOF'\n";
    for (; i < steps.size() && steps[i].ns == ns; i++) s += steps[i].line + "\n";
    s += "SLUICE_EOF\n";
  }
  auto r = sh(s);
  if (r.exitCode != 0) return Error::msg("setting up the probe topology failed: " + r.describe() + "\nscript:\n" + s);
  return {};
}

/// ETHTOOL_STXCSUM off on @p dev in @p ns.
Status txChecksumOffIn(const TestNetns& ns, const std::string& dev) {
  return ns.run([&]() -> Status {
    Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Error::fromErrno(errno, "socket");
    struct ethtool_value ev {};
    ev.cmd = ETHTOOL_STXCSUM;
    struct ifreq ifr {};
    std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
    ifr.ifr_data = reinterpret_cast<char*>(&ev);
    if (::ioctl(s.get(), SIOCETHTOOL, &ifr) != 0)
      return Error::fromErrno(errno, "tx checksum offload off on " + dev + " in " + ns.name());
    return {};
  });
}

Status setAll(const TestNetns& ns, const std::vector<std::pair<std::string, std::string>>& kv) {
  for (const auto& [k, v] : kv) {
    Status st = ns.setSysctl(k, v);
    if (!st.ok()) return Error::msg(ns.name() + ": sysctl " + k + "=" + v + ": " + st.error().message);
  }
  return {};
}

std::string mac(int a, int b) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "02:5e:00:%02x:%02x:%02x", a, b >> 8 & 0xff, b & 0xff);
  return buf;
}

// No DAD anywhere: addresses are usable at once.
const std::vector<std::pair<std::string, std::string>> kNoDad = {
    {"net/ipv6/conf/all/accept_dad", "0"},
    {"net/ipv6/conf/default/accept_dad", "0"},
};

}  // namespace

ProbeTopology::ProbeTopology(CniKind kind) : kind_(kind) {
  Status st = build();
  if (!st.ok()) error_ = st.error().message;
}

Status ProbeTopology::build() {
  if (!node_.ok()) return Error::msg(node_.error());
  if (!remote_.ok()) return Error::msg(remote_.error());
  SLUICE_TRY(setAll(node_, kNoDad));
  SLUICE_TRY(setAll(remote_, kNoDad));
  SLUICE_TRY(setAll(node_, {
                               {"net/ipv4/ip_forward", "1"},
                               {"net/ipv6/conf/all/forwarding", "1"},
                               {"net/ipv4/conf/all/rp_filter", "0"},
                               {"net/ipv4/conf/default/rp_filter", "0"},
                           }));
  const std::string n = node_.name(), r = remote_.name();
  const std::string nodeMac = mac(1, 1), remoteMac = mac(1, 2);
  std::vector<Step> steps = {
      {n, "link add uplink address " + nodeMac + " type veth peer name eth0 address " + remoteMac + " netns " + r},
      {n, std::string("addr add ") + kNodeV4 + "/24 dev uplink"},
      {n, std::string("addr add ") + kNode2V4 + "/24 dev uplink"},
      {n, std::string("addr add ") + kNodeV6 + "/64 dev uplink nodad"},
      // Deprecated: bindable, but never picked as a source, so the node's
      // own source address stays kNodeV6.
      {n, std::string("addr add ") + kNode2V6 + "/64 dev uplink nodad preferred_lft 0"},
      {n, "link set uplink up"},
      {n, std::string("neigh replace ") + kRemoteV4 + " lladdr " + remoteMac + " dev uplink nud permanent"},
      {n, std::string("neigh replace ") + kRemoteV6 + " lladdr " + remoteMac + " dev uplink nud permanent"},
  };
  if (kind_ == CniKind::Bridged) {
    const std::string bridgeMac = mac(2, 1);
    steps.insert(steps.end(), {
                                  {n, "link add cni0 address " + bridgeMac + " type bridge forward_delay 0 stp_state 0"},
                                  {n, std::string("addr add ") + kBridgeV4 + "/24 dev cni0"},
                                  {n, std::string("addr add ") + kBridgeV6 + "/64 dev cni0 nodad"},
                                  {n, "link set cni0 up"},
                              });
  }
  steps.insert(steps.end(), {
                                {r, std::string("addr add ") + kRemoteV4 + "/24 dev eth0"},
                                {r, std::string("addr add ") + kRemoteV6 + "/64 dev eth0 nodad"},
                                {r, "link set eth0 up"},
                                {r, std::string("route add 0.0.0.0/0 via ") + kNodeV4 + " dev eth0"},
                                {r, std::string("route add ::/0 via ") + kNodeV6 + " dev eth0"},
                                {r, std::string("neigh replace ") + kNodeV4 + " lladdr " + nodeMac + " dev eth0 nud permanent"},
                                {r, std::string("neigh replace ") + kNodeV6 + " lladdr " + nodeMac + " dev eth0 nud permanent"},
                            });
  return script(steps);
}

Result<ProbePod*> ProbeTopology::addPod() {
  if (!ok()) return Error::msg(error_);
  auto pod = std::make_unique<ProbePod>();
  pod->index = static_cast<int>(pods_.size());
  pod->ns = std::make_unique<TestNetns>("pod");
  if (!pod->ns->ok()) return Error::msg(pod->ns->error());
  SLUICE_TRY(setAll(*pod->ns, kNoDad));
  const int i = pod->index;
  const bool routed = kind_ == CniKind::Routed;
  pod->hostIface = (routed ? "vethr" : "vethb") + std::to_string(i);
  pod->hostMac = mac(3, 2 * i + 0x100);
  pod->podMac = mac(3, 2 * i + 0x101);
  pod->v4 = (routed ? "10.201.0." : "10.202.0.") + std::to_string(10 + i);
  pod->v6 = (routed ? "fd00:201::" : "fd00:202::") + std::to_string(10 + i);
  const std::string n = node_.name(), p = pod->ns->name();
  const std::string& h = pod->hostIface;
  const std::string& pm = pod->podMac;
  // Both ends are created in their namespaces directly.
  std::vector<Step> steps = {
      {n, "link add " + h + " address " + pod->hostMac + " type veth peer name eth0 address " + pm + " netns " + p},
  };
  if (routed) {
    steps.insert(steps.end(), {
                                  {n, "link set " + h + " up"},
                                  {n, "route add " + pod->v4 + "/32 dev " + h},
                                  {n, "route add " + pod->v6 + "/128 dev " + h},
                                  {n, "neigh replace " + pod->v4 + " lladdr " + pm + " dev " + h + " nud permanent"},
                                  {n, "neigh replace " + pod->v6 + " lladdr " + pm + " dev " + h + " nud permanent"},
                                  {p, "addr add " + pod->v4 + "/32 dev eth0"},
                                  {p, "addr add " + pod->v6 + "/128 dev eth0 nodad"},
                                  {p, "link set eth0 up"},
                                  // The gateways are the host-side veth's MAC.
                                  {p, "neigh replace 169.254.1.1 lladdr " + pod->hostMac + " dev eth0 nud permanent"},
                                  {p, "neigh replace fe80::1 lladdr " + pod->hostMac + " dev eth0 nud permanent"},
                                  {p, "route add 0.0.0.0/0 via 169.254.1.1 dev eth0 onlink"},
                                  {p, "route add ::/0 via fe80::1 dev eth0"},
                              });
  } else {
    const std::string bridgeMac = mac(2, 1);
    steps.insert(steps.end(), {
                                  {n, "link set " + h + " master cni0"},
                                  {n, "link set " + h + " up"},
                                  {n, "neigh replace " + pod->v4 + " lladdr " + pm + " dev cni0 nud permanent"},
                                  {n, "neigh replace " + pod->v6 + " lladdr " + pm + " dev cni0 nud permanent"},
                                  {"", "bridge -n " + n + " fdb replace " + pm + " dev " + h + " master static"},
                                  {p, "addr add " + pod->v4 + "/24 dev eth0"},
                                  {p, "addr add " + pod->v6 + "/64 dev eth0 nodad"},
                                  {p, "link set eth0 up"},
                                  {p, std::string("neigh replace ") + kBridgeV4 + " lladdr " + bridgeMac +
                                          " dev eth0 nud permanent"},
                                  {p, std::string("neigh replace ") + kBridgeV6 + " lladdr " + bridgeMac +
                                          " dev eth0 nud permanent"},
                                  {p, std::string("route add 0.0.0.0/0 via ") + kBridgeV4 + " dev eth0"},
                                  {p, std::string("route add ::/0 via ") + kBridgeV6 + " dev eth0"},
                              });
    // Pods on the bridge talk to each other directly (same subnet).
    for (const auto& other : pods_)
      for (int family : {AF_INET, AF_INET6})
        steps.push_back({p, "neigh replace " + other->ip(family) + " lladdr " + other->podMac + " dev eth0 nud permanent"});
    for (const auto& other : pods_)
      for (int family : {AF_INET, AF_INET6})
        steps.push_back({other->ns->name(), "neigh replace " + pod->ip(family) + " lladdr " + pm + " dev eth0 nud permanent"});
  }
  SLUICE_TRY(script(steps));
  if (routed) {
    // As Calico: the node answers ARP for anything on the pod's veth.
    Status st = node_.setSysctl("net/ipv4/conf/" + h + "/proxy_arp", "1");
    if (!st.ok()) return Error::msg("proxy_arp on " + h + ": " + st.error().message);
  }
  pods_.push_back(std::move(pod));
  return pods_.back().get();
}

Status ProbeTopology::txChecksumOff(const ProbePod& pod) {
  SLUICE_TRY(txChecksumOffIn(node_, pod.hostIface));
  return txChecksumOffIn(*pod.ns, "eth0");
}

}  // namespace sluice::test
