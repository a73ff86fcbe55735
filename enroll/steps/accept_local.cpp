#include "enroll/context.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"
#include "loader/sysctl.h"

namespace sluice {
namespace {

// A looped-back outbound packet arrives with the pod's own address as
// source: without accept_local the stack drops it as a martian.
class AcceptLocalStep final : public Step {
 public:
  AcceptLocalStep(uint32_t slot, std::string name) : slot_(slot), name_(std::move(name)) {}
  std::string what() const override { return "accept_local on " + name_; }
  Where where() const override { return Where::Pod; }
  Status apply(PodContext& c) override {
    auto& s = c.rec.ifaces[slot_];
    auto current = value(c, s);
    SLUICE_TRY(current);
    if (*current == 1) return {};
    auto nl = c.podNetlink();
    SLUICE_TRY(nl);
    SLUICE_TRY(setAcceptLocal(**nl, static_cast<int>(s.ifindex), 1));
    if (s.accept_local_before < 0) s.accept_local_before = *current;
    return {};
  }
  Status undo(PodContext& c) override {
    auto& s = c.rec.ifaces[slot_];
    if (s.accept_local_before < 0) return {};
    auto nl = c.podNetlink();
    SLUICE_TRY(nl);
    return setAcceptLocal(**nl, static_cast<int>(s.ifindex), s.accept_local_before);
  }
  StepCheck check(PodContext& c) override {
    auto& s = c.rec.ifaces[slot_];
    const LinkInfo* l = c.podLink(static_cast<int>(s.ifindex), ifaceName(s));
    if (!l) return StepCheck::unknown("interface " + ifaceName(s) + " is gone");
    auto al = value(c, s);
    if (al.ok() && *al != 1) return StepCheck::missing("accept_local is off on " + ifaceName(s));
    return StepCheck::inPlace();
  }

 private:
  // The link dump reports it; /proc/sys only when it did not.
  static Result<int> value(PodContext& c, const sluice_pod_iface& s) {
    const LinkInfo* l = c.podLink(static_cast<int>(s.ifindex), ifaceName(s));
    if (l && l->acceptLocal >= 0) return l->acceptLocal;
    auto text = readSysctl("net/ipv4/conf/" + ifaceName(s) + "/accept_local");
    SLUICE_TRY(text);
    return std::stoi(*text);
  }

  uint32_t slot_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Step> acceptLocalStep(uint32_t slot, const std::string& name) {
  return std::make_unique<AcceptLocalStep>(slot, name);
}

}  // namespace sluice
