#include <sys/socket.h>

#include "enroll/context.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

// Nothing to make: the programs fill these maps as traffic flows. Undo
// forgets the pod's entries, which nothing else would.
class ProgramStateStep final : public Step {
 public:
  std::string what() const override { return "the programs' state of the pod"; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext&) override { return {}; }
  Status undo(PodContext& c) override {
    Status first;
    auto keep = [&first](Status s) {
      if (!s.ok() && first.ok()) first = s;
    };
    const uint64_t cookie = c.rec.netns_cookie;
    PodPrograms& p = *c.programs;
    for (const auto* m : {&p.snatRev, &p.snatClosed})
      for (const auto& k : m->keys())
        if (auto v = m->lookup(k); v && v->netns_cookie == cookie) keep(m->erase(k));
    // The proxy's listeners the programs kept (they leave by themselves when
    // closed; a proxy that stays in an unenrolled pod keeps its sockets).
    const Settings& s = *c.settings;
    for (uint16_t port : {s.outboundPort, s.inboundPort, s.dnsPort})
      for (uint8_t family : {uint8_t{AF_INET}, uint8_t{AF_INET6}}) {
        sluice_listener_key lk{};
        lk.netns_cookie = cookie;
        lk.port = port;
        lk.family = family;
        keep(p.podListeners.erase(lk));
      }
    for (const auto& k : p.dnsNat.keys())
      if (k.netns_cookie == cookie) keep(p.dnsNat.erase(k));
    return first;
  }
  StepCheck check(PodContext&) override { return StepCheck::inPlace(); }
};

}  // namespace

std::unique_ptr<Step> programStateStep() { return std::make_unique<ProgramStateStep>(); }

}  // namespace sluice
