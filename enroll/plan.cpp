// What enrolling a pod does, in order. Each line is a step (one file each
// in enroll/steps/) that can apply, undo and check itself; removal runs the
// same list backwards. The order is Istio's: the pod's netns is set up, the
// redirection switches on (pod_config), the pod is handed to the node proxy
// (ZDS AddWorkload, acked), and the node side (probe SNAT) comes last; so
// on removal the probe set is left first and the redirection stops before
// the pod's netns is undone.
#include "enroll/plan.h"

#include <sys/socket.h>

#include "enroll/registry.h"
#include "enroll/steps/steps.h"

namespace sluice {

PlanFor PlanFor::enrolled(const sluice_pod_record& rec) {
  PlanFor p;
  p.ipv6 = rec.routes & SLUICE_ROUTES_V6;
  p.nodeSide = rec.host_iface.ifindex != 0;
  return p;
}

namespace {

// Rule 4's return path: replies with the return mark are delivered locally.
void returnPath(Plan& plan, const PlanFor& what) {
  if (what.keepReturnPath) return;
  for (int family : {AF_INET, AF_INET6}) {
    if (family == AF_INET6 && !what.ipv6) continue;
    plan.push_back(returnRuleStep(family));
    plan.push_back(localRouteStep(family));
  }
}

// tc mode, in the pod's netns: accept_local on each interface, the return
// path, then the programs on each interface and on lo's egress. The
// programs pass everything until the pod's config is in the map, so
// attaching before it is safe.
void tcPod(Plan& plan, const sluice_pod_record& rec, const PlanFor& what) {
  for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++)
    plan.push_back(acceptLocalStep(i, ifaceName(rec.ifaces[i])));
  returnPath(plan, what);
  for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
    plan.push_back(tcHookStep({TcIface::PodIface, i}, TcHook::Ingress, &PodPrograms::ingressFd, true));
    plan.push_back(tcHookStep({TcIface::PodIface, i}, TcHook::Egress, &PodPrograms::egressFd, false));
  }
  plan.push_back(tcHookStep({TcIface::Lo, 0}, TcHook::Egress, &PodPrograms::loEgressFd, true));
}

// Socket mode, in the pod's netns: the return path, tcp_fwmark_accept, the
// pod's sk_lookup program, the proxy's listeners it hands connections to
// (those opened before the node's hooks saw them), and a TC ingress hook on each virtual (reroute)
// interface (what arrives there is forwarded, never looked up as a local
// socket's).
void socketPod(Plan& plan, const sluice_pod_record& rec, const PlanFor& what) {
  returnPath(plan, what);
  plan.push_back(fwmarkAcceptStep());
  plan.push_back(skLookupStep());
  plan.push_back(proxyListenersStep());
  for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++)
    plan.push_back(tcHookStep({TcIface::PodIface, i}, TcHook::Ingress, &PodPrograms::ingressFd, true));
}

}  // namespace

Plan planFor(const sluice_pod_record& rec, const PlanFor& what) {
  const bool socket = rec.capture == SLUICE_CAPTURE_SOCKET;
  Plan plan;
  plan.push_back(registryStep());  // claims the id; removed last
  if (socket) plan.push_back(nodeHooksStep());
  plan.push_back(linkDirStep());
  if (socket)
    socketPod(plan, rec, what);
  else
    tcPod(plan, rec, what);
  plan.push_back(programStateStep());
  plan.push_back(podStatsStep());
  plan.push_back(podConfigStep());  // the redirection is on from here
  if (socket) plan.push_back(podSockStep());
  if (what.handoff) plan.push_back(handoffStep());
  if (what.nodeSide) {
    plan.push_back(hostVethStep());
    plan.push_back(probeAddrsStep());
    plan.push_back(probeHookStep());
    plan.push_back(podAddrsStep());  // probes get the probe source from here
  }
  return plan;
}

}  // namespace sluice
