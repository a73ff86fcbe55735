#include "test/bench/load.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "base/fd.h"
#include "loader/netns.h"
#include "test/bench/util.h"
#include "test/common/topology.h"

namespace sluice::bench {

namespace {

constexpr auto kStuck = 3s;  // an operation without progress for this long failed

std::string errnoText(const std::string& what, int err) { return what + ": " + std::strerror(err); }

void setTimeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = t.count() / 1000;
  tv.tv_usec = (t.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/// A blocking TCP connection to dst that sent K and got it echoed back.
Result<Fd> connectAndGreet(const Addr& dst, int k, bool expectEcho, int mss) {
  Fd fd(::socket(dst.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  if (mss > 0 && ::setsockopt(fd.get(), IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof(mss)) != 0)
    return Error::fromErrno(errno, "TCP_MAXSEG");
  setTimeouts(fd.get(), 2s);
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string to = dst.text();
  if (::connect(fd.get(), dst.sa(), dst.len) != 0)
    return Error::fromErrno(errno, "connect " + to);
  char b = static_cast<char>(k);
  if (::send(fd.get(), &b, 1, MSG_NOSIGNAL) != 1) return Error::fromErrno(errno, "send to " + to);
  if (expectEcho) {
    char got = 0;
    ssize_t n = ::recv(fd.get(), &got, 1, 0);
    if (n != 1) return Error::fromErrno(n == 0 ? ECONNRESET : errno, "first response from " + to);
    if (got != b) return Error::msg("wrong first response from " + to);
  }
  return fd;
}

}  // namespace

Window windowOf(const LoadOptions& o) {
  if (o.from && o.end) return {*o.from, *o.end};
  auto from = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup));
  return {from, from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.duration))};
}

sockaddr_in v4(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

int Addr::index() const {
  if (family() == AF_INET6) return reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr.s6_addr[15];
  return static_cast<int>(ntohl(reinterpret_cast<const sockaddr_in&>(ss).sin_addr.s_addr) & 0xff);
}

std::string Addr::text() const { return sockaddrText(sa()); }

Addr addrOf(const sockaddr_in& a) {
  Addr d;
  std::memcpy(&d.ss, &a, sizeof(a));
  d.len = sizeof(a);
  return d;
}

Addr v6(const in6_addr& net, int k, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  a.sin6_addr = net;
  a.sin6_addr.s6_addr[15] = static_cast<uint8_t>(k);
  Addr d;
  std::memcpy(&d.ss, &a, sizeof(a));
  d.len = sizeof(a);
  return d;
}

in6_addr parseV6(const char* text) {
  in6_addr a{};
  ::inet_pton(AF_INET6, text, &a);
  return a;
}

sockaddr_in v4(uint32_t hostOrderAddr, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(hostOrderAddr);
  return a;
}

ConnRateResult runConnRate(int nsfd, const DstFn& dst, const LoadOptions& o) {
  ConnRateResult r;
  Status st = runInNetns(nsfd, [&]() -> Status {
    pinThisThread(o.cpu);
    Fd ep(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep.valid()) return Error::fromErrno(errno, "epoll_create1");
    enum State { Idle, Connecting, Waiting };
    struct Slot {
      int fd = -1;
      int k = 0;
      State state = Idle;
      Clock::time_point t0;
    };
    std::vector<Slot> slots(static_cast<size_t>(std::max(1, o.concurrency)));
    int nextK = 0;
    auto closeSlot = [](Slot& s) {
      if (s.fd >= 0) ::close(s.fd);
      s.fd = -1;
      s.state = Idle;
    };
    auto open = [&](size_t i) {
      Slot& s = slots[i];
      s.k = nextK++ % 250 + 1;
      const Addr d = dst(s.k);
      s.fd = ::socket(d.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (s.fd < 0) {
        r.check.fail(errnoText("socket", errno));
        return;
      }
      int one = 1;
      ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (o.mss > 0) ::setsockopt(s.fd, IPPROTO_TCP, TCP_MAXSEG, &o.mss, sizeof(o.mss));
      s.t0 = Clock::now();
      if (::connect(s.fd, d.sa(), d.len) != 0 && errno != EINPROGRESS) {
        r.check.fail(errnoText("connect " + d.text(), errno));
        closeSlot(s);
        return;
      }
      epoll_event ev{};
      ev.events = EPOLLOUT;
      ev.data.u32 = static_cast<uint32_t>(i);
      ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, s.fd, &ev);
      s.state = Connecting;
    };

    auto start = Clock::now();
    auto [from, end] = windowOf(o);
    uint64_t inWindow = 0;
    for (size_t i = 0; i < slots.size(); i++) open(i);
    auto lastSweep = start;
    epoll_event evs[64];
    Clock::time_point now = start;
    while (!gStop.load(std::memory_order_relaxed)) {
      now = Clock::now();
      if (now >= end) break;
      int n = ::epoll_wait(ep.get(), evs, 64, 10);
      for (int e = 0; e < n; e++) {
        size_t i = evs[e].data.u32;
        Slot& s = slots[i];
        if (s.state == Connecting) {
          int err = 0;
          socklen_t len = sizeof(err);
          ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err != 0) {
            r.check.fail(errnoText("connect " + dst(s.k).text(), err));
            closeSlot(s);
            open(i);
            continue;
          }
          char b = static_cast<char>(s.k);
          if (::send(s.fd, &b, 1, MSG_NOSIGNAL) != 1) {
            r.check.fail(errnoText("send", errno));
            closeSlot(s);
            open(i);
            continue;
          }
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.u32 = static_cast<uint32_t>(i);
          ::epoll_ctl(ep.get(), EPOLL_CTL_MOD, s.fd, &ev);
          s.state = Waiting;
        } else if (s.state == Waiting) {
          char b = 0;
          ssize_t m = ::recv(s.fd, &b, 1, MSG_DONTWAIT);
          if (m < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          if (m == 1 && static_cast<uint8_t>(b) == s.k) {
            r.check.total++;
            if (Clock::now() >= from) inWindow++;
          } else {
            r.check.fail(m == 1 ? "wrong response byte" : m == 0 ? "connection closed before the response"
                                                                   : errnoText("recv", errno));
          }
          closeSlot(s);
          open(i);
        }
      }
      if (now - lastSweep > 100ms) {
        lastSweep = now;
        for (size_t i = 0; i < slots.size(); i++) {
          Slot& s = slots[i];
          if (s.state != Idle && now - s.t0 > kStuck) {
            r.check.fail(std::string(s.state == Connecting ? "connect" : "response") + " took longer than 3 s");
            closeSlot(s);
          }
          if (s.state == Idle) open(i);
        }
      }
    }
    double window = std::chrono::duration<double>(now - from).count();
    r.rate = window > 0 ? static_cast<double>(inWindow) / window : 0;
    for (auto& s : slots) closeSlot(s);
    return {};
  });
  if (!st.ok()) r.check.fail(st.error().message);
  return r;
}

RrResult runRr(int nsfd, const DstFn& dst, const LoadOptions& o) {
  RrResult r;
  std::vector<Fd> conns;
  int n = std::max(1, o.concurrency);
  Status st = runInNetns(nsfd, [&]() -> Status {
    for (int i = 0; i < n; i++) {
      auto c = connectAndGreet(dst(i % 250 + 1), i % 250 + 1, true, o.mss);
      SLUICE_TRY(c);
      conns.push_back(std::move(*c));
    }
    return {};
  });
  if (!st.ok()) {
    r.check.fail(st.error().message);
    return r;
  }
  struct PerThread {
    std::vector<uint32_t> lat;
    uint64_t total = 0;
    RunCheck check;
  };
  std::vector<PerThread> per(static_cast<size_t>(n));
  auto [from, end] = windowOf(o);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; i++) {
    threads.emplace_back([&, i] {
      pinThisThread(o.cpu);
      PerThread& p = per[static_cast<size_t>(i)];
      p.lat.reserve(1 << 20);
      int fd = conns[static_cast<size_t>(i)].get();
      char b = 'r';
      for (;;) {
        auto t0 = Clock::now();
        if (t0 >= end || gStop.load(std::memory_order_relaxed)) break;
        if (::send(fd, &b, 1, MSG_NOSIGNAL) != 1) {
          p.check.fail(errnoText("send", errno));
          break;
        }
        char got;
        ssize_t m = ::recv(fd, &got, 1, 0);
        if (m != 1) {
          p.check.fail(m == 0 ? "connection closed" : errnoText("recv", errno));
          break;
        }
        auto t1 = Clock::now();
        p.total++;
        if (t0 >= from) p.lat.push_back(static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
      }
    });
  }
  for (auto& t : threads) t.join();
  double window = std::chrono::duration<double>(std::min(Clock::now(), end) - from).count();
  std::vector<uint32_t> all;
  for (auto& p : per) {
    all.insert(all.end(), p.lat.begin(), p.lat.end());
    r.check.total += p.total;
    r.check.errors += p.check.errors;
    if (r.check.firstError.empty()) r.check.firstError = p.check.firstError;
  }
  r.tps = window > 0 ? static_cast<double>(all.size()) / window : 0;
  r.p50us = percentileInPlace(all, 50) / 1000.0;
  r.p99us = percentileInPlace(all, 99) / 1000.0;
  return r;
}

BulkResult runBulk(int nsfd, const Addr& dst, const Sink& sink, const LoadOptions& o) {
  BulkResult r;
  Status st = runInNetns(nsfd, [&]() -> Status {
    pinThisThread(o.cpu);
    auto c = connectAndGreet(dst, dst.index(), false, o.mss);
    SLUICE_TRY(c);
    std::vector<char> buf(64 * 1024, 'b');
    auto [from, end] = windowOf(o);
    bool started = false;
    uint64_t b0 = 0;
    Clock::time_point t0;
    for (;;) {
      auto now = Clock::now();
      if (!started && now >= from) {
        started = true;
        b0 = sink.bytes();
        t0 = now;
      }
      if (now >= end || gStop.load(std::memory_order_relaxed)) break;
      ssize_t n = ::send(c->get(), buf.data(), buf.size(), MSG_NOSIGNAL);
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        return Error::fromErrno(n == 0 ? EPIPE : errno, "bulk send");
      }
      r.check.total += static_cast<uint64_t>(n);
    }
    if (started) {
      double secs = secondsSince(t0);
      r.gbps = static_cast<double>(sink.bytes() - b0) * 8 / secs / 1e9;
    }
    return {};
  });
  if (!st.ok()) r.check.fail(st.error().message);
  return r;
}

DnsResult runDns(int nsfd, const sockaddr_in& resolver, const std::string& answer, const LoadOptions& o) {
  DnsResult r;
  in_addr want{};
  ::inet_pton(AF_INET, answer.c_str(), &want);
  const std::string query = sluice::test::dnsQuery(0, "bench.sluice.example", 1);
  Status st = runInNetns(nsfd, [&]() -> Status {
    pinThisThread(o.cpu);
    Fd ep(::epoll_create1(EPOLL_CLOEXEC));
    if (!ep.valid()) return Error::fromErrno(errno, "epoll_create1");
    struct Slot {
      int fd = -1;
      uint16_t id = 0;
      Clock::time_point t0;
    };
    std::vector<Slot> slots(static_cast<size_t>(std::max(1, o.concurrency)));
    uint16_t nextId = 1;
    std::string q = query;
    auto closeSlot = [](Slot& s) {
      if (s.fd >= 0) ::close(s.fd);
      s.fd = -1;
    };
    auto open = [&](size_t i) {
      Slot& s = slots[i];
      s.fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (s.fd < 0) {
        r.check.fail(errnoText("socket", errno));
        return;
      }
      s.id = nextId++;
      q[0] = static_cast<char>(s.id >> 8);
      q[1] = static_cast<char>(s.id & 0xff);
      s.t0 = Clock::now();
      if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&resolver), sizeof(resolver)) != 0 ||
          ::send(s.fd, q.data(), q.size(), 0) < 0) {
        r.check.fail(errnoText("query", errno));
        closeSlot(s);
        return;
      }
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(i);
      ::epoll_ctl(ep.get(), EPOLL_CTL_ADD, s.fd, &ev);
    };
    auto start = Clock::now();
    auto [from, end] = windowOf(o);
    uint64_t inWindow = 0;
    for (size_t i = 0; i < slots.size(); i++) open(i);
    auto lastSweep = start;
    epoll_event evs[64];
    Clock::time_point now = start;
    while (!gStop.load(std::memory_order_relaxed)) {
      now = Clock::now();
      if (now >= end) break;
      int n = ::epoll_wait(ep.get(), evs, 64, 10);
      for (int e = 0; e < n; e++) {
        size_t i = evs[e].data.u32;
        Slot& s = slots[i];
        unsigned char buf[512];
        sockaddr_in from4{};
        socklen_t flen = sizeof(from4);
        ssize_t m = ::recvfrom(s.fd, buf, sizeof(buf), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from4), &flen);
        if (m < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (m < 0) {
          r.check.fail(errnoText("DNS answer", errno));
        } else if (from4.sin_addr.s_addr != resolver.sin_addr.s_addr || from4.sin_port != resolver.sin_port) {
          r.check.fail("DNS answer from " + sockaddrText(reinterpret_cast<sockaddr*>(&from4)));
        } else if (m < 16 || (buf[0] << 8 | buf[1]) != s.id || !(buf[2] & 0x80) || (buf[6] << 8 | buf[7]) != 1 ||
                   std::memcmp(buf + m - 4, &want, 4) != 0) {
          r.check.fail("malformed or wrong DNS answer");
        } else {
          r.check.total++;
          if (Clock::now() >= from) inWindow++;
        }
        closeSlot(s);
        open(i);
      }
      if (now - lastSweep > 100ms) {
        lastSweep = now;
        for (size_t i = 0; i < slots.size(); i++) {
          Slot& s = slots[i];
          if (s.fd >= 0 && now - s.t0 > 1s) {
            r.lost++;  // UDP: counted apart from errors, checked as a share
            closeSlot(s);
          }
          if (s.fd < 0) open(i);
        }
      }
    }
    double window = std::chrono::duration<double>(now - from).count();
    r.qps = window > 0 ? static_cast<double>(inWindow) / window : 0;
    for (auto& s : slots) closeSlot(s);
    return {};
  });
  if (!st.ok()) r.check.fail(st.error().message);
  return r;
}

}  // namespace sluice::bench
