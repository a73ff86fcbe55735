#include <spdlog/spdlog.h>

#include <optional>
#include <utility>

#include "enroll/context.h"
#include "enroll/discover.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"

namespace sluice {
namespace {

// The pod's addresses (Istio's probe ipset): the node's probe hook
// (bpf/node_probe.bpf.c) binds a socket of the node's netns connecting to
// one of them to the probe address. Only with a host-side interface
// (hostVethStep).
class PodAddrsStep final : public Step {
 public:
  std::string what() const override { return std::string("addresses in ") + SLUICE_PIN_POD_ADDRS; }
  Where where() const override { return Where::Host; }
  // Its errors name the address and the pod holding it.
  bool namesItsErrors() const override { return false; }
  Status apply(PodContext& c) override {
    if (!c.rec.host_iface.ifindex) {
      c.rec.addr_count = 0;  // nothing on the node translates towards this pod
      return {};
    }
    for (uint32_t i = 0; i < c.rec.addr_count; i++) SLUICE_TRY(claim(c, c.rec.addrs[i]));
    for (uint32_t i = 0; i < c.rec.addr_count; i++) {
      sluice_pod_addr_info info{c.rec.netns_cookie, c.rec.node_netns_cookie};
      // Node netns 0: migrated from a build whose host-side programs still
      // translate this pod's probes (loader/migrate.cpp); kept so.
      if (auto have = c.programs->podAddrs.lookup(c.rec.addrs[i]);
          have && have->netns_cookie == c.rec.netns_cookie && have->node_netns_cookie == 0)
        info.node_netns_cookie = 0;
      SLUICE_TRY(c.programs->podAddrs.update(c.rec.addrs[i], info));
    }
    return {};
  }
  Status undo(PodContext& c) override {
    Status first;
    for (uint32_t i = 0; i < c.rec.addr_count && i < SLUICE_MAX_POD_ADDRS; i++) {
      auto owner = c.programs->podAddrs.lookup(c.rec.addrs[i]);
      if (!owner || owner->netns_cookie != c.rec.netns_cookie) continue;
      Status st = c.programs->podAddrs.erase(c.rec.addrs[i]);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }
  StepCheck check(PodContext& c) override {
    std::vector<std::string> missing;
    for (uint32_t i = 0; c.rec.host_iface.ifindex && i < c.rec.addr_count && i < SLUICE_MAX_POD_ADDRS; i++)
      if (!c.programs->podAddrs.lookup(c.rec.addrs[i]))
        missing.push_back("address " + formatPodAddr(c.rec.addrs[i]) + " is missing from " + SLUICE_PIN_POD_ADDRS);
    if (missing.empty()) return StepCheck::inPlace();
    return StepCheck::missing(std::move(missing));
  }

 private:
  // An address another live pod has registered is a conflict, not something
  // to take over; one held by a pod whose netns is gone (or by none) is reaped.
  static Status claim(PodContext& c, const sluice_pod_addr& addr) {
    auto owner = c.programs->podAddrs.lookup(addr);
    if (!owner || owner->netns_cookie == c.rec.netns_cookie) return {};
    const std::string text = formatPodAddr(addr);
    std::optional<std::pair<std::string, sluice_pod_record>> holder;
    for (const auto& key : c.programs->pods.keys())
      if (auto other = c.programs->pods.lookup(key); other && other->netns_cookie == owner->netns_cookie)
        holder = {podIdOf(key), *other};
    if (!holder) {
      spdlog::warn("pod {}: address {} was registered for no enrolled pod (a stale entry); taking it over", c.id, text);
      return {};
    }
    auto gone = recordedNetnsGone(holder->second);
    SLUICE_TRY(gone);
    if (!*gone)
      return Error::msg("address " + text + " is already registered for another pod ('" + holder->first + "')", EEXIST);
    return c.services.reapStale(holder->first, holder->second, "address " + text);
  }
};

}  // namespace

std::unique_ptr<Step> podAddrsStep() { return std::make_unique<PodAddrsStep>(); }

}  // namespace sluice
