// The Datapath's record of the node proxy's cgroups (enroll/proxy_identity.h).
#include <spdlog/spdlog.h>

#include "enroll/datapath.h"
#include "enroll/registry.h"
#include "loader/cgroup.h"

namespace sluice {

Result<uint64_t> Datapath::addProxyProcess(pid_t pid) {
  auto id = cgroupIdOfPid(pid);
  SLUICE_TRY(id);
  sluice_proxy_cgroup v{};
  v.pid = static_cast<__u32>(pid);
  v.since_ns = nowNs();
  if (auto have = programs_->proxyCgroups.lookup(*id)) v.since_ns = have->since_ns;
  Status st = programs_->proxyCgroups.update(*id, v);
  if (!st.ok() && st.error().code == E2BIG && pruneProxyCgroups() > 0) st = programs_->proxyCgroups.update(*id, v);
  if (!st.ok())
    return Error::msg("record the node proxy's cgroup: " + st.error().message + " (at most " +
                          std::to_string(SLUICE_PROXY_CGROUPS) + " live proxy cgroups)",
                      st.error().code);
  // The cgroup is in the set before the check turns on: the proxy's
  // traffic never sees a moment where its mark does not count.
  SLUICE_TRY(programs_->proxyIdentity.update(0, sluice_proxy_identity{1, 0}));
  return *id;
}

size_t Datapath::pruneProxyCgroups() {
  size_t gone = 0;
  for (uint64_t id : programs_->proxyCgroups.keys()) {
    auto exists = cgroupExists(id);
    if (exists.ok() && !*exists && programs_->proxyCgroups.erase(id).ok()) {
      spdlog::info("node proxy cgroup {} is gone; forgotten", id);
      gone++;
    }
  }
  return gone;
}

Status Datapath::clearProxyIdentity() {
  SLUICE_TRY(programs_->proxyIdentity.update(0, sluice_proxy_identity{}));
  for (uint64_t id : programs_->proxyCgroups.keys()) SLUICE_TRY(programs_->proxyCgroups.erase(id));
  return {};
}

ProxyIdentity Datapath::proxyIdentity() {
  ProxyIdentity out;
  auto on = programs_->proxyIdentity.lookup(0);
  out.cgroupCheck = on && on->cgroup_check;
  for (uint64_t id : programs_->proxyCgroups.keys())
    if (auto v = programs_->proxyCgroups.lookup(id)) out.cgroups.push_back({id, v->pid, v->since_ns});
  return out;
}

}  // namespace sluice
