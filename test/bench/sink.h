// The benchmark's sink: a terminating "proxy" with ztunnel's socket contract
// (listeners [::]:15001 and [::]:15006 dual-stack, IP_TRANSPARENT,
// SO_REUSEPORT, SO_MARK 0x539; DNS on 127.0.0.1:15053), served by one epoll
// thread. Unlike the stand-in it does not relay: it answers itself, so the
// figures measure the redirection, not a proxy.
//
// Every accepted connection is checked: its original destination (read
// with SO_ORIGINAL_DST in the iptables cases, getsockname() otherwise) must
// lie in the range the load generator dials (a.b.c.K:port), and the first
// byte the client sends must be K. A connection that fails the check counts
// as "bad": a broken redirect cannot post a good number.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/result.h"

namespace sluice::bench {

/// How the sink reads an accepted connection's original destination:
/// getsockname (TPROXY-style delivery), SO_ORIGINAL_DST (REDIRECT; then
/// IP6T_SO_ORIGINAL_DST, as ztunnel asks), or as ztunnel does, those two
/// and getsockname when both fail.
enum class OrigDstMethod { GetSockName, SoOriginalDst, Ztunnel };

/// The original destinations one listener must see: (net | K):port with K
/// in 1..250; net is a /24 in host byte order. IPv6 connections: net6 with
/// its last byte K.
struct Expect {
  uint32_t net = 0;
  uint16_t port = 0;
  in6_addr net6{};
};

struct SinkConfig {
  int netnsFd = -1;  ///< sockets are created in this netns
  OrigDstMethod method = OrigDstMethod::GetSockName;
  Expect outbound;  ///< what the 15001 listener must see
  Expect inbound;   ///< what the 15006 listener must see
  uint16_t outboundPort = 15001;
  uint16_t inboundPort = 15006;
  uint16_t dnsPort = 15053;
  uint32_t mark = 0x539;
  std::string dnsAnswer = "10.96.0.99";
  int cpu = -1;  ///< pin the serving thread
};

/// What the sink recorded of one accepted connection (probe checks).
struct ConnInfo {
  std::string listener;  ///< "outbound" | "inbound"
  std::string local;     ///< getsockname()
  std::string peer;
  std::string soOriginalDst;  ///< "" when SO_ORIGINAL_DST and IP6T_SO_ORIGINAL_DST failed
  int soOriginalDstErrno = 0;
  std::string origDst;  ///< what the configured method gave
};

struct SinkCounters {
  uint64_t accepted = 0;
  uint64_t ok = 0;    ///< first byte matched the original destination
  uint64_t bad = 0;   ///< wrong original destination or first byte
  uint64_t bytes = 0; ///< discard mode
  uint64_t dnsQueries = 0;
};

enum class SinkMode { Echo, Discard };

class Sink {
 public:
  static Result<std::unique_ptr<Sink>> start(const SinkConfig& config);
  ~Sink();
  Sink(const Sink&) = delete;
  Sink& operator=(const Sink&) = delete;

  void setMode(SinkMode m) { mode_.store(m); }
  SinkCounters counters() const;
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  /// The first few failed checks, as text.
  std::vector<std::string> badSamples() const;

  /// While on, every accepted connection is recorded (slow path).
  void setRecording(bool on);
  std::vector<ConnInfo> recorded() const;

  /// The listening sockets (for a SOCKMAP that hands them connections).
  int outboundListenerFd() const { return outL_.get(); }
  int inboundListenerFd() const { return inL_.get(); }

 private:
  Sink() = default;
  void serve();
  void acceptAll(int lfd, bool outbound);
  void serveConn(int fd);
  void serveDns();
  void noteBad(const std::string& what);

  SinkConfig cfg_;
  Fd outL_, inL_, udp_, ep_, wake_;
  std::thread thread_;
  std::atomic<SinkMode> mode_{SinkMode::Echo};
  std::atomic<uint64_t> accepted_{0}, ok_{0}, bad_{0}, bytes_{0}, dns_{0};
  std::atomic<bool> recording_{false};
  mutable std::mutex mu_;
  std::vector<ConnInfo> recorded_;
  std::vector<std::string> badSamples_;
  // Per-fd state of accepted connections: -2 free, -1 failed the origdst
  // check, 0 first byte seen, 1..250 waiting for the first byte K.
  std::vector<int16_t> conn_;
};

/// "10.96.0.7:80" from a sockaddr (v4-mapped IPv6 printed as IPv4).
std::string sockaddrText(const sockaddr* sa);

}  // namespace sluice::bench
