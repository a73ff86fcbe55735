#include "base/tc_mode.h"

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

const char* captureModeName(CaptureMode m) {
  switch (m) {
    case CaptureMode::Auto: return "auto";
    case CaptureMode::Tc: return "tc";
    case CaptureMode::Socket: return "socket";
  }
  return "?";
}

Result<CaptureMode> parseCaptureMode(const std::string& s) {
  if (s == "auto") return CaptureMode::Auto;
  if (s == "tc") return CaptureMode::Tc;
  if (s == "socket") return CaptureMode::Socket;
  return Error::msg("invalid --capture '" + s + "' (expected auto, tc or socket)", EINVAL);
}

}  // namespace sluice
