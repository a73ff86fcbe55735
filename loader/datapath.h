// Enrolling pods into sluice and removing them: the loader's public face,
// used by sluicectl (and later the agent).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  /// Probe SNAT connections held at once (snat_rev's capacity); the least
  /// recently used are forgotten beyond it. Tests set it low to put the map
  /// under pressure; every process sharing a bpffs root must agree.
  uint32_t snatEntries = SLUICE_SNAT_ENTRIES;
};

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
};

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
};

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

  /// Enrolls a pod netns. Idempotent for the same netns and settings; an
  /// error when the id or netns is enrolled otherwise. A failure half way
  /// rolls back everything it did.
  Result<PodInfo> addPod(const PodSpec& spec);

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

  /// A second instance of the programs (same maps), loaded when a sweep
  /// moves a tcx link to the front (moveTcxToFront); dropped after it.
  Result<PodPrograms*> stagingPrograms();

  DatapathOptions options_;
  std::unique_ptr<PodPrograms> programs_;
  std::unique_ptr<PodPrograms> staging_;
};

}  // namespace sluice
