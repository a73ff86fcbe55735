// Enrolling pods into sluice and removing them: the facade sluicectl, the
// CNI path and the agent use. What enrolling does is the pod's plan
// (enroll/plan.cpp), run by enroll/runner.h; this class holds the loaded
// programs, takes the state lock and keeps the registry.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "base/pod_types.h"
#include "base/result.h"
#include "base/tc_mode.h"
#include "enroll/handoff.h"
#include "enroll/plan.h"
#include "enroll/proxy_identity.h"
#include "enroll/registry.h"
#include "enroll/runner.h"
#include "enroll/settings.h"
#include "loader/bpffs.h"
#include "loader/pod_guard.h"
#include "loader/programs.h"
#include "maps/sluice_maps.h"

namespace sluice {

struct PodContext;

struct DatapathOptions {
  std::string bpffsRoot = SLUICE_DEFAULT_BPFFS_ROOT;
  TcMode tcMode = TcMode::Auto;
  /// Where pods are captured: at the socket or at TC (auto: the socket
  /// where the kernel has its hooks).
  CaptureMode capture = CaptureMode::Auto;
  /// The cgroup v2 directory the socket mode's node hooks attach at; empty:
  /// the root of the cgroup v2 hierarchy (every process of the node).
  std::string cgroupPath;
  Settings settings;
  /// Take the settings pinned under bpffsRoot (the agent's, say its
  /// --host-probe-snat-ip) when there are any, instead of imposing
  /// `settings`: a process that works beside the agent (sluicectl).
  bool adoptPinnedSettings = false;
  /// Probe SNAT connections held at once (snat_rev's capacity); the least
  /// recently used are forgotten beyond it. Tests set it low to put the map
  /// under pressure; every process sharing a bpffs root must agree.
  uint32_t snatEntries = SLUICE_SNAT_ENTRIES;
  /// Socket mode: the pods' own sk_lookup programs kept loaded ahead by a
  /// background thread (loader/sk_lookup_stubs.h), so that an enrollment
  /// does not load one (~0.5 ms). 0: each is loaded at its enrollment (a
  /// one-shot process). The agent keeps kSkLookupStubsAhead.
  size_t skLookupStubsAhead = 0;
  /// Attach the pod guard (loader/pod_guard.h) at the first enrollment.
  /// Off only for tests that share a machine: each attach and detach of a
  /// BPF LSM link patches kernel text, which an emulated guest pays for.
  bool podGuard = podGuardWanted();
};

/// What a long-running process that enrolls pods keeps loaded ahead.
inline constexpr size_t kSkLookupStubsAhead = 16;

/// How an enrolled pod's traffic is captured: what Datapath::updatePodSettings
/// changes in place (the PodSpec fields of the same names).
struct CaptureSettings {
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> rerouteIfaces;
};

/// A pod's enrollment made ready but not run: the context its steps run
/// with (filled in by discovery in its netns) and what its plan depends on.
struct PreparedPod {
  PodContext context;
  PlanFor what;
};

/// One reconciliation sweep over every enrolled pod.
struct ReconcileReport {
  size_t pods = 0;                   ///< enrolled before the sweep
  std::vector<std::string> removed;  ///< pods whose netns was gone
  std::vector<PodCheck> repaired;    ///< pods that had damage (fixed or not)
  int programsReplaced = 0;          ///< hooks now running this Datapath's programs
  std::vector<std::string> errors;   ///< what could not be done, one line each
};

class Datapath {
 public:
  /// Mounts bpffs if needed, loads the programs, creates or reuses the
  /// pinned maps and writes the global settings (first time), or checks
  /// them against the pinned ones.
  static Result<std::unique_ptr<Datapath>> open(const DatapathOptions& options);

  /// Enrolls a pod netns. Idempotent for the same netns, settings and
  /// identity; an error when the id or netns is enrolled otherwise. A pod
  /// whose netns is gone does not block its id or addresses: it is removed
  /// first (and a warning says so). Relative netns paths are refused. A
  /// failure half way rolls back everything it did. With @p hook, its apply
  /// runs after the redirection is in place (again for an enrolled pod: a
  /// retried hand-off; failing then leaves the enrollment in place, and is
  /// an error only when hook->failureIsFatal).
  Result<PodInfo> addPod(const PodSpec& spec, const Handoff* hook = nullptr);

  /// What addPod does before it runs the pod's plan, and nothing after:
  /// the spec checked, the pod's netns discovered into a context, what the
  /// plan depends on (planFor(context.rec, what) is the plan addPod would
  /// run). Nothing is applied. For tests that drive the steps one at a time
  /// (test/netns/plan_steps_test.cpp). An id enrolled already: EEXIST.
  Result<PreparedPod> preparePod(const PodSpec& spec, const Handoff* hook = nullptr);

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
  /// removePod, leaving the pod's return path (policy rule and local
  /// routes) in place: the pod goes back to Istio's node agent, whose
  /// connmark restore routes replies by the same rule and table.
  Status removePodKeepingReturnPath(const std::string& id);

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

  /// The capture a pod spec asking for @p requested gets here: socket or
  /// tc (auto resolved by the kernel's features and the loaded programs);
  /// ENOTSUP naming why when the socket mode is asked for and unavailable.
  Result<CaptureMode> resolveCapture(CaptureMode requested) const;
  /// The cgroup the node hooks attach at (DatapathOptions::cgroupPath or
  /// the cgroup v2 root).
  Result<std::string> nodeCgroup() const;

  const DatapathOptions& options() const { return options_; }
  PodPrograms& programs() { return *programs_; }

  /// Attaches the pod guard (loader/pod_guard.h) unless options say not
  /// to or this Datapath did already: at its first enrollment, and by the
  /// agent at start when pods are enrolled (an upgrade from a build
  /// without it). Never an error: where it cannot run it is logged and
  /// `sluicectl status` says why.
  void ensurePodGuardFor();

 private:
  Datapath(DatapathOptions options, std::unique_ptr<PodPrograms> programs)
      : options_(std::move(options)), programs_(std::move(programs)) {}

  /// An enrolled pod's record, read with the state lock held.
  struct LockedPod {
    StateLock lock;
    sluice_pod_record rec;
  };
  /// Validates @p id, takes the state lock, reads the pod's record; an
  /// error when it is not enrolled.
  Result<LockedPod> lockedPod(const std::string& id);
  /// The context a pod's steps run with, from its record.
  PodContext contextFor(const std::string& id, const sluice_pod_record& rec);
  /// addPod and preparePod up to the plan: the spec checked, the state
  /// lock taken, the pod discovered.
  struct Preparation {
    StateLock lock;
    std::string id;
    PreparedPod pod;
    std::optional<sluice_pod_record> existing;
    bool alreadyEnrolled = false;
  };
  Result<Preparation> prepare(const PodSpec& spec, const Handoff* hook);
  /// addPod up to its plan, the state lock held (in @p p): the pod @p spec
  /// names, discovered into p.pod; its record in the registry, if any, in
  /// p.existing (p.alreadyEnrolled: with the same settings).
  Status prepareLocked(const PodSpec& spec, const Handoff* hook, Preparation& p);
  /// The retried enrollment of a pod enrolled with the same settings: the
  /// hand-off again (a failure leaves the enrollment as it was).
  Result<PodInfo> retryHandoff(const std::string& id, const sluice_pod_record& rec, const Handoff* hook);
  /// An enrolled pod whose enrollment was cut short before its node side
  /// (the enroller killed): the node's steps of its plan, with what
  /// discovery @p found in its netns now.
  Status completeNodeSide(const std::string& id, const sluice_pod_record& rec, const PodContext& found);
  Status teardown(const std::string& id, const sluice_pod_record& rec, bool keepReturnPath = false);
  /// teardown of a pod whose netns is gone and that still holds something
  /// a new enrollment needs (@p held: "its id", "address A"); says so.
  Status reapStale(const std::string& id, const sluice_pod_record& rec, const std::string& held);
  /// Socket mode: the node-wide hooks re-made and switched to this
  /// Datapath's programs, before a sweep looks at the pods.
  void reconcileNodeHooks(const std::vector<sluice_pod_id>& keys, ReconcileReport& report);
  void reconcileProbeHook(const std::vector<sluice_pod_id>& keys, ReconcileReport& report);

  /// A second instance of the programs (same maps), loaded when a sweep
  /// moves a tcx link to the front (moveTcxToFront); dropped after it.
  Result<PodPrograms*> stagingPrograms();

  /// Socket mode, before a pod's steps: the node hooks in place at the
  /// node cgroup (ensureNodeHooks). Checked link by link the first time and
  /// whenever the cgroup changed; otherwise by nodeHooksComplete, with the
  /// full check only when that finds something missing, or @p full. The
  /// lock held.
  Status ensureNodeHooksFor(bool full = false);

  DatapathOptions options_;
  std::unique_ptr<PodPrograms> programs_;
  std::unique_ptr<PodPrograms> staging_;
  /// The node's probe hook in place (ensureProbeHook): checked fully once
  /// per process and cgroup, then by its pins.
  Status ensureProbeHookFor(bool full = false);
  std::optional<std::string> probeHookChecked_;
  bool probeHookSwept_ = false;  ///< a sweep compared the probe hook's programs with this build's
  /// The cgroup (path, id) ensureNodeHooksFor last checked fully.
  std::optional<std::pair<std::string, uint64_t>> nodeHooksChecked_;
  /// The pod guard (loader/pod_guard.h) was ensured by this Datapath:
  /// once per process, at its first enrollment, in either mode.
  bool podGuardChecked_ = false;
};

}  // namespace sluice
