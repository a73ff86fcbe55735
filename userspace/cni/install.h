// `sluice-cni install` / `uninstall`: putting the plugin into the node's CNI
// configuration (the primary conflist's chain and the CNI bin dir) and
// taking it out again. The DaemonSet's init container runs install; see
// deploy/README.md.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "base/result.h"
#include "userspace/cni/mesh_install.h"

namespace sluice::cni {

struct InstallOptions {
  std::string confDir;  ///< --cni-conf-dir (e.g. /etc/cni/net.d)
  std::string binDir;   ///< --cni-bin-dir (e.g. /opt/cni/bin)
  std::string agentSocket = "/var/run/sluice/agent.sock";  ///< written as agentSocket
  std::string binary = "/proc/self/exe";                   ///< what is copied to binDir/sluice-cni
  /// --kubeconfig, --service-account-dir, --exclude-namespaces,
  /// --ambient-enablement-selector (mesh_install.h).
  MeshInstallOptions mesh;
};

/// Parses the arguments after `install` / `uninstall` (uninstall takes no
/// --agent-socket or --binary). Errors name the bad argument (EINVAL).
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

/// The primary config of a CNI config dir with sluice-cni appended:
/// planned by planChain, written by writeChain.
struct ChainPlan {
  std::string path;  ///< the primary (lexically first) config
  nlohmann::ordered_json current, updated;
  bool changes() const { return current != updated; }
};

/// Reads the primary config of @p confDir and plans sluice-cni's entry.
/// Errors: ENOENT when the dir has no config yet; EINVAL (naming the file)
/// when the primary is a single-plugin .conf / .json, not JSON, or not a
/// conflist with plugins.
Result<ChainPlan> planChain(const std::string& confDir, const std::string& agentSocket);

/// Writes plan.updated to plan.path atomically, keeping the file's mode.
Status writeChain(const ChainPlan& plan);

/// What install / uninstall did, one line each ("added sluice-cni to ...").
using Actions = std::vector<std::string>;

/// Copies the binary and adds sluice-cni to the primary config. Refuses
/// (EINVAL) when the primary config is a single-plugin .conf / .json file,
/// and (ENOENT) when the directory has no config yet.
Result<Actions> install(const InstallOptions& options);

/// Removes sluice-cni from every *.conflist of confDir and its binary from
/// binDir. Nothing to remove is not an error.
Result<Actions> uninstall(const InstallOptions& options);

/// `sluice-cni install|uninstall ARGS`: exit 0, 1 on failure (one line on
/// @p err), 2 on usage errors.
int installMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace sluice::cni
