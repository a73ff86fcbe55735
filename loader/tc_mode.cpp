#include "loader/tc_mode.h"

namespace sluice {

Result<TcMode> parseTcMode(const std::string& s) {
  if (s == "auto") return TcMode::Auto;
  if (s == "tcx") return TcMode::Tcx;
  if (s == "legacy") return TcMode::Legacy;
  return Error::msg("invalid --tc-mode '" + s + "' (expected auto, tcx or legacy)", EINVAL);
}

const char* tcModeName(TcMode m) {
  switch (m) {
    case TcMode::Auto: return "auto";
    case TcMode::Tcx: return "tcx";
    case TcMode::Legacy: return "legacy";
  }
  return "?";
}

}  // namespace sluice
