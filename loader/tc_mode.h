// How pods' programs are attached, by name: tcx links (Linux 6.6+) or
// clsact + cls_bpf ("legacy"). Apart from loader/tc.h so that components
// without libbpf (sluice-cni) can name the modes.
#pragma once

#include <string>

#include "loader/result.h"

namespace sluice {

enum class TcMode { Auto, Tcx, Legacy };

/// "auto" | "tcx" | "legacy".
Result<TcMode> parseTcMode(const std::string& s);
const char* tcModeName(TcMode m);

}  // namespace sluice
