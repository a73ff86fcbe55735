#include <spdlog/spdlog.h>

#include "enroll/context.h"
#include "enroll/registry.h"
#include "enroll/steps/steps.h"
#include "loader/netlink.h"
#include "loader/netns.h"

namespace sluice {
namespace {

// The node side starts from the pod's host-side veth: the link the pod's
// veth names as its peer, and that names the pod's veth back (ifindexes
// alone can collide across netns).
class HostVethStep final : public Step {
 public:
  std::string what() const override { return "host-side veth"; }
  Where where() const override { return Where::Node; }
  Status apply(PodContext& c) override {
    if (c.rec.host_iface.ifindex) return {};  // found already
    auto cookie = currentNetnsCookie();
    SLUICE_TRY(cookie);
    c.rec.node_netns_cookie = *cookie;
    // The peer asked for by its ifindex: one answer, whatever the number of
    // pods' veths on the node (a dump of them all grew with it).
    auto nl = NetlinkSocket::open();
    SLUICE_TRY(nl);
    auto peer = getLinkOn(*nl, c.peerIfindex);
    SLUICE_TRY(peer);
    const LinkInfo* host = nullptr;
    if (*peer && (*peer)->kind == "veth" && (*peer)->linkIfindex == c.podVethIfindex) host = &**peer;
    const std::string nodePath = nodeNetnsPathOf(c.rec);
    if (!host) {
      if (nodePath.empty()) {
        spdlog::warn("pod {}: no host-side veth of the pod in this netns; probe SNAT not attached", c.id);
        return {};
      }
      return Error::msg("no host-side veth of pod '" + c.id + "' in node netns " + nodePath, ENODEV);
    }
    copyString(c.rec.host_iface.name, sizeof(c.rec.host_iface.name), host->name);
    c.rec.host_iface.ifindex = static_cast<__u32>(host->ifindex);
    c.rec.host_iface.accept_local_before = -1;
    spdlog::info("pod {}: probe source for {} address(es), host-side {}", c.id, c.rec.addr_count, host->name);
    return {};
  }
  Status undo(PodContext&) override { return {}; }  // the record goes with the pod
  StepCheck check(PodContext&) override { return StepCheck::inPlace(); }  // its hooks say whether it is there
  bool namesItsErrors() const override { return false; }
};

}  // namespace

std::unique_ptr<Step> hostVethStep() { return std::make_unique<HostVethStep>(); }

}  // namespace sluice
