// How the programs tell the node proxy's traffic (rule 5): the proxy mark
// alone, or the mark from one of the proxy's cgroups (proxy_cgroups).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

/// A cgroup (v2) of the node proxy, as proxy_cgroups records it.
struct ProxyCgroup {
  uint64_t id = 0;
  uint32_t pid = 0;       ///< the proxy process seen in it
  uint64_t sinceNs = 0;   ///< CLOCK_REALTIME when first seen
};

/// The mark alone, or the mark from one of these cgroups.
struct ProxyIdentity {
  bool cgroupCheck = false;
  std::vector<ProxyCgroup> cgroups;
};

/// The proxy identity pinned under @p root, read from the pins without
/// loading programs or taking the lock; nullopt when nothing is pinned.
/// @p mark and @p mask get the pinned settings' proxy mark.
Result<std::optional<ProxyIdentity>> readPinnedProxyIdentity(const std::string& root, uint32_t& mark, uint32_t& mask);

}  // namespace sluice
