#include "test/standin/standin.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "base/fd.h"

#ifndef IPV6_FREEBIND
#define IPV6_FREEBIND 78
#endif

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kRelayBufferSize = 64 * 1024;
// Bounded work per wake-up, so one busy socket cannot starve the others or
// delay stop().
constexpr int kMaxRoundsPerEvent = 16;
constexpr size_t kDnsTcpMaxPendingOut = 256 * 1024;
constexpr uint64_t kWakeToken = ~uint64_t{0};

// ---- Addresses -------------------------------------------------------------

/// A socket address of either family.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  sockaddr* raw() { return reinterpret_cast<sockaddr*>(&storage); }
  const sockaddr* raw() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr_in* v4() { return reinterpret_cast<sockaddr_in*>(&storage); }
  const sockaddr_in* v4() const { return reinterpret_cast<const sockaddr_in*>(&storage); }
  sockaddr_in6* v6() { return reinterpret_cast<sockaddr_in6*>(&storage); }
  const sockaddr_in6* v6() const { return reinterpret_cast<const sockaddr_in6*>(&storage); }

  uint16_t port() const {
    if (family() == AF_INET) return ntohs(v4()->sin_port);
    if (family() == AF_INET6) return ntohs(v6()->sin6_port);
    return 0;
  }
  void setPort(uint16_t port) {
    if (family() == AF_INET) v4()->sin_port = htons(port);
    if (family() == AF_INET6) v6()->sin6_port = htons(port);
  }
};

SockAddr makeV4(const in_addr& addr, uint16_t port) {
  SockAddr a;
  a.v4()->sin_family = AF_INET;
  a.v4()->sin_addr = addr;
  a.v4()->sin_port = htons(port);
  a.len = sizeof(sockaddr_in);
  return a;
}

SockAddr makeV6(const in6_addr& addr, uint16_t port, uint32_t scope = 0) {
  SockAddr a;
  a.v6()->sin6_family = AF_INET6;
  a.v6()->sin6_addr = addr;
  a.v6()->sin6_port = htons(port);
  a.v6()->sin6_scope_id = scope;
  a.len = sizeof(sockaddr_in6);
  return a;
}

/// A v4-mapped IPv6 address (from a dual-stack socket) becomes plain IPv4.
SockAddr normalize(const SockAddr& a) {
  if (a.family() == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a.v6()->sin6_addr)) {
    in_addr v4;
    std::memcpy(&v4, &a.v6()->sin6_addr.s6_addr[12], 4);
    return makeV4(v4, a.port());
  }
  return a;
}

std::string formatAddr(const SockAddr& in) {
  SockAddr a = normalize(in);
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.family() == AF_INET) {
    ::inet_ntop(AF_INET, &a.v4()->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(a.port());
  }
  if (a.family() == AF_INET6) {
    ::inet_ntop(AF_INET6, &a.v6()->sin6_addr, buf, sizeof(buf));
    std::string s = std::string("[") + buf;
    if (a.v6()->sin6_scope_id != 0) s += "%" + std::to_string(a.v6()->sin6_scope_id);
    return s + "]:" + std::to_string(a.port());
  }
  return "?";
}

/// Parses "1.2.3.4:80" or "[fd00::1]:80".
std::optional<SockAddr> parseAddr(const std::string& text) {
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) return std::nullopt;
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  unsigned long p = std::stoul(port);
  if (p > 65535) return std::nullopt;
  in_addr v4;
  in6_addr v6;
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return makeV4(v4, static_cast<uint16_t>(p));
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return makeV6(v6, static_cast<uint16_t>(p));
  return std::nullopt;
}

// Not in glibc's headers: netfilter's (linux/netfilter_ipv4.h,
// linux/netfilter_ipv6/ip6_tables.h).
constexpr int kSoOriginalDst = 80;
constexpr int kIp6tSoOriginalDst = 80;

/// The original destination of an accepted connection as ztunnel reads it
/// (src/socket.rs, orig_dst_addr_or_default): SO_ORIGINAL_DST, then
/// IP6T_SO_ORIGINAL_DST (dual-stack sockets answer either), else the local
/// address. @p from says which answered.
std::optional<SockAddr> originalDst(int fd, std::string& from) {
  SockAddr a;
  a.len = sizeof(a.storage);
  if (::getsockopt(fd, SOL_IP, kSoOriginalDst, a.raw(), &a.len) == 0 && a.family() == AF_INET) {
    from = "SO_ORIGINAL_DST";
    return a;
  }
  a = SockAddr{};
  a.len = sizeof(a.storage);
  if (::getsockopt(fd, SOL_IPV6, kIp6tSoOriginalDst, a.raw(), &a.len) == 0 && a.family() == AF_INET6) {
    from = "IP6T_SO_ORIGINAL_DST";
    return a;
  }
  from = "local address";
  a = SockAddr{};
  a.len = sizeof(a.storage);
  if (::getsockname(fd, a.raw(), &a.len) != 0) return std::nullopt;
  return a;
}

std::optional<SockAddr> localAddr(int fd) {
  SockAddr a;
  a.len = sizeof(a.storage);
  if (::getsockname(fd, a.raw(), &a.len) != 0) return std::nullopt;
  return a;
}

Status setIntOpt(int fd, int level, int name, int value, const char* what) {
  if (::setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    return Error::fromErrno(errno, std::string("setsockopt ") + what);
  }
  return {};
}

/// Resets instead of closing gracefully: the peer sees ECONNRESET.
void setLingerZero(int fd) {
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
}

// ---- DNS -------------------------------------------------------------------

/// The parts of a DNS query the stand-in answers from.
struct DnsQuery {
  uint16_t id = 0;
  uint16_t flags = 0;
  std::string name;        // presentation form, "." for the root
  uint16_t qtype = 0;
  size_t questionEnd = 0;  // offset just past the first question
};

std::string dnsTypeName(uint16_t type) {
  switch (type) {
    case 1: return "A";
    case 2: return "NS";
    case 5: return "CNAME";
    case 6: return "SOA";
    case 12: return "PTR";
    case 15: return "MX";
    case 16: return "TXT";
    case 28: return "AAAA";
    case 33: return "SRV";
    case 64: return "SVCB";
    case 65: return "HTTPS";
    case 255: return "ANY";
    default: return "TYPE" + std::to_string(type);
  }
}

/// Parses the header and first question; nullopt for anything malformed or
/// that is not a query.
std::optional<DnsQuery> parseDnsQuery(const uint8_t* p, size_t n) {
  if (n < 12) return std::nullopt;
  DnsQuery q;
  q.id = static_cast<uint16_t>(p[0] << 8 | p[1]);
  q.flags = static_cast<uint16_t>(p[2] << 8 | p[3]);
  if (q.flags & 0x8000) return std::nullopt;  // a response
  uint16_t qdcount = static_cast<uint16_t>(p[4] << 8 | p[5]);
  if (qdcount == 0) return std::nullopt;
  size_t off = 12;
  size_t wireLen = 1;
  for (;;) {
    if (off >= n) return std::nullopt;
    uint8_t len = p[off++];
    if (len == 0) break;
    if (len & 0xc0) return std::nullopt;  // no compression in a question
    if (off + len > n) return std::nullopt;
    wireLen += len + 1u;
    if (wireLen > 255) return std::nullopt;
    if (!q.name.empty()) q.name += '.';
    for (size_t i = 0; i < len; ++i) {
      uint8_t c = p[off + i];
      if (c > 0x20 && c < 0x7f && c != '.' && c != '\\') {
        q.name += static_cast<char>(c);
      } else {
        char esc[5];
        std::snprintf(esc, sizeof(esc), "\\%03u", c);
        q.name += esc;
      }
    }
    off += len;
  }
  if (off + 4 > n) return std::nullopt;
  q.qtype = static_cast<uint16_t>(p[off] << 8 | p[off + 1]);
  off += 4;
  q.questionEnd = off;
  if (q.name.empty()) q.name = ".";
  return q;
}

void putU16(std::string& out, uint16_t v) {
  out += static_cast<char>(v >> 8);
  out += static_cast<char>(v & 0xff);
}

/// The answer to q: header, the question echoed, and an A/AAAA record when
/// the type asks for one.
std::string buildDnsAnswer(const DnsQuery& q, const uint8_t* query, const in_addr& a,
                           const in6_addr& aaaa) {
  bool answerA = q.qtype == 1;
  bool answerAAAA = q.qtype == 28;
  std::string out;
  out.reserve(q.questionEnd + 28);
  putU16(out, q.id);
  // QR=1, opcode copied, RD copied, RA=1, RCODE 0.
  uint16_t flags = 0x8000 | (q.flags & 0x7800) | (q.flags & 0x0100) | 0x0080;
  putU16(out, flags);
  putU16(out, 1);                                   // QDCOUNT
  putU16(out, (answerA || answerAAAA) ? 1 : 0);     // ANCOUNT
  putU16(out, 0);                                   // NSCOUNT
  putU16(out, 0);                                   // ARCOUNT
  out.append(reinterpret_cast<const char*>(query + 12), q.questionEnd - 12);
  if (answerA || answerAAAA) {
    putU16(out, 0xc00c);  // pointer to the question's name
    putU16(out, q.qtype);
    putU16(out, 1);       // IN
    putU16(out, 0);       // TTL 30
    putU16(out, 30);
    if (answerA) {
      putU16(out, 4);
      out.append(reinterpret_cast<const char*>(&a), 4);
    } else {
      putU16(out, 16);
      out.append(reinterpret_cast<const char*>(&aaaa), 16);
    }
  }
  return out;
}

// ---- Event log -------------------------------------------------------------

/// Events shared between the serving thread and callers.
class EventLog {
 public:
  explicit EventLog(std::function<void(const ProxyEvent&)> callback)
      : callback_(std::move(callback)) {}

  void record(ProxyEvent event) {
    spdlog::debug("standin: {} :{} orig_dst={} peer={} {}", event.listener,
                  event.listenerPort, event.origDst, event.peer, event.detail);
    {
      std::lock_guard lock(mutex_);
      events_.push_back(event);
    }
    cv_.notify_all();
    if (callback_) callback_(event);
  }
  std::vector<ProxyEvent> snapshot() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  bool waitFor(size_t n, std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return events_.size() >= n; });
  }
  void clear() {
    std::lock_guard lock(mutex_);
    events_.clear();
  }

 private:
  std::function<void(const ProxyEvent&)> callback_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::vector<ProxyEvent> events_;
};

// ---- Serving loop ----------------------------------------------------------

enum class Kind { Outbound, Inbound, Hbone, DnsTcp };

const char* kindName(Kind k) {
  switch (k) {
    case Kind::Outbound: return "outbound";
    case Kind::Inbound: return "inbound";
    case Kind::Hbone: return "hbone";
    case Kind::DnsTcp: return "dns-tcp";
  }
  return "?";
}

/// Something registered in the epoll set: up to two fds ("sides").
class Session {
 public:
  virtual ~Session() = default;
  /// Handles readiness of one side.
  virtual void onEvent(int side, uint32_t events) = 0;
  /// Called when the deadline this session asked for has passed.
  virtual void onDeadline() {}
  /// Called when the stand-in stops, before its sockets close.
  virtual void onStop() {}
  /// True once the session can be destroyed.
  bool finished() const { return finished_; }

 protected:
  bool finished_ = false;
};

/// The single-threaded epoll server; lives in the serving thread only.
class Server {
 public:
  Server(const StandInConfig& config, EventLog& log, std::atomic<size_t>& connections)
      : config_(config), log_(log), connections_(connections) {}

  /// Opens every socket: relay listeners on [::] when @p listenV6 (else
  /// 0.0.0.0), DNS on 127.0.0.1 and, when @p dnsV6, on ::1.
  Status open(int wakeFd, bool listenV6, bool dnsV6);
  void run();

  const StandInConfig& config() const { return config_; }
  EventLog& log() { return log_; }
  std::atomic<size_t>& connections() { return connections_; }
  const in_addr& answerV4() const { return answerV4_; }
  const in6_addr& answerV6() const { return answerV6_; }

  /// Registers a session; returns its id.
  uint64_t add(std::unique_ptr<Session> session) {
    uint64_t id = nextId_++;
    sessions_.emplace(id, std::move(session));
    return id;
  }
  /// Makes the epoll set watch fd for `events` (0: not at all). `current`
  /// is the caller's record of what is registered now. A socket with nothing
  /// to wait for is removed, so a hung-up peer cannot make epoll spin.
  void watch(int fd, uint64_t id, int side, uint32_t events, uint32_t& current) {
    if (events == current) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id << 1 | static_cast<uint64_t>(side);
    int op = current == 0 ? EPOLL_CTL_ADD : (events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD);
    if (::epoll_ctl(epoll_.get(), op, fd, &ev) != 0) {
      spdlog::warn("standin: epoll_ctl: {}", std::strerror(errno));
    }
    current = events;
  }
  void addDeadline(Clock::time_point when, uint64_t id) { deadlines_.emplace(when, id); }

  void onAccepted(Kind kind, uint16_t port, Fd fd, const SockAddr& peer);

  /// True when connecting to `target` would reach one of our own relay
  /// listeners: a direct connection without a data plane in front would
  /// otherwise relay to itself forever.
  bool isOwnRelayListener(const SockAddr& target) const;

  /// Where a relay for original destination `origDst` connects.
  SockAddr upstreamFor(const SockAddr& origDst) const {
    return override_ ? *override_ : origDst;
  }

 private:
  Status openTcpListener(Kind kind, uint16_t port, int family, const SockAddr& addr,
                         bool transparent);
  Status openDnsUdp(int family, const SockAddr& addr);
  int epollTimeoutMs() const;
  void expireDeadlines();

  const StandInConfig& config_;
  EventLog& log_;
  std::atomic<size_t>& connections_;
  in_addr answerV4_{};
  in6_addr answerV6_{};
  std::optional<SockAddr> override_;
  Fd epoll_;
  std::unordered_map<uint64_t, std::unique_ptr<Session>> sessions_;
  std::multimap<Clock::time_point, uint64_t> deadlines_;
  uint64_t nextId_ = 1;
};

/// Counts a client connection for openConnections() until released (before
/// its sockets close, so a client that saw the close sees the count too).
class ConnectionCount {
 public:
  explicit ConnectionCount(std::atomic<size_t>& n) : n_(n) { ++n_; }
  ~ConnectionCount() { release(); }
  ConnectionCount(const ConnectionCount&) = delete;
  ConnectionCount& operator=(const ConnectionCount&) = delete;
  void release() {
    if (!released_) --n_;
    released_ = true;
  }

 private:
  std::atomic<size_t>& n_;
  bool released_ = false;
};

/// A listening TCP socket.
class TcpListener final : public Session {
 public:
  TcpListener(Server& server, Kind kind, uint16_t port, Fd fd)
      : server_(server), kind_(kind), port_(port), fd_(std::move(fd)) {}
  void registerWith(uint64_t id) { server_.watch(fd_.get(), id, 0, EPOLLIN, registered_); }

  void onEvent(int, uint32_t) override {
    for (int i = 0; i < 64; ++i) {
      SockAddr peer;
      peer.len = sizeof(peer.storage);
      int c = ::accept4(fd_.get(), peer.raw(), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          spdlog::warn("standin: accept on {}: {}", kindName(kind_), std::strerror(errno));
        }
        return;
      }
      server_.onAccepted(kind_, port_, Fd(c), peer);
    }
  }

 private:
  Server& server_;
  Kind kind_;
  uint16_t port_;
  Fd fd_;
  uint32_t registered_ = 0;
};

/// A DNS UDP socket (127.0.0.1 or ::1).
class DnsUdp final : public Session {
 public:
  DnsUdp(Server& server, Fd fd, uint16_t port)
      : server_(server), fd_(std::move(fd)), port_(port), buffer_(65536) {}
  void registerWith(uint64_t id) { server_.watch(fd_.get(), id, 0, EPOLLIN, registered_); }

  void onEvent(int, uint32_t) override {
    for (int i = 0; i < 64; ++i) {
      SockAddr peer;
      iovec iov{buffer_.data(), buffer_.size()};
      alignas(cmsghdr) char control[512];
      msghdr msg{};
      msg.msg_name = peer.raw();
      msg.msg_namelen = sizeof(peer.storage);
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        return;  // EAGAIN, or an ICMP error queued by an earlier answer
      }
      peer.len = msg.msg_namelen;
      if (msg.msg_flags & MSG_TRUNC) continue;
      auto q = parseDnsQuery(buffer_.data(), static_cast<size_t>(n));
      if (!q) continue;
      ProxyEvent ev;
      ev.listener = "dns-udp";
      ev.listenerPort = port_;
      ev.origDst = formatAddr(destination(msg));
      ev.origDstFrom = "datagram";
      ev.peer = formatAddr(peer);
      ev.detail = q->name + " " + dnsTypeName(q->qtype);
      server_.log().record(std::move(ev));
      std::string answer = buildDnsAnswer(*q, buffer_.data(), server_.answerV4(), server_.answerV6());
      // Sent from the socket's own address (127.0.0.1 / ::1): the data
      // plane, not the proxy, makes it look like it came from the resolver.
      ::sendto(fd_.get(), answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL, peer.raw(),
               peer.len);
    }
  }

 private:
  /// The datagram's destination. IP_ORIGDSTADDR carries address and port;
  /// IP_PKTINFO only the address (then the port is our own).
  SockAddr destination(msghdr& msg) const {
    std::optional<SockAddr> fromPktinfo;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_ORIGDSTADDR) {
        sockaddr_in sin;
        std::memcpy(&sin, CMSG_DATA(c), sizeof(sin));
        return makeV4(sin.sin_addr, ntohs(sin.sin_port));
      }
      if (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_ORIGDSTADDR) {
        sockaddr_in6 sin6;
        std::memcpy(&sin6, CMSG_DATA(c), sizeof(sin6));
        return makeV6(sin6.sin6_addr, ntohs(sin6.sin6_port), sin6.sin6_scope_id);
      }
      if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_PKTINFO) {
        in_pktinfo info;
        std::memcpy(&info, CMSG_DATA(c), sizeof(info));
        fromPktinfo = makeV4(info.ipi_addr, port_);
      }
      if (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
        in6_pktinfo info;
        std::memcpy(&info, CMSG_DATA(c), sizeof(info));
        fromPktinfo = makeV6(info.ipi6_addr, port_);
      }
    }
    if (fromPktinfo) return *fromPktinfo;
    auto local = localAddr(fd_.get());
    return local ? *local : SockAddr{};
  }

  Server& server_;
  Fd fd_;
  uint16_t port_;
  std::vector<uint8_t> buffer_;
  uint32_t registered_ = 0;
};

/// One DNS-over-TCP client connection: length-prefixed queries, answered in
/// order.
class DnsTcpConnection final : public Session {
 public:
  DnsTcpConnection(Server& server, Fd fd, uint16_t port, std::string origDst, std::string peer)
      : server_(server), count_(server.connections()), fd_(std::move(fd)), port_(port),
        origDst_(std::move(origDst)), peer_(std::move(peer)) {}
  void registerWith(uint64_t id) {
    id_ = id;
    updateInterest();
  }

  void onEvent(int, uint32_t) override {
    if (!flush()) return fail();
    for (int round = 0; round < kMaxRoundsPerEvent && !eof_ && out_.size() < kDnsTcpMaxPendingOut;
         ++round) {
      char buf[16384];
      ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return fail();
      }
      if (n == 0) {
        eof_ = true;
        break;
      }
      in_.append(buf, static_cast<size_t>(n));
      processFrames();
    }
    if (!flush()) return fail();
    if (eof_ && out_.empty()) return fail();  // done: close
    updateInterest();
  }

 private:
  void processFrames() {
    size_t off = 0;
    while (in_.size() - off >= 2) {
      size_t len = static_cast<uint8_t>(in_[off]) << 8 | static_cast<uint8_t>(in_[off + 1]);
      if (in_.size() - off - 2 < len) break;
      const auto* msg = reinterpret_cast<const uint8_t*>(in_.data() + off + 2);
      if (auto q = parseDnsQuery(msg, len)) {
        ProxyEvent ev;
        ev.listener = "dns-tcp";
        ev.listenerPort = port_;
        ev.origDst = origDst_;
        ev.origDstFrom = "local address";
        ev.peer = peer_;
        ev.detail = q->name + " " + dnsTypeName(q->qtype);
        server_.log().record(std::move(ev));
        std::string answer = buildDnsAnswer(*q, msg, server_.answerV4(), server_.answerV6());
        putU16(out_, static_cast<uint16_t>(answer.size()));
        out_ += answer;
      }
      off += 2 + len;
    }
    in_.erase(0, off);
  }
  bool flush() {
    while (!out_.empty()) {
      ssize_t n = ::send(fd_.get(), out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      out_.erase(0, static_cast<size_t>(n));
    }
    return true;
  }
  void updateInterest() {
    uint32_t want = 0;
    if (!eof_ && out_.size() < kDnsTcpMaxPendingOut) want |= EPOLLIN;
    if (!out_.empty()) want |= EPOLLOUT;
    server_.watch(fd_.get(), id_, 0, want, registered_);
  }
  void fail() {
    count_.release();
    fd_.reset();  // closing removes it from the epoll set
    finished_ = true;
  }

  Server& server_;
  ConnectionCount count_;
  Fd fd_;
  uint16_t port_;
  std::string origDst_;
  std::string peer_;
  std::string in_;
  std::string out_;
  bool eof_ = false;
  uint64_t id_ = 0;
  uint32_t registered_ = 0;
};

/// One direction of a relay.
struct Pipe {
  std::unique_ptr<char[]> buffer{new char[kRelayBufferSize]};
  size_t begin = 0;
  size_t end = 0;
  bool eof = false;   // the source sent FIN
  bool shut = false;  // FIN passed on to the sink (SHUT_WR)
  bool pending() const { return end > begin; }
};

/// An outbound or inbound connection: client socket, upstream socket, and
/// the bytes in between.
class Relay final : public Session {
 public:
  Relay(Server& server, Fd client, ProxyEvent event)
      : server_(server), count_(server.connections()), client_(std::move(client)),
        event_(std::move(event)) {}

  /// Starts the upstream connect towards `target`; `source`: bind there
  /// first (transparently) to keep the client's address.
  void begin(uint64_t id, const SockAddr& target, const std::optional<SockAddr>& source) {
    id_ = id;
    if (server_.isOwnRelayListener(target)) {
      return failUpstream("refusing to connect to the stand-in's own listener " +
                          formatAddr(target) + " (would loop)");
    }
    int family = target.family();
    Fd s(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!s.valid()) return failUpstream(std::strerror(errno));
    // The mark tells the data plane this is the proxy's own traffic.
    if (auto st = setIntOpt(s.get(), SOL_SOCKET, SO_MARK, static_cast<int>(server_.config().mark),
                            "SO_MARK");
        !st) {
      return failUpstream(st.error().message);
    }
    if (source) {
      SockAddr src = *source;
      if (src.family() != family) return failUpstream(std::strerror(EAFNOSUPPORT));
      src.setPort(0);
      // Binding a foreign (the client's) address needs TRANSPARENT; FREEBIND
      // lets the bind succeed although no interface has that address.
      Status st = family == AF_INET
                      ? setIntOpt(s.get(), SOL_IP, IP_TRANSPARENT, 1, "IP_TRANSPARENT")
                      : setIntOpt(s.get(), SOL_IPV6, IPV6_TRANSPARENT, 1, "IPV6_TRANSPARENT");
      if (!st) return failUpstream(st.error().message);
      if (family == AF_INET) {
        st = setIntOpt(s.get(), SOL_IP, IP_FREEBIND, 1, "IP_FREEBIND");
      } else if (!setIntOpt(s.get(), SOL_IPV6, IPV6_FREEBIND, 1, "IPV6_FREEBIND")) {
        st = setIntOpt(s.get(), SOL_IP, IP_FREEBIND, 1, "IP_FREEBIND");
      }
      if (!st) return failUpstream(st.error().message);
      if (::bind(s.get(), src.raw(), src.len) != 0) {
        return failUpstream("bind " + formatAddr(src) + ": " + std::strerror(errno));
      }
    }
    upstream_ = std::move(s);
    if (::connect(upstream_.get(), target.raw(), target.len) == 0) return connected();
    if (errno != EINPROGRESS) return failUpstream(std::strerror(errno));
    connecting_ = true;
    server_.addDeadline(Clock::now() + server_.config().upstreamConnectTimeout, id_);
    server_.watch(upstream_.get(), id_, 1, EPOLLOUT, upstreamRegistered_);
  }

  void onEvent(int side, uint32_t) override {
    if (connecting_) {
      if (side != 1) return;
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(upstream_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) return failUpstream(std::strerror(err));
      return connected();
    }
    pumpAll();
  }

  void onDeadline() override {
    if (connecting_) failUpstream(std::strerror(ETIMEDOUT));
  }

 private:
  void connected() {
    connecting_ = false;
    event_.detail = "upstream ok";
    server_.log().record(event_);
    pumpAll();
  }

  void failUpstream(const std::string& why) {
    connecting_ = false;
    event_.detail = "upstream failed: " + why;
    server_.log().record(event_);
    // The app sees the refusal as a reset, as it would without the proxy.
    if (client_.valid()) setLingerZero(client_.get());
    close();
  }

  void onStop() override { abort(); }

  void abort() {
    if (client_.valid()) setLingerZero(client_.get());
    if (upstream_.valid()) setLingerZero(upstream_.get());
    close();
  }

  void close() {
    count_.release();
    client_.reset();
    upstream_.reset();
    finished_ = true;
  }

  /// Moves bytes from `from` to `to` until both would block (bounded);
  /// passes EOF on as SHUT_WR once everything before it was written.
  static bool pump(int from, int to, Pipe& p) {
    for (int round = 0; round < kMaxRoundsPerEvent; ++round) {
      if (p.pending()) {
        ssize_t n = ::send(to, p.buffer.get() + p.begin, p.end - p.begin, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EINTR) continue;
          return errno == EAGAIN || errno == EWOULDBLOCK;
        }
        p.begin += static_cast<size_t>(n);
        continue;
      }
      if (p.eof) {
        if (!p.shut) {
          ::shutdown(to, SHUT_WR);
          p.shut = true;
        }
        return true;
      }
      ssize_t n = ::recv(from, p.buffer.get(), kRelayBufferSize, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      if (n == 0) {
        p.eof = true;
        continue;
      }
      p.begin = 0;
      p.end = static_cast<size_t>(n);
    }
    return true;
  }

  void pumpAll() {
    const char* side = nullptr;
    if (!pump(client_.get(), upstream_.get(), toUpstream_))
      side = "app -> upstream";
    else if (!pump(upstream_.get(), client_.get(), toClient_))
      side = "upstream -> app";
    if (side) {
      // Logged, not recorded as an event (tests count one event per
      // relay): a reset passed on to the app says where it came from.
      spdlog::info("standin: {} relay {} -> {} reset: relaying {} failed ({})", event_.listener, event_.peer,
                   event_.origDst, side, std::strerror(errno));
      return abort();
    }
    if (toUpstream_.shut && toClient_.shut) return close();
    server_.watch(client_.get(), id_, 0, interest(toUpstream_, toClient_), clientRegistered_);
    server_.watch(upstream_.get(), id_, 1, interest(toClient_, toUpstream_), upstreamRegistered_);
  }

  /// What a socket waits for: readable when its outgoing pipe is empty and
  /// open, writable when bytes for it are pending.
  static uint32_t interest(const Pipe& readInto, const Pipe& writeFrom) {
    uint32_t want = 0;
    if (!readInto.eof && !readInto.pending()) want |= EPOLLIN;
    if (writeFrom.pending()) want |= EPOLLOUT;
    return want;
  }

  Server& server_;
  ConnectionCount count_;
  Fd client_;
  Fd upstream_;
  ProxyEvent event_;
  Pipe toUpstream_;
  Pipe toClient_;
  bool connecting_ = false;
  uint64_t id_ = 0;
  uint32_t clientRegistered_ = 0;
  uint32_t upstreamRegistered_ = 0;
};

Status Server::openTcpListener(Kind kind, uint16_t port, int family, const SockAddr& addr,
                               bool transparent) {
  std::string what = std::string(kindName(kind)) + " listener " + formatAddr(addr);
  Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, what + ": socket");
  auto opt = [&](int level, int name, int value, const char* optName) -> Status {
    if (::setsockopt(fd.get(), level, name, &value, sizeof(value)) != 0) {
      return Error::fromErrno(errno, what + ": setsockopt " + optName);
    }
    return {};
  };
  SLUICE_TRY(opt(SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"));
  if (config_.reuseport) SLUICE_TRY(opt(SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT"));
  SLUICE_TRY(opt(SOL_SOCKET, SO_MARK, static_cast<int>(config_.mark), "SO_MARK"));
  if (family == AF_INET6) {
    // [::] serves both families; ::1 is v6 only (127.0.0.1 has its own socket).
    bool dualStack = IN6_IS_ADDR_UNSPECIFIED(&addr.v6()->sin6_addr);
    SLUICE_TRY(opt(SOL_IPV6, IPV6_V6ONLY, dualStack ? 0 : 1, "IPV6_V6ONLY"));
  }
  if (transparent) {
    // Needed for TPROXY-style delivery: the SYN-ACK leaves from the original
    // destination, which is not a local address. Best effort, like ztunnel.
    Status st = family == AF_INET6 ? opt(SOL_IPV6, IPV6_TRANSPARENT, 1, "IPV6_TRANSPARENT")
                                   : opt(SOL_IP, IP_TRANSPARENT, 1, "IP_TRANSPARENT");
    if (st && family == AF_INET6) st = opt(SOL_IP, IP_TRANSPARENT, 1, "IP_TRANSPARENT");
    if (!st) spdlog::warn("standin: {}", st.error().message);
  }
  if (::bind(fd.get(), addr.raw(), addr.len) != 0) return Error::fromErrno(errno, what + ": bind");
  if (::listen(fd.get(), config_.backlog) != 0) return Error::fromErrno(errno, what + ": listen");
  auto listener = std::make_unique<TcpListener>(*this, kind, port, std::move(fd));
  auto* raw = listener.get();
  raw->registerWith(add(std::move(listener)));
  return {};
}

Status Server::openDnsUdp(int family, const SockAddr& addr) {
  std::string what = "dns-udp socket " + formatAddr(addr);
  Fd fd(::socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, what + ": socket");
  auto opt = [&](int level, int name, int value, const char* optName) -> Status {
    if (::setsockopt(fd.get(), level, name, &value, sizeof(value)) != 0) {
      return Error::fromErrno(errno, what + ": setsockopt " + optName);
    }
    return {};
  };
  SLUICE_TRY(opt(SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"));
  if (config_.reuseport) SLUICE_TRY(opt(SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT"));
  SLUICE_TRY(opt(SOL_SOCKET, SO_MARK, static_cast<int>(config_.mark), "SO_MARK"));
  // The data plane hands over queries still addressed to the resolver the
  // app asked; these options report that address per datagram.
  if (family == AF_INET) {
    SLUICE_TRY(opt(SOL_IP, IP_PKTINFO, 1, "IP_PKTINFO"));
    SLUICE_TRY(opt(SOL_IP, IP_RECVORIGDSTADDR, 1, "IP_RECVORIGDSTADDR"));
  } else {
    SLUICE_TRY(opt(SOL_IPV6, IPV6_V6ONLY, 1, "IPV6_V6ONLY"));
    SLUICE_TRY(opt(SOL_IPV6, IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO"));
    SLUICE_TRY(opt(SOL_IPV6, IPV6_RECVORIGDSTADDR, 1, "IPV6_RECVORIGDSTADDR"));
  }
  if (::bind(fd.get(), addr.raw(), addr.len) != 0) return Error::fromErrno(errno, what + ": bind");
  auto sock = std::make_unique<DnsUdp>(*this, std::move(fd), config_.dnsPort);
  auto* raw = sock.get();
  raw->registerWith(add(std::move(sock)));
  return {};
}

Status Server::open(int wakeFd, bool listenV6, bool dnsV6) {
  if (::inet_pton(AF_INET, config_.dnsAnswerV4.c_str(), &answerV4_) != 1) {
    return Error::msg("invalid dnsAnswerV4 '" + config_.dnsAnswerV4 + "'", EINVAL);
  }
  if (::inet_pton(AF_INET6, config_.dnsAnswerV6.c_str(), &answerV6_) != 1) {
    return Error::msg("invalid dnsAnswerV6 '" + config_.dnsAnswerV6 + "'", EINVAL);
  }
  if (!config_.upstreamOverride.empty()) {
    override_ = parseAddr(config_.upstreamOverride);
    if (!override_) {
      return Error::msg("invalid upstream override '" + config_.upstreamOverride +
                            "' (want 1.2.3.4:80 or [::1]:80)",
                        EINVAL);
    }
  }
  epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return Error::fromErrno(errno, "epoll_create1");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wakeFd, &ev) != 0) {
    return Error::fromErrno(errno, "epoll_ctl");
  }

  int family = listenV6 ? AF_INET6 : AF_INET;
  SockAddr any = listenV6 ? makeV6(in6addr_any, 0) : makeV4(in_addr{htonl(INADDR_ANY)}, 0);
  const std::array<std::pair<Kind, uint16_t>, 3> relayListeners = {
      {{Kind::Outbound, config_.outboundPort},
       {Kind::Inbound, config_.inboundPort},
       {Kind::Hbone, config_.hbonePort}}};
  for (auto [kind, port] : relayListeners) {
    SockAddr addr = any;
    addr.setPort(port);
    SLUICE_TRY(openTcpListener(kind, port, family, addr, config_.transparent));
  }
  SockAddr lo4 = makeV4(in_addr{htonl(INADDR_LOOPBACK)}, config_.dnsPort);
  SLUICE_TRY(openDnsUdp(AF_INET, lo4));
  SLUICE_TRY(openTcpListener(Kind::DnsTcp, config_.dnsPort, AF_INET, lo4, false));
  if (dnsV6) {
    SockAddr lo6 = makeV6(in6addr_loopback, config_.dnsPort);
    SLUICE_TRY(openDnsUdp(AF_INET6, lo6));
    SLUICE_TRY(openTcpListener(Kind::DnsTcp, config_.dnsPort, AF_INET6, lo6, false));
  }
  return {};
}

bool canBind(const SockAddr& addr) {
  Fd probe(::socket(addr.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  return probe.valid() && ::bind(probe.get(), addr.raw(), addr.len) == 0;
}

bool Server::isOwnRelayListener(const SockAddr& target) const {
  SockAddr t = normalize(target);
  if (t.port() != config_.outboundPort && t.port() != config_.inboundPort) return false;
  // Is the address one of this netns' own? bind() without TRANSPARENT
  // succeeds only for local (or wildcard) addresses.
  Fd probe(::socket(t.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return false;
  t.setPort(0);
  return ::bind(probe.get(), t.raw(), t.len) == 0;
}

void Server::onAccepted(Kind kind, uint16_t port, Fd fd, const SockAddr& peer) {
  std::string from = "local address";
  auto local = kind == Kind::DnsTcp ? localAddr(fd.get()) : originalDst(fd.get(), from);
  if (!local) return;
  ProxyEvent ev;
  ev.listener = kindName(kind);
  ev.listenerPort = port;
  ev.origDst = formatAddr(*local);
  ev.origDstFrom = from;
  ev.peer = formatAddr(peer);
  switch (kind) {
    case Kind::Hbone: {
      log_.record(std::move(ev));
      static constexpr char kGreeting[] = "hbone\n";
      ::send(fd.get(), kGreeting, sizeof(kGreeting) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      return;  // fd closes here
    }
    case Kind::DnsTcp: {
      auto conn = std::make_unique<DnsTcpConnection>(*this, std::move(fd), port, ev.origDst, ev.peer);
      auto* raw = conn.get();
      raw->registerWith(add(std::move(conn)));
      return;
    }
    case Kind::Outbound:
    case Kind::Inbound: {
      SockAddr origDst = normalize(*local);
      std::optional<SockAddr> source;
      if (kind == Kind::Inbound) source = normalize(peer);
      auto relay = std::make_unique<Relay>(*this, std::move(fd), std::move(ev));
      auto* raw = relay.get();
      uint64_t id = add(std::move(relay));
      raw->begin(id, upstreamFor(origDst), source);
      if (raw->finished()) sessions_.erase(id);
      return;
    }
  }
}

int Server::epollTimeoutMs() const {
  if (deadlines_.empty()) return -1;
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 60'000));
}

void Server::expireDeadlines() {
  auto now = Clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    uint64_t id = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;
    it->second->onDeadline();
    if (it->second->finished()) sessions_.erase(it);
  }
}

void Server::run() {
  std::array<epoll_event, 64> events;
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                         epollTimeoutMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("standin: epoll_wait: {}", std::strerror(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t token = events[static_cast<size_t>(i)].data.u64;
      if (token == kWakeToken) {
        // Stopping is abrupt, as a killed proxy's is: every relayed
        // connection is reset, never half-closed with a FIN that would look
        // like an answer to the app.
        for (auto& [id, session] : sessions_) session->onStop();
        return;
      }
      // A session destroyed earlier in this batch is simply not found.
      auto it = sessions_.find(token >> 1);
      if (it == sessions_.end()) continue;
      it->second->onEvent(static_cast<int>(token & 1), events[static_cast<size_t>(i)].events);
      if (it->second->finished()) sessions_.erase(it);
    }
    expireDeadlines();
  }
}

}  // namespace

// ---- ProxyStandIn ----------------------------------------------------------

struct ProxyStandIn::State {
  explicit State(const StandInConfig& c) : config(c), log(c.onEvent) {}

  StandInConfig config;
  EventLog log;
  std::atomic<size_t> connections{0};
  Fd wake;
  std::thread thread;
  std::mutex stopMutex;
};

ProxyStandIn::ProxyStandIn(std::unique_ptr<State> state) : state_(std::move(state)) {}

ProxyStandIn::~ProxyStandIn() { stop(); }

Result<std::unique_ptr<ProxyStandIn>> ProxyStandIn::start(const StandInConfig& config) {
  auto state = std::make_unique<State>(config);
  state->wake = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!state->wake.valid()) return Error::fromErrno(errno, "eventfd");

  std::promise<Status> ready;
  auto readyFuture = ready.get_future();
  State* st = state.get();
  state->thread = std::thread([st, ready = std::move(ready)]() mutable {
    ::pthread_setname_np(::pthread_self(), "sluice-standin");
    if (!st->config.netnsPath.empty()) {
      // Only this thread moves; every socket it creates belongs to the netns.
      Fd ns(::open(st->config.netnsPath.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns.valid()) {
        ready.set_value(Error::fromErrno(errno, "netns " + st->config.netnsPath));
        return;
      }
      if (::setns(ns.get(), CLONE_NEWNET) != 0) {
        ready.set_value(Error::fromErrno(errno, "setns " + st->config.netnsPath));
        return;
      }
    } else if (st->config.netnsFd >= 0) {
      // The caller's fd stays valid until ready is set (start() waits).
      if (::setns(st->config.netnsFd, CLONE_NEWNET) != 0) {
        ready.set_value(Error::fromErrno(errno, "setns (netns fd " + std::to_string(st->config.netnsFd) + ")"));
        return;
      }
    }
    bool listenV6 = st->config.ipv6;
    bool dnsV6 = st->config.ipv6;
    if (st->config.detectIpv6) {
      // ztunnel's test: can an IPv6 socket bind here at all, and on ::1?
      listenV6 = canBind(makeV6(in6addr_any, 0));
      dnsV6 = canBind(makeV6(in6addr_loopback, 0));
    }
    Server server(st->config, st->log, st->connections);
    Status opened = server.open(st->wake.get(), listenV6, dnsV6);
    bool ok = opened.ok();
    ready.set_value(std::move(opened));
    if (ok) server.run();
    // Leaving the scope closes every socket before the thread ends.
  });
  Status opened = readyFuture.get();
  if (!opened) {
    state->thread.join();
    return opened.error();
  }
  return std::unique_ptr<ProxyStandIn>(new ProxyStandIn(std::move(state)));
}

void ProxyStandIn::stop() {
  std::lock_guard lock(state_->stopMutex);
  if (!state_->thread.joinable()) return;
  uint64_t one = 1;
  if (::write(state_->wake.get(), &one, sizeof(one)) < 0) {
    spdlog::error("standin: cannot wake the serving thread: {}", std::strerror(errno));
  }
  state_->thread.join();
}

std::vector<ProxyEvent> ProxyStandIn::events() const { return state_->log.snapshot(); }

bool ProxyStandIn::waitForEvents(size_t n, std::chrono::milliseconds timeout) const {
  return state_->log.waitFor(n, timeout);
}

void ProxyStandIn::clearEvents() { state_->log.clear(); }

size_t ProxyStandIn::openConnections() const { return state_->connections.load(); }

}  // namespace sluice
