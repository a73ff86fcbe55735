#include "loader/probe_hook.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "base/fd.h"
#include "loader/sock_hooks.h"
#include "loader/tc.h"
#include "maps/sluice_maps.h"
#include "node_probe.skel.h"

namespace sluice {
namespace {

const std::vector<std::string> kLinks = {"probe_connect4", "probe_connect6"};
constexpr const char* kWhat = "node probe hook";

// The maps the hook uses (pinned by the pod programs, reused by name) and
// its own counters; the other maps of lib/maps.h are not created.
bool usedMap(const char* name) {
  for (const char* n : {SLUICE_PIN_SETTINGS, SLUICE_PIN_POD_ADDRS, SLUICE_PIN_POD_STATS, SLUICE_PIN_PROBE_STATS})
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

using Skel = std::unique_ptr<node_probe, void (*)(node_probe*)>;

Result<Skel> loadProbeHook(const std::string& root) {
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = root.c_str());
  Skel skel(node_probe__open_opts(&opts), node_probe__destroy);
  if (!skel) return Error::fromErrno(errno, "open the node probe hook's programs");
  bpf_map* m = nullptr;
  bpf_object__for_each_map(m, skel->obj) {
    if (!bpf_map__is_internal(m) && !usedMap(bpf_map__name(m))) bpf_map__set_autocreate(m, false);
  }
  if (int err = node_probe__load(skel.get()); err != 0)
    return Error::fromErrno(-err, "the kernel refused the node probe hook's programs (--log-level debug shows why)");
  return skel;
}

// ---- rtnetlink: the probe addresses on lo ----

struct AddrRequest {
  nlmsghdr h;
  ifaddrmsg ifa;
  char attrs[128];
};

void addAttr(AddrRequest& r, uint16_t type, const void* data, size_t len) {
  auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(&r) + NLMSG_ALIGN(r.h.nlmsg_len));
  a->rta_type = type;
  a->rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
  std::memcpy(RTA_DATA(a), data, len);
  r.h.nlmsg_len = NLMSG_ALIGN(r.h.nlmsg_len) + RTA_ALIGN(a->rta_len);
}

// One RTM_NEWADDR / RTM_DELADDR of @p addr on lo, acked: 0 or the errno.
int addrRequest(uint16_t type, int family, const void* addr) {
  Fd nl(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
  if (!nl.valid()) return errno;
  AddrRequest r{};
  r.h.nlmsg_len = NLMSG_LENGTH(sizeof(ifaddrmsg));
  r.h.nlmsg_type = type;
  r.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | (type == RTM_NEWADDR ? NLM_F_CREATE | NLM_F_EXCL : 0);
  r.h.nlmsg_seq = 1;
  r.ifa.ifa_family = static_cast<uint8_t>(family);
  r.ifa.ifa_prefixlen = family == AF_INET ? 32 : 128;
  // IPv4 scope host: never picked as the source of a route by itself.
  r.ifa.ifa_scope = family == AF_INET ? RT_SCOPE_HOST : RT_SCOPE_UNIVERSE;
  r.ifa.ifa_index = if_nametoindex("lo");
  if (!r.ifa.ifa_index) return errno;
  const size_t len = family == AF_INET ? 4 : 16;
  addAttr(r, IFA_LOCAL, addr, len);
  addAttr(r, IFA_ADDRESS, addr, len);
  if (family == AF_INET6 && type == RTM_NEWADDR) {
    // No DAD, and deprecated (preferred 0): the kernel never picks it as a
    // source by itself (RFC 6724 rule 3); a bound socket still uses it.
    uint32_t flags = IFA_F_NODAD;
    addAttr(r, IFA_FLAGS, &flags, sizeof(flags));
    ifa_cacheinfo ci{};
    ci.ifa_prefered = 0;
    ci.ifa_valid = 0xFFFFFFFFu;
    addAttr(r, IFA_CACHEINFO, &ci, sizeof(ci));
  }
  if (::send(nl.get(), &r, r.h.nlmsg_len, 0) < 0) return errno;
  char buf[512];
  ssize_t n = ::recv(nl.get(), buf, sizeof(buf), 0);
  if (n < 0) return errno;
  auto* h = reinterpret_cast<nlmsghdr*>(buf);
  if (!NLMSG_OK(h, static_cast<unsigned>(n)) || h->nlmsg_type != NLMSG_ERROR) return EPROTO;
  return -reinterpret_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
}

bool ipv6Enabled() {
  // An IPv6 socket needs the family; the node's lo may still have it
  // disabled (disable_ipv6), which RTM_NEWADDR reports as EACCES.
  Fd s(::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  return s.valid();
}

std::string addrText(int family, const void* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(family, addr, buf, sizeof(buf));
  return buf;
}

struct ProbeAddrs {
  uint32_t v4 = 0;
  uint8_t v6[16] = {};
};

Result<ProbeAddrs> parseProbeAddrs(const std::string& v4, const std::string& v6) {
  ProbeAddrs a;
  if (::inet_pton(AF_INET, v4.c_str(), &a.v4) != 1) return Error::msg("probe address '" + v4 + "' is not IPv4", EINVAL);
  if (::inet_pton(AF_INET6, v6.c_str(), a.v6) != 1) return Error::msg("probe address '" + v6 + "' is not IPv6", EINVAL);
  return a;
}

}  // namespace

bool probeHookPinned(const std::string& root) { return nodeLinksPinned(root, kLinks); }

Result<ProbeHookReport> ensureProbeHook(const std::string& root, const std::string& cgroupPath, bool replace) {
  if (!replace && probeHookPinned(root) && checkProbeHook(root, cgroupPath).empty()) return ProbeHookReport{};
  auto skel = loadProbeHook(root);
  SLUICE_TRY(skel);
  std::vector<NodeHook> hooks = {
      {kLinks[0], BPF_CGROUP_INET4_CONNECT, bpf_program__fd((*skel)->progs.node_connect4)},
      {kLinks[1], BPF_CGROUP_INET6_CONNECT, bpf_program__fd((*skel)->progs.node_connect6)},
  };
  // Switch only links running other instructions (an older build's): a
  // fresh load of the same program has another id but the same tag.
  bool differs = false;
  for (const auto& h : hooks) {
    Fd link(bpf_obj_get((root + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/" + h.name).c_str()));
    if (link.valid() && linkedProgramTag(link.get()) != programTag(h.progFd)) differs = true;
  }
  auto done = ensureCgroupLinks(root, cgroupPath, hooks, replace && differs, kWhat);
  SLUICE_TRY(done);
  return ProbeHookReport{done->attached, done->replaced};
}

std::vector<std::string> checkProbeHook(const std::string& root, const std::string& cgroupPath) {
  return checkCgroupLinks(root, cgroupPath, kLinks, kWhat);
}

Status removeProbeHook(const std::string& root) {
  Status first;
  for (const auto& n : kLinks) {
    Status st = detachNodeLink(root, n);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

std::vector<uint64_t> probeHookStats(const std::string& root) {
  std::vector<uint64_t> out(SLUICE_PROBE_STATS, 0);
  Fd m(bpf_obj_get((root + "/" + SLUICE_PIN_PROBE_STATS).c_str()));
  if (!m.valid()) return out;
  int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) return out;
  std::vector<uint64_t> perCpu(static_cast<size_t>(cpus));
  for (uint32_t i = 0; i < SLUICE_PROBE_STATS; i++)
    if (bpf_map_lookup_elem(m.get(), &i, perCpu.data()) == 0)
      for (uint64_t v : perCpu) out[i] += v;
  return out;
}

// Whether this netns owns @p addr (on any interface): a bind to an
// address it does not own fails (EADDRNOTAVAIL). Without the family's
// sockets (IPv6 disabled) it counts as owned: nothing to add or miss.
bool isLocal(int family, const void* addr) {
  Fd s(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return family == AF_INET6;
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    std::memcpy(&a->sin_addr, addr, 4);
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    std::memcpy(&a->sin6_addr, addr, 16);
    len = sizeof(*a);
  }
  return ::bind(s.get(), reinterpret_cast<sockaddr*>(&ss), len) == 0 || errno != EADDRNOTAVAIL;
}

Status ensureProbeAddrs(const std::string& v4, const std::string& v6) {
  auto a = parseProbeAddrs(v4, v6);
  SLUICE_TRY(a);
  const uint32_t probeV4 = a->v4;
  const uint8_t* probeV6 = a->v6;
  // An address the node already has (say its own, --host-probe-snat-ip
  // set to the node's IP) is not added to lo a second time.
  const bool have4 = isLocal(AF_INET, &probeV4), have6 = isLocal(AF_INET6, probeV6);
  if (have4 && have6) return {};
  int err = have4 ? 0 : addrRequest(RTM_NEWADDR, AF_INET, &probeV4);
  if (err && err != EEXIST) return Error::fromErrno(err, "add the probe address " + addrText(AF_INET, &probeV4) + " to lo");
  if (!ipv6Enabled() || have6) return {};
  err = addrRequest(RTM_NEWADDR, AF_INET6, probeV6);
  if (err == EACCES) return {};  // IPv6 disabled on lo: no IPv6 probes here
  if (err && err != EEXIST) return Error::fromErrno(err, "add the probe address " + addrText(AF_INET6, probeV6) + " to lo");
  return {};
}

std::vector<std::string> checkProbeAddrs(const std::string& v4, const std::string& v6) {
  std::vector<std::string> out;
  auto parsed = parseProbeAddrs(v4, v6);
  if (!parsed.ok()) return {parsed.error().message};
  if (!isLocal(AF_INET, &parsed->v4))
    out.push_back("the probe address " + addrText(AF_INET, &parsed->v4) + " is not on the node");
  if (!isLocal(AF_INET6, parsed->v6))
    out.push_back("the probe address " + addrText(AF_INET6, parsed->v6) + " is not on the node");
  return out;
}

Status removeProbeAddrs(const std::string& v4, const std::string& v6) {
  auto a = parseProbeAddrs(v4, v6);
  SLUICE_TRY(a);
  const uint32_t probeV4 = a->v4;
  const uint8_t* probeV6 = a->v6;
  int err = addrRequest(RTM_DELADDR, AF_INET, &probeV4);
  if (err && err != EADDRNOTAVAIL && err != ENODEV)
    return Error::fromErrno(err, "remove the probe address " + addrText(AF_INET, &probeV4) + " from lo");
  if (!ipv6Enabled()) return {};
  err = addrRequest(RTM_DELADDR, AF_INET6, probeV6);
  if (err && err != EADDRNOTAVAIL && err != ENODEV && err != EACCES)
    return Error::fromErrno(err, "remove the probe address " + addrText(AF_INET6, probeV6) + " from lo");
  return {};
}

}  // namespace sluice
