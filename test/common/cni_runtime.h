// A container runtime's side of CNI, for the tests that drive the real
// plugins: libcni's semantics (CNI_* environment, the network config on
// stdin with cniVersion, name and prevResult injected, the chain in
// conflist order on ADD/CHECK and in reverse order on DEL), and the way
// containerd, CRI-O and libcni pick the network of a conf dir.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/result.h"
#include "test/common/topology.h"

namespace sluice::test {

/// Where Debian's containernetworking-plugins install bridge, host-local...
inline constexpr const char* kSystemCniDir = "/usr/lib/cni";

/// @p s quoted for sh.
std::string shellQuote(const std::string& s);

/// The CNI_* parameters of one pod's invocations. Empty values are left out
/// of the environment.
struct CniParams {
  std::string containerId;
  std::string netns;
  std::string ifname = "eth0";
  std::string args;
};

struct PluginRun {
  std::string type;
  CommandResult result;
};

/// What a chain operation did: every plugin's run, and for ADD the final
/// result (or the failing plugin's error JSON).
struct ChainOutcome {
  bool ok = false;
  nlohmann::json result;
  nlohmann::json error;
  std::vector<PluginRun> runs;
  std::string describe() const;
};

/// The network a runtime uses from @p confDir, as libcni's ConfFiles +
/// ConfListFromFile/ConfListFromConf: the lexically first *.conf,
/// *.conflist or *.json, a single-plugin config as a one-plugin list;
/// also its file name in @p file.
Result<nlohmann::json> runtimeNetwork(const std::string& confDir, std::string* file = nullptr);

/// Runs CNI plugins from the node netns exactly as a runtime does.
class CniRuntime {
 public:
  CniRuntime(const TestNetns& node, std::string binDir, std::string scratchDir)
      : node_(node), binDir_(std::move(binDir)), scratch_(std::move(scratchDir)) {}

  std::string cniPath() const { return binDir_ + ":" + kSystemCniDir; }

  /// The runtime's working directory for the plugins ("": the test's).
  std::string cwd;

  /// The plugin binary of @p type, looked up in CNI_PATH order.
  std::string pluginPath(const std::string& type) const;

  /// One plugin invocation: @p stdinText on stdin, CNI_* in a clean
  /// environment.
  CommandResult invoke(const std::string& binary, const std::string& command, const CniParams& p,
                       const std::string& stdinText) const;

  /// One plugin of a conflist with the list's cniVersion and name (and
  /// prevResult when given) injected, as libcni does.
  CommandResult invokePlugin(const nlohmann::json& list, const nlohmann::json& plugin, const std::string& command,
                             const CniParams& p, const nlohmann::json& prevResult) const;

  /// ADD: every plugin in order, each one's result the next one's
  /// prevResult; stops at the first failure.
  ChainOutcome add(const nlohmann::json& list, const CniParams& p) const;

  /// CHECK (forward) or DEL (reverse), each plugin given the cached ADD
  /// result (null: none, as after a failed ADD).
  ChainOutcome checkOrDel(const nlohmann::json& list, const CniParams& p, const std::string& command,
                          const nlohmann::json& cached) const;

 private:
  const TestNetns& node_;
  std::string binDir_;
  std::string scratch_;
};

}  // namespace sluice::test
