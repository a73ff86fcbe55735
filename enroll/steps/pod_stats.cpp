#include "enroll/context.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

class PodStatsStep final : public Step {
 public:
  std::string what() const override { return std::string("entry in ") + SLUICE_PIN_POD_STATS; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext& c) override {
    Status st = c.programs->podStats.update(c.rec.netns_cookie, sluice_pod_stats{}, BPF_NOEXIST);
    if (!st.ok() && st.error().code == EEXIST) return {};  // there: it keeps its counts
    return st;
  }
  Status undo(PodContext& c) override { return c.programs->podStats.erase(c.rec.netns_cookie); }
  StepCheck check(PodContext& c) override {
    if (!c.programs->podStats.lookupPerCpu(c.rec.netns_cookie).empty()) return StepCheck::inPlace();
    return StepCheck::missing(std::string("no entry in ") + SLUICE_PIN_POD_STATS);
  }
};

}  // namespace

std::unique_ptr<Step> podStatsStep() { return std::make_unique<PodStatsStep>(); }

}  // namespace sluice
