#include "base/pod_types.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace sluice {

Error notEnrolledError(const std::string& id) { return Error::msg("pod '" + id + "' is not enrolled", ENOENT); }

std::string defaultPodId(const std::string& netnsPath) {
  std::string p = netnsPath;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  // /proc/PID/ns/net and /proc/PID/task/TID/ns/net all end in "net".
  if (p.rfind("/proc/", 0) == 0 && p.size() > 7 && p.compare(p.size() - 7, 7, "/ns/net") == 0) {
    std::string rest = p.substr(6, p.size() - 13);
    std::string pid = rest.substr(0, rest.find('/'));
    if (!pid.empty() && std::all_of(pid.begin(), pid.end(), ::isdigit)) return "pid-" + pid;
  }
  auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

Status validatePodId(const std::string& id) {
  if (id.empty()) return Error::msg("pod id is empty", EINVAL);
  if (id.size() >= SLUICE_ID_LEN)
    return Error::msg("pod id '" + id + "' is longer than " + std::to_string(SLUICE_ID_LEN - 1) + " characters", EINVAL);
  for (char c : id)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return Error::msg("pod id '" + id + "' has characters other than A-Z a-z 0-9 . _ -", EINVAL);
  return {};
}

Status validatePodIdentity(const PodIdentity& identity) {
  struct Field {
    const char* what;
    const std::string& value;
    size_t max;
  };
  for (const Field& f : {Field{"uid", identity.uid, SLUICE_UID_LEN - 1}, Field{"pod name", identity.name, 253},
                         Field{"pod namespace", identity.ns, SLUICE_K8S_NAMESPACE_LEN - 1},
                         Field{"service account", identity.serviceAccount, 253}}) {
    if (f.value.size() > f.max)
      return Error::msg(std::string(f.what) + " '" + f.value.substr(0, 64) + (f.value.size() > 64 ? "...'" : "'") +
                            " is longer than " + std::to_string(f.max) + " characters",
                        EINVAL);
    // Printable ASCII without spaces: these names end up in logs, JSON,
    // metrics labels and the node proxy's protocol.
    for (char c : f.value)
      if (c <= 0x20 || c >= 0x7f)
        return Error::msg(std::string(f.what) + " has a character that is not printable ASCII (or a space)", EINVAL);
  }
  return {};
}

const char* handoffStateName(HandoffState s) {
  switch (s) {
    case HandoffState::Acked: return "acked";
    case HandoffState::Failed: return "failed";
    case HandoffState::None: break;
  }
  return "not handed off";
}

std::string absoluteNetnsPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  std::error_code ec;
  auto abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

}  // namespace sluice
