#include <cstring>

#include "enroll/context.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"
#include "loader/netlink.h"

namespace sluice {
namespace {

// The pod's addresses for its pod_sock entry: given at enrollment, else
// recorded, else found on its interfaces (in its netns).
Result<std::vector<sluice_pod_addr>> sockAddrs(PodContext& c) {
  if (c.sockAddrs) return *c.sockAddrs;
  if (c.rec.addr_count) return std::vector<sluice_pod_addr>(c.rec.addrs, c.rec.addrs + c.rec.addr_count);
  return Error::msg("the pod's addresses are not known outside its netns", EINVAL);
}

class PodSockStep final : public Step {
 public:
  std::string what() const override { return std::string("entry in ") + SLUICE_PIN_POD_SOCK; }
  Where where() const override { return Where::Host; }
  Status apply(PodContext& c) override {
    SLUICE_TRY(loaded(c));
    // There (a settings update): its capture settings are replaced in one
    // update, its addresses kept.
    if (auto have = c.programs->podSock.lookup(c.rec.netns_cookie)) {
      have->flags = c.rec.config.flags;
      have->reroute_count = c.rec.config.reroute_count;
      std::memcpy(have->reroute_ifindex, c.rec.config.reroute_ifindex, sizeof(have->reroute_ifindex));
      return c.programs->podSock.update(c.rec.netns_cookie, *have);
    }
    auto addrs = sockAddrs(c);
    SLUICE_TRY(addrs);
    return c.programs->podSock.update(c.rec.netns_cookie, podSockValue(c.rec, *addrs));
  }
  Status undo(PodContext& c) override {
    SLUICE_TRY(loaded(c));
    return c.programs->podSock.erase(c.rec.netns_cookie);
  }
  StepCheck check(PodContext& c) override {
    if (!c.programs->socketLoaded()) return StepCheck::inPlace();
    auto have = c.programs->podSock.lookup(c.rec.netns_cookie);
    if (have && have->flags == c.rec.config.flags && have->reroute_count == c.rec.config.reroute_count)
      return StepCheck::inPlace();
    return StepCheck::missing(std::string(have ? "wrong" : "no") + " entry in " + SLUICE_PIN_POD_SOCK);
  }
  bool followsSettings() const override { return true; }

 private:
  static Status loaded(PodContext& c) {
    if (c.programs->socketLoaded()) return {};
    return Error::msg("pod " + c.id + " is captured at the socket, which this process cannot load: " +
                          c.programs->socketError(),
                      ENOTSUP);
  }
};

}  // namespace

std::unique_ptr<Step> podSockStep() { return std::make_unique<PodSockStep>(); }

}  // namespace sluice
