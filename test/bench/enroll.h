// Pod enrollment and removal as a cluster pays for it, node side included:
// sluice's Datapath (in process, every capture mode) with the pod's
// host-side veth in a node netns, the sluicectl CLI (--node-netns), and
// Istio's whole per-pod path (in the pod: iptables-restore of its rules +
// the policy-route script, nf_tables and legacy; on the node: the pod's
// address in its probe ipset), each in fresh network namespaces. Only the
// enrollment work is timed: namespaces and their veths are made
// beforehand, in bulk (PodFarm).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "test/bench/cases.h"
#include "test/bench/iptables.h"

namespace sluice::bench {

/// N pod namespaces, each with lo and an eth0 (10.222.x.y/16) whose veth
/// peer lives in one shared "node" namespace. All deleted on destruction.
class PodFarm {
 public:
  static Result<std::unique_ptr<PodFarm>> create(int pods);
  ~PodFarm();
  PodFarm(const PodFarm&) = delete;
  PodFarm& operator=(const PodFarm&) = delete;
  int size() const { return static_cast<int>(pods_.size()); }
  const std::string& name(int i) const { return pods_[static_cast<size_t>(i)]; }
  std::string path(int i) const { return "/run/netns/" + name(i); }
  /// The shared node netns holding the pods' host-side veths.
  std::string nodePath() const { return "/run/netns/" + node_; }
  /// Pod i's eth0 address.
  static std::string address(int i);
  /// What the CNI plugins before sluice's in a chain leave in pod i's netns
  /// just before it is enrolled: the `bridge` plugin writes
  /// net.ipv4.conf.eth0.arp_notify (and IPv6's accept_dad) there, so the
  /// pod's /proc/sys/net has been looked up once. The kernel's first such
  /// lookup in a netns compares the entry of every other netns that has
  /// one, which a later lookup in the same netns does not
  /// (docs/benchmarks.md). Not timed. Nothing when `bare`. A failure says
  /// which pod ("the CNI chain before pod N: ...").
  Status cniChainBefore(int i) const;
  /// --bare-netns: pods as `ip netns add` leaves them (no plugin ran).
  static inline bool bare = false;

 private:
  PodFarm() = default;
  std::string node_;
  std::vector<std::string> pods_;
};

/// Counts a phase's failures and keeps the first one's text.
struct Failures {
  uint64_t failures = 0;
  std::string firstError;
  void fail(const std::string& what) {
    failures++;
    if (firstError.empty()) firstError = what;
  }
};

/// Enroll / removal times of one path, milliseconds, in pod order.
struct PathTimes : Failures {
  CaseKind kind;
  /// Enrolled as in a cluster, node side included (sluice: the pod's
  /// host-side veth in the farm's node netns, PodSpec::nodeNetnsPath, as
  /// `sluicectl pod add --node-netns` does; Istio: the pod's address in the
  /// node's probe ipset). false: sluice's in-pod part alone (no node side).
  bool nodeSide = true;
  std::vector<double> addMs, removeMs;  ///< the whole add / removal
  std::vector<double> v4Ms, v6Ms, routeMs;  ///< iptables paths: the three in-pod steps of an add
  std::vector<double> inPodMs, nodeMs;  ///< iptables paths: an add's in-pod part (the three steps) and node part (ipset)
  std::vector<std::string> checks;  ///< what verified that the work was done
  bool verified = false;
};

struct EnrollResult {
  int pods = 0;
  std::vector<PathTimes> paths;
};

/// @p pods pods per path, the paths interleaved pod by pod. Every sluice
/// kind runs twice: whole (node side) and its in-pod part alone.
EnrollResult runEnrollBench(int pods, const std::vector<CaseKind>& kinds, const IstioRules* rules);

/// sluicectl as a process: `pod add --node-netns` / `pod remove` times
/// (including the process start) and peak RSS. The first `pod add` on the
/// fresh root loads, verifies and pins the programs (firstAddMs); the others
/// reuse the pins. Beside it, pod by pod on pods of their own, Istio's
/// per-pod processes (when @p rules): iptables-restore, ip6tables-restore
/// and the route script (ip rule / ip route) in the pod, `ipset add` on the
/// node.
struct CliResult : Failures {
  double firstAddMs = 0;
  std::vector<double> addMs, removeMs;
  long addMaxRssKb = 0, removeMaxRssKb = 0;
  std::vector<double> istioAddMs, istioRemoveMs;  ///< Istio's processes, whole
  std::vector<double> istioInPodMs, istioNodeMs;  ///< the in-pod processes / `ipset add`
  std::vector<std::string> checks;
};
CliResult runCliBench(int pods, const IstioRules* rules);

/// Enrollment as a container runtime does it with the hand-off to the node
/// proxy: the sluice-cni process (ADD, DEL) -> sluiced --ztunnel-socket ->
/// AddWorkload and its ack from the node proxy stand-in, timed as whole
/// processes. One agent and one stand-in per mode, pods in a PodFarm.
struct HandOffResult : Failures {
  std::string mode;  ///< socket (the CNI config's capture), or tcx / legacy (its tcMode)
  std::vector<double> addMs, removeMs;
  long addMaxRssKb = 0;
  std::vector<std::string> checks;  ///< node side included: every pod has its host-side veth
  bool verified = false;
};
std::vector<HandOffResult> runHandOffBench(int pods, const std::vector<std::string>& modes);

struct MapMem {
  std::string name, type;
  uint32_t maxEntries = 0;
  uint64_t memlock = 0;  ///< bytes (fdinfo "memlock", what bpftool map show prints)
};
/// The maps pinned under a bpffs root.
std::vector<MapMem> mapMemory(const std::string& root);
uint64_t fdinfoMemlock(int fd);

struct ScaleResult : Failures {
  std::string mode;  ///< "tcx" | "socket"
  int pods = 0;
  std::vector<double> addMs, removeMs;
  long rssBeforeKb = 0, rssAfterOpenKb = 0, rssAfterPodsKb = 0;
  std::vector<MapMem> mapsBefore, mapsAfter;
  uint64_t progMemlock = 0;
  std::string stubs;  ///< socket mode: how the sk_lookup programs were had
  std::string nodeSide;  ///< how many pods got their host-side veth (node side)
  // sluicectl with `pods` pods enrolled
  double cliAddMs = 0, cliListMs = 0, cliRemoveMs = 0;
  long cliAddRssKb = 0, cliListRssKb = 0, cliRemoveRssKb = 0;
  bool verified = false;
};
/// @p pods pods enrolled in one Datapath captured as @p capture (TC: tcx),
/// node side included.
ScaleResult runScaleBench(int pods, CaptureMode capture);

}  // namespace sluice::bench
