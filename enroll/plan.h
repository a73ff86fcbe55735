// A pod's plan: the ordered steps an enrolled pod needs, made from its
// record (enroll/plan.cpp is the one list). `pod add` applies them in
// order, `pod remove` undoes them in reverse, `check` asks each, the
// agent's sweep repairs what is missing (enroll/runner.h).
#pragma once

#include "enroll/step.h"
#include "maps/sluice_maps.h"

namespace sluice {

/// What the plan depends on beside the record.
struct PlanFor {
  bool ipv6 = false;      ///< the IPv6 rule and route (lo has IPv6; later: the record's routes)
  bool nodeSide = false;  ///< probe SNAT on the host-side veth
  bool handoff = false;   ///< hand the pod to the node proxy
  /// Removal only: the return path's policy rule and local routes are left
  /// in place (a hand-back to Istio's node agent, whose in-pod rules use
  /// the same rule and table).
  bool keepReturnPath = false;
  /// An enrolled pod's plan: what its record says it has.
  static PlanFor enrolled(const sluice_pod_record& rec);
};

/// The steps of the pod @p rec describes, in the order they are applied.
Plan planFor(const sluice_pod_record& rec, const PlanFor& what);

}  // namespace sluice
