// A small proxy with ztunnel's socket contract (see
// docs/redirection.md, "The proxy's side of the contract"): the
// listeners, marks and transparent sockets the data plane feeds, and a record
// of everything it received. Tests use it in-process; `sluice-standin` wraps
// it for live demos.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice {

/// One connection or DNS query the stand-in received.
///
/// Addresses are "1.2.3.4:80" or "[fd00::1]:80"; v4-mapped IPv6 addresses
/// (dual-stack listeners) are printed as plain IPv4.
struct ProxyEvent {
  /// "outbound" | "inbound" | "hbone" | "dns-udp" | "dns-tcp".
  std::string listener;
  /// Port of the listener that got it (15001, …).
  uint16_t listenerPort = 0;
  /// The original destination, found as ztunnel finds it: SO_ORIGINAL_DST
  /// on the accepted socket (IPv4, then IPv6), else its local address (with
  /// TPROXY-style delivery that is the app's original destination); for DNS
  /// the destination of the datagram.
  std::string origDst;
  /// How origDst was found: "SO_ORIGINAL_DST", "IP6T_SO_ORIGINAL_DST",
  /// "local address" (relays and DNS over TCP), or "datagram" (DNS over UDP).
  std::string origDstFrom;
  /// Remote address.
  std::string peer;
  /// DNS: queried name and type ("example.com A"). Relays: "upstream ok" or
  /// "upstream failed: <strerror or reason>". hbone: empty.
  std::string detail;
};

/// What the stand-in listens on and how it marks its sockets.
struct StandInConfig {
  uint16_t outboundPort = 15001;  ///< TCP, apps' outgoing connections
  uint16_t inboundPort = 15006;   ///< TCP, connections arriving at the pod
  uint16_t hbonePort = 15008;     ///< TCP, answers "hbone\n" and closes
  uint16_t dnsPort = 15053;       ///< UDP + TCP on 127.0.0.1 (and ::1)
  /// SO_MARK on every socket (listeners, DNS, upstream connections).
  uint32_t mark = 0x539;
  /// true: `[::]` dual-stack listeners + DNS also on `[::1]`;
  /// false: `0.0.0.0` listeners and DNS on 127.0.0.1 only.
  bool ipv6 = true;
  /// SO_REUSEPORT on every listening socket. Note that with it a second
  /// reuseport socket of the same user may share the ports (ztunnel's
  /// hand-over); a port is "in use" only for sockets without it.
  bool reuseport = true;
  /// IP_TRANSPARENT (+IPV6_TRANSPARENT) on the 15001/15006/15008 listeners,
  /// best effort (a warning is logged when refused).
  bool transparent = true;
  std::string dnsAnswerV4 = "10.96.0.99";  ///< A answer for any name
  std::string dnsAnswerV6 = "fd00::99";    ///< AAAA answer for any name
  /// When non-empty: every socket is created inside that network namespace
  /// (setns from the stand-in's own thread); the caller's thread never moves.
  std::string netnsPath;
  /// When >= 0 (and netnsPath is empty): the same with an open netns fd, as
  /// ztunnel receives it over ZDS. Borrowed: only used until start() returns.
  int netnsFd = -1;
  /// Decide `ipv6` inside the namespace at start, as ztunnel does per pod:
  /// `[::]` dual-stack listeners when the namespace has IPv6 at all (else
  /// `0.0.0.0`), DNS also on `[::1]` when its loopback has ::1.
  bool detectIpv6 = false;
  /// listen() backlog of the TCP listeners (ztunnel uses 128).
  int backlog = 1024;
  /// When non-empty ("1.2.3.4:80" or "[::1]:80"), the outbound and inbound
  /// relays connect there instead of to the original destination (still
  /// marked, inbound still with the client's address as source). For tests
  /// and demos without a data plane, where the original destination is
  /// always the stand-in's own listener.
  std::string upstreamOverride;
  /// A relay whose upstream connect has not completed by then fails with
  /// "upstream failed: Connection timed out".
  std::chrono::milliseconds upstreamConnectTimeout{5000};
  /// Called for every event, from the stand-in's thread, after it was
  /// recorded. Must not call stop().
  std::function<void(const ProxyEvent&)> onEvent;
};

/// The ztunnel stand-in: listeners on the outbound, inbound, HBONE and DNS
/// ports, served by one epoll thread.
///
/// - outbound: records the original destination (SO_ORIGINAL_DST first, the
///   accepted socket's local address when that fails, as ztunnel does),
///   connects there marked, relays both ways (half-close kept).
/// - inbound: same, but the upstream socket is IP_TRANSPARENT + FREEBIND and
///   bound to the client's IP, so the app sees the real client.
/// - hbone: writes "hbone\n" and closes.
/// - DNS (UDP, and TCP with 2-byte length prefixes): answers A/AAAA for any
///   name with the configured addresses, TTL 30; other types get no answer
///   record; malformed queries are ignored.
///
/// A relay's event is recorded once its upstream connect succeeded or
/// failed (detail "upstream ok" / "upstream failed: …"), before any byte is
/// relayed; every other event before the answer is sent. A relay whose
/// target is one of the stand-in's own relay listeners (a direct connection
/// without a data plane in front) fails instead of looping. On an upstream
/// failure the client connection is reset.
class ProxyStandIn {
 public:
  /// Opens all listeners (fails with a readable error if any cannot be
  /// opened, e.g. port in use or netns missing) and starts serving.
  static Result<std::unique_ptr<ProxyStandIn>> start(const StandInConfig& config);

  /// Calls stop().
  ~ProxyStandIn();
  ProxyStandIn(const ProxyStandIn&) = delete;
  ProxyStandIn& operator=(const ProxyStandIn&) = delete;

  /// Closes every socket (open client connections included) and joins the
  /// serving thread. Idempotent, thread-safe, returns within milliseconds.
  void stop();

  /// Thread-safe snapshot of the events, in arrival order.
  std::vector<ProxyEvent> events() const;

  /// Waits until at least n events were recorded; false on timeout.
  bool waitForEvents(size_t n, std::chrono::milliseconds timeout) const;

  /// Forgets the events recorded so far.
  void clearEvents();

  /// Client connections currently open (relays and DNS over TCP).
  size_t openConnections() const;

 private:
  struct State;
  explicit ProxyStandIn(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace sluice
