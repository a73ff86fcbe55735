// The hand-off of a pod to the node proxy (ZDS's AddWorkload and its ack):
// a step of the pod's plan that the caller supplies, because the data
// plane does not speak ZDS. Istio's order: redirection in place, then the
// hand-off, then the node side (probe SNAT).
#pragma once

#include <functional>

#include "base/pod_types.h"
#include "base/result.h"

namespace sluice {

/// What Datapath::addPod runs as the plan's hand-off step. Its outcome is
/// recorded in the registry (HandoffState). `undo` runs when a later step
/// fails after `apply` was tried (and, when failures are fatal, succeeded).
struct Handoff {
  std::function<Status(const PodInfo&)> apply;
  std::function<void(const PodInfo&)> undo;
  /// true (the CNI path): `apply` failing fails the enrollment and rolls
  /// everything back, so the runtime retries the sandbox. false (a running
  /// pod enrolled by the Kubernetes controller): the redirection stays in
  /// place with the hand-off recorded as failed, and addPod succeeds; the
  /// caller retries the hand-off with addPod later (Istio's "pending").
  bool failureIsFatal = true;
};

}  // namespace sluice
