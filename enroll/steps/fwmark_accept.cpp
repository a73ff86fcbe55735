#include "enroll/context.h"
#include "enroll/steps/steps.h"
#include "loader/sysctl.h"

namespace sluice {
namespace {

constexpr const char* kFwmarkAccept = "net/ipv4/tcp_fwmark_accept";

// Socket mode: an app's socket accepted from the proxy's spoofed
// connection keeps the return mark pod_skb_ingress gives its SYN.
class FwmarkAcceptStep final : public Step {
 public:
  std::string what() const override { return "net.ipv4.tcp_fwmark_accept"; }
  Where where() const override { return Where::Pod; }
  Status apply(PodContext& c) override {
    auto before = ensureSysctl(kFwmarkAccept, "1");
    SLUICE_TRY(before);
    if (*before && c.rec.fwmark_accept_before < 0) c.rec.fwmark_accept_before = std::stoi(**before);
    return {};
  }
  Status undo(PodContext& c) override {
    if (c.rec.fwmark_accept_before < 0) return {};
    return writeSysctl(kFwmarkAccept, std::to_string(c.rec.fwmark_accept_before));
  }
  StepCheck check(PodContext&) override {
    auto now = readSysctl(kFwmarkAccept);
    if (!now.ok()) return StepCheck::unknown(what() + ": " + now.error().message);
    return *now == "1" ? StepCheck::inPlace() : StepCheck::missing(what() + " is missing");
  }
};

}  // namespace

std::unique_ptr<Step> fwmarkAcceptStep() { return std::make_unique<FwmarkAcceptStep>(); }

}  // namespace sluice
