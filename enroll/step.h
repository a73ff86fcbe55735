// One step of a pod's enrollment (enroll/plan.h lists them in order): a
// small unit that knows how to do itself, undo itself, tell whether it is
// in place and, for a hook, take over in place what another build left.
// The runner (enroll/runner.h) drives every step the same way for `pod
// add`, `pod remove`, `check` and the agent's repair.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

struct PodContext;

/// Where a step works: the runner enters that netns once per run of
/// consecutive steps of the same kind, and checks its cookie once.
enum class Where {
  Host,  ///< no netns: maps, pins and cgroups, seen from any netns
  Pod,   ///< the pod's netns
  Node,  ///< the netns holding the pod's host-side interface
};

enum class StepState {
  InPlace,
  Missing,  ///< not there (apply makes it)
  Foreign,  ///< there, but running another build's program or not first in line (adopt takes it over)
  Unknown,  ///< cannot tell, or damage apply cannot mend (problems say why)
};

/// What check found: the state and, unless in place, what is wrong (one
/// line each; a Foreign step that only runs another build's program has
/// none: that is no damage, the sweep just switches it).
struct StepCheck {
  StepState state = StepState::InPlace;
  std::vector<std::string> problems;

  static StepCheck inPlace() { return {}; }
  static StepCheck missing(std::string why) { return {StepState::Missing, {std::move(why)}}; }
  static StepCheck missing(std::vector<std::string> why) { return {StepState::Missing, std::move(why)}; }
  static StepCheck foreign(std::string why = "") {
    if (why.empty()) return {StepState::Foreign, {}};
    return {StepState::Foreign, {std::move(why)}};
  }
  static StepCheck unknown(std::string why) { return {StepState::Unknown, {std::move(why)}}; }
};

class Step {
 public:
  virtual ~Step() = default;
  /// Names it in messages: "IPv4 policy rule for the return mark".
  virtual std::string what() const = 0;
  virtual Where where() const = 0;
  /// Makes it; idempotent (applying over an applied step succeeds).
  virtual Status apply(PodContext& c) = 0;
  /// Unmakes it; harmless when it is not there.
  virtual Status undo(PodContext& c) = 0;
  virtual StepCheck check(PodContext& c) = 0;
  /// Foreign: switches it to this build's program (first in line);
  /// returns how many programs now run this build's.
  virtual Result<int> adopt(PodContext&) { return 0; }
  /// The netns the step works in is gone: unmake what outlives it (pins).
  virtual Status forget(PodContext&) { return {}; }
  /// A failure of apply is reported as "what(): error" (false: as it is,
  /// the node proxy's own words for the hand-off).
  virtual bool namesItsErrors() const { return true; }
  /// Its desired state follows the pod's capture settings: what a
  /// settings update re-applies (Datapath::updatePodSettings).
  virtual bool followsSettings() const { return false; }
};

/// A pod's plan: its steps in the order `pod add` applies them.
using Plan = std::vector<std::unique_ptr<Step>>;

}  // namespace sluice
