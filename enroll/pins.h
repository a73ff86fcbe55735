// Where a pod's pins live under the bpffs root: one directory per pod,
// <root>/links/<pod id>, holding its tcx links and its sk_lookup link.
// The only place these paths are built.
#pragma once

#include <string>

#include "loader/tc.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// <root>/links: every pod's pin directory is in it.
inline std::string linksRoot(const std::string& root) { return root + "/" + SLUICE_PIN_LINKS_DIR; }
/// <root>/links/<id>.
inline std::string podLinkDir(const std::string& root, const std::string& id) { return linksRoot(root) + "/" + id; }
/// A pod-side tcx link: <dir>/<ifname>_<ingress|egress>.
inline std::string tcxPin(const std::string& linkDir, const std::string& ifname, TcHook hook) {
  return linkDir + "/" + ifname + "_" + tcHookName(hook);
}
/// A host-side tcx link (probe SNAT): <dir>/host_<ifname>_<ingress|egress>.
inline std::string hostPin(const std::string& linkDir, const std::string& ifname, TcHook hook) {
  return tcxPin(linkDir, "host_" + ifname, hook);
}
/// The socket mode's sk_lookup link of the pod.
inline std::string skLookupPin(const std::string& linkDir) { return linkDir + "/sk_lookup"; }

}  // namespace sluice
