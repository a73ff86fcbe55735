#include "enroll/settings.h"

#include <arpa/inet.h>

namespace sluice {

Result<sluice_settings> encodeSettings(const Settings& s) {
  sluice_settings out{};
  out.outbound_port = s.outboundPort;
  out.inbound_port = s.inboundPort;
  out.hbone_port = s.hbonePort;
  out.dns_port = s.dnsPort;
  out.proxy_mark = s.proxyMark;
  out.return_mark = s.returnMark;
  out.mark_mask = s.markMask;
  if (!s.outboundPort || !s.inboundPort || !s.hbonePort || !s.dnsPort)
    return Error::msg("settings: ports must be non-zero", EINVAL);
  if ((s.proxyMark & ~s.markMask) || (s.returnMark & ~s.markMask) || s.proxyMark == s.returnMark)
    return Error::msg("settings: proxy and return marks must differ and lie within the mark mask", EINVAL);
  if ((s.markMask & SLUICE_TAG_MASK) != 0)
    return Error::msg("settings: mark mask overlaps sluice's internal tag bits 0xffff0000", EINVAL);
  if (inet_pton(AF_INET, s.probeV4.c_str(), &out.probe_v4) != 1)
    return Error::msg("settings: invalid IPv4 probe address '" + s.probeV4 + "'", EINVAL);
  if (inet_pton(AF_INET6, s.probeV6.c_str(), out.probe_v6) != 1)
    return Error::msg("settings: invalid IPv6 probe address '" + s.probeV6 + "'", EINVAL);
  return out;
}

Settings decodeSettings(const sluice_settings& s) {
  Settings out;
  out.outboundPort = s.outbound_port;
  out.inboundPort = s.inbound_port;
  out.hbonePort = s.hbone_port;
  out.dnsPort = s.dns_port;
  out.proxyMark = s.proxy_mark;
  out.returnMark = s.return_mark;
  out.markMask = s.mark_mask;
  char buf[INET6_ADDRSTRLEN] = {};
  out.probeV4 = inet_ntop(AF_INET, &s.probe_v4, buf, sizeof(buf));
  out.probeV6 = inet_ntop(AF_INET6, s.probe_v6, buf, sizeof(buf));
  return out;
}

Status validateProbeAddr(int family, const std::string& addr, const std::string& what) {
  const bool v4 = family == AF_INET;
  in6_addr a{};
  if (inet_pton(family, addr.c_str(), &a) != 1)
    return Error::msg(what + ": '" + addr + "' is not an " + (v4 ? "IPv4" : "IPv6") + " address", EINVAL);
  bool bad;
  if (v4) {
    const uint32_t h = ntohl(reinterpret_cast<const in_addr*>(&a)->s_addr);
    bad = h == 0 || (h >> 24) == 127 || (h >> 28) == 0xe;
  } else {
    bad = IN6_IS_ADDR_UNSPECIFIED(&a) || IN6_IS_ADDR_LOOPBACK(&a) || IN6_IS_ADDR_MULTICAST(&a) ||
          IN6_IS_ADDR_V4MAPPED(&a);
  }
  if (bad) return Error::msg(what + ": '" + addr + "' cannot be a probe source (unspecified, loopback or multicast)", EINVAL);
  return {};
}

PolicyRule returnRule(const Settings& s, int family) {
  return PolicyRule{family, s.returnMark, s.markMask, SLUICE_RULE_PRIORITY, SLUICE_ROUTE_TABLE};
}

}  // namespace sluice
