// rtnetlink (via libnl3) for the few objects sluice manages: links (read
// only), fwmark policy rules, and the local default route of the proxy table.
//
// Every call opens its own NETLINK_ROUTE socket in the *calling thread's*
// network namespace; to act on a pod's namespace, call from inside
// runInNetns() (loader/netns.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

struct nl_sock;

namespace sluice {

/// Owns one connected libnl NETLINK_ROUTE socket. The socket belongs to the
/// network namespace of the thread that opened it, for its whole life, even
/// if it is later used from another thread.
class NetlinkSocket {
 public:
  /// Allocates a libnl socket and connects it to NETLINK_ROUTE in the
  /// calling thread's network namespace.
  static Result<NetlinkSocket> open();

  ~NetlinkSocket();
  NetlinkSocket(const NetlinkSocket&) = delete;
  NetlinkSocket& operator=(const NetlinkSocket&) = delete;
  /// Takes over @p other's socket, leaving @p other empty.
  NetlinkSocket(NetlinkSocket&& other) noexcept;
  /// Frees the current socket, then takes over @p other's.
  NetlinkSocket& operator=(NetlinkSocket&& other) noexcept;

  /// The libnl socket, still owned by this object (null once moved from).
  nl_sock* get() const { return sock_; }

  /// Runs @p request, a libnl call on this socket that returns a negative
  /// NLE_* code on failure. A failure becomes "WHAT: <strerror> (<kernel's
  /// extended ack message>)" with the kernel's own errno in Error::code
  /// (ENOENT, ESRCH, EEXIST, ...), which libnl alone would lose.
  Status call(const std::function<int(nl_sock*)>& request, const std::string& what);

 private:
  struct KernelError;
  NetlinkSocket(nl_sock* sock, std::unique_ptr<KernelError> kernelError);

  nl_sock* sock_ = nullptr;
  // Heap-allocated so the address handed to libnl's error callback survives
  // moves of this object.
  std::unique_ptr<KernelError> kernelError_;
};

/// One network interface as rtnetlink reports it.
struct LinkInfo {
  std::string name;
  int ifindex = 0;
  bool loopback = false;  ///< IFF_LOOPBACK
  bool up = false;        ///< IFF_UP (administratively up)
  std::string kind;       ///< IFLA_INFO_KIND: "veth", "bridge", ...; "" if none
  /// IFLA_LINK: for a veth, the peer's ifindex *in the peer's namespace*
  /// (which may be another one); 0 if none.
  int linkIfindex = 0;
  /// net.ipv4.conf.<name>.accept_local as the dump reports it
  /// (IFLA_AF_SPEC / IFLA_INET_CONF); -1 when not reported (no IPv4 on it).
  int acceptLocal = -1;
  /// IPv6 on and enabled on it (IFLA_AF_SPEC / IFLA_INET6_CONF: its
  /// disable_ipv6 is 0); false when not reported (IPv6 off in the kernel).
  bool ipv6 = false;
};

/// One address of an interface as rtnetlink reports it.
struct AddrInfo {
  int family = 0;  ///< AF_INET or AF_INET6
  int ifindex = 0;
  int prefixLen = 0;
  uint8_t addr[16] = {};  ///< network order; 4 bytes for IPv4
};

/// All interfaces in the calling thread's network namespace.
Result<std::vector<LinkInfo>> listLinks();

/// All interfaces in @p sock's network namespace.
Result<std::vector<LinkInfo>> listLinksOn(NetlinkSocket& sock);

/// Interface @p ifindex of @p sock's network namespace, asked alone (no
/// dump: the cost does not grow with the interfaces there); nullopt when
/// there is none.
Result<std::optional<LinkInfo>> getLinkOn(NetlinkSocket& sock, int ifindex);

/// Sets net.ipv4.conf.<if>.accept_local of interface @p ifindex with
/// RTM_SETLINK (IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF), the same setting
/// as the /proc/sys file. Path lookups under /proc/sys/net/ipv4/conf/<if>/
/// walk a dentry hash chain that holds that name for every network
/// namespace on the node, so they slow down with the number of pods;
/// netlink does not.
Status setAcceptLocal(NetlinkSocket& sock, int ifindex, int value);

/// Every IPv4 and IPv6 address in @p sock's network namespace, in the
/// kernel's order (the interface's own address, IFA_LOCAL, where it has a
/// peer address too).
Result<std::vector<AddrInfo>> listAddrsOn(NetlinkSocket& sock);

/// A policy routing rule "prio PRIORITY fwmark MARK/MASK lookup TABLE".
/// The functions below reject other families (EAFNOSUPPORT) and table 0
/// (EINVAL).
struct PolicyRule {
  int family = 0;  ///< AF_INET or AF_INET6
  uint32_t mark = 0;
  uint32_t mask = 0;
  uint32_t priority = 0;
  uint32_t table = 0;  ///< non-zero
};

/// Adds @p rule (like `ip rule add`). Succeeds without change when a rule
/// with the same family, priority, fwmark/mask and table already exists.
Status addPolicyRule(const PolicyRule& rule);

/// Deletes every rule with @p rule's family, priority, fwmark/mask and
/// table. Succeeds when there is none.
Status deletePolicyRule(const PolicyRule& rule);

/// Whether a rule with @p rule's family, priority, fwmark/mask and table
/// (action "lookup") exists.
Result<bool> policyRuleExists(const PolicyRule& rule);

/// addPolicyRule() on @p sock, with one rule dump instead of two: true when
/// the rule was added, false when it was already there.
Result<bool> ensurePolicyRule(NetlinkSocket& sock, const PolicyRule& rule);

/// Installs the route `ip route replace local 0.0.0.0/0 dev lo table TABLE`
/// (or `local ::/0` for AF_INET6): type local, scope host, out of interface
/// @p oifIndex (normally lo). Replacing makes it idempotent. For AF_INET6
/// the kernel requires the interface to be up (ENETDOWN otherwise). Like
/// the other route functions, rejects other families and table 0.
Status addLocalDefaultRoute(int family, uint32_t table, int oifIndex);

/// addLocalDefaultRoute() on @p sock.
Status addLocalDefaultRouteOn(NetlinkSocket& sock, int family, uint32_t table, int oifIndex);

/// Removes the route addLocalDefaultRoute installs; succeeds when absent.
Status deleteLocalDefaultRoute(int family, uint32_t table, int oifIndex);

/// Whether table @p table holds a local default route of @p family.
Result<bool> localDefaultRouteExists(int family, uint32_t table);

}  // namespace sluice
