#include "loader/datapath.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <net/if.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "loader/bpffs.h"
#include "loader/cgroup.h"
#include "loader/features.h"
#include "loader/privileges.h"
#include "loader/netlink.h"
#include "loader/netns.h"
#include "loader/pod_guard.h"
#include "loader/pod_stats.h"
#include "loader/sock_hooks.h"
#include "loader/socket_capture.h"
#include "loader/sysctl.h"

namespace sluice {

namespace {

/// Undo steps, run in reverse unless committed.
class Rollback {
 public:
  ~Rollback() { run(); }
  void add(std::function<void()> step) { steps_.push_back(std::move(step)); }
  void commit() { steps_.clear(); }
  void run() {
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) (*it)();
    steps_.clear();
  }

 private:
  std::vector<std::function<void()>> steps_;
};

// Interfaces with no Ethernet header at TC (L3 tunnels): the programs parse
// from an Ethernet header, so they are not attached there.
bool isL3OnlyKind(const std::string& kind) {
  static const std::set<std::string> kinds = {"ipip", "sit", "ip6tnl", "gre", "ip6gre", "wireguard", "vti", "vti6", "tun"};
  return kinds.count(kind) > 0;
}

void copyString(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(s.size(), cap - 1));
}

std::string fromFixed(const char* s, size_t cap) { return std::string(s, strnlen(s, cap)); }

sluice_pod_id podKey(const std::string& id) {
  sluice_pod_id k{};
  copyString(k.id, sizeof(k.id), id);
  return k;
}

std::string acceptLocalSysctl(const std::string& ifname) { return "net/ipv4/conf/" + ifname + "/accept_local"; }

// accept_local of a link: the link dump reports it; /proc/sys only when it
// did not.
Result<int> acceptLocalOf(const LinkInfo& l) {
  if (l.acceptLocal >= 0) return l.acceptLocal;
  auto text = readSysctl(acceptLocalSysctl(l.name));
  SLUICE_TRY(text);
  return std::stoi(*text);
}

bool sameConfig(const sluice_pod_config& a, const sluice_pod_config& b) {
  if (a.flags != b.flags || a.reroute_count != b.reroute_count) return false;
  for (uint32_t i = 0; i < a.reroute_count && i < SLUICE_MAX_REROUTE_IFACES; i++)
    if (a.reroute_ifindex[i] != b.reroute_ifindex[i]) return false;
  return true;
}

std::string describeConfig(const PodInfo& p) {
  std::string s = std::string("dns-capture ") + (p.dnsCapture ? "on" : "off") + ", inbound-capture " +
                  (p.inboundCapture ? "on" : "off");
  for (const auto& r : p.rerouteIfaces) s += ", reroute-iface " + r;
  return s;
}

Result<sluice_pod_addr> parsePodAddr(const std::string& text) {
  sluice_pod_addr a{};
  if (inet_pton(AF_INET, text.c_str(), a.addr) == 1) {
    a.family = AF_INET;
    return a;
  }
  if (inet_pton(AF_INET6, text.c_str(), a.addr) == 1) {
    a.family = AF_INET6;
    return a;
  }
  return Error::msg("invalid pod address '" + text + "'", EINVAL);
}

std::string formatPodAddr(const sluice_pod_addr& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(a.family, a.addr, buf, sizeof(buf));
  return buf;
}

// The pod's addresses: every address of its non-loopback interfaces but
// IPv6 link-local ones (probes go to the pod IP), in the kernel's order.
// @p links are the interfaces of @p nl's netns.
Result<std::vector<sluice_pod_addr>> discoverPodAddrs(NetlinkSocket& nl, const std::vector<LinkInfo>& links) {
  auto addrs = listAddrsOn(nl);
  if (!addrs.ok()) return Error::msg("list the pod's addresses: " + addrs.error().message, addrs.error().code);
  std::vector<sluice_pod_addr> out;
  for (const auto& a : *addrs) {
    auto link = std::find_if(links.begin(), links.end(), [&](const LinkInfo& l) { return l.ifindex == a.ifindex; });
    if (link != links.end() && link->loopback) continue;
    if (a.family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(reinterpret_cast<const in6_addr*>(a.addr))) continue;
    sluice_pod_addr p{};
    p.family = static_cast<uint8_t>(a.family);
    std::memcpy(p.addr, a.addr, a.family == AF_INET ? 4 : 16);
    out.push_back(p);
  }
  return out;
}

std::string hostPin(const std::string& dir, const sluice_pod_iface& host, TcHook hook) {
  return dir + "/host_" + std::string(host.name, strnlen(host.name, sizeof(host.name))) + "_" + tcHookName(hook);
}

// Whether the netns a pod was enrolled from is gone: its file is missing,
// is no netns any more (the placeholder of an unmounted /var/run/netns
// entry), or names another netns now.
Result<bool> recordedNetnsGone(const sluice_pod_record& rec) {
  std::string path = fromFixed(rec.netns_path, sizeof(rec.netns_path));
  auto ns = openNetns(path);
  if (!ns.ok()) {
    if (ns.error().code == ENOENT || ns.error().code == EINVAL) return true;
    return ns.error();
  }
  bool other = false;
  SLUICE_TRY(runInNetns(ns->get(), [&]() -> Status {
    auto cookie = currentNetnsCookie();
    SLUICE_TRY(cookie);
    other = *cookie != rec.netns_cookie;
    return {};
  }));
  return other;
}

Status requireAbsolute(const std::string& path, const char* what) {
  if (!path.empty() && path[0] != '/')
    return Error::msg(std::string(what) + " path '" + path +
                          "' is relative: give an absolute path (every sluice process must find the same file)",
                      EINVAL);
  return {};
}

uint64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Error otherSettingsError(const PodInfo& enrolled) {
  return Error::msg("pod '" + enrolled.id + "' is already enrolled with other settings (" + describeConfig(enrolled) +
                        "); remove it first",
                    EEXIST);
}

Result<sluice_settings> encodeSettings(const Settings& s) {
  sluice_settings out{};
  out.outbound_port = s.outboundPort;
  out.inbound_port = s.inboundPort;
  out.hbone_port = s.hbonePort;
  out.dns_port = s.dnsPort;
  out.proxy_mark = s.proxyMark;
  out.return_mark = s.returnMark;
  out.mark_mask = s.markMask;
  if (!s.outboundPort || !s.inboundPort || !s.hbonePort || !s.dnsPort)
    return Error::msg("settings: ports must be non-zero", EINVAL);
  if ((s.proxyMark & ~s.markMask) || (s.returnMark & ~s.markMask) || s.proxyMark == s.returnMark)
    return Error::msg("settings: proxy and return marks must differ and lie within the mark mask", EINVAL);
  if ((s.markMask & SLUICE_TAG_MASK) != 0)
    return Error::msg("settings: mark mask overlaps sluice's internal tag bits 0xffff0000", EINVAL);
  if (inet_pton(AF_INET, s.probeV4.c_str(), &out.probe_v4) != 1)
    return Error::msg("settings: invalid IPv4 probe address '" + s.probeV4 + "'", EINVAL);
  if (inet_pton(AF_INET6, s.probeV6.c_str(), out.probe_v6) != 1)
    return Error::msg("settings: invalid IPv6 probe address '" + s.probeV6 + "'", EINVAL);
  return out;
}

PodInfo podInfoFromRecord(const std::string& id, const sluice_pod_record& rec) {
  PodInfo p;
  p.id = id;
  p.netnsPath = fromFixed(rec.netns_path, sizeof(rec.netns_path));
  p.netnsCookie = rec.netns_cookie;
  p.capture = rec.capture == SLUICE_CAPTURE_SOCKET ? "socket" : "tc";
  p.tcMode = rec.tc_mode == SLUICE_TC_LEGACY ? "legacy" : "tcx";
  p.dnsCapture = rec.config.flags & SLUICE_POD_DNS_CAPTURE;
  p.inboundCapture = rec.config.flags & SLUICE_POD_INBOUND_CAPTURE;
  p.ipv6Routes = rec.routes & SLUICE_ROUTES_V6;
  p.enrolledAtNs = rec.enrolled_at_ns;
  for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
    std::string name = fromFixed(rec.ifaces[i].name, sizeof(rec.ifaces[i].name));
    p.interfaces.push_back(name);
    for (uint32_t r = 0; r < rec.config.reroute_count && r < SLUICE_MAX_REROUTE_IFACES; r++)
      if (rec.config.reroute_ifindex[r] == rec.ifaces[i].ifindex) p.rerouteIfaces.push_back(name);
  }
  if (rec.host_iface.ifindex) p.hostIface = fromFixed(rec.host_iface.name, sizeof(rec.host_iface.name));
  p.nodeNetnsPath = fromFixed(rec.node_netns_path, sizeof(rec.node_netns_path));
  for (uint32_t i = 0; i < rec.addr_count && i < SLUICE_MAX_POD_ADDRS; i++) p.ips.push_back(formatPodAddr(rec.addrs[i]));
  p.identity.uid = fromFixed(rec.identity.uid, sizeof(rec.identity.uid));
  p.identity.name = fromFixed(rec.identity.name, sizeof(rec.identity.name));
  p.identity.ns = fromFixed(rec.identity.ns, sizeof(rec.identity.ns));
  p.identity.serviceAccount = fromFixed(rec.identity.service_account, sizeof(rec.identity.service_account));
  p.handoff = rec.handoff.state == SLUICE_HANDOFF_ACKED    ? HandoffState::Acked
              : rec.handoff.state == SLUICE_HANDOFF_FAILED ? HandoffState::Failed
                                                           : HandoffState::None;
  p.handoffError = fromFixed(rec.handoff.error, sizeof(rec.handoff.error));
  p.handoffAtNs = rec.handoff.at_ns;
  return p;
}

namespace {

void recordIdentity(sluice_pod_record& rec, const PodIdentity& id) {
  copyString(rec.identity.uid, sizeof(rec.identity.uid), id.uid);
  copyString(rec.identity.name, sizeof(rec.identity.name), id.name);
  copyString(rec.identity.ns, sizeof(rec.identity.ns), id.ns);
  copyString(rec.identity.service_account, sizeof(rec.identity.service_account), id.serviceAccount);
}

void recordHandoff(sluice_pod_record& rec, HandoffState state, const std::string& error) {
  rec.handoff.state = state == HandoffState::Acked    ? SLUICE_HANDOFF_ACKED
                      : state == HandoffState::Failed ? SLUICE_HANDOFF_FAILED
                                                      : SLUICE_HANDOFF_NONE;
  copyString(rec.handoff.error, sizeof(rec.handoff.error), error);
  rec.handoff.at_ns = nowNs();
}

std::string describeIdentity(const PodIdentity& id) {
  if (id.empty()) return "no identity";
  return "uid '" + id.uid + "', " + id.ns + "/" + id.name;
}

}  // namespace

Result<std::unique_ptr<Datapath>> Datapath::open(const DatapathOptions& options) {
  auto wanted = encodeSettings(options.settings);
  SLUICE_TRY(wanted);
  // Before anything is created: an unprivileged run must not leave a root
  // directory it owns, where root's pins would later live.
  SLUICE_TRY(checkPrivileges());
  SLUICE_TRY(ensureBpffsRoot(options.bpffsRoot));
  auto lock = StateLock::acquire(options.bpffsRoot);
  SLUICE_TRY(lock);
  auto programs = PodPrograms::load(options.bpffsRoot, options.snatEntries);
  SLUICE_TRY(programs);
  // Whatever else is pinned there (an older build's programs, a load that
  // crashed half way) is no program's only reference: hooks hold theirs.
  if (auto stale = removeStaleProgramPins(options.bpffsRoot); !stale.ok())
    spdlog::warn("{}", stale.error().message);
  auto current = (*programs)->settings.lookup(0);
  bool fresh = !current || current->outbound_port == 0;
  if (fresh) {
    SLUICE_TRY((*programs)->settings.update(0, *wanted));
    spdlog::info("wrote settings to {}/{}", options.bpffsRoot, SLUICE_PIN_SETTINGS);
  } else if (std::memcmp(&*current, &*wanted, sizeof(*wanted)) != 0) {
    if (!(*programs)->pods.keys().empty())
      return Error::msg("settings differ from the ones pinned under " + options.bpffsRoot +
                            " while pods are enrolled; remove the pods first",
                        EBUSY);
    SLUICE_TRY((*programs)->settings.update(0, *wanted));
    spdlog::info("replaced settings in {}/{} (no pods enrolled)", options.bpffsRoot, SLUICE_PIN_SETTINGS);
  }
  if (options.skLookupStubsAhead > 0 && (*programs)->socketLoaded())
    SLUICE_TRY((*programs)->keepSkLookupStubs(options.skLookupStubsAhead));
  return std::unique_ptr<Datapath>(new Datapath(options, std::move(*programs)));
}

std::string Datapath::linkDir(const std::string& id) const {
  return options_.bpffsRoot + "/" + SLUICE_PIN_LINKS_DIR + "/" + id;
}

Result<std::string> Datapath::podIdForNetns(const std::string& netnsPath) {
  auto ns = openNetns(netnsPath);
  SLUICE_TRY(ns);
  auto cookie = netnsCookie(ns->get());
  SLUICE_TRY(cookie);
  for (const auto& key : programs_->pods.keys()) {
    auto rec = programs_->pods.lookup(key);
    if (rec && rec->netns_cookie == *cookie) return fromFixed(key.id, sizeof(key.id));
  }
  return Error::msg("netns " + netnsPath + " is not enrolled", ENOENT);
}

Result<PodInfo> Datapath::addPod(const PodSpec& spec, const EnrollHook* hook) {
  std::string id = spec.id.empty() ? defaultPodId(spec.netnsPath) : spec.id;
  SLUICE_TRY(validatePodId(id));
  SLUICE_TRY(validatePodIdentity(spec.identity));
  if (spec.rerouteIfaces.size() > SLUICE_MAX_REROUTE_IFACES)
    return Error::msg("at most " + std::to_string(SLUICE_MAX_REROUTE_IFACES) + " --reroute-iface", EINVAL);
  SLUICE_TRY(requireAbsolute(spec.netnsPath, "netns"));
  if (spec.nodeNetnsPath) SLUICE_TRY(requireAbsolute(*spec.nodeNetnsPath, "node netns"));
  auto ns = openNetns(spec.netnsPath);
  SLUICE_TRY(ns);
  auto lock = StateLock::acquire(options_.bpffsRoot);
  SLUICE_TRY(lock);

  const Settings& settings = options_.settings;
  sluice_pod_record rec{};
  copyString(rec.netns_path, sizeof(rec.netns_path), spec.netnsPath);
  if (spec.netnsPath.size() >= sizeof(rec.netns_path))
    return Error::msg("netns path is longer than " + std::to_string(sizeof(rec.netns_path) - 1) + " characters", EINVAL);
  auto ino = netnsInode(ns->get());
  SLUICE_TRY(ino);
  rec.netns_ino = *ino;
  rec.enrolled_at_ns = nowNs();
  rec.config.flags = (spec.dnsCapture ? SLUICE_POD_DNS_CAPTURE : 0) | (spec.inboundCapture ? SLUICE_POD_INBOUND_CAPTURE : 0);
  copyString(rec.config.id, sizeof(rec.config.id), id);
  recordIdentity(rec, spec.identity);

  TcMode mode = spec.tcMode.value_or(options_.tcMode);
  std::string pinDir = linkDir(id);
  auto capture = resolveCapture(spec.capture.value_or(options_.capture));
  SLUICE_TRY(capture);
  const bool socketMode = *capture == CaptureMode::Socket;
  rec.capture = socketMode ? SLUICE_CAPTURE_SOCKET : SLUICE_CAPTURE_TC;
  ensurePodGuardFor();
  rec.fwmark_accept_before = -1;
  std::vector<sluice_pod_addr> sockAddrs;  // socket mode: the pod's addresses for pod_sock
  if (socketMode && !programs_->pods.lookup(podKey(id))) {
    // The node-wide hooks, once per node (a no-op when they are there).
    SLUICE_TRY(ensureNodeHooksFor());
    if (mode == TcMode::Auto) {
      auto f = kernelFeatures();
      SLUICE_TRY(f);
      mode = f->autoTcMode();
    }
  }
  auto existing = programs_->pods.lookup(podKey(id));
  if (existing) {
    // A pod whose netns is gone (no agent swept it) must not block its id.
    auto gone = recordedNetnsGone(*existing);
    SLUICE_TRY(gone);
    if (*gone) {
      SLUICE_TRY(reapStale(id, *existing, "its id"));
      existing.reset();
    }
  }
  bool alreadyEnrolled = false;
  int podVethIfindex = 0, peerIfindex = 0;
  if (spec.ips.size() > SLUICE_MAX_POD_ADDRS)
    return Error::msg("at most " + std::to_string(SLUICE_MAX_POD_ADDRS) + " --ip", EINVAL);
  for (const auto& ip : spec.ips) {
    auto a = parsePodAddr(ip);
    SLUICE_TRY(a);
    rec.addrs[rec.addr_count++] = *a;
  }
  if (spec.nodeNetnsPath) {
    if (spec.nodeNetnsPath->size() >= sizeof(rec.node_netns_path))
      return Error::msg("node netns path is too long", EINVAL);
    copyString(rec.node_netns_path, sizeof(rec.node_netns_path), *spec.nodeNetnsPath);
  }

  // Everything in the pod's netns happens on one thread that entered it;
  // on failure the steps done so far are undone on that same thread.
  Status inNs = runInNetns(ns->get(), [&]() -> Status {
    auto cookie = currentNetnsCookie();
    SLUICE_TRY(cookie);
    rec.netns_cookie = *cookie;
    // One netlink socket for every request in the pod's netns.
    auto nl = NetlinkSocket::open();
    SLUICE_TRY(nl);
    auto links = listLinksOn(*nl);
    SLUICE_TRY(links);
    std::vector<LinkInfo> attachTo;
    bool loIpv6 = false;  // IPv6 on lo: the IPv6 rule and route too
    for (const auto& l : *links) {
      if (l.loopback) {
        rec.lo_ifindex = l.ifindex;
        loIpv6 = l.ipv6;
        continue;
      }
      if (isL3OnlyKind(l.kind)) {
        spdlog::warn("pod {}: not attaching to {} ({} has no Ethernet header)", id, l.name, l.kind);
        continue;
      }
      attachTo.push_back(l);
    }
    for (const auto& name : spec.rerouteIfaces) {
      auto it = std::find_if(attachTo.begin(), attachTo.end(), [&](const LinkInfo& l) { return l.name == name; });
      if (it == attachTo.end())
        return Error::msg("reroute interface '" + name + "' not found in netns " + spec.netnsPath, ENODEV);
      rec.config.reroute_ifindex[rec.config.reroute_count++] = it->ifindex;
    }

    // Same id or same netns already enrolled?
    if (existing) {
      PodInfo have = podInfoFromRecord(id, *existing);
      if (existing->netns_cookie != rec.netns_cookie)
        return Error::msg("pod id '" + id + "' is already enrolled for another netns (" + have.netnsPath + ")", EEXIST);
      if (!sameConfig(existing->config, rec.config))
        return otherSettingsError(have);
      if (have.identity != spec.identity)
        return Error::msg("pod '" + id + "' is already enrolled with another identity (" + describeIdentity(have.identity) +
                              "); remove it first",
                          EEXIST);
      alreadyEnrolled = true;
      return {};
    }
    // pod_config is keyed by the netns cookie: one lookup, where reading the
    // whole registry cost O(pods) per enrollment.
    if (auto other = programs_->podConfig.lookup(rec.netns_cookie))
      return Error::msg("netns " + spec.netnsPath + " is already enrolled as pod '" +
                            fromFixed(other->id, sizeof(other->id)) + "'",
                        EEXIST);
    if (attachTo.empty()) return Error::msg("netns " + spec.netnsPath + " has no non-loopback interface to attach to", ENODEV);
    if (attachTo.size() > SLUICE_MAX_POD_IFACES)
      return Error::msg("netns " + spec.netnsPath + " has more than " + std::to_string(SLUICE_MAX_POD_IFACES) + " interfaces", E2BIG);
    if (!rec.lo_ifindex) return Error::msg("netns " + spec.netnsPath + " has no loopback interface", ENODEV);

    // Node side inputs: the veth whose peer is the host-side interface
    // (eth0 first), and the addresses probes will target.
    for (const auto& l : attachTo) {
      if (l.kind != "veth" || !l.linkIfindex) continue;
      if (!podVethIfindex || l.name == "eth0") {
        podVethIfindex = l.ifindex;
        peerIfindex = l.linkIfindex;
      }
    }
    if (spec.nodeNetnsPath && spec.ips.empty()) {
      auto found = discoverPodAddrs(*nl, *links);
      SLUICE_TRY(found);
      for (const auto& a : *found) {
        if (rec.addr_count == SLUICE_MAX_POD_ADDRS) break;
        rec.addrs[rec.addr_count++] = a;
      }
    }
    if (socketMode) {
      // The addresses the socket programs need: given, else found here.
      if (rec.addr_count) {
        sockAddrs.assign(rec.addrs, rec.addrs + rec.addr_count);
      } else {
        auto found = discoverPodAddrs(*nl, *links);
        SLUICE_TRY(found);
        sockAddrs = *found;
      }
      // Only the virtual interfaces get a TC hook.
      for (uint32_t r = 0; r < rec.config.reroute_count; r++) {
        auto it = std::find_if(attachTo.begin(), attachTo.end(),
                               [&](const LinkInfo& l) { return l.ifindex == static_cast<int>(rec.config.reroute_ifindex[r]); });
        auto& slot = rec.ifaces[rec.iface_count++];
        copyString(slot.name, sizeof(slot.name), it->name);
        slot.ifindex = it->ifindex;
        slot.accept_local_before = -1;
      }
      rec.tc_mode = mode == TcMode::Legacy ? SLUICE_TC_LEGACY : SLUICE_TC_TCX;
      if (::mkdir((options_.bpffsRoot + "/" + SLUICE_PIN_LINKS_DIR).c_str(), 0700) != 0 && errno != EEXIST)
        return Error::fromErrno(errno, "mkdir " + options_.bpffsRoot + "/" + SLUICE_PIN_LINKS_DIR);
      if (::mkdir(pinDir.c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + pinDir);
      Status applied = applySteps(socketSteps(id, rec, *nl, ns->get(), loIpv6));
      if (!applied.ok()) (void)removeTree(pinDir);
      return applied;
    }

    Rollback undo;
    // A looped-back outbound packet arrives with the pod's own address as
    // source: without accept_local the stack drops it as a martian.
    for (const auto& l : attachTo) {
      auto& slot = rec.ifaces[rec.iface_count++];
      copyString(slot.name, sizeof(slot.name), l.name);
      slot.ifindex = l.ifindex;
      slot.accept_local_before = -1;
      auto current = acceptLocalOf(l);
      SLUICE_TRY(current);
      int before = *current;
      if (before != 1) {
        SLUICE_TRY(setAcceptLocal(*nl, l.ifindex, 1));
        slot.accept_local_before = before;
        int ifindex = l.ifindex;
        NetlinkSocket& sock = *nl;  // outlives undo, declared after it
        undo.add([&sock, ifindex, before] { (void)setAcceptLocal(sock, ifindex, before); });
      }
    }

    // Policy routing: packets with the return mark are delivered locally.
    std::vector<int> families = {AF_INET};
    if (loIpv6) families.push_back(AF_INET6);
    for (int family : families) {
      auto added = ensurePolicyRule(*nl, returnRule(settings, family));
      SLUICE_TRY(added);
      if (*added) undo.add([&settings, family] { (void)deletePolicyRule(returnRule(settings, family)); });
      SLUICE_TRY(addLocalDefaultRouteOn(*nl, family, SLUICE_ROUTE_TABLE, rec.lo_ifindex));
      int lo = rec.lo_ifindex;
      undo.add([family, lo] { (void)deleteLocalDefaultRoute(family, SLUICE_ROUTE_TABLE, lo); });
      rec.routes |= family == AF_INET ? SLUICE_ROUTES_V4 : SLUICE_ROUTES_V6;
    }

    // Attachments. The programs pass everything until the pod's config is
    // in the map, so attaching before it is safe.
    struct Attach {
      int ifindex;
      std::string name;
      TcHook hook;
      int progFd;
      sluice_pod_iface* slot;
    };
    std::vector<Attach> attaches;
    for (uint32_t i = 0; i < rec.iface_count; i++) {
      auto& slot = rec.ifaces[i];
      std::string name = fromFixed(slot.name, sizeof(slot.name));
      attaches.push_back({static_cast<int>(slot.ifindex), name, TcHook::Ingress, programs_->ingressFd(), &slot});
      attaches.push_back({static_cast<int>(slot.ifindex), name, TcHook::Egress, programs_->egressFd(), &slot});
    }
    attaches.push_back({static_cast<int>(rec.lo_ifindex), "lo", TcHook::Egress, programs_->loEgressFd(), nullptr});

    if (mode != TcMode::Legacy) {
      if (::mkdir((options_.bpffsRoot + "/" + SLUICE_PIN_LINKS_DIR).c_str(), 0700) != 0 && errno != EEXIST)
        return Error::fromErrno(errno, "mkdir " + options_.bpffsRoot + "/" + SLUICE_PIN_LINKS_DIR);
      if (::mkdir(pinDir.c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + pinDir);
      undo.add([pinDir] { (void)removeTree(pinDir); });
    }
    for (const auto& a : attaches) {
      if (mode != TcMode::Legacy) {
        std::string pin = pinDir + "/" + a.name + "_" + tcHookName(a.hook);
        Status st = attachTcx(a.ifindex, a.hook, a.progFd, pin);
        if (!st.ok() && st.error().code == EOPNOTSUPP && mode == TcMode::Auto && attaches.front().ifindex == a.ifindex &&
            a.hook == TcHook::Ingress) {
          spdlog::info("kernel has no tcx; attaching with clsact + cls_bpf");
          mode = TcMode::Legacy;
        } else {
          SLUICE_TRY(st);
          undo.add([pin] { (void)detachTcx(pin); });
          continue;
        }
      }
      auto created = attachLegacy(a.ifindex, a.hook, a.progFd);
      SLUICE_TRY(created);
      if (*created) {
        if (a.slot)
          a.slot->created_clsact = 1;
        else
          rec.lo_created_clsact = 1;
      }
      bool destroy = *created;
      int ifindex = a.ifindex;
      TcHook hook = a.hook;
      undo.add([ifindex, hook, destroy] { (void)detachLegacy(ifindex, hook, destroy); });
    }
    rec.tc_mode = mode == TcMode::Legacy ? SLUICE_TC_LEGACY : SLUICE_TC_TCX;
    undo.commit();
    return {};
  });
  SLUICE_TRY(inNs);
  if (alreadyEnrolled) {
    spdlog::info("pod {} is already enrolled with these settings", id);
    PodInfo have = podInfoFromRecord(id, *existing);
    if (!hook) return have;
    // A retried enrollment retries the hand-off (the node proxy answers a
    // pod it has with success); a failure leaves the enrollment as it was.
    Status handed = hook->apply(have);
    SLUICE_TRY(setHandoff(id, handed.ok() ? HandoffState::Acked : HandoffState::Failed,
                          handed.ok() ? "" : handed.error().message));
    if (hook->failureIsFatal) SLUICE_TRY(handed);
    auto now = programs_->pods.lookup(podKey(id));
    return now ? podInfoFromRecord(id, *now) : have;
  }

  // Map entries, in Istio's order: redirection in place (the pod's config
  // switches it on), then the hand-off to the node proxy, then the node
  // side (probe SNAT) last.
  sluice_pod_stats zero{};
  bool handedOff = false;
  Status st = programs_->pods.update(podKey(id), rec, BPF_NOEXIST);
  if (st.ok()) st = programs_->podStats.update(rec.netns_cookie, zero);
  if (st.ok()) st = programs_->podConfig.update(rec.netns_cookie, rec.config);
  // The socket programs act on the pod from here on.
  if (st.ok() && socketMode) st = programs_->podSock.update(rec.netns_cookie, podSockValue(rec, sockAddrs));
  if (st.ok() && hook) {
    Status handed = hook->apply(podInfoFromRecord(id, rec));
    // Tried, and (when a failure is not fatal) possibly half-done: a later
    // failure takes the pod back from the node proxy.
    handedOff = handed.ok() || !hook->failureIsFatal;
    if (handed.ok())
      recordHandoff(rec, HandoffState::Acked, "");
    else if (!hook->failureIsFatal)
      recordHandoff(rec, HandoffState::Failed, handed.error().message);
    else
      st = handed;
    if (st.ok()) st = programs_->pods.update(podKey(id), rec);
  }
  if (st.ok() && spec.nodeNetnsPath) {
    st = addNodeSide(id, spec, podVethIfindex, peerIfindex, rec);
    if (st.ok()) st = programs_->pods.update(podKey(id), rec);
  }
  if (!st.ok()) {
    (void)programs_->pods.update(podKey(id), rec);  // teardown reads the record
    (void)teardown(id, rec);
    if (handedOff && hook->undo) hook->undo(podInfoFromRecord(id, rec));
    return st.error();
  }
  PodInfo info = podInfoFromRecord(id, rec);
  if (socketMode)
    spdlog::info("enrolled pod {} (netns {}, socket capture, {} virtual interface(s), {})", id, spec.netnsPath,
                 info.interfaces.size(), describeConfig(info));
  else
    spdlog::info("enrolled pod {} (netns {}, {}, {} interface(s), {})", id, spec.netnsPath, info.tcMode,
                 info.interfaces.size(), describeConfig(info));
  // Not an error: the proxy may not use SO_REUSEPORT. Said at enrolment,
  // because traffic would otherwise just vanish into a dropped handshake.
  // The socket mode hands connections to reuseport listeners on any kernel,
  // but a reroute interface's traffic is still captured at TC.
  if (auto f = kernelFeatures(); f.ok() && !f->reuseportAssign.present) {
    if (!socketMode)
      spdlog::warn("pod {}: {}", id, reuseportWarning(*f));
    else if (rec.config.reroute_count)
      spdlog::warn("pod {}: its --reroute-iface traffic is captured at TC: {}", id, reuseportWarning(*f));
  }
  return info;
}

std::vector<PodStep> Datapath::socketSteps(const std::string& id, sluice_pod_record& rec, NetlinkSocket& nl,
                                           int netnsFd, bool ipv6) {
  SocketPodContext c;
  c.settings = &options_.settings;
  c.programs = programs_.get();
  c.nl = &nl;
  c.rec = &rec;
  c.netnsFd = netnsFd;
  c.linkDir = linkDir(id);
  c.ipv6 = ipv6;
  return socketPodSteps(c);
}

Result<CaptureMode> Datapath::resolveCapture(CaptureMode requested) const {
  if (requested == CaptureMode::Tc) return CaptureMode::Tc;
  auto f = kernelFeatures();
  SLUICE_TRY(f);
  std::string why = socketUnavailableReason(*f);
  if (why.empty() && !programs_->socketLoaded()) why = programs_->socketError();
  if (requested == CaptureMode::Socket && !why.empty())
    return Error::msg("socket capture unavailable: " + why + "; use --capture tc", ENOTSUP);
  return why.empty() ? CaptureMode::Socket : CaptureMode::Tc;
}

Result<std::string> Datapath::nodeCgroup() const { return nodeHookCgroup(options_.cgroupPath); }

void Datapath::ensurePodGuardFor() {
  if (podGuardChecked_ || !options_.podGuard) return;
  podGuardChecked_ = true;
  // Not an enrollment's failure: without the guard the pods are as safe as
  // the capture modes make them, and status says what is missing.
  auto guard = ensurePodGuard(options_.bpffsRoot);
  if (!guard.ok())
    spdlog::warn("pod guard not attached: {}; apps holding CAP_NET_RAW can send frames past the proxy",
                 guard.error().message);
  else if (!guard->active)  // the kernel's, not this enrollment's: status says it; the agent warns once
    spdlog::info("pod guard inactive: {}; apps holding CAP_NET_RAW can send frames past the proxy", guard->why);
}

Status Datapath::ensureNodeHooksFor() {
  auto cg = nodeCgroup();
  SLUICE_TRY(cg);
  auto id = cgroupIdOfPath(*cg);
  SLUICE_TRY(id);
  if (nodeHooksChecked_ && nodeHooksChecked_->first == *cg && nodeHooksChecked_->second == *id &&
      nodeHooksComplete(options_.bpffsRoot, *programs_))
    return {};
  nodeHooksChecked_.reset();
  SLUICE_TRY(ensureNodeHooks(options_.bpffsRoot, *cg, *programs_, false));
  nodeHooksChecked_.emplace(*cg, *id);
  return {};
}

Status Datapath::addNodeSide(const std::string& id, const PodSpec& spec, int podVethIfindex, int peerIfindex,
                             sluice_pod_record& rec) {
  std::string nodePath = spec.nodeNetnsPath->empty() ? "/proc/self/ns/net" : *spec.nodeNetnsPath;
  auto nodeNs = openNetns(nodePath);
  if (!nodeNs.ok()) return Error::msg("node " + nodeNs.error().message, nodeNs.error().code);
  TcMode mode = rec.tc_mode == SLUICE_TC_LEGACY ? TcMode::Legacy : TcMode::Tcx;
  std::string dir = linkDir(id);
  SLUICE_TRY(runInNetns(nodeNs->get(), [&]() -> Status {
    auto cookie = currentNetnsCookie();
    SLUICE_TRY(cookie);
    rec.node_netns_cookie = *cookie;
    // The host-side veth: the link the pod's veth names as its peer, and
    // that names the pod's veth back (ifindexes alone can collide).
    const LinkInfo* host = nullptr;
    auto links = listLinks();
    SLUICE_TRY(links);
    for (const auto& l : *links)
      if (peerIfindex && l.ifindex == peerIfindex && l.kind == "veth" && l.linkIfindex == podVethIfindex) host = &l;
    if (!host) {
      if (spec.nodeNetnsPath->empty()) {
        spdlog::warn("pod {}: no host-side veth of the pod in this netns; probe SNAT not attached", id);
        return {};
      }
      return Error::msg("no host-side veth of pod '" + id + "' in node netns " + nodePath, ENODEV);
    }
    copyString(rec.host_iface.name, sizeof(rec.host_iface.name), host->name);
    rec.host_iface.ifindex = host->ifindex;
    rec.host_iface.accept_local_before = -1;
    for (TcHook hook : {TcHook::Egress, TcHook::Ingress}) {
      int fd = hook == TcHook::Egress ? programs_->hostEgressFd() : programs_->hostIngressFd();
      if (mode == TcMode::Legacy) {
        auto created = attachLegacy(host->ifindex, hook, fd);
        SLUICE_TRY(created);
        if (*created) rec.host_iface.created_clsact = 1;
      } else {
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + dir);
        SLUICE_TRY(attachTcx(host->ifindex, hook, fd, hostPin(dir, rec.host_iface, hook)));
      }
    }
    spdlog::info("pod {}: probe SNAT on host-side {} ({} address(es))", id, host->name, rec.addr_count);
    return {};
  }));
  if (!rec.host_iface.ifindex) {
    rec.addr_count = 0;  // nothing on the node translates towards this pod
    return {};
  }
  // The pod's addresses (Istio's probe ipset). An address another live pod
  // has registered is a conflict, not something to take over; one held by
  // a pod whose netns is gone (or by none) is reaped.
  for (uint32_t i = 0; i < rec.addr_count; i++) {
    auto owner = programs_->podAddrs.lookup(rec.addrs[i]);
    if (!owner || owner->netns_cookie == rec.netns_cookie) continue;
    const std::string addr = formatPodAddr(rec.addrs[i]);
    std::optional<std::pair<std::string, sluice_pod_record>> holder;
    for (const auto& key : programs_->pods.keys())
      if (auto other = programs_->pods.lookup(key); other && other->netns_cookie == owner->netns_cookie)
        holder = {fromFixed(key.id, sizeof(key.id)), *other};
    if (!holder) {
      spdlog::warn("pod {}: address {} was registered for no enrolled pod (a stale entry); taking it over", id, addr);
      continue;
    }
    auto gone = recordedNetnsGone(holder->second);
    SLUICE_TRY(gone);
    if (!*gone)
      return Error::msg("address " + addr + " is already registered for another pod ('" + holder->first + "')", EEXIST);
    SLUICE_TRY(reapStale(holder->first, holder->second, "address " + addr));
  }
  for (uint32_t i = 0; i < rec.addr_count; i++)
    SLUICE_TRY(programs_->podAddrs.update(rec.addrs[i], sluice_pod_addr_info{rec.netns_cookie}));

  return {};
}

Status Datapath::teardown(const std::string& id, const sluice_pod_record& rec) {
  const Settings& settings = options_.settings;
  Status first;
  auto keep = [&first](Status s) {
    if (!s.ok() && first.ok()) first = s;
  };
  // Istio's order: the pod's addresses leave the probe set first, then the
  // redirection stops (without its config the programs pass all).
  for (uint32_t i = 0; i < rec.addr_count && i < SLUICE_MAX_POD_ADDRS; i++) {
    auto owner = programs_->podAddrs.lookup(rec.addrs[i]);
    if (owner && owner->netns_cookie == rec.netns_cookie) keep(programs_->podAddrs.erase(rec.addrs[i]));
  }
  const bool socketMode = rec.capture == SLUICE_CAPTURE_SOCKET;
  if (socketMode) {
    if (!programs_->socketLoaded())
      keep(Error::msg("pod " + id + " is captured at the socket, which this process cannot load: " +
                          programs_->socketError(),
                      ENOTSUP));
    else
      keep(programs_->podSock.erase(rec.netns_cookie));
  }
  keep(programs_->podConfig.erase(rec.netns_cookie));

  std::string path = fromFixed(rec.netns_path, sizeof(rec.netns_path));
  auto ns = openNetns(path);
  bool nsAlive = false;
  if (ns.ok()) {
    Status inNs = runInNetns(ns->get(), [&]() -> Status {
      auto cookie = currentNetnsCookie();
      SLUICE_TRY(cookie);
      if (*cookie != rec.netns_cookie) return {};  // the path names another netns now
      nsAlive = true;
      Status st;
      auto keepIn = [&st](Status s) {
        if (!s.ok() && st.ok()) st = s;
      };
      auto nl = NetlinkSocket::open();
      SLUICE_TRY(nl);
      if (socketMode) {
        sluice_pod_record copy = rec;
        return undoSteps(socketSteps(id, copy, *nl, ns->get(), rec.routes & SLUICE_ROUTES_V6));
      }
      for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
        const auto& slot = rec.ifaces[i];
        if (rec.tc_mode == SLUICE_TC_LEGACY) {
          keepIn(detachLegacy(slot.ifindex, TcHook::Ingress, false));
          keepIn(detachLegacy(slot.ifindex, TcHook::Egress, slot.created_clsact));
        }
        if (slot.accept_local_before >= 0)
          keepIn(setAcceptLocal(*nl, static_cast<int>(slot.ifindex), slot.accept_local_before));
      }
      if (rec.tc_mode == SLUICE_TC_LEGACY)
        keepIn(detachLegacy(rec.lo_ifindex, TcHook::Egress, rec.lo_created_clsact));
      for (int family : {AF_INET, AF_INET6}) {
        if (!(rec.routes & (family == AF_INET ? SLUICE_ROUTES_V4 : SLUICE_ROUTES_V6))) continue;
        keepIn(deletePolicyRule(returnRule(settings, family)));
        keepIn(deleteLocalDefaultRoute(family, SLUICE_ROUTE_TABLE, rec.lo_ifindex));
      }
      return st;
    });
    keep(inNs);
  } else if (ns.error().code != ENOENT) {
    keep(ns.error());
  }
  if (!nsAlive) spdlog::info("pod {}: netns {} is gone; its attachments went with it", id, path);

  // Node side: SNAT state, legacy filters.
  for (const auto* m : {&programs_->snatRev, &programs_->snatClosed})
    for (const auto& k : m->keys()) {
      auto v = m->lookup(k);
      if (v && v->netns_cookie == rec.netns_cookie) keep(m->erase(k));
    }
  if (rec.host_iface.ifindex && rec.tc_mode == SLUICE_TC_LEGACY) {
    std::string nodePath = fromFixed(rec.node_netns_path, sizeof(rec.node_netns_path));
    auto nodeNs = openNetns(nodePath.empty() ? "/proc/self/ns/net" : nodePath);
    if (nodeNs.ok()) {
      keep(runInNetns(nodeNs->get(), [&]() -> Status {
        auto cookie = currentNetnsCookie();
        SLUICE_TRY(cookie);
        if (*cookie != rec.node_netns_cookie) return {};
        Status st = detachLegacy(rec.host_iface.ifindex, TcHook::Ingress, false);
        Status st2 = detachLegacy(rec.host_iface.ifindex, TcHook::Egress, rec.host_iface.created_clsact);
        return st.ok() ? st2 : st;
      }));
    } else if (nodeNs.error().code != ENOENT) {
      keep(nodeNs.error());
    }
  }

  // tcx links are pinned: detach and unpin wherever the netns is.
  std::string dir = linkDir(id);
  if (rec.host_iface.ifindex) {
    keep(detachTcx(hostPin(dir, rec.host_iface, TcHook::Ingress)));
    keep(detachTcx(hostPin(dir, rec.host_iface, TcHook::Egress)));
  }
  for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
    std::string name = fromFixed(rec.ifaces[i].name, sizeof(rec.ifaces[i].name));
    keep(detachTcx(dir + "/" + name + "_ingress"));
    keep(detachTcx(dir + "/" + name + "_egress"));
  }
  keep(detachTcx(dir + "/lo_egress"));
  keep(removeTree(dir));

  keep(programs_->podStats.erase(rec.netns_cookie));
  // The proxy's listeners the programs kept (they leave by themselves when
  // closed; a proxy that stays in an unenrolled pod keeps its sockets).
  const Settings& set = options_.settings;
  for (uint16_t port : {set.outboundPort, set.inboundPort, set.dnsPort})
    for (uint8_t family : {uint8_t{AF_INET}, uint8_t{AF_INET6}}) {
      sluice_listener_key lk{};
      lk.netns_cookie = rec.netns_cookie;
      lk.port = port;
      lk.family = family;
      keep(programs_->podListeners.erase(lk));
    }
  for (const auto& k : programs_->dnsNat.keys())
    if (k.netns_cookie == rec.netns_cookie) keep(programs_->dnsNat.erase(k));
  // The record goes last, and only when everything else is gone, so that a
  // failed removal can be retried.
  if (first.ok()) keep(programs_->pods.erase(podKey(id)));
  return first;
}

Result<uint64_t> Datapath::addProxyProcess(pid_t pid) {
  auto id = cgroupIdOfPid(pid);
  SLUICE_TRY(id);
  sluice_proxy_cgroup v{};
  v.pid = static_cast<__u32>(pid);
  v.since_ns = nowNs();
  if (auto have = programs_->proxyCgroups.lookup(*id)) v.since_ns = have->since_ns;
  Status st = programs_->proxyCgroups.update(*id, v);
  if (!st.ok() && st.error().code == E2BIG && pruneProxyCgroups() > 0) st = programs_->proxyCgroups.update(*id, v);
  if (!st.ok())
    return Error::msg("record the node proxy's cgroup: " + st.error().message + " (at most " +
                          std::to_string(SLUICE_PROXY_CGROUPS) + " live proxy cgroups)",
                      st.error().code);
  // The cgroup is in the set before the check turns on: the proxy's
  // traffic never sees a moment where its mark does not count.
  SLUICE_TRY(programs_->proxyIdentity.update(0, sluice_proxy_identity{1, 0}));
  return *id;
}

size_t Datapath::pruneProxyCgroups() {
  size_t gone = 0;
  for (uint64_t id : programs_->proxyCgroups.keys()) {
    auto exists = cgroupExists(id);
    if (exists.ok() && !*exists && programs_->proxyCgroups.erase(id).ok()) {
      spdlog::info("node proxy cgroup {} is gone; forgotten", id);
      gone++;
    }
  }
  return gone;
}

Status Datapath::clearProxyIdentity() {
  SLUICE_TRY(programs_->proxyIdentity.update(0, sluice_proxy_identity{}));
  for (uint64_t id : programs_->proxyCgroups.keys()) SLUICE_TRY(programs_->proxyCgroups.erase(id));
  return {};
}

ProxyIdentity Datapath::proxyIdentity() {
  ProxyIdentity out;
  auto on = programs_->proxyIdentity.lookup(0);
  out.cgroupCheck = on && on->cgroup_check;
  for (uint64_t id : programs_->proxyCgroups.keys())
    if (auto v = programs_->proxyCgroups.lookup(id)) out.cgroups.push_back({id, v->pid, v->since_ns});
  return out;
}

Result<std::optional<ProxyIdentity>> readPinnedProxyIdentity(const std::string& root, uint32_t& mark, uint32_t& mask) {
  auto open = [&](const char* name) { return Fd(bpf_obj_get((root + "/" + name).c_str())); };
  Fd settings = open(SLUICE_PIN_SETTINGS), on = open(SLUICE_PIN_PROXY_IDENTITY), cgroups = open(SLUICE_PIN_PROXY_CGROUPS);
  if (!settings.valid() || !on.valid() || !cgroups.valid()) {
    if (errno == ENOENT) return std::optional<ProxyIdentity>();
    return Error::fromErrno(errno, "read the pinned proxy identity under " + root);
  }
  __u32 zero = 0;
  sluice_settings st{};
  if (bpf_map_lookup_elem(settings.get(), &zero, &st) != 0) return Error::fromErrno(errno, "read pinned settings");
  mark = st.proxy_mark;
  mask = st.mark_mask;
  ProxyIdentity out;
  sluice_proxy_identity pi{};
  if (bpf_map_lookup_elem(on.get(), &zero, &pi) == 0) out.cgroupCheck = pi.cgroup_check;
  __u64 cur = 0, next = 0;
  const __u64* prev = nullptr;
  while (bpf_map_get_next_key(cgroups.get(), prev, &next) == 0) {
    cur = next;
    prev = &cur;
    sluice_proxy_cgroup v{};
    if (bpf_map_lookup_elem(cgroups.get(), &cur, &v) == 0) out.cgroups.push_back({cur, v.pid, v.since_ns});
  }
  return std::optional<ProxyIdentity>(out);
}

Status Datapath::setHandoff(const std::string& id, HandoffState state, const std::string& error) {
  auto rec = programs_->pods.lookup(podKey(id));
  if (!rec) return {};
  recordHandoff(*rec, state, error);
  // BPF_EXIST: a pod removed meanwhile is not brought back.
  Status st = programs_->pods.update(podKey(id), *rec, BPF_EXIST);
  if (!st.ok() && st.error().code == ENOENT) return {};
  return st;
}

Result<PodInfo> Datapath::updatePodSettings(const std::string& id, const CaptureSettings& settings) {
  SLUICE_TRY(validatePodId(id));
  if (settings.rerouteIfaces.size() > SLUICE_MAX_REROUTE_IFACES)
    return Error::msg("at most " + std::to_string(SLUICE_MAX_REROUTE_IFACES) + " reroute interfaces", EINVAL);
  auto lock = StateLock::acquire(options_.bpffsRoot);
  SLUICE_TRY(lock);
  auto rec = programs_->pods.lookup(podKey(id));
  if (!rec) return notEnrolledError(id);

  sluice_pod_config cfg = rec->config;
  cfg.flags &= ~(SLUICE_POD_DNS_CAPTURE | SLUICE_POD_INBOUND_CAPTURE);
  cfg.flags |= (settings.dnsCapture ? SLUICE_POD_DNS_CAPTURE : 0) | (settings.inboundCapture ? SLUICE_POD_INBOUND_CAPTURE : 0);
  cfg.reroute_count = 0;
  std::memset(cfg.reroute_ifindex, 0, sizeof(cfg.reroute_ifindex));
  if (!settings.rerouteIfaces.empty()) {
    // Names resolve in the pod's netns, as at enrollment; the programs run
    // only on the interfaces attached then, so only those can reroute.
    std::string path = fromFixed(rec->netns_path, sizeof(rec->netns_path));
    auto ns = openNetns(path);
    SLUICE_TRY(ns);
    SLUICE_TRY(runInNetns(ns->get(), [&]() -> Status {
      auto cookie = currentNetnsCookie();
      SLUICE_TRY(cookie);
      if (*cookie != rec->netns_cookie)
        return Error::msg("pod '" + id + "': " + path + " names another netns now", ESTALE);
      auto links = listLinks();
      SLUICE_TRY(links);
      for (const auto& name : settings.rerouteIfaces) {
        auto l = std::find_if(links->begin(), links->end(), [&](const LinkInfo& x) { return x.name == name; });
        if (l == links->end())
          return Error::msg("reroute interface '" + name + "' not found in netns " + path, ENODEV);
        bool attached = false;
        for (uint32_t i = 0; i < rec->iface_count && i < SLUICE_MAX_POD_IFACES; i++)
          attached = attached || static_cast<int>(rec->ifaces[i].ifindex) == l->ifindex;
        // Captured at the socket, only the virtual interfaces named at
        // enrollment got a TC hook (the others must not have one: it would
        // capture inbound at TC beside sk_lookup).
        if (!attached && rec->capture == SLUICE_CAPTURE_SOCKET)
          return Error::msg("reroute interface '" + name + "' of pod '" + id +
                                "' has no sluice programs (captured at the socket, only the reroute interfaces named "
                                "at enrollment get them); remove and add the pod",
                            EINVAL);
        if (!attached)
          return Error::msg("reroute interface '" + name + "' of pod '" + id +
                                "' has no sluice programs (it appeared after the pod was enrolled); remove and add the pod",
                            EINVAL);
        cfg.reroute_ifindex[cfg.reroute_count++] = static_cast<__u32>(l->ifindex);
      }
      return {};
    }));
  }
  if (sameConfig(cfg, rec->config)) return podInfoFromRecord(id, *rec);

  sluice_pod_record updated = *rec;
  updated.config = cfg;
  // The record first: should the second write fail (or the process die in
  // between), the sweep finds pod_config differing from the record and
  // writes the record's, so the pod ends up with the settings asked for.
  SLUICE_TRY(programs_->pods.update(podKey(id), updated, BPF_EXIST));
  // One element replaced in one update: a packet sees the old config or the
  // new one, never no config (which would pass it uncaptured).
  if (Status st = programs_->podConfig.update(rec->netns_cookie, cfg, BPF_EXIST); !st.ok()) {
    (void)programs_->pods.update(podKey(id), *rec, BPF_EXIST);
    return st.error();
  }
  // A pod captured at the socket: its socket programs read the settings
  // from pod_sock (same one-element replacement).
  if (rec->capture == SLUICE_CAPTURE_SOCKET) {
    auto sock = programs_->podSock.lookup(rec->netns_cookie);
    Status st = sock ? Status() : Error::msg("pod '" + id + "' has no " + SLUICE_PIN_POD_SOCK + " entry", ENOENT);
    if (st.ok()) {
      sock->flags = cfg.flags;
      sock->reroute_count = cfg.reroute_count;
      std::memcpy(sock->reroute_ifindex, cfg.reroute_ifindex, sizeof(sock->reroute_ifindex));
      st = programs_->podSock.update(rec->netns_cookie, *sock, BPF_EXIST);
    }
    if (!st.ok()) {
      (void)programs_->podConfig.update(rec->netns_cookie, rec->config, BPF_EXIST);
      (void)programs_->pods.update(podKey(id), *rec, BPF_EXIST);
      return st.error();
    }
  }
  PodInfo before = podInfoFromRecord(id, *rec), after = podInfoFromRecord(id, updated);
  spdlog::info("pod {}: settings changed in place ({} -> {})", id, describeConfig(before), describeConfig(after));
  return after;
}

Status Datapath::reapStale(const std::string& id, const sluice_pod_record& rec, const std::string& held) {
  spdlog::warn("reaping pod '{}': its netns {} is gone, and it still held {}", id,
               fromFixed(rec.netns_path, sizeof(rec.netns_path)), held);
  Status st = teardown(id, rec);
  if (!st.ok()) return Error::msg("could not reap pod '" + id + "' whose netns is gone: " + st.error().message, st.error().code);
  return {};
}

Status Datapath::removePod(const std::string& id) {
  SLUICE_TRY(validatePodId(id));
  auto lock = StateLock::acquire(options_.bpffsRoot);
  SLUICE_TRY(lock);
  auto rec = programs_->pods.lookup(podKey(id));
  if (!rec) return notEnrolledError(id);
  Status st = teardown(id, *rec);
  if (st.ok()) spdlog::info("removed pod {}", id);
  return st;
}

std::vector<PodInfo> Datapath::listPods() {
  std::vector<PodInfo> out;
  for (const auto& key : programs_->pods.keys()) {
    auto rec = programs_->pods.lookup(key);
    if (rec) out.push_back(podInfoFromRecord(fromFixed(key.id, sizeof(key.id)), *rec));
  }
  std::sort(out.begin(), out.end(), [](const PodInfo& a, const PodInfo& b) { return a.id < b.id; });
  return out;
}

Result<std::vector<PodCounters>> Datapath::stats(const std::optional<std::string>& id) {
  std::vector<PodCounters> out;
  auto pods = listPods();
  if (id && std::none_of(pods.begin(), pods.end(), [&](const PodInfo& p) { return p.id == *id; }))
    return notEnrolledError(*id);
  for (const auto& p : pods) {
    if (id && p.id != *id) continue;
    PodCounters c;
    c.id = p.id;
    c.stats = sumPerCpu(programs_->podStats.lookupPerCpu(p.netnsCookie));
    out.push_back(c);
  }
  return out;
}

}  // namespace sluice

// ---------------------------------------------------------------------------
// Checking and repairing enrolled pods (the agent's reconciliation).

namespace sluice {

namespace {

// One hook of an enrolled pod: where it is and which program belongs there.
struct Hook {
  int ifindex;
  std::string ifname;
  TcHook hook;
  int (PodPrograms::*prog)() const;  ///< which of the programs
  std::string pin;                   ///< tcx pin path
};

}  // namespace

Result<PodPrograms*> Datapath::stagingPrograms() {
  if (!staging_) {
    // Its own instance: a tcx hook refuses the program it already runs.
    auto p = PodPrograms::load(options_.bpffsRoot, options_.snatEntries, PodPrograms::Sharing::Private);
    SLUICE_TRY(p);
    staging_ = std::move(*p);
  }
  return staging_.get();
}

PodCheck Datapath::inspect(const std::string& id, const sluice_pod_record& rec, bool repair) {
  PodCheck out;
  out.id = id;
  const bool legacy = rec.tc_mode == SLUICE_TC_LEGACY;
  auto found = [&](const std::string& what, const std::function<Status()>& fix) {
    out.problems.push_back(what);
    if (!repair) return;
    Status st = fix();
    if (st.ok()) {
      out.repaired.push_back(what);
      spdlog::info("pod {}: repaired: {}", id, what);
    } else {
      out.problems.back() += " (repair failed: " + st.error().message + ")";
      spdlog::warn("pod {}: could not repair {}: {}", id, what, st.error().message);
    }
  };
  // A hook: attached (else re-attach), running our program (else swap it).
  auto checkHook = [&](const Hook& hk) {
    struct : Hook {
      int progFd;
    } h{hk, (programs_.get()->*hk.prog)()};
    std::string where = h.ifname + " " + tcHookName(h.hook);
    uint32_t want = programId(h.progFd);
    uint32_t have = legacy ? legacyProgramId(h.ifindex, h.hook) : tcxProgramId(h.pin);
    if (!have) {
      found("no program attached at " + where, [&]() -> Status {
        if (legacy) {
          auto r = attachLegacy(h.ifindex, h.hook, h.progFd);
          return r.ok() ? Status() : Status(r.error());
        }
        return attachTcx(h.ifindex, h.hook, h.progFd, h.pin);
      });
      return;
    }
    // sluice's program runs first (loader/tc.h): an earlier build's filter
    // at the old priority, or a program someone put in front of the link,
    // moves it back to the front (with this Datapath's program).
    bool moved = false;
    if (legacy && legacyAtOldPriority(h.ifindex, h.hook)) {
      found("sluice's filter at " + where + " is at the old priority 0x51ce, after others",
            [&] { return moveLegacyToFront(h.ifindex, h.hook, h.progFd); });
      moved = repair;
    } else if (!legacy) {
      auto pos = tcxPosition(h.ifindex, h.hook, h.pin);
      if (pos.ok() && *pos > 0) {
        found(std::to_string(*pos) + " program(s) run before sluice's at " + where,
              [&]() -> Status {
                auto staging = stagingPrograms();
                SLUICE_TRY(staging);
                return moveTcxToFront(h.ifindex, h.hook, h.progFd, ((*staging)->*h.prog)(), h.pin);
              });
        moved = repair;
      }
    }
    if (moved) {
      if (have != want) out.programsReplaced++;  // the moved hook runs this Datapath's program
      have = legacy ? legacyProgramId(h.ifindex, h.hook) : tcxProgramId(h.pin);
    }
    if (have != want && repair) {
      Status st = legacy ? replaceLegacyProgram(h.ifindex, h.hook, h.progFd) : updateTcx(h.pin, h.progFd);
      if (st.ok())
        out.programsReplaced++;
      else
        out.problems.push_back("could not switch " + where + " to program " + std::to_string(want) + ": " +
                               st.error().message);
    }
  };

  std::string dir = linkDir(id);
  std::string path = fromFixed(rec.netns_path, sizeof(rec.netns_path));
  std::vector<sluice_pod_addr> sockAddrs;  // socket mode: the pod's addresses, for its pod_sock entry
  auto ns = openNetns(path);
  if (!ns.ok()) {
    if (ns.error().code != ENOENT) out.problems.push_back(ns.error().message);
    out.gone = ns.error().code == ENOENT;
    return out;
  }
  Status inNs = runInNetns(ns->get(), [&]() -> Status {
    auto cookie = currentNetnsCookie();
    SLUICE_TRY(cookie);
    if (*cookie != rec.netns_cookie) {
      out.gone = true;  // the path names another netns now
      return {};
    }
    auto nl = NetlinkSocket::open();
    SLUICE_TRY(nl);
    auto links = listLinksOn(*nl);
    SLUICE_TRY(links);
    auto linkOf = [&](int ifindex) -> const LinkInfo* {
      for (const auto& l : *links)
        if (l.ifindex == ifindex) return &l;
      return nullptr;
    };
    if (rec.capture == SLUICE_CAPTURE_SOCKET) {
      if (rec.addr_count) {
        sockAddrs.assign(rec.addrs, rec.addrs + rec.addr_count);
      } else if (auto found = discoverPodAddrs(*nl, *links); found.ok()) {
        sockAddrs = *found;
      }
      // The steps repair what they recorded in a copy: the registry keeps
      // what the enrollment found (the sysctl's value before it).
      sluice_pod_record copy = rec;
      for (const auto& step : socketSteps(id, copy, *nl, ns->get(), rec.routes & SLUICE_ROUTES_V6)) {
        auto in = step.inPlace();
        if (!in.ok())
          out.problems.push_back(step.what + ": " + in.error().message);
        else if (!*in)
          found(step.what + " is missing", step.apply);
      }
      // A virtual interface's hook runs this Datapath's program.
      for (uint32_t i = 0; repair && i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
        const auto& slot = rec.ifaces[i];
        std::string pin = dir + "/" + fromFixed(slot.name, sizeof(slot.name)) + "_ingress";
        uint32_t want = programId(programs_->ingressFd());
        uint32_t have = legacy ? legacyProgramId(static_cast<int>(slot.ifindex), TcHook::Ingress) : tcxProgramId(pin);
        if (!have || have == want) continue;
        Status st = legacy ? replaceLegacyProgram(static_cast<int>(slot.ifindex), TcHook::Ingress, programs_->ingressFd())
                           : updateTcx(pin, programs_->ingressFd());
        if (st.ok()) out.programsReplaced++;
      }
      return {};
    }
    for (uint32_t i = 0; i < rec.iface_count && i < SLUICE_MAX_POD_IFACES; i++) {
      const auto& slot = rec.ifaces[i];
      std::string name = fromFixed(slot.name, sizeof(slot.name));
      const LinkInfo* l = linkOf(static_cast<int>(slot.ifindex));
      if (!l || l->name != name) {
        out.problems.push_back("interface " + name + " is gone");
        continue;
      }
      checkHook({l->ifindex, name, TcHook::Ingress, &PodPrograms::ingressFd, dir + "/" + name + "_ingress"});
      checkHook({l->ifindex, name, TcHook::Egress, &PodPrograms::egressFd, dir + "/" + name + "_egress"});
      auto al = acceptLocalOf(*l);
      if (al.ok() && *al != 1)
        found("accept_local is off on " + name, [&] { return setAcceptLocal(*nl, l->ifindex, 1); });
    }
    if (linkOf(static_cast<int>(rec.lo_ifindex)))
      checkHook({static_cast<int>(rec.lo_ifindex), "lo", TcHook::Egress, &PodPrograms::loEgressFd, dir + "/lo_egress"});
    for (int family : {AF_INET, AF_INET6}) {
      if (!(rec.routes & (family == AF_INET ? SLUICE_ROUTES_V4 : SLUICE_ROUTES_V6))) continue;
      const char* fam = family == AF_INET ? "IPv4" : "IPv6";
      auto rule = policyRuleExists(returnRule(options_.settings, family));
      if (rule.ok() && !*rule)
        found(std::string(fam) + " policy rule for the return mark is missing",
              [&] { return addPolicyRule(returnRule(options_.settings, family)); });
      auto route = localDefaultRouteExists(family, SLUICE_ROUTE_TABLE);
      if (route.ok() && !*route)
        found(std::string(fam) + " local default route of table " + std::to_string(SLUICE_ROUTE_TABLE) + " is missing",
              [&] { return addLocalDefaultRoute(family, SLUICE_ROUTE_TABLE, rec.lo_ifindex); });
    }
    return {};
  });
  if (!inNs.ok()) out.problems.push_back(inNs.error().message);
  if (out.gone) return out;

  // Node side: the host-side veth's probe SNAT hooks.
  if (rec.host_iface.ifindex) {
    std::string nodePath = fromFixed(rec.node_netns_path, sizeof(rec.node_netns_path));
    auto nodeNs = openNetns(nodePath.empty() ? "/proc/self/ns/net" : nodePath);
    if (!nodeNs.ok()) {
      out.problems.push_back("node " + nodeNs.error().message);
    } else {
      Status st = runInNetns(nodeNs->get(), [&]() -> Status {
        auto cookie = currentNetnsCookie();
        SLUICE_TRY(cookie);
        std::string name = fromFixed(rec.host_iface.name, sizeof(rec.host_iface.name));
        if (*cookie != rec.node_netns_cookie) {
          out.problems.push_back("node netns of host-side " + name + " is another one now");
          return {};
        }
        auto links = listLinks();
        SLUICE_TRY(links);
        bool present = std::any_of(links->begin(), links->end(), [&](const LinkInfo& l) {
          return l.ifindex == static_cast<int>(rec.host_iface.ifindex) && l.name == name;
        });
        if (!present) {
          out.problems.push_back("host-side interface " + name + " is gone");
          return {};
        }
        for (TcHook hook : {TcHook::Egress, TcHook::Ingress}) {
          auto prog = hook == TcHook::Egress ? &PodPrograms::hostEgressFd : &PodPrograms::hostIngressFd;
          checkHook({static_cast<int>(rec.host_iface.ifindex), "host-side " + name, hook, prog,
                     hostPin(dir, rec.host_iface, hook)});
        }
        return {};
      });
      if (!st.ok()) out.problems.push_back(st.error().message);
    }
    for (uint32_t i = 0; i < rec.addr_count && i < SLUICE_MAX_POD_ADDRS; i++) {
      auto owner = programs_->podAddrs.lookup(rec.addrs[i]);
      if (!owner)
        found("address " + formatPodAddr(rec.addrs[i]) + " is missing from " + SLUICE_PIN_POD_ADDRS,
              [&] { return programs_->podAddrs.update(rec.addrs[i], sluice_pod_addr_info{rec.netns_cookie}); });
    }
  }

  // Map entries: the config switches redirection on; stats are counted.
  auto cfg = programs_->podConfig.lookup(rec.netns_cookie);
  if (!cfg || std::memcmp(&*cfg, &rec.config, sizeof(rec.config)) != 0)
    found(std::string(cfg ? "wrong" : "no") + " entry in " + SLUICE_PIN_POD_CONFIG,
          [&] { return programs_->podConfig.update(rec.netns_cookie, rec.config); });
  if (programs_->podStats.lookupPerCpu(rec.netns_cookie).empty())
    found(std::string("no entry in ") + SLUICE_PIN_POD_STATS,
          [&] { return programs_->podStats.update(rec.netns_cookie, sluice_pod_stats{}); });
  if (rec.capture == SLUICE_CAPTURE_SOCKET && programs_->socketLoaded()) {
    if (auto cg = nodeCgroup(); cg.ok())
      for (auto& p : checkNodeHooks(options_.bpffsRoot, *cg, *programs_)) out.problems.push_back(p);
    sluice_pod_sock want = podSockValue(rec, sockAddrs);
    auto have = programs_->podSock.lookup(rec.netns_cookie);
    if (!have || have->flags != want.flags || have->reroute_count != want.reroute_count)
      found(std::string(have ? "wrong" : "no") + " entry in " + SLUICE_PIN_POD_SOCK,
            [&] { return programs_->podSock.update(rec.netns_cookie, want); });
  }
  return out;
}

Result<PodCheck> Datapath::checkPod(const std::string& id) {
  SLUICE_TRY(validatePodId(id));
  auto lock = StateLock::acquire(options_.bpffsRoot);
  SLUICE_TRY(lock);
  auto rec = programs_->pods.lookup(podKey(id));
  if (!rec) return notEnrolledError(id);
  return inspect(id, *rec, false);
}

ReconcileReport Datapath::reconcile() {
  ReconcileReport report;
  auto lock = StateLock::acquire(options_.bpffsRoot);
  if (!lock.ok()) {
    report.errors.push_back(lock.error().message);
    return report;
  }
  auto keys = programs_->pods.keys();
  report.pods = keys.size();
  // The socket mode's node hooks: re-made when missing, switched to this
  // Datapath's programs in place (how a newer build takes over).
  bool socketPods = std::any_of(keys.begin(), keys.end(), [&](const sluice_pod_id& k) {
    auto r = programs_->pods.lookup(k);
    return r && r->capture == SLUICE_CAPTURE_SOCKET;
  });
  if (programs_->socketLoaded() && (socketPods || nodeHooksPinned(options_.bpffsRoot))) {
    auto cg = nodeCgroup();
    auto done = cg.ok() ? ensureNodeHooks(options_.bpffsRoot, *cg, *programs_, true) : Result<NodeHooksReport>(cg.error());
    if (!done.ok()) {
      report.errors.push_back("socket mode node hooks: " + done.error().message);
    } else {
      report.programsReplaced += done->replaced;
      if (done->attached) {
        PodCheck node;
        node.id = "(node)";
        node.problems.push_back(std::to_string(done->attached) + " socket mode node hook(s) missing");
        node.repaired = node.problems;
        report.repaired.push_back(node);
      }
    }
  }
  struct DropStaging {
    std::unique_ptr<PodPrograms>& p;
    ~DropStaging() { p.reset(); }
  } dropStaging{staging_};
  for (const auto& key : keys) {
    std::string id = fromFixed(key.id, sizeof(key.id));
    auto rec = programs_->pods.lookup(key);
    if (!rec) continue;  // removed meanwhile (by another sluice process)
    PodCheck c = inspect(id, *rec, true);
    report.programsReplaced += c.programsReplaced;
    if (c.gone) {
      spdlog::info("pod {}: netns {} is gone; removing the pod", id, fromFixed(rec->netns_path, sizeof(rec->netns_path)));
      Status st = teardown(id, *rec);
      if (st.ok())
        report.removed.push_back(id);
      else
        report.errors.push_back("pod " + id + ": " + st.error().message);
      continue;
    }
    if (!c.problems.empty()) {
      for (const auto& p : c.problems)
        if (std::find(c.repaired.begin(), c.repaired.end(), p) == c.repaired.end())
          report.errors.push_back("pod " + id + ": " + p);
      report.repaired.push_back(std::move(c));
    }
  }
  return report;
}

}  // namespace sluice
