// A pod's enrollment as steps (style.md, "Enrollment as steps"): each step
// knows how to do itself, undo itself and tell whether it is in place, so
// that `pod add` (apply in order, undo the applied ones on failure),
// `pod remove` (undo in reverse), `check` (inPlace) and the reconciliation
// (inPlace, then apply) are written once per step. The socket mode's
// enrollment is made of them (loader/socket_capture.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

/// One step of a pod's enrollment.
struct PodStep {
  std::string what;  ///< names it in messages: "IPv4 policy rule for the return mark"
  std::function<Status()> apply;
  std::function<Status()> undo;
  std::function<Result<bool>()> inPlace;
};

/// Applies @p steps in order; when one fails, the ones applied are undone in
/// reverse and its error is returned, prefixed with what it is.
Status applySteps(const std::vector<PodStep>& steps);

/// Undoes every step, in reverse, all of them even when one fails; returns
/// the first error.
Status undoSteps(const std::vector<PodStep>& steps);

/// The steps not in place, as "what" (a step that cannot tell counts as
/// not in place, with its error appended).
std::vector<std::string> stepsNotInPlace(const std::vector<PodStep>& steps);

}  // namespace sluice
