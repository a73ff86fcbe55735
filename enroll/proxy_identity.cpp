#include "enroll/proxy_identity.h"

#include <bpf/bpf.h>

#include "base/fd.h"
#include "maps/sluice_maps.h"

namespace sluice {

Result<std::optional<ProxyIdentity>> readPinnedProxyIdentity(const std::string& root, uint32_t& mark, uint32_t& mask) {
  auto open = [&](const char* name) { return Fd(bpf_obj_get((root + "/" + name).c_str())); };
  Fd settings = open(SLUICE_PIN_SETTINGS), on = open(SLUICE_PIN_PROXY_IDENTITY), cgroups = open(SLUICE_PIN_PROXY_CGROUPS);
  if (!settings.valid() || !on.valid() || !cgroups.valid()) {
    if (errno == ENOENT) return std::optional<ProxyIdentity>();
    return Error::fromErrno(errno, "read the pinned proxy identity under " + root);
  }
  __u32 zero = 0;
  sluice_settings st{};
  if (bpf_map_lookup_elem(settings.get(), &zero, &st) != 0) return Error::fromErrno(errno, "read pinned settings");
  mark = st.proxy_mark;
  mask = st.mark_mask;
  ProxyIdentity out;
  sluice_proxy_identity pi{};
  if (bpf_map_lookup_elem(on.get(), &zero, &pi) == 0) out.cgroupCheck = pi.cgroup_check;
  __u64 cur = 0, next = 0;
  const __u64* prev = nullptr;
  while (bpf_map_get_next_key(cgroups.get(), prev, &next) == 0) {
    cur = next;
    prev = &cur;
    sluice_proxy_cgroup v{};
    if (bpf_map_lookup_elem(cgroups.get(), &cur, &v) == 0) out.cgroups.push_back({cur, v.pid, v.since_ns});
  }
  return std::optional<ProxyIdentity>(out);
}

}  // namespace sluice
