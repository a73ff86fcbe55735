// The pod types every sluice component speaks -- what `pod add` asks for,
// what the registry records, a pod's counters -- and the checks on pod ids
// and netns paths. No libbpf, libnl or skeletons: sluice-cni, a static
// executable, is built from these (with the agent's protocol and client).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/tc_mode.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// The pod's Kubernetes identity: what the node proxy is told when the pod
/// is handed to it (ZDS), kept in the registry. All empty for a pod enrolled
/// without one (by hand, or by a build before identities).
struct PodIdentity {
  std::string uid;             ///< metadata.uid
  std::string name;            ///< metadata.name
  std::string ns;              ///< metadata.namespace
  std::string serviceAccount;  ///< spec.serviceAccountName
  bool empty() const { return uid.empty() && name.empty() && ns.empty() && serviceAccount.empty(); }
  bool operator==(const PodIdentity&) const = default;
};

/// Lengths and characters of an identity: the uid 1-47, name and service
/// account up to 253, namespace up to 63 printable characters without spaces
/// (EINVAL naming the field otherwise); all may be empty.
Status validatePodIdentity(const PodIdentity& identity);

/// What `pod add` asks for.
struct PodSpec {
  std::string netnsPath;
  std::string id;  ///< empty: defaultPodId(netnsPath)
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> rerouteIfaces;
  /// Node side (probe SNAT): the netns holding the pod's host-side
  /// interface; "" is the caller's own netns. nullopt: no node side.
  std::optional<std::string> nodeNetnsPath;
  /// The pod's addresses for probe SNAT; empty: discovered in the pod netns
  /// (every address of its non-loopback interfaces but IPv6 link-local).
  std::vector<std::string> ips;
  /// Attach mode for this pod; nullopt: the Datapath's (DatapathOptions).
  std::optional<TcMode> tcMode;
  /// Capture mode for this pod; nullopt: the Datapath's (DatapathOptions).
  std::optional<CaptureMode> capture;
  PodIdentity identity;
};

/// The hand-off of a pod to the node proxy, as the registry records it.
enum class HandoffState { None, Acked, Failed };
/// "not handed off" | "acked" | "failed".
const char* handoffStateName(HandoffState s);

/// An enrolled pod as the registry records it.
struct PodInfo {
  std::string id;
  std::string netnsPath;
  uint64_t netnsCookie = 0;
  std::string capture = "tc";  ///< "tc" | "socket"
  std::string tcMode;  ///< "tcx" | "legacy" (socket mode: of its virtual interfaces' hooks)
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> interfaces;     ///< with TC hooks (non-loopback; socket mode: virtual interfaces)
  std::vector<std::string> rerouteIfaces;  ///< by name
  bool ipv6Routes = false;
  uint64_t enrolledAtNs = 0;
  std::string hostIface;           ///< node-side interface ("" if none)
  std::string nodeNetnsPath;       ///< "" = the enrolling process's netns
  std::vector<std::string> ips;    ///< registered for probe SNAT
  PodIdentity identity;
  HandoffState handoff = HandoffState::None;
  std::string handoffError;  ///< why the last hand-off failed
  uint64_t handoffAtNs = 0;  ///< CLOCK_REALTIME of the last hand-off change
};

/// Counters summed over CPUs.
struct PodCounters {
  std::string id;
  sluice_pod_stats stats{};
};

/// The pod id `pod add` uses when --id is not given: the netns file's name
/// (/var/run/netns/NAME → NAME), or "pid-N" for /proc/N/ns/net.
std::string defaultPodId(const std::string& netnsPath);

/// Pod ids are 1-63 characters of [A-Za-z0-9._-].
Status validatePodId(const std::string& id);

/// @p path made absolute against the working directory (and lexically
/// normalised); absolute paths are returned as they are. What the CLI and
/// the CNI plugin record: the agent's sweep runs elsewhere, and a relative
/// path there names another file -- a live pod would look gone.
std::string absoluteNetnsPath(const std::string& path);

/// "pod 'ID' is not enrolled" (ENOENT).
Error notEnrolledError(const std::string& id);

}  // namespace sluice
