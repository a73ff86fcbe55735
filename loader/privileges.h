// The capabilities sluice needs, checked up front.
#pragma once

#include "base/result.h"

namespace sluice {

/// EPERM with a readable message unless the process has CAP_SYS_ADMIN
/// (setns, mounting bpffs, loading BPF) and CAP_NET_ADMIN (TC, routes,
/// sysctls) in its effective set.
Status checkPrivileges();

}  // namespace sluice
