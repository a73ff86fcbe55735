// Enrolling pods into sluice and removing them: the loader's public face,
// used by sluicectl (and later the agent).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "loader/programs.h"
#include "loader/result.h"
#include "loader/tc.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// Global settings; defaults are the spec's (Istio's) values.
struct Settings {
  uint16_t outboundPort = SLUICE_DEFAULT_OUTBOUND_PORT;
  uint16_t inboundPort = SLUICE_DEFAULT_INBOUND_PORT;
  uint16_t hbonePort = SLUICE_DEFAULT_HBONE_PORT;
  uint16_t dnsPort = SLUICE_DEFAULT_DNS_PORT;
  uint32_t proxyMark = SLUICE_DEFAULT_PROXY_MARK;
  uint32_t returnMark = SLUICE_DEFAULT_RETURN_MARK;
  uint32_t markMask = SLUICE_DEFAULT_MARK_MASK;
  std::string probeV4 = SLUICE_DEFAULT_PROBE_V4;
  std::string probeV6 = SLUICE_DEFAULT_PROBE_V6;
};

/// Converts Settings to the map layout; errors name the bad field.
Result<sluice_settings> encodeSettings(const Settings& s);

struct DatapathOptions {
  std::string bpffsRoot = SLUICE_DEFAULT_BPFFS_ROOT;
  TcMode tcMode = TcMode::Auto;
  Settings settings;
};

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
  std::string tcMode;  ///< "tcx" | "legacy"
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> interfaces;     ///< attached (non-loopback)
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

/// An enrollment step outside the data plane, run by Datapath::addPod once
/// the pod's redirection is in place and before the node side (probe SNAT)
/// is, as Istio's agent orders it: the hand-off of the pod to the node
/// proxy. Its outcome is recorded in the registry (HandoffState).
/// `undo` runs when a later step fails after `apply` was tried (and, when
/// failures are fatal, succeeded).
struct EnrollHook {
  std::function<Status(const PodInfo&)> apply;
  std::function<void(const PodInfo&)> undo;
  /// true (the CNI path): `apply` failing fails the enrollment and rolls
  /// everything back, so the runtime retries the sandbox. false (a running
  /// pod enrolled by the Kubernetes controller): the redirection stays in
  /// place with the hand-off recorded as failed, and addPod succeeds; the
  /// caller retries the hand-off with addPod later (Istio's "pending").
  bool failureIsFatal = true;
};

/// How an enrolled pod's traffic is captured: what Datapath::updatePodSettings
/// changes in place (the PodSpec fields of the same names).
struct CaptureSettings {
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> rerouteIfaces;
};

/// A cgroup (v2) of the node proxy, as proxy_cgroups records it.
struct ProxyCgroup {
  uint64_t id = 0;
  uint32_t pid = 0;       ///< the proxy process seen in it
  uint64_t sinceNs = 0;   ///< CLOCK_REALTIME when first seen
};

/// How the programs tell the node proxy's traffic (rule 5): the mark alone,
/// or the mark from one of the proxy's cgroups.
struct ProxyIdentity {
  bool cgroupCheck = false;
  std::vector<ProxyCgroup> cgroups;
};

/// The proxy identity pinned under @p root, read from the pins without
/// loading programs or taking the lock; nullopt when nothing is pinned.
/// @p mark and @p mask get the pinned settings' proxy mark.
Result<std::optional<ProxyIdentity>> readPinnedProxyIdentity(const std::string& root, uint32_t& mark, uint32_t& mask);

/// Counters summed over CPUs.
struct PodCounters {
  std::string id;
  sluice_pod_stats stats{};
};

/// What a look at one enrolled pod found (and, when repairing, did).
struct PodCheck {
  std::string id;
  bool gone = false;                  ///< its netns no longer exists
  std::vector<std::string> problems;  ///< damage found
  std::vector<std::string> repaired;  ///< damage fixed (repair mode only)
  int programsReplaced = 0;           ///< hooks switched to this Datapath's programs
};

/// One reconciliation sweep over every enrolled pod.
struct ReconcileReport {
  size_t pods = 0;                   ///< enrolled before the sweep
  std::vector<std::string> removed;  ///< pods whose netns was gone
  std::vector<PodCheck> repaired;    ///< pods that had damage (fixed or not)
  int programsReplaced = 0;          ///< hooks now running this Datapath's programs
  std::vector<std::string> errors;   ///< what could not be done, one line each
};

/// The pod id `pod add` uses when --id is not given: the netns file's name
/// (/var/run/netns/NAME → NAME), or "pid-N" for /proc/N/ns/net.
std::string defaultPodId(const std::string& netnsPath);

/// Pod ids are 1-63 characters of [A-Za-z0-9._-].
Status validatePodId(const std::string& id);

/// "pod 'ID' is not enrolled" (ENOENT).
Error notEnrolledError(const std::string& id);

/// The refusal of a `pod add` whose settings differ from the enrolled
/// pod's; names the settings in force (EEXIST).
Error otherSettingsError(const PodInfo& enrolled);

/// Reads PodInfo out of a registry record.
PodInfo podInfoFromRecord(const std::string& id, const sluice_pod_record& rec);

class Datapath {
 public:
  /// Mounts bpffs if needed, loads the programs, creates or reuses the
  /// pinned maps and writes the global settings (first time), or checks
  /// them against the pinned ones.
  static Result<std::unique_ptr<Datapath>> open(const DatapathOptions& options);

  /// Enrolls a pod netns. Idempotent for the same netns, settings and
  /// identity; an error when the id or netns is enrolled otherwise. A
  /// failure half way rolls back everything it did. With @p hook, its apply
  /// runs after the redirection is in place (again for an enrolled pod: a
  /// retried hand-off; failing then leaves the enrollment in place, and is
  /// an error only when hook->failureIsFatal).
  Result<PodInfo> addPod(const PodSpec& spec, const EnrollHook* hook = nullptr);

  /// Changes an enrolled pod's capture settings in place, without a gap in
  /// capture: its pod_config entry (what the programs read) is replaced in
  /// one map update, so every packet sees the old settings or the new ones.
  /// Reroute interfaces are resolved to ifindexes in the pod's netns and
  /// must be interfaces the programs are attached to. The registry record
  /// follows (first, so a failure between the two is repaired by the sweep
  /// towards the new settings). Same settings: nothing is written. Errors:
  /// ENOENT (not enrolled), ENODEV (no such interface), EINVAL, and nothing
  /// changed.
  Result<PodInfo> updatePodSettings(const std::string& id, const CaptureSettings& settings);

  /// Records the outcome of a hand-off of pod @p id in the registry (no-op
  /// for a pod not enrolled). Takes no lock: callers serialize it with the
  /// pod's add and removal (the agent's datapath mutex).
  Status setHandoff(const std::string& id, HandoffState state, const std::string& error = "");

  /// Undoes an enrollment: redirection stops first, then attachments,
  /// rules, routes, sysctls and map entries go. A pod whose netns is gone is
  /// cleaned up too.
  Status removePod(const std::string& id);

  /// The id of the pod enrolled from netnsPath (same netns), if any.
  Result<std::string> podIdForNetns(const std::string& netnsPath);

  std::vector<PodInfo> listPods();

  /// Looks at an enrolled pod without changing anything: attachments,
  /// sysctls, policy rules and routes, node side, map entries.
  Result<PodCheck> checkPod(const std::string& id);

  /// The agent's sweep: pods whose netns is gone are removed; damaged pods
  /// are repaired (missing attachments re-made, rules, routes, sysctls and
  /// map entries restored); every hook is switched in place to this
  /// Datapath's programs (bpf_link_update for tcx, a filter replace for
  /// clsact), which is how a newer build takes over without a gap.
  ReconcileReport reconcile();

  /// The node proxy runs as process @p pid (a ZDS peer): its cgroup v2
  /// joins proxy_cgroups and the cgroup check turns on, so that the proxy
  /// mark counts only from the proxy's cgroups. Returns the cgroup id.
  /// Cgroups that are gone are forgotten first when the map is full.
  Result<uint64_t> addProxyProcess(pid_t pid);
  /// Forgets the proxy cgroups that no longer exist; returns how many.
  size_t pruneProxyCgroups();
  /// Back to the mark alone (an agent that hands no pod to a node proxy).
  Status clearProxyIdentity();
  ProxyIdentity proxyIdentity();

  /// Counters of one pod (id) or all.
  Result<std::vector<PodCounters>> stats(const std::optional<std::string>& id);

  const DatapathOptions& options() const { return options_; }
  PodPrograms& programs() { return *programs_; }

 private:
  Datapath(DatapathOptions options, std::unique_ptr<PodPrograms> programs)
      : options_(std::move(options)), programs_(std::move(programs)) {}

  std::string linkDir(const std::string& id) const;
  /// checkPod / reconcile of one pod, the lock held.
  PodCheck inspect(const std::string& id, const sluice_pod_record& rec, bool repair);
  Status teardown(const std::string& id, const sluice_pod_record& rec);
  /// Node side of addPod: finds the host-side veth in the node netns and
  /// attaches the probe SNAT programs; registers the pod's addresses.
  Status addNodeSide(const std::string& id, const PodSpec& spec, int podVethIfindex, int peerIfindex,
                     sluice_pod_record& rec);

  DatapathOptions options_;
  std::unique_ptr<PodPrograms> programs_;
};

}  // namespace sluice
