#include "enroll/context.h"
#include "enroll/steps/steps.h"
#include "loader/sock_hooks.h"

namespace sluice {
namespace {

// The socket mode's cgroup hooks are the node's, not the pod's: the first
// socket-mode pod puts them in place, and they stay for the others.
class NodeHooksStep final : public Step {
 public:
  std::string what() const override { return "socket mode node hooks"; }
  Where where() const override { return Where::Host; }
  // Its errors name the cgroup ("cgroup X is not a cgroup v2 directory").
  bool namesItsErrors() const override { return false; }
  // After a check that found damage (a repair), every link is read back:
  // the per-process cache sees pins only, not a hook detached behind one.
  Status apply(PodContext& c) override { return c.services.ensureNodeHooks(damageSeen_); }
  Status undo(PodContext&) override { return {}; }
  StepCheck check(PodContext& c) override {
    if (!c.programs->socketLoaded()) return StepCheck::inPlace();
    auto cg = c.services.nodeCgroup();
    if (!cg.ok()) return StepCheck::unknown("node cgroup: " + cg.error().message);
    auto problems = checkNodeHooks(c.root, *cg, *c.programs);
    damageSeen_ = !problems.empty();
    if (problems.empty()) return StepCheck::inPlace();
    return StepCheck::missing(std::move(problems));
  }

 private:
  bool damageSeen_ = false;
};

}  // namespace

std::unique_ptr<Step> nodeHooksStep() { return std::make_unique<NodeHooksStep>(); }

}  // namespace sluice
