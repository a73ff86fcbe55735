#include "enroll/context.h"
#include "enroll/pins.h"
#include "enroll/steps/steps.h"
#include "loader/sock_hooks.h"

namespace sluice {
namespace {

// Rules 6-8 in socket mode: new connections from outside, at the socket
// lookup of the pod's netns.
class SkLookupStep final : public Step {
 public:
  std::string what() const override { return "sk_lookup program in the pod's netns"; }
  Where where() const override { return Where::Pod; }
  Status apply(PodContext& c) override {
    if (podSkLookupAttached(skLookupPin(c.linkDir))) return {};
    return attachPodSkLookup(*c.programs, c.rec.netns_cookie, c.podNetnsFd, skLookupPin(c.linkDir));
  }
  Status undo(PodContext& c) override { return detachPodSkLookup(skLookupPin(c.linkDir)); }
  Status forget(PodContext& c) override { return undo(c); }
  StepCheck check(PodContext& c) override {
    if (podSkLookupAttached(skLookupPin(c.linkDir))) return StepCheck::inPlace();
    return StepCheck::missing(what() + " is missing");
  }
};

}  // namespace

std::unique_ptr<Step> skLookupStep() { return std::make_unique<SkLookupStep>(); }

}  // namespace sluice
