#include "loader/socket_capture.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstring>

#include "loader/sock_hooks.h"
#include "loader/sysctl.h"
#include "loader/tc.h"

namespace sluice {

namespace {

constexpr const char* kFwmarkAccept = "net/ipv4/tcp_fwmark_accept";

std::string familyName(int family) { return family == AF_INET ? "IPv4" : "IPv6"; }

uint32_t routesBit(int family) { return family == AF_INET ? SLUICE_ROUTES_V4 : SLUICE_ROUTES_V6; }

}  // namespace

PolicyRule returnRule(const Settings& s, int family) {
  return PolicyRule{family, s.returnMark, s.markMask, SLUICE_RULE_PRIORITY, SLUICE_ROUTE_TABLE};
}

std::vector<PodStep> socketPodSteps(const SocketPodContext& c) {
  std::vector<PodStep> steps;
  // Rule 4: the app's replies to the proxy's spoofed connections carry the
  // return mark; policy routing delivers them locally, to the proxy.
  for (int family : {AF_INET, AF_INET6}) {
    if (family == AF_INET6 && !c.ipv6) continue;
    steps.push_back(PodStep{
        familyName(family) + " policy rule for the return mark",
        [c, family]() -> Status {
          auto added = ensurePolicyRule(*c.nl, returnRule(*c.settings, family));
          SLUICE_TRY(added);
          return {};
        },
        [c, family]() -> Status { return deletePolicyRule(returnRule(*c.settings, family)); },
        [c, family]() -> Result<bool> { return policyRuleExists(returnRule(*c.settings, family)); },
    });
    steps.push_back(PodStep{
        familyName(family) + " local default route of table " + std::to_string(SLUICE_ROUTE_TABLE),
        [c, family]() -> Status {
          SLUICE_TRY(addLocalDefaultRouteOn(*c.nl, family, SLUICE_ROUTE_TABLE, c.rec->lo_ifindex));
          c.rec->routes |= routesBit(family);
          return {};
        },
        [c, family]() -> Status {
          if (!(c.rec->routes & routesBit(family))) return {};
          return deleteLocalDefaultRoute(family, SLUICE_ROUTE_TABLE, c.rec->lo_ifindex);
        },
        [family]() -> Result<bool> { return localDefaultRouteExists(family, SLUICE_ROUTE_TABLE); },
    });
  }
  steps.push_back(PodStep{
      "net.ipv4.tcp_fwmark_accept",
      [c]() -> Status {
        auto before = ensureSysctl(kFwmarkAccept, "1");
        SLUICE_TRY(before);
        if (*before) c.rec->fwmark_accept_before = std::stoi(**before);
        return {};
      },
      [c]() -> Status {
        if (c.rec->fwmark_accept_before < 0) return {};
        return writeSysctl(kFwmarkAccept, std::to_string(c.rec->fwmark_accept_before));
      },
      []() -> Result<bool> {
        auto now = readSysctl(kFwmarkAccept);
        SLUICE_TRY(now);
        return *now == "1";
      },
  });
  // Rules 6-8: new connections from outside, at the socket lookup.
  const std::string pin = skLookupPin(c.linkDir);
  steps.push_back(PodStep{
      "sk_lookup program in the pod's netns",
      [c, pin]() -> Status { return attachPodSkLookup(*c.programs, c.rec->netns_cookie, c.netnsFd, pin); },
      [pin]() -> Status { return detachPodSkLookup(pin); },
      [pin]() -> Result<bool> { return podSkLookupAttached(pin); },
  });
  // Virtual interfaces: what arrives there is outbound traffic to any
  // destination, forwarded rather than delivered to a local socket; the TC
  // program (pod_ingress) hands it to the outbound listener.
  const bool legacy = c.rec->tc_mode == SLUICE_TC_LEGACY;
  for (uint32_t i = 0; i < c.rec->iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
    sluice_pod_iface* slot = &c.rec->ifaces[i];
    const std::string name(slot->name, strnlen(slot->name, sizeof(slot->name)));
    const std::string tcxPin = c.linkDir + "/" + name + "_ingress";
    const int ifindex = static_cast<int>(slot->ifindex);
    steps.push_back(PodStep{
        "TC ingress hook of virtual interface " + name,
        [c, slot, ifindex, tcxPin, legacy]() -> Status {
          if (!legacy) return attachTcx(ifindex, TcHook::Ingress, c.programs->ingressFd(), tcxPin);
          auto created = attachLegacy(ifindex, TcHook::Ingress, c.programs->ingressFd());
          SLUICE_TRY(created);
          if (*created) slot->created_clsact = 1;
          return {};
        },
        [slot, ifindex, tcxPin, legacy]() -> Status {
          if (!legacy) return detachTcx(tcxPin);
          return detachLegacy(ifindex, TcHook::Ingress, slot->created_clsact);
        },
        [ifindex, tcxPin, legacy]() -> Result<bool> {
          return legacy ? legacyAttached(ifindex, TcHook::Ingress) : tcxAttached(tcxPin);
        },
    });
  }
  return steps;
}

sluice_pod_sock podSockValue(const sluice_pod_record& rec, const std::vector<sluice_pod_addr>& addrs) {
  sluice_pod_sock v{};
  v.flags = rec.config.flags;
  v.reroute_count = rec.config.reroute_count;
  std::memcpy(v.reroute_ifindex, rec.config.reroute_ifindex, sizeof(v.reroute_ifindex));
  for (const auto& a : addrs) {
    if (a.family == AF_INET && v.v4_count < SLUICE_SOCK_POD_ADDRS)
      std::memcpy(&v.v4[v.v4_count++], a.addr, 4);
    else if (a.family == AF_INET6 && v.v6_count < SLUICE_SOCK_POD_ADDRS)
      std::memcpy(v.v6[v.v6_count++], a.addr, 16);
  }
  return v;
}

}  // namespace sluice
