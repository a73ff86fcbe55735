// How pods are captured (at the socket or at TC) and how TC programs are
// attached, by name: tcx links (Linux 6.6+) or clsact + cls_bpf ("legacy").
// Apart from loader/tc.h and loader/features.h so that components without
// libbpf (sluice-cni) can name the modes.
#pragma once

#include <string>

#include "base/result.h"

namespace sluice {

enum class TcMode { Auto, Tcx, Legacy };

/// "auto" | "tcx" | "legacy".
Result<TcMode> parseTcMode(const std::string& s);
const char* tcModeName(TcMode m);

/// Where a pod's traffic is captured.
enum class CaptureMode {
  Auto,    ///< socket where the kernel has every hook it needs, else tc
  Tc,      ///< programs at the TC hooks of the pod's interfaces
  Socket,  ///< cgroup socket hooks of the node + sk_lookup in the pod's netns
};
/// "auto" | "tc" | "socket".
const char* captureModeName(CaptureMode m);
/// Inverse of captureModeName; the error names --capture.
Result<CaptureMode> parseCaptureMode(const std::string& s);

}  // namespace sluice
