// `sluice-cni install` / `uninstall`: putting the plugin into the node's CNI
// configuration (the primary conflist's chain and the CNI bin dir) and
// taking it out again. The DaemonSet's init container runs install; see
// deploy/README.md.
#pragma once

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "base/result.h"
#include "userspace/cni/mesh_install.h"

namespace sluice::cni {

/// The name of sluice-cni's own conflist (--cni-owned-conflist): sorts
/// before the usual primaries (05-cilium, 10-calico, 10-flannel, ...), as
/// Istio's 02-istio-cni.conflist (cni/pkg/constants/constants.go,
/// DefaultIstioOwnedCNIConfigFilename).
inline constexpr const char* kDefaultOwnedConflist = "02-sluice-cni.conflist";
/// The standalone network config of --cni-unchained (Multus).
inline constexpr const char* kDefaultStandaloneConf = "sluice-cni.conf";

/// How sluice-cni joins the node's CNI configuration; the same flags on
/// `sluice-cni install`/`uninstall` and sluiced (Istio's names in
/// deploy/README.md).
struct ConfMode {
  /// --cni-conf-name: chained, the primary config to chain after instead of
  /// the lexically first; unchained, the name of the standalone config.
  std::string confName;
  /// --cni-owned-conflist: sluice-cni's own conflist (ownedName), the
  /// primary's plugins then sluice-cni; the primary's file is not touched.
  bool owned = false;
  std::string ownedName = kDefaultOwnedConflist;  ///< --cni-owned-conflist-name
  /// false (--cni-unchained): a standalone config holding sluice-cni alone,
  /// for Multus to run as an additional network (OpenShift).
  bool chained = true;
};

/// Whether @p flag is one of ConfMode's, and whether it takes a value.
bool isConfModeFlag(const std::string& flag, bool& takesValue);
/// Applies one ConfMode flag (@p value is ignored for those without one).
Status applyConfModeFlag(ConfMode& mode, const std::string& flag, const std::string& value);
/// The combination's errors (EINVAL), naming the flags.
Status validateConfMode(const ConfMode& mode);

struct InstallOptions {
  std::string confDir;  ///< --cni-conf-dir (e.g. /etc/cni/net.d)
  std::string binDir;   ///< --cni-bin-dir (e.g. /opt/cni/bin)
  std::string agentSocket = "/var/run/sluice/agent.sock";  ///< written as agentSocket
  std::string binary = "/proc/self/exe";                   ///< what is copied to binDir/sluice-cni
  ConfMode mode;
  /// --wait-timeout: how long install waits for the primary's config to
  /// appear (nullopt: as long as it takes, as Istio's installer; 0: not).
  std::optional<std::chrono::seconds> waitTimeout;
  /// Progress lines while install waits (nullptr: none).
  std::function<void(const std::string&)> progress;
  /// --kubeconfig, --service-account-dir, --exclude-namespaces,
  /// --ambient-enablement-selector (mesh_install.h).
  MeshInstallOptions mesh;
};

/// Parses the arguments after `install` / `uninstall` (uninstall takes no
/// --agent-socket, --binary or --wait-timeout). Errors name the bad
/// argument (EINVAL).
Result<InstallOptions> parseInstallArgs(const std::vector<std::string>& args, bool forInstall);

/// The network config files of @p confDir as a runtime sees them
/// (*.conf, *.conflist, *.json), sorted by name: the first is the one the
/// runtime uses (containerd, CRI-O and libcni all take the lexically first).
Result<std::vector<std::string>> configFiles(const std::string& confDir);

/// @p conflist with one {"type":"sluice-cni","agentSocket":...} entry at the
/// end of "plugins" (an older entry is dropped first, so calling it again
/// changes nothing). Errors (EINVAL) when it is not a conflist: no
/// "plugins" array, or a plugin without "type". @p file names it in errors.
Result<nlohmann::ordered_json> withSluice(const nlohmann::ordered_json& conflist, const std::string& agentSocket,
                                          const std::string& file);

/// @p conflist without sluice-cni entries; @p removed says whether any was.
nlohmann::ordered_json withoutSluice(const nlohmann::ordered_json& conflist, bool& removed);

/// Writes @p path whole or not at all: a temporary file in the same
/// directory (a name no runtime loads), fsync, chmod @p mode, rename.
Status writeFileAtomic(const std::string& path, const std::string& content, unsigned mode);

/// What sluice-cni's entry in a CNI config dir should be: planned by
/// planChain, written by writeChain.
struct ChainPlan {
  std::string path;     ///< the file written (the primary, its .conflist, the owned or standalone file)
  std::string primary;  ///< the primary config it is made from ("" unchained)
  /// path's content now (nullopt: not there, or not JSON), and as planned.
  std::optional<nlohmann::ordered_json> current;
  nlohmann::ordered_json updated;
  /// A single-plugin .conf replaced by path (its .conflist): removed once
  /// path is written.
  std::string replaces;
  unsigned mode = 0644;  ///< path's mode (an existing file's, else the primary's)
  bool changes() const { return !replaces.empty() || !current || *current != updated; }
};

/// Plans sluice-cni's entry in @p confDir as @p mode says.
/// Errors: ENOENT when the primary config is not there yet (chained);
/// EINVAL (naming the file) when it is not JSON, not a CNI config, when
/// the owned conflist would not sort first, or when converting a .conf
/// would overwrite another network's .conflist.
Result<ChainPlan> planChain(const std::string& confDir, const std::string& agentSocket, const ConfMode& mode = {});

/// Writes plan.updated to plan.path atomically (plan.mode), then removes
/// plan.replaces.
Status writeChain(const ChainPlan& plan);

/// A network config as a conflist: a conflist as it is; a single-plugin
/// config (top-level "type") as {"cniVersion", "name", "plugins": [the
/// rest]} -- its own version and name kept (host-local keeps its leases
/// under the network's name). EINVAL naming @p file otherwise.
Result<nlohmann::ordered_json> asConflist(const nlohmann::ordered_json& config, const std::string& file);

/// The standalone network config of --cni-unchained.
nlohmann::ordered_json standaloneConf(const std::string& agentSocket);

/// What install / uninstall did, one line each ("added sluice-cni to ...").
using Actions = std::vector<std::string>;

/// Copies the binary and writes sluice-cni's entry as options.mode says.
/// Chained, it first waits (options.waitTimeout) for the primary config;
/// ETIMEDOUT when it did not appear in time, with nothing written.
Result<Actions> install(const InstallOptions& options);

/// Removes sluice-cni from every *.conflist of confDir, deletes its own
/// files there (the owned conflist options.mode.ownedName, standalone
/// configs of type sluice-cni) and its binary from binDir; the primary's
/// files are otherwise left as they are. Nothing to remove is not an error.
/// The agent calls it too.
Result<Actions> uninstall(const InstallOptions& options);

/// `sluice-cni install|uninstall ARGS`: exit 0, 1 on failure (one line on
/// @p err), 2 on usage errors.
int installMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace sluice::cni
