#include "test/bench/sink.h"

#include <arpa/inet.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "loader/netns.h"
#include "test/bench/util.h"

namespace sluice::bench {

namespace {

constexpr size_t kBufSize = 256 * 1024;

Status setOpt(int fd, int level, int name, int value, const char* what) {
  if (::setsockopt(fd, level, name, &value, sizeof(value)) != 0) return Error::fromErrno(errno, what);
  return {};
}

/// [::]:port dual-stack with ztunnel's options.
Result<Fd> tcpListener(uint16_t port, uint32_t mark) {
  Fd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  SLUICE_TRY(setOpt(fd.get(), SOL_IPV6, IPV6_V6ONLY, 0, "IPV6_V6ONLY"));
  SLUICE_TRY(setOpt(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"));
  SLUICE_TRY(setOpt(fd.get(), SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT"));
  SLUICE_TRY(setOpt(fd.get(), SOL_SOCKET, SO_MARK, static_cast<int>(mark), "SO_MARK"));
  SLUICE_TRY(setOpt(fd.get(), SOL_IPV6, IPV6_TRANSPARENT, 1, "IPV6_TRANSPARENT"));
  SLUICE_TRY(setOpt(fd.get(), SOL_IP, IP_TRANSPARENT, 1, "IP_TRANSPARENT"));
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  a.sin6_addr = in6addr_any;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Error::fromErrno(errno, "bind [::]:" + std::to_string(port));
  if (::listen(fd.get(), 4096) != 0) return Error::fromErrno(errno, "listen");
  return fd;
}

Result<Fd> udpSocket(uint16_t port, uint32_t mark) {
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  SLUICE_TRY(setOpt(fd.get(), SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT"));
  SLUICE_TRY(setOpt(fd.get(), SOL_SOCKET, SO_MARK, static_cast<int>(mark), "SO_MARK"));
  (void)setOpt(fd.get(), SOL_SOCKET, SO_RCVBUF, 4 << 20, "SO_RCVBUF");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0)
    return Error::fromErrno(errno, "bind 127.0.0.1:" + std::to_string(port));
  return fd;
}

/// K when @p ss (v4, v4-mapped v6 or v6) is one of the destinations @p want
/// describes, else 0.
int indexIn(const sockaddr_storage& ss, const Expect& want) {
  uint32_t a = 0;
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto& s4 = reinterpret_cast<const sockaddr_in&>(ss);
    a = ntohl(s4.sin_addr.s_addr);
    port = ntohs(s4.sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto& s6 = reinterpret_cast<const sockaddr_in6&>(ss);
    port = ntohs(s6.sin6_port);
    const uint8_t* b = s6.sin6_addr.s6_addr;
    if (!IN6_IS_ADDR_V4MAPPED(&s6.sin6_addr)) {
      int k = b[15];
      bool in = std::memcmp(b, want.net6.s6_addr, 15) == 0 && port == want.port && k >= 1 && k <= 250;
      return in ? k : 0;
    }
    a = static_cast<uint32_t>(b[12]) << 24 | static_cast<uint32_t>(b[13]) << 16 | static_cast<uint32_t>(b[14]) << 8 | b[15];
  } else {
    return 0;
  }
  int k = static_cast<int>(a & 0xff);
  return (a & 0xffffff00u) == want.net && port == want.port && k >= 1 && k <= 250 ? k : 0;
}

void putU16(std::string& s, uint16_t v) {
  s += static_cast<char>(v >> 8);
  s += static_cast<char>(v & 0xff);
}

}  // namespace

std::string sockaddrText(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &s->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(s->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) {
      ::inet_ntop(AF_INET, &s->sin6_addr.s6_addr[12], buf, sizeof(buf));
      return std::string(buf) + ":" + std::to_string(ntohs(s->sin6_port));
    }
    ::inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(s->sin6_port));
  }
  return "?";
}

Result<std::unique_ptr<Sink>> Sink::start(const SinkConfig& config) {
  std::unique_ptr<Sink> s(new Sink());
  s->cfg_ = config;
  Status st = runInNetns(config.netnsFd, [&]() -> Status {
    auto o = tcpListener(config.outboundPort, config.mark);
    SLUICE_TRY(o);
    auto i = tcpListener(config.inboundPort, config.mark);
    SLUICE_TRY(i);
    auto u = udpSocket(config.dnsPort, config.mark);
    SLUICE_TRY(u);
    s->outL_ = std::move(*o);
    s->inL_ = std::move(*i);
    s->udp_ = std::move(*u);
    return {};
  });
  if (!st.ok()) return Error::msg("sink: " + st.error().message, st.error().code);
  s->ep_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  s->wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->ep_.valid() || !s->wake_.valid()) return Error::fromErrno(errno, "sink: epoll/eventfd");
  for (int fd : {s->outL_.get(), s->inL_.get(), s->udp_.get(), s->wake_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(s->ep_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Error::fromErrno(errno, "sink: epoll_ctl");
  }
  s->conn_.assign(4096, -2);
  s->thread_ = std::thread([raw = s.get()] { raw->serve(); });
  return s;
}

Sink::~Sink() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
    thread_.join();
  }
  for (size_t fd = 0; fd < conn_.size(); fd++)
    if (conn_[fd] != -2) ::close(static_cast<int>(fd));
}

SinkCounters Sink::counters() const {
  SinkCounters c;
  c.accepted = accepted_.load();
  c.ok = ok_.load();
  c.bad = bad_.load();
  c.bytes = bytes_.load();
  c.dnsQueries = dns_.load();
  return c;
}

std::vector<std::string> Sink::badSamples() const {
  std::lock_guard lock(mu_);
  return badSamples_;
}

void Sink::setRecording(bool on) {
  std::lock_guard lock(mu_);
  recorded_.clear();
  recording_.store(on);
}

std::vector<ConnInfo> Sink::recorded() const {
  std::lock_guard lock(mu_);
  return recorded_;
}

void Sink::noteBad(const std::string& what) {
  bad_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  if (badSamples_.size() < 5) badSamples_.push_back(what);
}

void Sink::serve() {
  pinThisThread(cfg_.cpu);
  epoll_event evs[128];
  for (;;) {
    int n = ::epoll_wait(ep_.get(), evs, 128, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == wake_.get()) return;
      if (fd == outL_.get()) acceptAll(fd, true);
      else if (fd == inL_.get()) acceptAll(fd, false);
      else if (fd == udp_.get()) serveDns();
      else serveConn(fd);
    }
  }
}

void Sink::acceptAll(int lfd, bool outbound) {
  for (;;) {
    int c = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) return;  // EAGAIN (or a transient error: the next event retries)
    accepted_.fetch_add(1, std::memory_order_relaxed);
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const Expect& want = outbound ? cfg_.outbound : cfg_.inbound;

    sockaddr_storage od{};
    bool have = false;
    int soErr = 0;
    sockaddr_storage so{};
    bool soOk = false;
    if (cfg_.method != OrigDstMethod::GetSockName || recording_.load(std::memory_order_relaxed)) {
      // ztunnel's order (src/socket.rs): SO_ORIGINAL_DST, then
      // IP6T_SO_ORIGINAL_DST (the same option number at SOL_IPV6).
      socklen_t soLen = sizeof(so);
      soOk = ::getsockopt(c, SOL_IP, SO_ORIGINAL_DST, &so, &soLen) == 0 && so.ss_family == AF_INET;
      if (!soOk) {
        soErr = errno;
        so = {};
        soLen = sizeof(so);
        soOk = ::getsockopt(c, SOL_IPV6, SO_ORIGINAL_DST, &so, &soLen) == 0 && so.ss_family == AF_INET6;
      }
    }
    sockaddr_storage local{};
    socklen_t llen = sizeof(local);
    bool localOk = false;
    if (cfg_.method == OrigDstMethod::GetSockName || (cfg_.method == OrigDstMethod::Ztunnel && !soOk) ||
        recording_.load(std::memory_order_relaxed))
      localOk = ::getsockname(c, reinterpret_cast<sockaddr*>(&local), &llen) == 0;
    if (cfg_.method == OrigDstMethod::SoOriginalDst || (cfg_.method == OrigDstMethod::Ztunnel && soOk)) {
      have = soOk;
      od = so;
    } else {
      have = localOk;
      od = local;
    }

    int16_t state = -1;
    if (!have) {
      noteBad(std::string(outbound ? "outbound" : "inbound") + ": no original destination (" +
              (cfg_.method == OrigDstMethod::SoOriginalDst ? std::string("SO_ORIGINAL_DST: ") + std::strerror(soErr)
                                                           : std::string("getsockname")) +
              ")");
    } else if (int k = indexIn(od, want); k > 0) {
      state = static_cast<int16_t>(k);
    } else {
      noteBad(std::string(outbound ? "outbound" : "inbound") + ": original destination " +
              sockaddrText(reinterpret_cast<sockaddr*>(&od)) + " is not one the client dials");
    }

    if (recording_.load(std::memory_order_relaxed)) {
      ConnInfo ci;
      ci.listener = outbound ? "outbound" : "inbound";
      if (localOk) ci.local = sockaddrText(reinterpret_cast<sockaddr*>(&local));
      sockaddr_storage peer{};
      socklen_t plen = sizeof(peer);
      if (::getpeername(c, reinterpret_cast<sockaddr*>(&peer), &plen) == 0)
        ci.peer = sockaddrText(reinterpret_cast<sockaddr*>(&peer));
      if (soOk) ci.soOriginalDst = sockaddrText(reinterpret_cast<sockaddr*>(&so));
      ci.soOriginalDstErrno = soOk ? 0 : soErr;
      if (have) ci.origDst = sockaddrText(reinterpret_cast<sockaddr*>(&od));
      std::lock_guard lock(mu_);
      recorded_.push_back(ci);
    }

    if (static_cast<size_t>(c) >= conn_.size()) conn_.resize(static_cast<size_t>(c) * 2, -2);
    conn_[static_cast<size_t>(c)] = state;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = c;
    if (::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, c, &ev) != 0) {
      conn_[static_cast<size_t>(c)] = -2;
      ::close(c);
    }
  }
}

void Sink::serveConn(int fd) {
  static thread_local std::vector<char> buf(kBufSize);
  ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    conn_[static_cast<size_t>(fd)] = -2;
    ::close(fd);
    return;
  }
  int16_t& st = conn_[static_cast<size_t>(fd)];
  if (st != 0) {
    if (st > 0 && static_cast<uint8_t>(buf[0]) == st) {
      ok_.fetch_add(1, std::memory_order_relaxed);
    } else if (st > 0) {
      noteBad("first byte " + std::to_string(static_cast<uint8_t>(buf[0])) + " but original destination index " +
              std::to_string(st));
    }
    st = 0;  // a connection that failed the check is counted once (at accept)
  }
  if (mode_.load(std::memory_order_relaxed) == SinkMode::Discard) {
    bytes_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
    return;
  }
  (void)::send(fd, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Sink::serveDns() {
  in_addr answer{};
  ::inet_pton(AF_INET, cfg_.dnsAnswer.c_str(), &answer);
  for (int i = 0; i < 64; i++) {
    char q[512];
    sockaddr_storage from{};
    socklen_t flen = sizeof(from);
    ssize_t n = ::recvfrom(udp_.get(), q, sizeof(q), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
    if (n < 0) return;
    if (n < 12) continue;
    // Question: header, then one name and QTYPE/QCLASS.
    size_t off = 12;
    while (off < static_cast<size_t>(n) && q[off] != 0) off += 1 + static_cast<uint8_t>(q[off]);
    off += 5;
    if (off > static_cast<size_t>(n)) continue;
    uint16_t qtype = static_cast<uint16_t>(static_cast<uint8_t>(q[off - 4]) << 8 | static_cast<uint8_t>(q[off - 3]));
    bool a = qtype == 1;
    std::string r(q, 2);  // id
    putU16(r, 0x8180);    // QR RD RA
    putU16(r, 1);
    putU16(r, a ? 1 : 0);
    putU16(r, 0);
    putU16(r, 0);
    r.append(q + 12, off - 12);
    if (a) {
      putU16(r, 0xc00c);
      putU16(r, 1);
      putU16(r, 1);
      putU16(r, 0);
      putU16(r, 30);
      putU16(r, 4);
      r.append(reinterpret_cast<const char*>(&answer), 4);
    }
    dns_.fetch_add(1, std::memory_order_relaxed);  // before the answer: the client may check at once
    ::sendto(udp_.get(), r.data(), r.size(), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), flen);
  }
}

}  // namespace sluice::bench
