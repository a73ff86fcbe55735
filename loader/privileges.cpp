#include "loader/privileges.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace sluice {

namespace {

bool effective(const __user_cap_data_struct (&data)[2], int cap) { return data[cap / 32].effective & (1u << (cap % 32)); }

}  // namespace

Status checkPrivileges() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) return Error::fromErrno(errno, "read the process capabilities");
  std::string missing;
  if (!effective(data, CAP_SYS_ADMIN)) missing += "CAP_SYS_ADMIN";
  if (!effective(data, CAP_NET_ADMIN)) missing += std::string(missing.empty() ? "" : " and ") + "CAP_NET_ADMIN";
  if (!missing.empty()) return Error::msg("missing privilege: " + missing + " needed (run as root)", EPERM);
  return {};
}

}  // namespace sluice
