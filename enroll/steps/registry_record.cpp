#include "enroll/context.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

class RegistryStep final : public Step {
 public:
  std::string what() const override { return std::string("record in ") + SLUICE_PIN_PODS; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext& c) override {
    Status st = c.programs->pods.update(podKey(c.id), c.rec, BPF_NOEXIST);
    if (st.ok() || st.error().code != EEXIST) return st;
    // Its own record (applied again): fine; another netns's: the id is taken.
    auto have = c.programs->pods.lookup(podKey(c.id));
    if (have && have->netns_cookie == c.rec.netns_cookie) return c.saveRecord();
    return Error::msg("pod id '" + c.id + "' is already enrolled for another netns", EEXIST);
  }
  Status undo(PodContext& c) override {
    if (c.undoFailed) return {};  // kept: what is left can be removed again
    auto have = c.programs->pods.lookup(podKey(c.id));
    if (!have || have->netns_cookie != c.rec.netns_cookie) return {};  // not this pod's
    return c.programs->pods.erase(podKey(c.id));
  }
  StepCheck check(PodContext& c) override {
    if (c.programs->pods.lookup(podKey(c.id))) return StepCheck::inPlace();
    return StepCheck::missing("no record in " + std::string(SLUICE_PIN_PODS));
  }
};

}  // namespace

std::unique_ptr<Step> registryStep() { return std::make_unique<RegistryStep>(); }

}  // namespace sluice
