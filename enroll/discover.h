// What is found in a pod's netns before its plan is made: its interfaces
// (which get hooks, which is lo, which veth leads to the node), its
// addresses, whether it is enrolled already. Runs on a thread in the pod's
// netns; fills the PodContext's record.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/pod_types.h"
#include "enroll/context.h"
#include "loader/netlink.h"

namespace sluice {

/// What discovery tells `pod add` beside the record it fills.
struct Discovery {
  bool alreadyEnrolled = false;  ///< same netns, settings and identity: nothing to do
  bool ipv6 = false;             ///< lo has IPv6: the IPv6 rule and route too
};

/// In the pod's netns: records its cookie, interfaces, reroute interfaces
/// and addresses in c.rec, and what the node side and socket mode need in
/// @p c. Errors when the netns is enrolled otherwise or has nothing to
/// hook. @p existing: the record of the same id, if any.
Result<Discovery> discoverPod(PodContext& c, const PodSpec& spec, const std::optional<sluice_pod_record>& existing);

/// In the pod's netns: resolves @p names to the ifindexes of interfaces the
/// pod's programs are attached to, into @p cfg (a settings update).
Status resolveRerouteIfaces(PodContext& c, const std::vector<std::string>& names, sluice_pod_config& cfg);

/// In the pod's netns, socket mode: the pod's addresses for pod_sock when
/// none were given or recorded.
Status findSockAddrs(PodContext& c);

/// Whether the netns a pod was enrolled from is gone: its file is missing,
/// is no netns any more (the placeholder of an unmounted /var/run/netns
/// entry), or names another netns now.
Result<bool> recordedNetnsGone(const sluice_pod_record& rec);

}  // namespace sluice
