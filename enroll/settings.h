// The node-wide settings every enrolled pod shares (ports, marks, probe
// addresses): what `sluice_settings` holds, and the policy rule they imply.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"
#include "loader/netlink.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// Global settings; defaults are the spec's (Istio's) values.
struct Settings {
  uint16_t outboundPort = SLUICE_DEFAULT_OUTBOUND_PORT;
  uint16_t inboundPort = SLUICE_DEFAULT_INBOUND_PORT;
  uint16_t hbonePort = SLUICE_DEFAULT_HBONE_PORT;
  uint16_t dnsPort = SLUICE_DEFAULT_DNS_PORT;
  uint32_t proxyMark = SLUICE_DEFAULT_PROXY_MARK;
  uint32_t returnMark = SLUICE_DEFAULT_RETURN_MARK;
  uint32_t markMask = SLUICE_DEFAULT_MARK_MASK;
  std::string probeV4 = SLUICE_DEFAULT_PROBE_V4;
  std::string probeV6 = SLUICE_DEFAULT_PROBE_V6;
};

/// Converts Settings to the map layout; errors name the bad field.
Result<sluice_settings> encodeSettings(const Settings& s);

/// The Settings a pinned sluice_settings holds (encodeSettings' inverse).
Settings decodeSettings(const sluice_settings& s);

/// An address a node's probes may leave from (--host-probe-snat-ip[v6]):
/// @p family's, neither unspecified, loopback nor multicast; EINVAL names
/// @p what otherwise.
Status validateProbeAddr(int family, const std::string& addr, const std::string& what);

/// The policy rule that delivers packets with the return mark locally
/// (rule 4's return path), in a pod's netns.
PolicyRule returnRule(const Settings& s, int family);

}  // namespace sluice
