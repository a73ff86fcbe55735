// The socket mode's part of a pod's enrollment inside the pod's netns, as
// steps (loader/pod_steps.h): the return path of rule 4 (the policy rule and
// local route of each family, and net.ipv4.tcp_fwmark_accept so that an
// app's socket accepted from the proxy's spoofed connection keeps the
// return mark pod_skb_ingress gives its SYN), the pod's own sk_lookup
// program, and a TC ingress hook on each virtual interface (traffic
// forwarded through one is never looked up as a local socket's).
#pragma once

#include <string>
#include <vector>

#include "loader/datapath.h"
#include "loader/netlink.h"
#include "loader/pod_steps.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// What the steps of one pod work with. The record is filled in as they
/// apply (routes, the sysctl's previous value, the virtual interfaces'
/// qdiscs).
struct SocketPodContext {
  const Settings* settings = nullptr;
  const PodPrograms* programs = nullptr;
  NetlinkSocket* nl = nullptr;      ///< opened in the pod's netns
  sluice_pod_record* rec = nullptr;
  int netnsFd = -1;                 ///< the pod's netns (for its sk_lookup link)
  std::string linkDir;              ///< <root>/links/<pod>: its pins
  bool ipv6 = false;                ///< lo has IPv6: the IPv6 rule and route too
};

/// The steps, in the order `pod add` applies them. Call (all of them) on a
/// thread in the pod's netns.
std::vector<PodStep> socketPodSteps(const SocketPodContext& c);

/// The policy rule that delivers packets with the return mark locally.
PolicyRule returnRule(const Settings& s, int family);

/// The pod_sock entry of a pod: its flags and virtual interfaces (from the
/// record) and its addresses (the first SLUICE_SOCK_POD_ADDRS of each family).
sluice_pod_sock podSockValue(const sluice_pod_record& rec, const std::vector<sluice_pod_addr>& addrs);

/// Where the pod's sk_lookup link is pinned.
inline std::string skLookupPin(const std::string& linkDir) { return linkDir + "/sk_lookup"; }

}  // namespace sluice
