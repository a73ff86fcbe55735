#include <cstring>

#include "enroll/context.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

// The programs pass a pod's traffic until this entry is there: writing it
// switches the redirection on, deleting it switches it off. One element
// replaced in one update: a packet sees the old config or the new one.
class PodConfigStep final : public Step {
 public:
  std::string what() const override { return std::string("entry in ") + SLUICE_PIN_POD_CONFIG; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext& c) override { return c.programs->podConfig.update(c.rec.netns_cookie, c.rec.config); }
  Status undo(PodContext& c) override { return c.programs->podConfig.erase(c.rec.netns_cookie); }
  StepCheck check(PodContext& c) override {
    auto have = c.programs->podConfig.lookup(c.rec.netns_cookie);
    if (have && std::memcmp(&*have, &c.rec.config, sizeof(c.rec.config)) == 0) return StepCheck::inPlace();
    return StepCheck::missing(std::string(have ? "wrong" : "no") + " entry in " + SLUICE_PIN_POD_CONFIG);
  }
  bool followsSettings() const override { return true; }
};

}  // namespace

std::unique_ptr<Step> podConfigStep() { return std::make_unique<PodConfigStep>(); }

}  // namespace sluice
