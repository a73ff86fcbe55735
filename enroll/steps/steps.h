// The steps a pod's plan is made of (enroll/plan.cpp puts them in order),
// one file each in this folder.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "enroll/step.h"
#include "loader/programs.h"
#include "loader/tc.h"

namespace sluice {

// ---- no netns: the registry, pins, maps, the node-wide hooks ----

/// The pod's record in the registry (`pods`): claims the id first, goes
/// last (and only when every other undo succeeded, so removal can be retried).
std::unique_ptr<Step> registryStep();
/// The pod's pin directory (<root>/links/<id>); undo removes it with what is left in it.
std::unique_ptr<Step> linkDirStep();
/// Socket mode: the node-wide cgroup hooks (shared by every pod: undo leaves them).
std::unique_ptr<Step> nodeHooksStep();
/// What the programs keep of the pod by themselves (probe SNAT state, its
/// proxy listeners, DNS translations): undo forgets it.
std::unique_ptr<Step> programStateStep();
/// The pod's counters (pod_stats).
std::unique_ptr<Step> podStatsStep();
/// pod_config: the entry that switches the pod's redirection on.
std::unique_ptr<Step> podConfigStep();
/// Socket mode: pod_sock, the socket programs' entry of the pod.
std::unique_ptr<Step> podSockStep();
/// The hand-off to the node proxy (PodContext::handoff).
std::unique_ptr<Step> handoffStep();
/// The node side: the pod's addresses in pod_addrs (Istio's probe ipset),
/// with the node netns whose sockets get the probe source towards them.
std::unique_ptr<Step> podAddrsStep();
/// The node's probe hook (cgroup connect4/connect6, once per node; undo leaves it).
std::unique_ptr<Step> probeHookStep();

// ---- in the pod's netns ----

/// net.ipv4.conf.<iface>.accept_local = 1 on pod interface @p slot (tc mode:
/// a looped-back outbound packet has the pod's own source).
std::unique_ptr<Step> acceptLocalStep(uint32_t slot, const std::string& name);
/// The policy rule delivering the return mark locally (rule 4).
std::unique_ptr<Step> returnRuleStep(int family);
/// The local default route of sluice's table, through lo.
std::unique_ptr<Step> localRouteStep(int family);
/// Socket mode: net.ipv4.tcp_fwmark_accept = 1 (an accepted socket keeps the return mark).
std::unique_ptr<Step> fwmarkAcceptStep();
/// Socket mode: the pod's own sk_lookup program (rules 6-8).
std::unique_ptr<Step> skLookupStep();
/// Socket mode: the proxy's listeners already open in the pod's netns,
/// registered where pod_sk_lookup finds them (pod_sockops sees only those
/// opened after the node's hooks were attached).
std::unique_ptr<Step> proxyListenersStep();

// ---- in the node netns ----

/// Finds the pod's host-side veth and records it (none found in the
/// caller's own netns: no probe source, not an error).
std::unique_ptr<Step> hostVethStep();
/// The probe addresses on the node's lo (shared by the node's pods; undo leaves them).
std::unique_ptr<Step> probeAddrsStep();

// ---- TC hooks, pod side or host side ----

/// Which interface a TC hook is on, read from the record when the step runs.
struct TcIface {
  enum Kind { PodIface, Lo, Host } kind = PodIface;
  uint32_t slot = 0;  ///< PodIface: index into the record's ifaces
};
/// Which of the loaded programs runs there.
using ProgramFd = int (PodPrograms::*)() const;
/// A TC hook: a tcx link pinned in the pod's directory, or a clsact filter.
/// @p ownsClsact: this hook's undo deletes the clsact qdisc sluice created
/// (the interface's first hook, undone last).
std::unique_ptr<Step> tcHookStep(TcIface iface, TcHook hook, ProgramFd program, bool ownsClsact);

}  // namespace sluice
