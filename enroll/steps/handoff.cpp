#include "enroll/context.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

// The pod goes to the node proxy once its redirection is in place, and is
// taken back when a later step (the node side) fails.
class HandoffStep final : public Step {
 public:
  std::string what() const override { return "hand-off to the node proxy"; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext& c) override {
    if (!c.handoff) return {};
    Status handed = c.handoff->apply(podInfoFromRecord(c.id, c.rec));
    // Tried, and (when a failure is not fatal) possibly half-done.
    c.handedOff = handed.ok() || !c.handoff->failureIsFatal;
    if (handed.ok()) {
      recordHandoff(c.rec, HandoffState::Acked, "");
      return {};
    }
    if (c.handoff->failureIsFatal) return handed;
    recordHandoff(c.rec, HandoffState::Failed, handed.error().message);
    return {};
  }
  Status undo(PodContext& c) override {
    if (c.handoff && c.handedOff) {
      if (c.handoff->undo) c.handoff->undo(podInfoFromRecord(c.id, c.rec));
      // Taken back: the record no longer says the node proxy has the pod.
      recordHandoff(c.rec, HandoffState::None, "");
    }
    c.handedOff = false;
    return {};
  }
  StepCheck check(PodContext& c) override {
    if (c.rec.handoff.state == SLUICE_HANDOFF_ACKED) return StepCheck::inPlace();
    // Not the data plane's to repair: the agent retries it (addPod again).
    return StepCheck::unknown(c.rec.handoff.state == SLUICE_HANDOFF_FAILED
                                  ? "hand-off failed: " + fromFixed(c.rec.handoff.error, sizeof(c.rec.handoff.error))
                                  : "not handed to the node proxy");
  }
  bool namesItsErrors() const override { return false; }
};

}  // namespace

std::unique_ptr<Step> handoffStep() { return std::make_unique<HandoffStep>(); }

}  // namespace sluice
