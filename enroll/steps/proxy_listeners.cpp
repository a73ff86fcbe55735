#include <sys/socket.h>

#include <algorithm>
#include <set>

#include "enroll/context.h"
#include "enroll/steps/steps.h"
#include "loader/sock_diag.h"

namespace sluice {
namespace {

// What the pod's netns holds of the proxy's listeners on its inbound and
// outbound ports, beside what sock_listeners holds of them.
struct ListenerSurvey {
  std::vector<TcpListenerInfo> unregistered;  ///< the proxy's, unknown to pod_sk_lookup
  std::vector<std::string> unjudged;          ///< listeners whose owner cannot be told
};

std::string describe(const TcpListenerInfo& l) {
  return std::string(l.family == AF_INET6 ? "IPv6" : "IPv4") + " listener on :" + std::to_string(l.port) +
         " (socket cookie " + std::to_string(l.cookie) + ")";
}

sluice_sock_listener_key listenerKey(uint64_t netns, uint16_t port, int family, int slot) {
  sluice_sock_listener_key k{};
  k.netns_cookie = netns;
  k.port = port;
  k.family = static_cast<uint8_t>(family);
  k.slot = static_cast<uint8_t>(slot);
  return k;
}

// Lists the listeners of the netns the runner is in (the pod's) and judges
// each as pod_sockops does when a socket starts listening: the inbound or
// outbound port, the proxy's mark and, once the proxy's cgroups are
// known, one of them.
Result<ListenerSurvey> survey(PodContext& c) {
  auto all = listTcpListeners();
  SLUICE_TRY(all);
  const Settings& s = *c.settings;
  const PodPrograms& p = *c.programs;
  ListenerSurvey out;
  // Most often (a pod being enrolled) nothing listens on the proxy's ports
  // yet: then no map is read.
  if (std::none_of(all->begin(), all->end(),
                   [&](const TcpListenerInfo& l) { return l.port == s.inboundPort || l.port == s.outboundPort; }))
    return out;
  std::set<uint64_t> registered;
  for (uint16_t port : {s.outboundPort, s.inboundPort})
    for (int family : {AF_INET, AF_INET6})
      for (int slot = 0; slot < SLUICE_LISTENER_SLOTS; slot++)
        if (auto v = p.sockListeners.lookup(listenerKey(c.rec.netns_cookie, port, family, slot))) registered.insert(*v);
  auto identity = p.proxyIdentity.lookup(0);
  const bool cgroupCheck = identity && identity->cgroup_check;
  for (const auto& l : *all) {
    if (l.port != s.inboundPort && l.port != s.outboundPort) continue;
    if (registered.count(l.cookie)) continue;
    if (!l.mark) {
      out.unjudged.push_back(describe(l) + ": the kernel does not show its mark");
      continue;
    }
    if ((*l.mark & s.markMask) != s.proxyMark) continue;  // an app's: never the proxy's listener
    if (cgroupCheck) {
      if (!l.cgroupId) {
        out.unjudged.push_back(describe(l) + ": the kernel does not show its cgroup");
        continue;
      }
      if (!p.proxyCgroups.lookup(*l.cgroupId)) continue;  // the mark, but not the proxy's cgroup
    }
    out.unregistered.push_back(l);
  }
  return out;
}

// Puts the proxy's socket @p sock into the first free slot of its port and
// family (as pod_sockops does at listen()).
Status registerListener(PodContext& c, const TcpListenerInfo& l, int sock) {
  const __u64 value = static_cast<__u64>(sock);
  for (int slot = 0; slot < SLUICE_LISTENER_SLOTS; slot++) {
    Status st = c.programs->sockListeners.update(listenerKey(c.rec.netns_cookie, l.port, l.family, slot), value,
                                                 BPF_NOEXIST);
    if (st.ok()) return {};
    if (st.error().code != EEXIST) return Error::msg(describe(l) + ": " + st.error().message, st.error().code);
  }
  return Error::msg(describe(l) + ": every one of its " + std::to_string(SLUICE_LISTENER_SLOTS) +
                        " slots in " + SLUICE_PIN_SOCK_LISTENERS + " is taken",
                    ENOSPC);
}

// Socket mode: the proxy's listeners that exist already in the pod's netns,
// put where pod_sk_lookup finds them. pod_sockops registers a listener when
// the proxy calls listen(); one opened before the node's hooks were
// attached (a proxy that served the pod before sluice did: Istio's node
// agent handed it over, or the proxy listened before `pod add`), or before
// a migration re-created sock_listeners, was never seen there, and every
// inbound connection (and IPv6 outbound through the port block) would be
// refused. The kernel's socket table (sock_diag) lists them; the socket
// itself is taken from the process that holds it (pidfd_getfd, the proxy's
// known processes first) and put into the SOCKHASH from here.
class ProxyListenersStep final : public Step {
 public:
  std::string what() const override { return "the proxy's listeners in " SLUICE_PIN_SOCK_LISTENERS; }
  Where where() const override { return Where::Pod; }
  Status apply(PodContext& c) override {
    auto found = survey(c);
    SLUICE_TRY(found);
    if (found->unregistered.empty()) return {};
    std::vector<pid_t> proxyPids;
    for (uint64_t id : c.programs->proxyCgroups.keys())
      if (auto v = c.programs->proxyCgroups.lookup(id); v && v->pid) proxyPids.push_back(static_cast<pid_t>(v->pid));
    std::set<uint64_t> gone;
    for (const auto& l : found->unregistered) {
      auto sock = takeSocket(l.inode, l.cookie, proxyPids);
      if (!sock.ok() && sock.error().code == ENOENT) {
        gone.insert(l.cookie);  // closed since it was listed, unless the next survey still lists it
        continue;
      }
      if (!sock.ok()) return Error::msg(describe(l) + ": " + sock.error().message, sock.error().code);
      SLUICE_TRY(registerListener(c, l, sock->get()));
    }
    if (gone.empty()) return {};
    auto again = survey(c);
    SLUICE_TRY(again);
    for (const auto& l : again->unregistered)
      if (gone.count(l.cookie))
        return Error::msg(describe(l) + ": listed, but no process it could be taken from holds it", ENOENT);
    return {};
  }
  // The programs keep a proxy's listeners in a netns that is not enrolled
  // too (they leave the map when closed): nothing to undo.
  Status undo(PodContext&) override { return {}; }
  StepCheck check(PodContext& c) override {
    auto found = survey(c);
    if (!found.ok()) return StepCheck::unknown("cannot list the pod's listeners: " + found.error().message);
    std::vector<std::string> problems;
    for (const auto& l : found->unregistered)
      problems.push_back("the proxy's " + describe(l) + " is not in " SLUICE_PIN_SOCK_LISTENERS
                         ": the connections it serves are refused");
    if (!problems.empty()) return StepCheck::missing(std::move(problems));
    if (!found->unjudged.empty()) return {StepState::Unknown, found->unjudged};
    return StepCheck::inPlace();
  }
};

}  // namespace

std::unique_ptr<Step> proxyListenersStep() { return std::make_unique<ProxyListenersStep>(); }

}  // namespace sluice
