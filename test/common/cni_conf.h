// The node's CNI configuration as the CNI tests start from it: a primary
// conflist (the real bridge + host-local plugins) with sluice-cni chained
// into it by `sluice-cni install`, the way the DaemonSet's init container
// does.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/result.h"

namespace sluice::test {

/// Where and how the primary network is laid out.
struct BridgeNetwork {
  std::string confDir;       ///< the runtime's network config dir
  std::string binDir;        ///< where install copies sluice-cni
  std::string file;          ///< the conflist's file name in confDir
  std::string name;          ///< the network's name
  std::string bridge;        ///< the bridge device (gateway, default route, no masquerade)
  std::string subnetPrefix;  ///< "10.231.7." : host-local hands out prefix + "0/24"
  std::string ipamDir;       ///< host-local's dataDir
  std::string agentSocket;   ///< written into sluice-cni's entry
};

/// The bridge + host-local conflist of @p net (what the primary CNI writes).
nlohmann::json bridgeConflist(const BridgeNetwork& net);

/// Writes the bridge + host-local conflist and runs `sluice-cni install`
/// into it; the conflist as installed (sluice-cni last), or what failed.
Result<nlohmann::json> installBridgeConflist(const BridgeNetwork& net);

}  // namespace sluice::test
