#include "loader/netlink.h"

#include <linux/fib_rules.h>
#include <linux/if_link.h>
#include <linux/ip.h>
#include <linux/if_addr.h>
#include <linux/ipv6.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netlink/errno.h>
#include <netlink/handlers.h>
#include <netlink/netlink.h>
#include <netlink/msg.h>
#include <netlink/attr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/inet.h>
#include <netlink/route/nexthop.h>
#include <netlink/route/route.h>
#include <netlink/route/rule.h>
#include <netlink/socket.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#ifndef RTEXT_FILTER_SKIP_STATS
#define RTEXT_FILTER_SKIP_STATS (1 << 3)
#endif
#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif

namespace sluice {

// What the kernel said in the last NLMSG_ERROR it sent on this socket.
struct NetlinkSocket::KernelError {
  int code = 0;         // positive errno; 0 when none recorded
  std::string message;  // NLMSGERR_ATTR_MSG (extended ack), may be empty
};

namespace {

struct CacheDeleter {
  void operator()(nl_cache* c) const { nl_cache_free(c); }
};
struct RuleDeleter {
  void operator()(rtnl_rule* r) const { rtnl_rule_put(r); }
};
struct RouteDeleter {
  void operator()(rtnl_route* r) const { rtnl_route_put(r); }
};
struct AddrDeleter {
  void operator()(nl_addr* a) const { nl_addr_put(a); }
};
using CachePtr = std::unique_ptr<nl_cache, CacheDeleter>;
using RulePtr = std::unique_ptr<rtnl_rule, RuleDeleter>;
using RoutePtr = std::unique_ptr<rtnl_route, RouteDeleter>;
using AddrPtr = std::unique_ptr<nl_addr, AddrDeleter>;

// For failures that did not come from the kernel (allocation, parsing,
// socket errors): libnl only has its NLE_* code, mapped back to the nearest
// errno.
int nleToErrno(int nle) {
  switch (std::abs(nle)) {
    case NLE_INTR: return EINTR;
    case NLE_BAD_SOCK: return EBADF;
    case NLE_AGAIN: return EAGAIN;
    case NLE_NOMEM: return ENOMEM;
    case NLE_EXIST: return EEXIST;
    case NLE_INVAL: return EINVAL;
    case NLE_RANGE: return ERANGE;
    case NLE_MSGSIZE: return EMSGSIZE;
    case NLE_OPNOTSUPP: return EOPNOTSUPP;
    case NLE_AF_NOSUPPORT: return EAFNOSUPPORT;
    case NLE_OBJ_NOTFOUND: return ENOENT;
    case NLE_NOADDR: return EADDRNOTAVAIL;
    case NLE_BUSY: return EBUSY;
    case NLE_NOACCESS: return EACCES;
    case NLE_PERM: return EPERM;
    case NLE_NODEV: return ENODEV;
    default: return EIO;
  }
}

// The kernel's explanation in an NLMSG_ERROR (extended ack attribute
// NLMSGERR_ATTR_MSG, e.g. "Nexthop device is not up"), or "" if none.
std::string extendedAckMessage(const nlmsgerr* err) {
  // libnl hands callbacks nlmsg_data() of the NLMSG_ERROR message; step back
  // to its header to find the attributes, which follow the nlmsgerr and the
  // echoed request (unless the kernel capped the echo to its header).
  const auto* hdr = reinterpret_cast<const nlmsghdr*>(reinterpret_cast<const char*>(err) -
                                                      NLMSG_HDRLEN);
  if (!(hdr->nlmsg_flags & NLM_F_ACK_TLVS)) return "";
  size_t offset = NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nlmsgerr));
  if (!(hdr->nlmsg_flags & NLM_F_CAPPED)) offset += NLMSG_ALIGN(err->msg.nlmsg_len - NLMSG_HDRLEN);
  const char* base = reinterpret_cast<const char*>(hdr);
  while (offset + NLA_HDRLEN <= hdr->nlmsg_len) {
    const auto* attr = reinterpret_cast<const nlattr*>(base + offset);
    if (attr->nla_len < NLA_HDRLEN || offset + attr->nla_len > hdr->nlmsg_len) break;
    if ((attr->nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG) {
      const char* text = base + offset + NLA_HDRLEN;
      return std::string(text, strnlen(text, attr->nla_len - NLA_HDRLEN));
    }
    offset += NLA_ALIGN(attr->nla_len);
  }
  return "";
}

const char* familyName(int family) {
  switch (family) {
    case AF_INET: return "IPv4";
    case AF_INET6: return "IPv6";
    default: return "unknown family";
  }
}

Status checkArgs(int family, uint32_t table, const std::string& what) {
  if (family != AF_INET && family != AF_INET6) {
    return Error::msg(what + ": address family " + std::to_string(family) +
                          " is neither AF_INET nor AF_INET6",
                      EAFNOSUPPORT);
  }
  // Table 0 (RT_TABLE_UNSPEC) does not mean "table 0" to the kernel: a rule
  // gets some unused table allocated, a route lands in main.
  if (table == 0) return Error::msg(what + ": routing table 0 is not a table", EINVAL);
  return {};
}

std::string describe(const PolicyRule& r) {
  return fmt::format("{} rule prio {} fwmark {:#x}/{:#x} lookup {}", familyName(r.family),
                     r.priority, r.mark, r.mask, r.table);
}

std::string describeRoute(int family, uint32_t table, int oifIndex) {
  return fmt::format("{} route local {} dev #{} table {}", familyName(family),
                     family == AF_INET6 ? "::/0" : "0.0.0.0/0", oifIndex, table);
}

// Runs a libnl dump into a fresh cache. The kernel marks a dump that raced
// with a change as inconsistent (NLM_F_DUMP_INTR, which libnl reports as
// NLE_DUMP_INTR); such a dump is simply repeated.
template <typename AllocFn>
Result<CachePtr> dump(NetlinkSocket& sock, AllocFn alloc, const std::string& what) {
  constexpr int kAttempts = 5;
  Status last;
  for (int i = 0; i < kAttempts; ++i) {
    nl_cache* cache = nullptr;
    int rc = 0;
    last = sock.call(
        [&](nl_sock* s) {
          rc = alloc(s, &cache);
          return rc;
        },
        what);
    if (last.ok()) return CachePtr(cache);
    if (std::abs(rc) != NLE_DUMP_INTR) break;
  }
  return last.error();
}

template <typename T, typename Fn>
void forEach(nl_cache* cache, Fn fn) {
  for (nl_object* o = nl_cache_get_first(cache); o; o = nl_cache_get_next(o)) {
    fn(reinterpret_cast<T*>(o));
  }
}

bool isNotFound(const Status& st) {
  // RTM_DELRULE and IPv6 RTM_DELROUTE answer ENOENT, IPv4 RTM_DELROUTE ESRCH.
  return !st.ok() && (st.error().code == ENOENT || st.error().code == ESRCH);
}

// ---- policy rules -----------------------------------------------------------

Result<RulePtr> buildRule(const PolicyRule& r) {
  RulePtr rule(rtnl_rule_alloc());
  if (!rule) return Error::msg("cannot allocate " + describe(r), ENOMEM);
  rtnl_rule_set_family(rule.get(), r.family);
  // Always sent, so even priority 0 is matched exactly rather than the kernel
  // picking one (on add) or treating it as a wildcard (on delete).
  rtnl_rule_set_prio(rule.get(), r.priority);
  rtnl_rule_set_mark(rule.get(), r.mark);
  rtnl_rule_set_mask(rule.get(), r.mask);
  // libnl sends the table both in the 8-bit header field (truncated) and as
  // FRA_TABLE, which the kernel prefers, so tables above 255 work.
  rtnl_rule_set_table(rule.get(), r.table);
  rtnl_rule_set_action(rule.get(), FR_ACT_TO_TBL);
  return rule;
}

bool sameRule(rtnl_rule* have, const PolicyRule& want) {
  // The kernel omits FRA_PRIORITY/FRA_FWMARK/FRA_FWMASK when zero, and
  // libnl's getters return 0 for absent attributes: the same meaning.
  return rtnl_rule_get_family(have) == want.family &&
         rtnl_rule_get_action(have) == FR_ACT_TO_TBL &&
         rtnl_rule_get_prio(have) == want.priority && rtnl_rule_get_mark(have) == want.mark &&
         rtnl_rule_get_mask(have) == want.mask && rtnl_rule_get_table(have) == want.table &&
         rtnl_rule_get_src(have) == nullptr && rtnl_rule_get_dst(have) == nullptr &&
         rtnl_rule_get_iif(have) == nullptr && rtnl_rule_get_oif(have) == nullptr;
}

Result<bool> ruleExists(NetlinkSocket& sock, const PolicyRule& want) {
  // libnl 3.7 always dumps rules of every family; sameRule() filters.
  auto cache = dump(
      sock,
      [&](nl_sock* s, nl_cache** out) { return rtnl_rule_alloc_cache(s, want.family, out); },
      "dump " + std::string(familyName(want.family)) + " rules");
  SLUICE_TRY(cache);
  bool found = false;
  forEach<rtnl_rule>(cache->get(), [&](rtnl_rule* r) { found = found || sameRule(r, want); });
  return found;
}

// ---- local default route ----------------------------------------------------

Result<RoutePtr> buildLocalDefaultRoute(int family, uint32_t table, int oifIndex,
                                        const std::string& what) {
  RoutePtr route(rtnl_route_alloc());
  if (!route) return Error::msg("cannot allocate " + what, ENOMEM);
  rtnl_route_set_family(route.get(), static_cast<uint8_t>(family));
  rtnl_route_set_table(route.get(), table);
  rtnl_route_set_type(route.get(), RTN_LOCAL);
  // IPv6 has no route scopes and ignores this; IPv4 needs host scope for a
  // local route.
  rtnl_route_set_scope(route.get(), RT_SCOPE_HOST);
  // Same protocol as `ip route` (libnl's default is "static").
  rtnl_route_set_protocol(route.get(), RTPROT_BOOT);
  // libnl always sends RTA_PRIORITY, 0 here; for IPv6 the kernel turns
  // metric 0 into 1024, the same as `ip -6 route` without a metric.

  // 0.0.0.0/0 or ::/0. libnl refuses a route without a destination, and
  // nl_addr_parse("default") would give a zero-length address instead.
  std::array<unsigned char, 16> zeros{};
  AddrPtr dst(nl_addr_build(family, zeros.data(), family == AF_INET6 ? 16 : 4));
  if (!dst) return Error::msg("cannot allocate " + what, ENOMEM);
  nl_addr_set_prefixlen(dst.get(), 0);
  int err = rtnl_route_set_dst(route.get(), dst.get());  // takes its own reference
  if (err < 0) return Error{nleToErrno(err), what + ": " + nl_geterror(err)};

  rtnl_nexthop* nh = rtnl_route_nh_alloc();
  if (!nh) return Error::msg("cannot allocate " + what, ENOMEM);
  rtnl_route_nh_set_ifindex(nh, oifIndex);
  rtnl_route_add_nexthop(route.get(), nh);  // the route owns nh from here
  return route;
}

}  // namespace

// ---- NetlinkSocket ----------------------------------------------------------

NetlinkSocket::NetlinkSocket(nl_sock* sock, std::unique_ptr<KernelError> kernelError)
    : sock_(sock), kernelError_(std::move(kernelError)) {}

Result<NetlinkSocket> NetlinkSocket::open() {
  nl_sock* raw = nl_socket_alloc();
  if (!raw) return Error::msg("cannot allocate netlink socket", ENOMEM);
  NetlinkSocket sock(raw, std::make_unique<KernelError>());
  // The kernel binds a netlink socket to the network namespace of the thread
  // that creates it (here, in nl_connect); it never follows a later setns().
  int err = nl_connect(raw, NETLINK_ROUTE);
  if (err < 0) {
    return Error{nleToErrno(err), std::string("connect NETLINK_ROUTE socket: ") + nl_geterror(err)};
  }
  // Ask for extended acks so errors carry the kernel's explanation ("Nexthop
  // device is not up"); best effort, older kernels simply lack the option.
  int one = 1;
  (void)::setsockopt(nl_socket_get_fd(raw), SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
  // libnl 3.7 folds the kernel's errno into a coarse NLE_* code (ENETDOWN,
  // for one, becomes "Unspecific failure") and ignores extended acks. This
  // callback sees the raw nlmsgerr first and records both; NL_STOP then lets
  // libnl fail the request as it would have anyway.
  err = nl_socket_modify_err_cb(
      raw, NL_CB_CUSTOM,
      [](sockaddr_nl* /*who*/, nlmsgerr* e, void* arg) -> int {
        auto* out = static_cast<KernelError*>(arg);
        out->code = -e->error;
        try {
          out->message = extendedAckMessage(e);
        } catch (...) {  // never unwind through libnl's C frames
          out->message.clear();
        }
        return NL_STOP;
      },
      sock.kernelError_.get());
  if (err < 0) {
    return Error{nleToErrno(err), std::string("set netlink error callback: ") + nl_geterror(err)};
  }
  return sock;
}

NetlinkSocket::~NetlinkSocket() {
  // nl_socket_free also closes the fd when connected.
  if (sock_) nl_socket_free(sock_);
}

NetlinkSocket::NetlinkSocket(NetlinkSocket&& other) noexcept
    : sock_(std::exchange(other.sock_, nullptr)), kernelError_(std::move(other.kernelError_)) {}

NetlinkSocket& NetlinkSocket::operator=(NetlinkSocket&& other) noexcept {
  if (this != &other) {
    if (sock_) nl_socket_free(sock_);
    sock_ = std::exchange(other.sock_, nullptr);
    kernelError_ = std::move(other.kernelError_);
  }
  return *this;
}

Status NetlinkSocket::call(const std::function<int(nl_sock*)>& request, const std::string& what) {
  if (!sock_) return Error::msg(what + ": netlink socket was moved from", EBADF);
  *kernelError_ = KernelError{};
  int rc = request(sock_);
  if (rc >= 0) return {};
  if (kernelError_->code != 0) {
    std::string message = what + ": " + std::strerror(kernelError_->code);
    if (!kernelError_->message.empty()) message += " (" + kernelError_->message + ")";
    return Error{kernelError_->code, message};
  }
  return Error{nleToErrno(rc), what + ": " + nl_geterror(rc)};
}

// ---- links ------------------------------------------------------------------

Result<std::vector<LinkInfo>> listLinks() {
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  return listLinksOn(*sock);
}

namespace {

// Sends one request of @p type with header @p hdr (and IFLA_EXT_MASK
// @p extMask when non-zero), @p flags NLM_F_DUMP or 0, and hands every
// answer to @p each, parsed by hand: libnl's caches parse every attribute
// of every object (link stats, both families' per-interface settings),
// several times the cost of the request itself. Not a dump, the kernel
// answers with one message (or its error), then the ack, each its own
// datagram: both are read. @p rc gets libnl's code of the receive.
Status requestEach(NetlinkSocket& sock, int type, int flags, const void* hdr, size_t hdrLen, uint32_t extMask,
                   const std::function<void(nlmsghdr*)>& each, const std::string& what, int& rc) {
  auto parse = [](nl_msg* m, void* arg) -> int {
    (*static_cast<const std::function<void(nlmsghdr*)>*>(arg))(nlmsg_hdr(m));
    return NL_OK;
  };
  std::unique_ptr<nl_msg, void (*)(nl_msg*)> msg(nlmsg_alloc_simple(type, flags), nlmsg_free);
  if (!msg) return Error::msg(what + ": cannot allocate message", ENOMEM);
  if (nlmsg_append(msg.get(), const_cast<void*>(hdr), hdrLen, NLMSG_ALIGNTO) < 0 ||
      (extMask && nla_put_u32(msg.get(), IFLA_EXT_MASK, extMask) < 0))
    return Error::msg(what + ": message too long", EMSGSIZE);
  // A copy of the socket's callbacks (the error callback call() relies
  // on included) with the parser.
  nl_cb* base = nl_socket_get_cb(sock.get());
  std::unique_ptr<nl_cb, void (*)(nl_cb*)> cb(nl_cb_clone(base), nl_cb_put);
  nl_cb_put(base);
  if (!cb) return Error::msg(what + ": cannot allocate callbacks", ENOMEM);
  nl_cb_set(cb.get(), NL_CB_VALID, NL_CB_CUSTOM, parse, const_cast<std::function<void(nlmsghdr*)>*>(&each));
  return sock.call(
      [&](nl_sock* s) {
        rc = nl_send_auto(s, msg.get());
        if (rc < 0) return rc;
        rc = nl_recvmsgs(s, cb.get());
        if (rc < 0 || (flags & NLM_F_DUMP)) return rc;
        return nl_wait_for_ack(s);
      },
      what);
}

// Runs a dump request (requestEach); a dump that raced with a change
// (NLM_F_DUMP_INTR) is repeated from the start, after @p restart.
Status dumpEach(NetlinkSocket& sock, int type, const void* hdr, size_t hdrLen, uint32_t extMask,
                const std::function<void(nlmsghdr*)>& each, const std::function<void()>& restart,
                const std::string& what) {
  constexpr int kAttempts = 5;
  Status last;
  for (int i = 0; i < kAttempts; ++i) {
    restart();
    int rc = 0;
    last = requestEach(sock, type, NLM_F_DUMP, hdr, hdrLen, extMask, each, what, rc);
    if (last.ok() || std::abs(rc) != NLE_DUMP_INTR) return last;
  }
  return last;
}

// Attribute @p type of the nested attribute @p nest, or null.
nlattr* nested(nlattr* nest, int type) {
  return nest ? nla_find(static_cast<nlattr*>(nla_data(nest)), nla_len(nest), type) : nullptr;
}

// A string attribute's text (up to its NUL or its end); empty when absent.
std::string attrString(const nlattr* attr) {
  if (!attr) return "";
  const auto* text = static_cast<const char*>(nla_data(attr));
  return std::string(text, strnlen(text, static_cast<size_t>(nla_len(attr))));
}

}  // namespace

namespace {

// One RTM_NEWLINK answer as LinkInfo; nullopt for anything else.
std::optional<LinkInfo> parseLink(nlmsghdr* h) {
  if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) return std::nullopt;
  const auto* ifi = static_cast<const ifinfomsg*>(nlmsg_data(h));
  nlattr* tb[IFLA_MAX + 1] = {};
  if (nlmsg_parse(h, sizeof(ifinfomsg), tb, IFLA_MAX, nullptr) < 0) return std::nullopt;
  LinkInfo info;
  info.ifindex = ifi->ifi_index;
  info.loopback = (ifi->ifi_flags & IFF_LOOPBACK) != 0;
  info.up = (ifi->ifi_flags & IFF_UP) != 0;
  info.name = attrString(tb[IFLA_IFNAME]);
  if (tb[IFLA_LINK] && nla_len(tb[IFLA_LINK]) >= 4) info.linkIfindex = static_cast<int>(nla_get_u32(tb[IFLA_LINK]));
  info.kind = attrString(nested(tb[IFLA_LINKINFO], IFLA_INFO_KIND));
  // IFLA_INET_CONF: u32 per setting, IPV4_DEVCONF_x at index x - 1.
  nlattr* conf4 = nested(nested(tb[IFLA_AF_SPEC], AF_INET), IFLA_INET_CONF);
  if (conf4 && nla_len(conf4) >= static_cast<int>(IPV4_DEVCONF_ACCEPT_LOCAL * sizeof(uint32_t))) {
    uint32_t v = 0;
    std::memcpy(&v, static_cast<char*>(nla_data(conf4)) + (IPV4_DEVCONF_ACCEPT_LOCAL - 1) * sizeof(uint32_t), sizeof(v));
    info.acceptLocal = static_cast<int>(v);
  }
  // IFLA_INET6_CONF: s32 per setting, DEVCONF_x at index x.
  nlattr* conf6 = nested(nested(tb[IFLA_AF_SPEC], AF_INET6), IFLA_INET6_CONF);
  if (conf6 && nla_len(conf6) >= static_cast<int>((DEVCONF_DISABLE_IPV6 + 1) * sizeof(int32_t))) {
    int32_t disabled = 0;
    std::memcpy(&disabled, static_cast<char*>(nla_data(conf6)) + DEVCONF_DISABLE_IPV6 * sizeof(int32_t),
                sizeof(disabled));
    info.ipv6 = disabled == 0;
  }
  return info;
}

}  // namespace

Result<std::vector<LinkInfo>> listLinksOn(NetlinkSocket& sock) {
  std::vector<LinkInfo> links;
  ifinfomsg req{};
  req.ifi_family = AF_UNSPEC;
  auto each = [&](nlmsghdr* h) {
    if (auto info = parseLink(h)) links.push_back(std::move(*info));
  };
  SLUICE_TRY(dumpEach(sock, RTM_GETLINK, &req, sizeof(req), RTEXT_FILTER_SKIP_STATS, each, [&] { links.clear(); },
                      "dump links"));
  return links;
}

Result<std::optional<LinkInfo>> getLinkOn(NetlinkSocket& sock, int ifindex) {
  if (ifindex <= 0) return std::optional<LinkInfo>();
  ifinfomsg req{};
  req.ifi_family = AF_UNSPEC;
  req.ifi_index = ifindex;
  std::optional<LinkInfo> found;
  int rc = 0;
  Status st = requestEach(
      sock, RTM_GETLINK, 0, &req, sizeof(req), RTEXT_FILTER_SKIP_STATS,
      [&](nlmsghdr* h) {
        if (auto info = parseLink(h)) found = std::move(*info);
      },
      "get link " + std::to_string(ifindex), rc);
  if (!st.ok()) {
    if (st.error().code == ENODEV) return std::optional<LinkInfo>();
    return st.error();
  }
  return found;
}

Result<std::vector<AddrInfo>> listAddrsOn(NetlinkSocket& sock) {
  std::vector<AddrInfo> addrs;
  ifaddrmsg req{};
  req.ifa_family = AF_UNSPEC;
  auto each = [&](nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWADDR || h->nlmsg_len < NLMSG_LENGTH(sizeof(ifaddrmsg))) return;
    const auto* ifa = static_cast<const ifaddrmsg*>(nlmsg_data(h));
    if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6) return;
    nlattr* tb[IFA_MAX + 1] = {};
    if (nlmsg_parse(h, sizeof(ifaddrmsg), tb, IFA_MAX, nullptr) < 0) return;
    // IFA_LOCAL is the interface's own address where it differs from
    // IFA_ADDRESS (the peer, on point-to-point links), as getifaddrs reads it.
    nlattr* a = tb[IFA_LOCAL] ? tb[IFA_LOCAL] : tb[IFA_ADDRESS];
    const int len = ifa->ifa_family == AF_INET ? 4 : 16;
    if (!a || nla_len(a) < len) return;
    AddrInfo info;
    info.family = ifa->ifa_family;
    info.ifindex = static_cast<int>(ifa->ifa_index);
    info.prefixLen = ifa->ifa_prefixlen;
    std::memcpy(info.addr, nla_data(a), static_cast<size_t>(len));
    addrs.push_back(info);
  };
  SLUICE_TRY(dumpEach(sock, RTM_GETADDR, &req, sizeof(req), 0, each, [&] { addrs.clear(); }, "dump addresses"));
  return addrs;
}

Status setAcceptLocal(NetlinkSocket& sock, int ifindex, int value) {
  const std::string what = fmt::format("set accept_local={} on interface #{}", value, ifindex);
  std::unique_ptr<nl_msg, void (*)(nl_msg*)> msg(nlmsg_alloc_simple(RTM_SETLINK, 0), nlmsg_free);
  if (!msg) return Error::msg(what + ": cannot allocate message", ENOMEM);
  ifinfomsg ifi{};
  ifi.ifi_family = AF_UNSPEC;
  ifi.ifi_index = ifindex;
  nlattr* spec = nullptr;
  nlattr* inet = nullptr;
  nlattr* conf = nullptr;
  if (nlmsg_append(msg.get(), &ifi, sizeof(ifi), NLMSG_ALIGNTO) < 0 ||
      !(spec = nla_nest_start(msg.get(), IFLA_AF_SPEC)) || !(inet = nla_nest_start(msg.get(), AF_INET)) ||
      !(conf = nla_nest_start(msg.get(), IFLA_INET_CONF)) ||
      nla_put_u32(msg.get(), IPV4_DEVCONF_ACCEPT_LOCAL, static_cast<uint32_t>(value)) < 0)
    return Error::msg(what + ": message too long", EMSGSIZE);
  nla_nest_end(msg.get(), conf);
  nla_nest_end(msg.get(), inet);
  nla_nest_end(msg.get(), spec);
  // nl_send_sync frees the message.
  SLUICE_TRY(sock.call([&](nl_sock* s) { return nl_send_sync(s, msg.release()); }, what));
  spdlog::debug("{}", what);
  return {};
}

// ---- policy rules -----------------------------------------------------------

Result<bool> policyRuleExists(const PolicyRule& rule) {
  SLUICE_TRY(checkArgs(rule.family, rule.table, describe(rule)));
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  return ruleExists(*sock, rule);
}

Status addPolicyRule(const PolicyRule& rule) {
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  auto added = ensurePolicyRule(*sock, rule);
  SLUICE_TRY(added);
  return {};
}

Result<bool> ensurePolicyRule(NetlinkSocket& sock, const PolicyRule& rule) {
  const std::string what = "add " + describe(rule);
  SLUICE_TRY(checkArgs(rule.family, rule.table, what));
  auto msg = buildRule(rule);
  SLUICE_TRY(msg);
  // Without NLM_F_EXCL the kernel happily stacks identical rules; with it,
  // the kernel compares every field (its rule_exists()) and answers EEXIST
  // when the same rule is there: one request instead of a dump of every
  // rule of both families first, which libnl 3.7 cannot narrow.
  Status st =
      sock.call([&](nl_sock* s) { return rtnl_rule_add(s, msg->get(), NLM_F_EXCL); }, what);
  if (!st.ok() && st.error().code != EEXIST) return st.error();
  spdlog::debug("{}{}", what, st.ok() ? "" : ": already present");
  return st.ok();
}

Status deletePolicyRule(const PolicyRule& rule) {
  const std::string what = "delete " + describe(rule);
  SLUICE_TRY(checkArgs(rule.family, rule.table, what));
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  auto msg = buildRule(rule);
  SLUICE_TRY(msg);
  // RTM_DELRULE removes one matching rule per request; duplicates (stacked
  // by `ip rule add` on old iproute2) need one request each. Stop at ENOENT,
  // with a bound in case something keeps re-adding the rule.
  constexpr int kMaxDeletes = 64;
  for (int i = 0; i < kMaxDeletes; ++i) {
    Status st = sock->call([&](nl_sock* s) { return rtnl_rule_delete(s, msg->get(), 0); }, what);
    if (isNotFound(st)) return {};
    SLUICE_TRY(st);
    spdlog::debug("{}", what);
  }
  return Error::msg(what + ": still present after " + std::to_string(kMaxDeletes) + " deletions",
                    EBUSY);
}

// ---- local default route ----------------------------------------------------

Status addLocalDefaultRoute(int family, uint32_t table, int oifIndex) {
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  return addLocalDefaultRouteOn(*sock, family, table, oifIndex);
}

Status addLocalDefaultRouteOn(NetlinkSocket& sock, int family, uint32_t table, int oifIndex) {
  const std::string what = "replace " + describeRoute(family, table, oifIndex);
  SLUICE_TRY(checkArgs(family, table, what));
  auto route = buildLocalDefaultRoute(family, table, oifIndex, what);
  SLUICE_TRY(route);
  // NLM_F_REPLACE (libnl adds NLM_F_CREATE) is `ip route replace`: creates
  // the route or overwrites the one with the same key, so repeating is a
  // no-op.
  SLUICE_TRY(sock.call(
      [&](nl_sock* s) { return rtnl_route_add(s, route->get(), NLM_F_REPLACE); }, what));
  spdlog::debug("{}", what);
  return {};
}

Status deleteLocalDefaultRoute(int family, uint32_t table, int oifIndex) {
  const std::string what = "delete " + describeRoute(family, table, oifIndex);
  SLUICE_TRY(checkArgs(family, table, what));
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  auto route = buildLocalDefaultRoute(family, table, oifIndex, what);
  SLUICE_TRY(route);
  // Protocol 0 is a wildcard for RTM_DELROUTE, so the route goes whichever
  // tool added it.
  rtnl_route_set_protocol(route->get(), RTPROT_UNSPEC);
  constexpr int kMaxDeletes = 64;
  for (int i = 0; i < kMaxDeletes; ++i) {
    Status st =
        sock->call([&](nl_sock* s) { return rtnl_route_delete(s, route->get(), 0); }, what);
    if (isNotFound(st)) return {};
    SLUICE_TRY(st);
    spdlog::debug("{}", what);
  }
  return Error::msg(what + ": still present after " + std::to_string(kMaxDeletes) + " deletions",
                    EBUSY);
}

Result<bool> localDefaultRouteExists(int family, uint32_t table) {
  const std::string what = fmt::format("dump {} routes", familyName(family));
  SLUICE_TRY(checkArgs(family, table, what));
  auto sock = NetlinkSocket::open();
  SLUICE_TRY(sock);
  // The dump covers every table (libnl does not ask for kernel-side
  // filtering), so filter here.
  auto cache = dump(
      *sock,
      [&](nl_sock* s, nl_cache** out) { return rtnl_route_alloc_cache(s, family, 0, out); }, what);
  SLUICE_TRY(cache);
  bool found = false;
  forEach<rtnl_route>(cache->get(), [&](rtnl_route* r) {
    nl_addr* dst = rtnl_route_get_dst(r);
    if (rtnl_route_get_family(r) == family && rtnl_route_get_table(r) == table &&
        rtnl_route_get_type(r) == RTN_LOCAL && dst && nl_addr_get_prefixlen(dst) == 0) {
      found = true;
    }
  });
  return found;
}

}  // namespace sluice
