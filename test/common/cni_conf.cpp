#include "test/common/cni_conf.h"

#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {

using nlohmann::json;

json bridgeConflist(const BridgeNetwork& net) {
  return {{"cniVersion", "1.0.0"},
          {"name", net.name},
          {"plugins",
           {{{"type", "bridge"},
             {"bridge", net.bridge},
             {"isGateway", true},
             {"isDefaultGateway", true},
             {"ipMasq", false},
             {"ipam",
              {{"type", "host-local"},
               {"dataDir", net.ipamDir},
               {"ranges", {{{{"subnet", net.subnetPrefix + "0/24"}}}}}}}}}}};
}

Result<json> installBridgeConflist(const BridgeNetwork& net) {
  json list = bridgeConflist(net);
  const std::string path = net.confDir + "/" + net.file;
  if (!writeTextFile(path, list.dump(2))) return Error::fromErrno(errno, "write " + path);
  auto r = runCommand({builtBinary("sluice-cni"), "install", "--cni-conf-dir", net.confDir, "--cni-bin-dir", net.binDir,
                       "--agent-socket", net.agentSocket});
  if (r.exitCode != 0) return Error::msg("sluice-cni install: " + r.describe(), EIO);
  json installed = json::parse(readTextFile(path), nullptr, false);
  if (!installed.is_object() || installed["plugins"].size() != 2 || installed["plugins"][1]["type"] != "sluice-cni")
    return Error::msg("sluice-cni install left " + path + " as " + installed.dump(), EIO);
  return installed;
}

}  // namespace sluice::test
