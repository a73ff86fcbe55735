// Rule 4's return path: the app's replies to the proxy's spoofed
// connections carry the return mark; policy routing delivers them locally,
// to the proxy. Two steps a family: the rule, then the route it looks up.
#include <sys/socket.h>

#include "enroll/context.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

std::string familyName(int family) { return family == AF_INET ? "IPv4" : "IPv6"; }
uint32_t routesBit(int family) { return family == AF_INET ? SLUICE_ROUTES_V4 : SLUICE_ROUTES_V6; }

StepCheck missingUnless(Result<bool> present, const std::string& what) {
  if (!present.ok()) return StepCheck::unknown(what + ": " + present.error().message);
  return *present ? StepCheck::inPlace() : StepCheck::missing(what + " is missing");
}

class ReturnRuleStep final : public Step {
 public:
  explicit ReturnRuleStep(int family) : family_(family) {}
  std::string what() const override { return familyName(family_) + " policy rule for the return mark"; }
  Where where() const override { return Where::Pod; }
  Status apply(PodContext& c) override {
    auto nl = c.podNetlink();
    SLUICE_TRY(nl);
    auto added = ensurePolicyRule(**nl, returnRule(*c.settings, family_));
    SLUICE_TRY(added);
    return {};
  }
  Status undo(PodContext& c) override { return deletePolicyRule(returnRule(*c.settings, family_)); }
  StepCheck check(PodContext& c) override {
    return missingUnless(policyRuleExists(returnRule(*c.settings, family_)), what());
  }

 private:
  int family_;
};

class LocalRouteStep final : public Step {
 public:
  explicit LocalRouteStep(int family) : family_(family) {}
  std::string what() const override {
    return familyName(family_) + " local default route of table " + std::to_string(SLUICE_ROUTE_TABLE);
  }
  Where where() const override { return Where::Pod; }
  Status apply(PodContext& c) override {
    // Already there (Istio's node agent made the same route: a pod taken
    // over): left untouched, as replacing it invalidates every route
    // cached with it, and a packet in flight meanwhile is lost.
    auto present = localDefaultRouteExists(family_, SLUICE_ROUTE_TABLE);
    if (!present.ok() || !*present) {
      auto nl = c.podNetlink();
      SLUICE_TRY(nl);
      SLUICE_TRY(addLocalDefaultRouteOn(**nl, family_, SLUICE_ROUTE_TABLE, static_cast<int>(c.rec.lo_ifindex)));
    }
    c.rec.routes |= routesBit(family_);
    return {};
  }
  Status undo(PodContext& c) override {
    if (!(c.rec.routes & routesBit(family_))) return {};
    return deleteLocalDefaultRoute(family_, SLUICE_ROUTE_TABLE, static_cast<int>(c.rec.lo_ifindex));
  }
  StepCheck check(PodContext&) override {
    return missingUnless(localDefaultRouteExists(family_, SLUICE_ROUTE_TABLE), what());
  }

 private:
  int family_;
};

}  // namespace

std::unique_ptr<Step> returnRuleStep(int family) { return std::make_unique<ReturnRuleStep>(family); }
std::unique_ptr<Step> localRouteStep(int family) { return std::make_unique<LocalRouteStep>(family); }

}  // namespace sluice
