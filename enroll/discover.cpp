#include "enroll/discover.h"

#include <netinet/in.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "enroll/registry.h"
#include "loader/netns.h"

namespace sluice {

namespace {

// Interfaces with no Ethernet header at TC (L3 tunnels): the programs parse
// from an Ethernet header, so they are not attached there.
bool isL3OnlyKind(const std::string& kind) {
  static const std::set<std::string> kinds = {"ipip", "sit", "ip6tnl", "gre", "ip6gre", "wireguard", "vti", "vti6", "tun"};
  return kinds.count(kind) > 0;
}

// The pod's addresses: every address of its non-loopback interfaces but
// IPv6 link-local ones (probes go to the pod IP), in the kernel's order.
Result<std::vector<sluice_pod_addr>> podAddrsOn(PodContext& c) {
  auto nl = c.podNetlink();
  SLUICE_TRY(nl);
  auto links = c.podInterfaces();
  SLUICE_TRY(links);
  auto addrs = listAddrsOn(**nl);
  if (!addrs.ok()) return Error::msg("list the pod's addresses: " + addrs.error().message, addrs.error().code);
  std::vector<sluice_pod_addr> out;
  for (const auto& a : *addrs) {
    auto link = std::find_if((*links)->begin(), (*links)->end(), [&](const LinkInfo& l) { return l.ifindex == a.ifindex; });
    if (link != (*links)->end() && link->loopback) continue;
    if (a.family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(reinterpret_cast<const in6_addr*>(a.addr))) continue;
    sluice_pod_addr p{};
    p.family = static_cast<uint8_t>(a.family);
    std::memcpy(p.addr, a.addr, a.family == AF_INET ? 4 : 16);
    out.push_back(p);
  }
  return out;
}

void addIface(sluice_pod_record& rec, const LinkInfo& l) {
  auto& slot = rec.ifaces[rec.iface_count++];
  copyString(slot.name, sizeof(slot.name), l.name);
  slot.ifindex = static_cast<__u32>(l.ifindex);
  slot.accept_local_before = -1;
}

// The same id enrolled already: the same netns, settings and identity, or
// an error naming what differs.
Status sameEnrollment(const PodContext& c, const PodSpec& spec, const sluice_pod_record& existing) {
  PodInfo have = podInfoFromRecord(c.id, existing);
  if (existing.netns_cookie != c.rec.netns_cookie)
    return Error::msg("pod id '" + c.id + "' is already enrolled for another netns (" + have.netnsPath + ")", EEXIST);
  if (!sameConfig(existing.config, c.rec.config)) return otherSettingsError(have);
  if (have.identity != spec.identity)
    return Error::msg("pod '" + c.id + "' is already enrolled with another identity (" +
                          describeIdentity(have.identity) + "); remove it first",
                      EEXIST);
  return {};
}

}  // namespace

Result<Discovery> discoverPod(PodContext& c, const PodSpec& spec, const std::optional<sluice_pod_record>& existing) {
  Discovery out;
  auto cookie = currentNetnsCookie();
  SLUICE_TRY(cookie);
  c.rec.netns_cookie = *cookie;
  auto links = c.podInterfaces();
  SLUICE_TRY(links);
  std::vector<LinkInfo> attachTo;
  for (const auto& l : **links) {
    if (l.loopback) {
      c.rec.lo_ifindex = static_cast<__u32>(l.ifindex);
      out.ipv6 = l.ipv6;
    } else if (isL3OnlyKind(l.kind)) {
      spdlog::warn("pod {}: not attaching to {} ({} has no Ethernet header)", c.id, l.name, l.kind);
    } else {
      attachTo.push_back(l);
    }
  }
  for (const auto& name : spec.rerouteIfaces) {
    auto it = std::find_if(attachTo.begin(), attachTo.end(), [&](const LinkInfo& l) { return l.name == name; });
    if (it == attachTo.end())
      return Error::msg("reroute interface '" + name + "' not found in netns " + spec.netnsPath, ENODEV);
    c.rec.config.reroute_ifindex[c.rec.config.reroute_count++] = static_cast<__u32>(it->ifindex);
  }
  // The veth whose peer is the host-side interface (eth0 first): the node
  // side's start, also for an enrolled pod whose node side is missing.
  for (const auto& l : attachTo) {
    if (l.kind != "veth" || !l.linkIfindex) continue;
    if (!c.podVethIfindex || l.name == "eth0") {
      c.podVethIfindex = l.ifindex;
      c.peerIfindex = l.linkIfindex;
    }
  }
  if (existing) {
    SLUICE_TRY(sameEnrollment(c, spec, *existing));
    out.alreadyEnrolled = true;
    return out;
  }
  // pod_config is keyed by the netns cookie: one lookup, where reading the
  // whole registry cost O(pods) per enrollment.
  if (auto other = c.programs->podConfig.lookup(c.rec.netns_cookie))
    return Error::msg("netns " + spec.netnsPath + " is already enrolled as pod '" + fromFixed(other->id, sizeof(other->id)) +
                          "'",
                      EEXIST);
  if (attachTo.empty()) return Error::msg("netns " + spec.netnsPath + " has no non-loopback interface to attach to", ENODEV);
  if (attachTo.size() > SLUICE_MAX_POD_IFACES)
    return Error::msg("netns " + spec.netnsPath + " has more than " + std::to_string(SLUICE_MAX_POD_IFACES) + " interfaces",
                      E2BIG);
  if (!c.rec.lo_ifindex) return Error::msg("netns " + spec.netnsPath + " has no loopback interface", ENODEV);

  // Node side inputs: the addresses probes will target.
  if (spec.nodeNetnsPath && spec.ips.empty()) {
    auto found = podAddrsOn(c);
    SLUICE_TRY(found);
    for (const auto& a : *found) {
      if (c.rec.addr_count == SLUICE_MAX_POD_ADDRS) break;
      c.rec.addrs[c.rec.addr_count++] = a;
    }
  }
  if (c.rec.capture != SLUICE_CAPTURE_SOCKET) {
    for (const auto& l : attachTo) addIface(c.rec, l);
    return out;
  }
  // Socket mode: only the virtual interfaces get a TC hook; the socket
  // programs need the pod's addresses (given, else found here).
  for (uint32_t r = 0; r < c.rec.config.reroute_count; r++)
    for (const auto& l : attachTo)
      if (l.ifindex == static_cast<int>(c.rec.config.reroute_ifindex[r])) addIface(c.rec, l);
  SLUICE_TRY(findSockAddrs(c));
  return out;
}

Status findSockAddrs(PodContext& c) {
  if (c.sockAddrs) return {};
  if (c.rec.addr_count) {
    c.sockAddrs.emplace(c.rec.addrs, c.rec.addrs + c.rec.addr_count);
    return {};
  }
  auto found = podAddrsOn(c);
  SLUICE_TRY(found);
  c.sockAddrs = std::move(*found);
  return {};
}

Status resolveRerouteIfaces(PodContext& c, const std::vector<std::string>& names, sluice_pod_config& cfg) {
  const std::string path = netnsPathOf(c.rec);
  auto links = c.podInterfaces();
  SLUICE_TRY(links);
  for (const auto& name : names) {
    auto l = std::find_if((*links)->begin(), (*links)->end(), [&](const LinkInfo& x) { return x.name == name; });
    if (l == (*links)->end()) return Error::msg("reroute interface '" + name + "' not found in netns " + path, ENODEV);
    bool attached = false;
    for (uint32_t i = 0; i < c.rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++)
      attached = attached || static_cast<int>(c.rec.ifaces[i].ifindex) == l->ifindex;
    // Captured at the socket, only the virtual interfaces named at
    // enrollment got a TC hook (the others must not have one: it would
    // capture inbound at TC beside sk_lookup).
    if (!attached && c.rec.capture == SLUICE_CAPTURE_SOCKET)
      return Error::msg("reroute interface '" + name + "' of pod '" + c.id +
                            "' has no sluice programs (captured at the socket, only the reroute interfaces named "
                            "at enrollment get them); remove and add the pod",
                        EINVAL);
    if (!attached)
      return Error::msg("reroute interface '" + name + "' of pod '" + c.id +
                            "' has no sluice programs (it appeared after the pod was enrolled); remove and add the pod",
                        EINVAL);
    cfg.reroute_ifindex[cfg.reroute_count++] = static_cast<__u32>(l->ifindex);
  }
  return {};
}

Result<bool> recordedNetnsGone(const sluice_pod_record& rec) {
  auto ns = openNetns(netnsPathOf(rec));
  if (!ns.ok()) {
    if (ns.error().code == ENOENT || ns.error().code == EINVAL) return true;
    return ns.error();
  }
  auto cookie = netnsCookie(ns->get());
  SLUICE_TRY(cookie);
  return *cookie != rec.netns_cookie;
}

}  // namespace sluice
