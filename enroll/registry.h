// The registry of enrolled pods (the pinned `pods` map, keyed by pod id):
// how a record's fixed-size fields are written and read back, and how a
// record reads as PodInfo. No kernel calls: pure conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/pod_types.h"
#include "base/result.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// @p s into a NUL-padded field of @p cap bytes (cut to cap - 1).
void copyString(char* dst, size_t cap, const std::string& s);
/// A NUL-padded field of @p cap bytes as a string.
std::string fromFixed(const char* s, size_t cap);

/// The registry key of pod @p id.
sluice_pod_id podKey(const std::string& id);
/// The id a registry key holds.
inline std::string podIdOf(const sluice_pod_id& key) { return fromFixed(key.id, sizeof(key.id)); }
/// The netns path a record holds.
inline std::string netnsPathOf(const sluice_pod_record& rec) { return fromFixed(rec.netns_path, sizeof(rec.netns_path)); }
/// The node netns path a record holds; "" is the enrolling process's own.
inline std::string nodeNetnsPathOf(const sluice_pod_record& rec) {
  return fromFixed(rec.node_netns_path, sizeof(rec.node_netns_path));
}
inline std::string ifaceName(const sluice_pod_iface& i) { return fromFixed(i.name, sizeof(i.name)); }

Result<sluice_pod_addr> parsePodAddr(const std::string& text);
std::string formatPodAddr(const sluice_pod_addr& a);

/// pod_config flags of the capture switches.
uint32_t captureFlags(bool dnsCapture, bool inboundCapture);
bool sameConfig(const sluice_pod_config& a, const sluice_pod_config& b);

void recordIdentity(sluice_pod_record& rec, const PodIdentity& id);
void recordHandoff(sluice_pod_record& rec, HandoffState state, const std::string& error);

/// Reads PodInfo out of a registry record.
PodInfo podInfoFromRecord(const std::string& id, const sluice_pod_record& rec);

/// "dns-capture on, inbound-capture off, reroute-iface X".
std::string describeConfig(const PodInfo& p);
/// "uid 'U', ns/name" or "no identity".
std::string describeIdentity(const PodIdentity& id);
/// The refusal of a `pod add` whose settings differ from the enrolled
/// pod's; names the settings in force (EEXIST).
Error otherSettingsError(const PodInfo& enrolled);

/// The pod_sock entry of a pod: its flags and virtual interfaces (from the
/// record) and its addresses (the first SLUICE_SOCK_POD_ADDRS of each family).
sluice_pod_sock podSockValue(const sluice_pod_record& rec, const std::vector<sluice_pod_addr>& addrs);

/// CLOCK_REALTIME in nanoseconds (the record's timestamps).
uint64_t nowNs();

}  // namespace sluice
