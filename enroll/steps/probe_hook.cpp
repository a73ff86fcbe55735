#include "enroll/context.h"
#include "enroll/steps/steps.h"
#include "loader/probe_hook.h"

namespace sluice {
namespace {

// The node's probe hook (loader/probe_hook.h) is the node's, not the pod's:
// the first pod with a node side attaches it, and it stays for the others.
class ProbeHookStep final : public Step {
 public:
  std::string what() const override { return "node probe hook"; }
  Where where() const override { return Where::Host; }
  bool namesItsErrors() const override { return false; }
  Status apply(PodContext& c) override {
    if (!c.rec.host_iface.ifindex) return {};  // no node side
    return c.services.ensureProbeHook(damageSeen_);
  }
  Status undo(PodContext&) override { return {}; }
  StepCheck check(PodContext& c) override {
    if (!c.rec.host_iface.ifindex) return StepCheck::inPlace();
    auto cg = c.services.nodeCgroup();
    if (!cg.ok()) return StepCheck::unknown("node cgroup: " + cg.error().message);
    auto problems = checkProbeHook(c.root, *cg);
    damageSeen_ = !problems.empty();
    if (problems.empty()) return StepCheck::inPlace();
    return StepCheck::missing(std::move(problems));
  }

 private:
  bool damageSeen_ = false;
};

// The probe addresses on lo of the node's netns, where the replies to
// probes arrive: shared by every pod of the node, so undo leaves them
// (uninstall removes them).
class ProbeAddrsStep final : public Step {
 public:
  std::string what() const override { return "probe addresses on the node's lo"; }
  Where where() const override { return Where::Node; }
  Status apply(PodContext& c) override {
    if (!c.rec.host_iface.ifindex) return {};
    return ensureProbeAddrs(c.settings->probeV4, c.settings->probeV6);
  }
  Status undo(PodContext&) override { return {}; }
  StepCheck check(PodContext& c) override {
    if (!c.rec.host_iface.ifindex) return StepCheck::inPlace();
    auto missing = checkProbeAddrs(c.settings->probeV4, c.settings->probeV6);
    if (missing.empty()) return StepCheck::inPlace();
    return StepCheck::missing(std::move(missing));
  }
};

}  // namespace

std::unique_ptr<Step> probeHookStep() { return std::make_unique<ProbeHookStep>(); }
std::unique_ptr<Step> probeAddrsStep() { return std::make_unique<ProbeAddrsStep>(); }

}  // namespace sluice
