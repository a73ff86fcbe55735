// The benchmark's load generators. Each runs on a thread that joined the
// client's network namespace (the pod for outbound traffic, the node for
// inbound), pinned to one CPU, for a warm-up and then a measured window.
//
// Destinations are indexed by K in 1..250 ((net | K):port; IPv6: the
// address's last byte is K); the first byte a client sends on a connection
// is K, which the sink checks against the original destination it recovers.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "test/bench/sink.h"
#include "test/bench/util.h"

namespace sluice::bench {

/// A destination of either family.
struct Addr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
  int family() const { return ss.ss_family; }
  /// K: the address's last byte.
  int index() const;
  std::string text() const;
};
Addr addrOf(const sockaddr_in& a);
/// @p net with its last byte replaced by @p k, at @p port.
Addr v6(const in6_addr& net, int k, uint16_t port);
in6_addr parseV6(const char* text);

using DstFn = std::function<Addr(int k)>;

struct LoadOptions {
  double warmup = 0.2;    ///< seconds before the measured window
  double duration = 1.0;  ///< measured window, seconds
  /// When set, the measured window [from, end) itself (warmup and
  /// duration are then ignored), so that a caller can sample around it.
  std::optional<Clock::time_point> from, end;
  int concurrency = 16;   ///< connections / queries in flight
  int cpu = -1;           ///< pin the client thread
  int mss = 0;            ///< TCP_MAXSEG on client sockets (0: the route's)
};

/// What every run reports besides its figure.
struct RunCheck {
  uint64_t total = 0;   ///< operations completed, warm-up included
  uint64_t errors = 0;  ///< failed connects, time-outs, wrong answers
  std::string firstError;
  void fail(const std::string& what) {
    errors++;
    if (firstError.empty()) firstError = what;
  }
};

/// The measured window of a run: [from, end).
struct Window {
  Clock::time_point from, end;
};
Window windowOf(const LoadOptions& o);

struct ConnRateResult {
  double rate = 0;  ///< completed connections per second in the window
  RunCheck check;
};
/// New connections: connect, 1-byte request, 1-byte response, close.
ConnRateResult runConnRate(int nsfd, const DstFn& dst, const LoadOptions& o);

struct RrResult {
  double tps = 0;  ///< transactions per second (all connections)
  double p50us = 0, p99us = 0;
  RunCheck check;
};
/// 1-byte request/response on long-lived connections (one thread per
/// connection, blocking I/O; concurrency = number of connections).
RrResult runRr(int nsfd, const DstFn& dst, const LoadOptions& o);

struct BulkResult {
  double gbps = 0;  ///< as counted by the sink
  RunCheck check;
};
/// One connection streaming 64 KiB writes into a sink in discard mode.
BulkResult runBulk(int nsfd, const Addr& dst, const Sink& sink, const LoadOptions& o);

struct DnsResult {
  double qps = 0;
  uint64_t lost = 0;
  RunCheck check;
};
/// DNS A queries over UDP, a fresh connected socket per query (as glibc's
/// resolver does); each answer must come from @p resolver and carry
/// @p answer.
DnsResult runDns(int nsfd, const sockaddr_in& resolver, const std::string& answer, const LoadOptions& o);

sockaddr_in v4(const std::string& ip, uint16_t port);
sockaddr_in v4(uint32_t hostOrderAddr, uint16_t port);

}  // namespace sluice::bench
