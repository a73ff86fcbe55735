// Runs a pod's plan (enroll/plan.h): apply, undo, check, repair, a
// settings update. Consecutive steps of the same Where form a group; the
// runner enters that netns once per group and checks its cookie once.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "enroll/context.h"
#include "enroll/step.h"

namespace sluice {

/// What a look at one enrolled pod found (and, when repairing, did).
struct PodCheck {
  std::string id;
  bool gone = false;                  ///< its netns no longer exists
  std::vector<std::string> problems;  ///< damage found
  std::vector<std::string> repaired;  ///< damage fixed (repair mode only)
  int programsReplaced = 0;           ///< hooks switched to this Datapath's programs
};

/// Runs @p fn in the pod's netns as the runner does for a group of Pod
/// steps (its cookie checked against the record, c.inPodNetns set); an
/// error names the pod when its netns is gone or is another one now.
Status inPodNetns(PodContext& c, const std::function<Status()>& fn);

/// Applies the steps in order; when one fails, the ones applied are undone
/// in reverse and its error is returned (prefixed with what it is). The
/// record is saved once at the end.
Status applyPlan(const Plan& plan, PodContext& c);

/// Undoes every step in reverse, all of them even when one fails; returns
/// the first error. In a netns that is gone, steps forget what outlives it.
Status undoPlan(const Plan& plan, PodContext& c);

/// Asks every step; with @p repair, applies what is missing and adopts
/// what runs another build's program. A pod whose netns is gone: `gone`,
/// nothing else looked at.
PodCheck checkPlan(const Plan& plan, PodContext& c, bool repair);

/// A settings update: re-applies the steps that follow the pod's capture
/// settings (c.rec holds the new ones); on failure re-applies them with
/// @p before and returns the error.
Status applySettings(const Plan& plan, PodContext& c, const sluice_pod_record& before);

}  // namespace sluice
