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

PolicyRule returnRule(const Settings& s, int family) {
  return PolicyRule{family, s.returnMark, s.markMask, SLUICE_RULE_PRIORITY, SLUICE_ROUTE_TABLE};
}

}  // namespace sluice
