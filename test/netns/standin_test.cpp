// Tests of the ztunnel stand-in (test/standin): real sockets in a fresh
// network namespace per test, no data plane.
//
//   test netns (lo up: 127.0.0.1, ::1)
//   +----------------------------------------------------------------+
//   | stand-in: [::]:15001 [::]:15006 [::]:15008                      |
//   |           127.0.0.1:15053 [::1]:15053 (UDP + TCP)               |
//   | test sockets (created from a thread that setns()'d here)        |
//   | echo/sink servers on 127.0.0.1:<kernel port>                    |
//   +----------------------------------------------------------------+
//
// Without a data plane every connection reaches a listener directly, so its
// original destination is the listener itself; relays are pointed at a test
// server with StandInConfig::upstreamOverride.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test/standin/standin.h"

extern char** environ;

namespace sluice {
namespace {

using namespace std::chrono_literals;

/// Owns a file descriptor.
class TestFd {
 public:
  TestFd() = default;
  explicit TestFd(int fd) : fd_(fd) {}
  ~TestFd() { reset(); }
  TestFd(TestFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  TestFd& operator=(TestFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

bool shell(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

/// A named network namespace (`ip netns add`) with lo up, deleted when this
/// goes away, whatever the test's outcome.
class ScopedNetns {
 public:
  ScopedNetns() {
    static std::atomic<int> counter{0};
    name_ = "sluice-standin-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    ok_ = shell("ip netns add " + name_) && ip("link set lo up");
  }
  ~ScopedNetns() { shell("ip netns del " + name_ + " 2>/dev/null"); }
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;

  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }
  std::string path() const { return "/run/netns/" + name_; }

  /// Runs `ip -n NAME args`.
  bool ip(const std::string& args) const { return shell("ip -n " + name_ + " " + args); }

  /// Runs fn on a thread inside the namespace (the caller's thread stays).
  template <typename F>
  void run(F&& fn) const {
    std::thread t([&] {
      int ns = ::open(path().c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
        ADD_FAILURE() << "setns " << path() << ": " << std::strerror(errno);
        if (ns >= 0) ::close(ns);
        return;
      }
      ::close(ns);
      fn();
    });
    t.join();
  }

  /// A socket of this namespace; usable from any thread afterwards.
  TestFd socket(int family, int type) const {
    TestFd fd;
    run([&] { fd = TestFd(::socket(family, type | SOCK_CLOEXEC, 0)); });
    if (fd.valid()) {
      timeval tv{5, 0};  // no test hangs on a lost byte
      ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    return fd;
  }

  /// Writes a sysctl of this namespace (/proc/sys/net follows the opener's netns).
  bool sysctl(const std::string& key, const std::string& value) const {
    bool ok = false;
    run([&] {
      std::ofstream f("/proc/sys/" + key);
      f << value;
      f.flush();
      ok = static_cast<bool>(f);
    });
    return ok;
  }

 private:
  std::string name_;
  bool ok_ = false;
};

// ---- Addresses ---------------------------------------------------------------

struct Addr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  const sockaddr* raw() const { return reinterpret_cast<const sockaddr*>(&ss); }
  sockaddr* raw() { return reinterpret_cast<sockaddr*>(&ss); }
  int family() const { return ss.ss_family; }
};

Addr addr(const std::string& ip, uint16_t port) {
  Addr a;
  auto* s4 = reinterpret_cast<sockaddr_in*>(&a.ss);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
  if (::inet_pton(AF_INET, ip.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    a.len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, ip.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    a.len = sizeof(sockaddr_in6);
  } else {
    ADD_FAILURE() << "bad address " << ip;
  }
  return a;
}

/// "1.2.3.4:80" / "[::1]:80", v4-mapped printed as v4 (the stand-in's format).
std::string str(const Addr& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.family() == AF_INET) {
    auto* s4 = reinterpret_cast<const sockaddr_in*>(&a.ss);
    ::inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(s4->sin_port));
  }
  auto* s6 = reinterpret_cast<const sockaddr_in6*>(&a.ss);
  if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
    ::inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(s6->sin6_port));
  }
  ::inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof(buf));
  return "[" + std::string(buf) + "]:" + std::to_string(ntohs(s6->sin6_port));
}

Addr localOf(int fd) {
  Addr a;
  a.len = sizeof(a.ss);
  ::getsockname(fd, a.raw(), &a.len);
  return a;
}

uint16_t portOf(const Addr& a) {
  return ntohs(reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_port);  // same offset in v6
}

/// A TCP connection from the namespace; invalid (and a failure added) when
/// connect fails and expectSuccess is true.
TestFd connectTcp(const ScopedNetns& ns, const std::string& ip, uint16_t port,
                  const std::string& bindIp = "") {
  Addr to = addr(ip, port);
  TestFd fd = ns.socket(to.family(), SOCK_STREAM);
  if (!bindIp.empty()) {
    Addr from = addr(bindIp, 0);
    if (::bind(fd.get(), from.raw(), from.len) != 0) {
      ADD_FAILURE() << "bind " << bindIp << ": " << std::strerror(errno);
      return {};
    }
  }
  if (::connect(fd.get(), to.raw(), to.len) != 0) {
    ADD_FAILURE() << "connect " << ip << ":" << port << ": " << std::strerror(errno);
    return {};
  }
  return fd;
}

/// How a connection the stand-in resets at once ends for the app: the
/// errno of connect() when the reset came before the connecting thread ran
/// again (slow machines, emulation), else of the first recv() (0: it read
/// data or an orderly EOF instead).
int resetErrno(const ScopedNetns& ns, const std::string& ip, uint16_t port) {
  Addr to = addr(ip, port);
  TestFd fd = ns.socket(to.family(), SOCK_STREAM);
  if (::connect(fd.get(), to.raw(), to.len) != 0) return errno;
  char b;
  return ::recv(fd.get(), &b, 1, 0) < 0 ? errno : 0;
}

/// errno of a connect attempt (0 on success).
int connectErrno(const ScopedNetns& ns, const std::string& ip, uint16_t port) {
  Addr to = addr(ip, port);
  TestFd fd = ns.socket(to.family(), SOCK_STREAM);
  return ::connect(fd.get(), to.raw(), to.len) == 0 ? 0 : errno;
}

bool sendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

/// Reads until EOF; nullopt on error or time-out (SO_RCVTIMEO).
std::optional<std::string> readToEof(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

bool readExactly(int fd, std::string& out, size_t n) {
  out.resize(n);
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, out.data() + off, n - off, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    off += static_cast<size_t>(r);
  }
  return true;
}

std::string pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// stop() takes about 1 ms here; sanitizer builds on a loaded 2-CPU machine
// were seen to wait about a second just for the serving thread to be scheduled.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr auto kPromptStop = 2000ms;
#else
constexpr auto kPromptStop = 100ms;
#endif

size_t threadCount() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The thread count once it has settled at @p want (or after a second): a
// joined thread stays in /proc/self/task until the kernel reaps it, which
// takes long enough to see on a slow (emulated) CPU.
size_t threadCountSettled(size_t want) {
  auto deadline = std::chrono::steady_clock::now() + 1s;
  size_t n = threadCount();
  while (n != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    n = threadCount();
  }
  return n;
}

// ---- Test servers --------------------------------------------------------------

/// A TCP server in a namespace: echoes what it reads; after the client's FIN
/// it sends "<eof>" and closes, which shows that half-close passes through in
/// both directions. Records each client's address and the accepted socket's
/// mark (the SYN's mark when net.ipv4.tcp_fwmark_accept=1).
class EchoServer {
 public:
  struct Accepted {
    std::string peer;
    uint32_t mark = 0;
  };

  EchoServer(const ScopedNetns& ns, const std::string& ip) {
    Addr a = addr(ip, 0);
    listen_ = ns.socket(a.family(), SOCK_STREAM);
    int one = 1;
    ::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listen_.get(), a.raw(), a.len) != 0 || ::listen(listen_.get(), 256) != 0) {
      ADD_FAILURE() << "echo server on " << ip << ": " << std::strerror(errno);
      return;
    }
    port_ = portOf(localOf(listen_.get()));
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~EchoServer() {
    stop_ = true;
    ::shutdown(listen_.get(), SHUT_RDWR);  // wakes accept()
    if (acceptor_.joinable()) acceptor_.join();
    std::lock_guard lock(mutex_);
    for (auto& t : connections_) t.join();
  }
  uint16_t port() const { return port_; }
  std::vector<Accepted> accepted() const {
    std::lock_guard lock(mutex_);
    return accepted_;
  }

 private:
  void acceptLoop() {
    for (;;) {
      Addr peer;
      peer.len = sizeof(peer.ss);
      int c = ::accept4(listen_.get(), peer.raw(), &peer.len, SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      uint32_t mark = 0;
      socklen_t len = sizeof(mark);
      ::getsockopt(c, SOL_SOCKET, SO_MARK, &mark, &len);
      std::lock_guard lock(mutex_);
      accepted_.push_back({str(peer), mark});
      connections_.emplace_back([this, fd = std::make_shared<TestFd>(c)] { serve(fd->get()); });
    }
  }
  void serve(int fd) {
    char buf[65536];
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0) return;
      if (n == 0) {
        sendAll(fd, "<eof>");
        ::shutdown(fd, SHUT_WR);
        return;
      }
      if (!sendAll(fd, std::string(buf, static_cast<size_t>(n)))) return;
    }
  }

  TestFd listen_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  mutable std::mutex mutex_;
  std::vector<std::thread> connections_;
  std::vector<Accepted> accepted_;
};

// ---- DNS -------------------------------------------------------------------------

std::string dnsQuery(uint16_t id, const std::string& name, uint16_t qtype, bool rd = true) {
  std::string q;
  auto u16 = [&](uint16_t v) {
    q += static_cast<char>(v >> 8);
    q += static_cast<char>(v & 0xff);
  };
  u16(id);
  u16(rd ? 0x0100 : 0);
  u16(1);
  u16(0);
  u16(0);
  u16(0);
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    q += static_cast<char>(dot - start);
    q += name.substr(start, dot - start);
    start = dot + 1;
  }
  q += '\0';
  u16(qtype);
  u16(1);
  return q;
}

/// A parsed answer: header, first question, first answer record.
struct DnsAnswer {
  uint16_t id = 0, flags = 0, qdcount = 0, ancount = 0;
  std::string qname;
  uint16_t qtype = 0, qclass = 0;
  uint16_t rrName = 0, rrType = 0, rrClass = 0;
  uint32_t ttl = 0;
  std::string rdata;  // the address as text
};

std::optional<DnsAnswer> parseAnswer(const std::string& m) {
  auto u8 = [&](size_t i) { return static_cast<uint8_t>(m[i]); };
  auto u16 = [&](size_t i) { return static_cast<uint16_t>(u8(i) << 8 | u8(i + 1)); };
  if (m.size() < 12) return std::nullopt;
  DnsAnswer a;
  a.id = u16(0);
  a.flags = u16(2);
  a.qdcount = u16(4);
  a.ancount = u16(6);
  size_t off = 12;
  while (off < m.size() && u8(off) != 0) {
    size_t len = u8(off);
    if (off + 1 + len > m.size()) return std::nullopt;
    if (!a.qname.empty()) a.qname += '.';
    a.qname += m.substr(off + 1, len);
    off += 1 + len;
  }
  if (off + 5 > m.size()) return std::nullopt;
  a.qtype = u16(off + 1);
  a.qclass = u16(off + 3);
  off += 5;
  if (a.ancount == 0) return off == m.size() ? std::optional(a) : std::nullopt;
  if (off + 12 > m.size()) return std::nullopt;
  a.rrName = u16(off);
  a.rrType = u16(off + 2);
  a.rrClass = u16(off + 4);
  a.ttl = static_cast<uint32_t>(u16(off + 6)) << 16 | u16(off + 8);
  size_t rdlen = u16(off + 10);
  off += 12;
  if (off + rdlen != m.size()) return std::nullopt;
  char buf[INET6_ADDRSTRLEN] = {};
  if (rdlen == 4) ::inet_ntop(AF_INET, m.data() + off, buf, sizeof(buf));
  if (rdlen == 16) ::inet_ntop(AF_INET6, m.data() + off, buf, sizeof(buf));
  a.rdata = buf;
  return a;
}

/// Sends a query over a connected UDP socket and returns the answer.
std::optional<std::string> udpExchange(int fd, const std::string& query) {
  if (::send(fd, query.data(), query.size(), 0) != static_cast<ssize_t>(query.size())) {
    return std::nullopt;
  }
  char buf[4096];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  if (n < 0) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

TestFd udpClient(const ScopedNetns& ns, const std::string& ip, uint16_t port) {
  Addr to = addr(ip, port);
  TestFd fd = ns.socket(to.family(), SOCK_DGRAM);
  EXPECT_EQ(::connect(fd.get(), to.raw(), to.len), 0) << std::strerror(errno);
  return fd;
}

std::string lengthPrefixed(const std::string& m) {
  std::string out;
  out += static_cast<char>(m.size() >> 8);
  out += static_cast<char>(m.size() & 0xff);
  return out + m;
}

std::optional<std::string> readTcpDnsMessage(int fd) {
  std::string len;
  if (!readExactly(fd, len, 2)) return std::nullopt;
  std::string m;
  size_t n = static_cast<uint8_t>(len[0]) << 8 | static_cast<uint8_t>(len[1]);
  if (!readExactly(fd, m, n)) return std::nullopt;
  return m;
}

// ---- Fixture -----------------------------------------------------------------------

/// A fresh namespace per test; the stand-in is started in it.
class StandIn : public ::testing::Test {
 protected:
  void SetUp() override {
    ns_ = std::make_unique<ScopedNetns>();
    ASSERT_TRUE(ns_->ok()) << "cannot create netns " << ns_->name();
  }

  StandInConfig config() const {
    StandInConfig c;
    c.netnsPath = ns_->path();
    return c;
  }

  std::unique_ptr<ProxyStandIn> start(const StandInConfig& c) {
    auto r = ProxyStandIn::start(c);
    if (!r) {
      ADD_FAILURE() << "start: " << r.error().message;
      return nullptr;
    }
    return std::move(*r);
  }

  std::unique_ptr<ScopedNetns> ns_;
};

// ---- Tests -----------------------------------------------------------------------------

TEST_F(StandIn, HboneGreetsAndRecordsAddresses) {
  auto proxy = start(config());
  ASSERT_TRUE(proxy);
  EXPECT_FALSE(proxy->waitForEvents(1, 20ms));

  TestFd v4 = connectTcp(*ns_, "127.0.0.1", 15008);
  ASSERT_TRUE(v4.valid());
  EXPECT_EQ(readToEof(v4.get()), "hbone\n");
  TestFd v6 = connectTcp(*ns_, "::1", 15008);
  ASSERT_TRUE(v6.valid());
  EXPECT_EQ(readToEof(v6.get()), "hbone\n");

  ASSERT_TRUE(proxy->waitForEvents(2, 2s));
  auto events = proxy->events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].listener, "hbone");
  EXPECT_EQ(events[0].listenerPort, 15008);
  EXPECT_EQ(events[0].origDst, "127.0.0.1:15008");  // dual-stack socket, printed as v4
  EXPECT_EQ(events[0].peer, str(localOf(v4.get())));
  EXPECT_EQ(events[0].detail, "");
  EXPECT_EQ(events[1].origDst, "[::1]:15008");
  EXPECT_EQ(events[1].peer, str(localOf(v6.get())));

  proxy->clearEvents();
  EXPECT_TRUE(proxy->events().empty());
}

TEST_F(StandIn, DnsOverUdpAnswersAAndAaaaOnBothLoopbacks) {
  StandInConfig c = config();
  c.dnsAnswerV4 = "10.1.2.3";
  auto proxy = start(c);
  ASSERT_TRUE(proxy);

  TestFd v4 = udpClient(*ns_, "127.0.0.1", 15053);
  auto raw = udpExchange(v4.get(), dnsQuery(0x1234, "example.com", 1));
  ASSERT_TRUE(raw);
  auto a = parseAnswer(*raw);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, 0x1234);
  EXPECT_EQ(a->flags, 0x8180);  // QR, RD copied, RA, NOERROR
  EXPECT_EQ(a->qdcount, 1);
  EXPECT_EQ(a->ancount, 1);
  EXPECT_EQ(a->qname, "example.com");
  EXPECT_EQ(a->qtype, 1);
  EXPECT_EQ(a->qclass, 1);
  EXPECT_EQ(a->rrName, 0xc00c);
  EXPECT_EQ(a->rrType, 1);
  EXPECT_EQ(a->rrClass, 1);
  EXPECT_EQ(a->ttl, 30u);
  EXPECT_EQ(a->rdata, "10.1.2.3");

  TestFd v6 = udpClient(*ns_, "::1", 15053);
  raw = udpExchange(v6.get(), dnsQuery(0xbeef, "svc.ns.svc.cluster.local", 28, false));
  ASSERT_TRUE(raw);
  a = parseAnswer(*raw);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, 0xbeef);
  EXPECT_EQ(a->flags, 0x8080);  // RD not set in the query
  EXPECT_EQ(a->ancount, 1);
  EXPECT_EQ(a->qname, "svc.ns.svc.cluster.local");
  EXPECT_EQ(a->rrType, 28);
  EXPECT_EQ(a->ttl, 30u);
  EXPECT_EQ(a->rdata, "fd00::99");

  // Other types: the question echoed, no answer record.
  raw = udpExchange(v4.get(), dnsQuery(7, "example.com", 16));
  ASSERT_TRUE(raw);
  a = parseAnswer(*raw);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, 7);
  EXPECT_EQ(a->ancount, 0);
  EXPECT_EQ(a->qtype, 16);

  auto events = proxy->events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].listener, "dns-udp");
  EXPECT_EQ(events[0].listenerPort, 15053);
  EXPECT_EQ(events[0].origDst, "127.0.0.1:15053");
  EXPECT_EQ(events[0].peer, str(localOf(v4.get())));
  EXPECT_EQ(events[0].detail, "example.com A");
  EXPECT_EQ(events[1].origDst, "[::1]:15053");
  EXPECT_EQ(events[1].peer, str(localOf(v6.get())));
  EXPECT_EQ(events[1].detail, "svc.ns.svc.cluster.local AAAA");
  EXPECT_EQ(events[2].detail, "example.com TXT");
}

TEST_F(StandIn, DnsOverUdpIgnoresMalformedQueries) {
  auto proxy = start(config());
  ASSERT_TRUE(proxy);
  TestFd fd = udpClient(*ns_, "127.0.0.1", 15053);

  std::string valid = dnsQuery(1, "a.example", 1);
  std::string response = valid;
  response[2] = static_cast<char>(response[2] | 0x80);  // QR set
  std::string noQuestion = valid.substr(0, 12);
  std::string pointerName = valid.substr(0, 12) + std::string("\xc0\x0c\x00\x01\x00\x01", 6);
  std::string longLabel = valid.substr(0, 12) + std::string(1, '\x40') + std::string(64, 'x') +
                          std::string("\0\0\1\0\1", 5);
  std::string tooLongName = valid.substr(0, 12);
  for (int i = 0; i < 5; ++i) tooLongName += std::string(1, '\x3f') + std::string(63, 'y');
  tooLongName += std::string("\0\0\1\0\1", 5);
  const std::vector<std::string> malformed = {
      "",
      "\x12\x34",
      valid.substr(0, 11),
      valid.substr(0, 16),           // name cut
      valid.substr(0, valid.size() - 1),  // class cut
      response,
      noQuestion,
      pointerName,
      longLabel,
      tooLongName,
  };
  for (const auto& m : malformed) {
    ASSERT_EQ(::send(fd.get(), m.data(), m.size(), 0), static_cast<ssize_t>(m.size()));
  }
  auto raw = udpExchange(fd.get(), dnsQuery(0x4242, "after.malformed", 1));
  ASSERT_TRUE(raw);
  auto a = parseAnswer(*raw);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, 0x4242);  // the first datagram back is the valid query's
  ASSERT_EQ(proxy->events().size(), 1u);
  EXPECT_EQ(proxy->events()[0].detail, "after.malformed A");

  // Random garbage (some of it may happen to parse): no crash, still serving.
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::string g(rng() % 80, '\0');
    for (auto& ch : g) ch = static_cast<char>(rng());
    if (g.size() > 2 && (rng() & 1)) g[2] = static_cast<char>(g[2] & 0x7f);  // looks like a query
    ::send(fd.get(), g.data(), g.size(), MSG_DONTWAIT);
  }
  // A fresh socket (the garbage's answers go to the old one); the burst may
  // have overflowed the receive buffer, so retry like a resolver would.
  TestFd fresh = udpClient(*ns_, "127.0.0.1", 15053);
  timeval tv{0, 500'000};
  ::setsockopt(fresh.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::optional<DnsAnswer> answer;
  for (int attempt = 0; attempt < 20 && !answer; ++attempt) {
    raw = udpExchange(fresh.get(), dnsQuery(0x5151, "still.alive", 28));
    if (raw) answer = parseAnswer(*raw);
  }
  ASSERT_TRUE(answer) << "no answer after the garbage";
  EXPECT_EQ(answer->id, 0x5151);
  EXPECT_EQ(answer->rdata, "fd00::99");
}

TEST_F(StandIn, DnsOverTcpAnswersSeveralQueriesPerConnection) {
  auto proxy = start(config());
  ASSERT_TRUE(proxy);
  for (const std::string ip : {"127.0.0.1", "::1"}) {
    proxy->clearEvents();
    TestFd fd = connectTcp(*ns_, ip, 15053);
    ASSERT_TRUE(fd.valid());
    // Two queries in one segment, a malformed one, then one split byte by byte.
    ASSERT_TRUE(sendAll(fd.get(), lengthPrefixed(dnsQuery(1, "one.example", 1)) +
                                      lengthPrefixed(dnsQuery(2, "two.example", 28)) +
                                      lengthPrefixed("\x01\x02\x03")));
    std::string third = lengthPrefixed(dnsQuery(3, "three.example", 1));
    for (char ch : third) {
      ASSERT_TRUE(sendAll(fd.get(), std::string(1, ch)));
      std::this_thread::sleep_for(1ms);
    }
    std::vector<DnsAnswer> answers;
    for (int i = 0; i < 3; ++i) {
      auto m = readTcpDnsMessage(fd.get());
      ASSERT_TRUE(m) << "answer " << i << " over " << ip;
      auto a = parseAnswer(*m);
      ASSERT_TRUE(a);
      answers.push_back(*a);
    }
    EXPECT_EQ(answers[0].id, 1);
    EXPECT_EQ(answers[0].rdata, "10.96.0.99");
    EXPECT_EQ(answers[1].id, 2);
    EXPECT_EQ(answers[1].rdata, "fd00::99");
    EXPECT_EQ(answers[2].id, 3);
    EXPECT_EQ(answers[2].qname, "three.example");

    ::shutdown(fd.get(), SHUT_WR);
    EXPECT_EQ(readToEof(fd.get()), "");  // closes after the client's FIN

    auto events = proxy->events();
    ASSERT_EQ(events.size(), 3u);
    std::string local = ip == "::1" ? "[::1]:15053" : "127.0.0.1:15053";
    for (const auto& ev : events) {
      EXPECT_EQ(ev.listener, "dns-tcp");
      EXPECT_EQ(ev.listenerPort, 15053);
      EXPECT_EQ(ev.origDst, local);
      EXPECT_EQ(ev.peer, str(localOf(fd.get())));
    }
    EXPECT_EQ(events[2].detail, "three.example A");
  }
}

TEST_F(StandIn, OutboundRelaysBothWaysWithHalfCloseAndMark) {
  // The echo server reads the mark of each connection's SYN.
  ASSERT_TRUE(ns_->sysctl("net/ipv4/tcp_fwmark_accept", "1"));
  EchoServer echo(*ns_, "127.0.0.1");
  StandInConfig c = config();
  c.mark = 0x1539;
  c.upstreamOverride = "127.0.0.1:" + std::to_string(echo.port());
  auto proxy = start(c);
  ASSERT_TRUE(proxy);

  TestFd fd = connectTcp(*ns_, "127.0.0.1", 15001);
  ASSERT_TRUE(fd.valid());
  std::string payload = pattern(1 << 20, 1);
  std::thread writer([&] {
    EXPECT_TRUE(sendAll(fd.get(), payload));
    ::shutdown(fd.get(), SHUT_WR);  // the echo server answers "<eof>" after it
  });
  auto got = readToEof(fd.get());
  writer.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->size(), payload.size() + 5);
  EXPECT_TRUE(*got == payload + "<eof>");

  auto events = proxy->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].listener, "outbound");
  EXPECT_EQ(events[0].listenerPort, 15001);
  EXPECT_EQ(events[0].origDst, "127.0.0.1:15001");
  EXPECT_EQ(events[0].peer, str(localOf(fd.get())));
  EXPECT_EQ(events[0].detail, "upstream ok");

  auto accepted = echo.accepted();
  ASSERT_EQ(accepted.size(), 1u);
  EXPECT_EQ(accepted[0].mark, 0x1539u);

  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (proxy->openConnections() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(proxy->openConnections(), 0u);
}

TEST_F(StandIn, ManyConcurrentRelays) {
  EchoServer echo(*ns_, "127.0.0.1");
  StandInConfig c = config();
  c.upstreamOverride = "127.0.0.1:" + std::to_string(echo.port());
  auto proxy = start(c);
  ASSERT_TRUE(proxy);

  constexpr int kClients = 50;
  std::atomic<int> good{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      // Outbound over v4 (dual-stack, v4-mapped) and v6; inbound over v4
      // only, as its upstream keeps the client's (v4) address.
      bool inbound = i % 3 == 0;
      TestFd fd = connectTcp(*ns_, !inbound && i % 2 ? "::1" : "127.0.0.1",
                             inbound ? 15006 : 15001);
      if (!fd.valid()) return;
      std::string payload = pattern(200'000 + static_cast<size_t>(i), static_cast<unsigned>(i));
      std::thread writer([&] {
        sendAll(fd.get(), payload);
        ::shutdown(fd.get(), SHUT_WR);
      });
      auto got = readToEof(fd.get());
      writer.join();
      if (got && *got == payload + "<eof>") ++good;
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(good.load(), kClients);
  EXPECT_EQ(proxy->events().size(), static_cast<size_t>(kClients));
  for (const auto& ev : proxy->events()) EXPECT_EQ(ev.detail, "upstream ok");
}

TEST_F(StandIn, UpstreamRefusalResetsTheClient) {
  uint16_t closedPort = 0;
  {
    // A port nobody listens on.
    TestFd probe = ns_->socket(AF_INET, SOCK_STREAM);
    Addr a = addr("127.0.0.1", 0);
    ASSERT_EQ(::bind(probe.get(), a.raw(), a.len), 0);
    closedPort = portOf(localOf(probe.get()));
  }
  StandInConfig c = config();
  c.upstreamOverride = "127.0.0.1:" + std::to_string(closedPort);
  auto proxy = start(c);
  ASSERT_TRUE(proxy);

  EXPECT_EQ(resetErrno(*ns_, "127.0.0.1", 15001), ECONNRESET);
  auto events = proxy->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].detail, "upstream failed: Connection refused");
  EXPECT_EQ(proxy->openConnections(), 0u);
}

TEST_F(StandIn, UpstreamConnectTimesOut) {
  // SYNs to 10.66.0.2 leave through v0 (permanent neighbour, no ARP) and are
  // dropped on arrival at v1: not a local address, no forwarding.
  ASSERT_TRUE(ns_->ip("link add v0 type veth peer name v1"));
  ASSERT_TRUE(ns_->ip("addr add 10.66.0.1/24 dev v0"));
  ASSERT_TRUE(ns_->ip("link set v0 up"));
  ASSERT_TRUE(ns_->ip("link set v1 up"));
  ASSERT_TRUE(ns_->ip("neigh add 10.66.0.2 lladdr 02:00:00:00:00:02 dev v0 nud permanent"));
  StandInConfig c = config();
  c.upstreamOverride = "10.66.0.2:80";
  c.upstreamConnectTimeout = 200ms;
  auto proxy = start(c);
  ASSERT_TRUE(proxy);

  TestFd fd = connectTcp(*ns_, "127.0.0.1", 15001);
  ASSERT_TRUE(fd.valid());
  auto t0 = std::chrono::steady_clock::now();
  char b;
  EXPECT_EQ(::recv(fd.get(), &b, 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GT(took, 150ms);
  EXPECT_LT(took, 2s);
  ASSERT_EQ(proxy->events().size(), 1u);
  EXPECT_EQ(proxy->events()[0].detail, "upstream failed: Connection timed out");
}

TEST_F(StandIn, DirectConnectionToARelayListenerDoesNotLoop) {
  // No override: the original destination is the listener itself.
  auto proxy = start(config());
  ASSERT_TRUE(proxy);
  for (uint16_t port : {15001, 15006}) EXPECT_EQ(resetErrno(*ns_, "127.0.0.1", port), ECONNRESET) << port;
  std::this_thread::sleep_for(100ms);  // a loop would keep adding events
  auto events = proxy->events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].listener, "outbound");
  EXPECT_EQ(events[1].listener, "inbound");
  for (const auto& ev : events) {
    EXPECT_EQ(ev.detail.rfind("upstream failed: refusing to connect to the stand-in's own", 0), 0u)
        << ev.detail;
  }
}

/// Inbound with the client's address kept: the stand-in's upstream socket
/// binds the (here non-local) client IP transparently. The policy route plays
/// the data plane's part of rule 4: the app's replies to the client IP go
/// back to the stand-in's socket instead of leaving the pod.
///
///   client netns                      pod netns (test fixture's)
///   c0 CLIENT_IP  <---- veth ---->  p0 POD_IP
///   connect POD_IP:15006 -------->  [::]:15006 stand-in
///                                      | socket bound CLIENT_IP (transparent)
///                                      v
///                                    POD_IP:P echo server (sees CLIENT_IP)
///   pod: rule "from POD_IP ipproto tcp sport P lookup 100",
///        table 100 "local CLIENT_IP dev lo"
void checkInboundKeepsClientAddress(const ScopedNetns& pod, bool v6) {
  ScopedNetns client;
  ASSERT_TRUE(client.ok());
  const std::string clientIp = v6 ? "fd77::1" : "10.77.0.1";
  const std::string podIp = v6 ? "fd77::2" : "10.77.0.2";
  const std::string plen = v6 ? "/64" : "/24";
  const std::string fam = v6 ? "-6 " : "-4 ";
  const std::string nodad = v6 ? " nodad" : "";
  ASSERT_TRUE(pod.ip("link add p0 type veth peer name c0 netns " + client.name()));
  ASSERT_TRUE(pod.ip("addr add " + podIp + plen + " dev p0" + nodad));
  ASSERT_TRUE(client.ip("addr add " + clientIp + plen + " dev c0" + nodad));
  ASSERT_TRUE(pod.ip("link set p0 up"));
  ASSERT_TRUE(client.ip("link set c0 up"));

  EchoServer echo(pod, podIp);
  ASSERT_TRUE(pod.ip(fam + "rule add from " + podIp + " ipproto tcp sport " +
                     std::to_string(echo.port()) + " lookup 100 pref 100"));
  ASSERT_TRUE(pod.ip(fam + "route add local " + clientIp + " dev lo table 100"));

  StandInConfig c;
  c.netnsPath = pod.path();
  c.upstreamOverride = (v6 ? "[" + podIp + "]" : podIp) + ":" + std::to_string(echo.port());
  auto r = ProxyStandIn::start(c);
  ASSERT_TRUE(r) << r.error().message;
  auto& proxy = *r;

  TestFd fd = connectTcp(client, podIp, 15006);
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(sendAll(fd.get(), "hello"));
  ::shutdown(fd.get(), SHUT_WR);
  EXPECT_EQ(readToEof(fd.get()), "hello<eof>");

  auto accepted = echo.accepted();
  ASSERT_EQ(accepted.size(), 1u);
  std::string seen = accepted[0].peer;
  std::string expectPrefix = v6 ? "[" + clientIp + "]:" : clientIp + ":";
  EXPECT_EQ(seen.rfind(expectPrefix, 0), 0u) << "app saw " << seen;

  auto events = proxy->events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].listener, "inbound");
  EXPECT_EQ(events[0].listenerPort, 15006);
  EXPECT_EQ(events[0].origDst, (v6 ? "[" + podIp + "]" : podIp) + ":15006");
  EXPECT_EQ(events[0].peer, str(localOf(fd.get())));
  EXPECT_EQ(events[0].detail, "upstream ok");
}

TEST_F(StandIn, InboundKeepsTheClientAddressV4) { checkInboundKeepsClientAddress(*ns_, false); }

TEST_F(StandIn, InboundKeepsTheClientAddressV6) { checkInboundKeepsClientAddress(*ns_, true); }

TEST_F(StandIn, StartFailsOnMissingNetns) {
  StandInConfig c;
  c.netnsPath = "/run/netns/sluice-standin-does-not-exist";
  auto r = ProxyStandIn::start(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "netns /run/netns/sluice-standin-does-not-exist: No such file or directory");
  EXPECT_EQ(r.error().code, ENOENT);
}

TEST_F(StandIn, StartFailsWhenAPortIsInUseAndClosesWhatItOpened) {
  // A socket without SO_REUSEPORT holds the inbound port.
  TestFd squatter = ns_->socket(AF_INET6, SOCK_STREAM);
  Addr any = addr("::", 15006);
  ASSERT_EQ(::bind(squatter.get(), any.raw(), any.len), 0);
  ASSERT_EQ(::listen(squatter.get(), 1), 0);

  size_t threadsBefore = threadCountSettled(1);  // an earlier test's thread may not be reaped yet
  auto r = ProxyStandIn::start(config());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "inbound listener [::]:15006: bind: Address already in use");
  EXPECT_EQ(r.error().code, EADDRINUSE);
  EXPECT_EQ(threadCountSettled(threadsBefore), threadsBefore);

  // The outbound listener opened before the failure is gone again.
  TestFd probe = ns_->socket(AF_INET6, SOCK_STREAM);
  Addr outbound = addr("::", 15001);
  EXPECT_EQ(::bind(probe.get(), outbound.raw(), outbound.len), 0) << std::strerror(errno);

  // Same for the DNS port (UDP).
  squatter.reset();
  probe.reset();
  TestFd dns = ns_->socket(AF_INET, SOCK_DGRAM);
  Addr lo = addr("127.0.0.1", 15053);
  ASSERT_EQ(::bind(dns.get(), lo.raw(), lo.len), 0);
  r = ProxyStandIn::start(config());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "dns-udp socket 127.0.0.1:15053: bind: Address already in use");
}

TEST_F(StandIn, StartRejectsBadConfiguration) {
  StandInConfig c = config();
  c.upstreamOverride = "nonsense";
  auto r = ProxyStandIn::start(c);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("invalid upstream override 'nonsense'"), std::string::npos);
  c = config();
  c.dnsAnswerV6 = "10.0.0.1";
  r = ProxyStandIn::start(c);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "invalid dnsAnswerV6 '10.0.0.1'");
}

TEST_F(StandIn, TwoInstancesShareThePortsWithReuseport) {
  // ztunnel's hand-over: a new instance binds while the old one still runs.
  auto first = start(config());
  ASSERT_TRUE(first);
  auto second = start(config());
  ASSERT_TRUE(second);
  StandInConfig exclusive = config();
  exclusive.reuseport = false;
  EXPECT_FALSE(ProxyStandIn::start(exclusive));
}

TEST_F(StandIn, Ipv4OnlyListensOnIpv4Only) {
  StandInConfig c = config();
  c.ipv6 = false;
  auto proxy = start(c);
  ASSERT_TRUE(proxy);
  TestFd fd = connectTcp(*ns_, "127.0.0.1", 15008);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(readToEof(fd.get()), "hbone\n");
  EXPECT_EQ(connectErrno(*ns_, "::1", 15008), ECONNREFUSED);
  EXPECT_EQ(connectErrno(*ns_, "::1", 15001), ECONNREFUSED);
  EXPECT_EQ(connectErrno(*ns_, "::1", 15053), ECONNREFUSED);
  TestFd udp6 = udpClient(*ns_, "::1", 15053);
  EXPECT_FALSE(udpExchange(udp6.get(), dnsQuery(1, "x", 1)));
  TestFd udp4 = udpClient(*ns_, "127.0.0.1", 15053);
  EXPECT_TRUE(udpExchange(udp4.get(), dnsQuery(1, "x", 1)));
  ASSERT_TRUE(proxy->waitForEvents(2, 1s));
  EXPECT_EQ(proxy->events()[0].origDst, "127.0.0.1:15008");
}

TEST_F(StandIn, StopIsPromptClosesEverythingAndLeavesNoThread) {
  // Upstream that completes handshakes but never accepts or reads: relays
  // stay open with data in flight.
  TestFd sink = ns_->socket(AF_INET, SOCK_STREAM);
  Addr lo = addr("127.0.0.1", 0);
  ASSERT_EQ(::bind(sink.get(), lo.raw(), lo.len), 0);
  ASSERT_EQ(::listen(sink.get(), 256), 0);

  size_t threadsBefore = threadCountSettled(1);  // an earlier test's thread may not be reaped yet
  StandInConfig c = config();
  c.upstreamOverride = str(localOf(sink.get()));
  auto proxy = start(c);
  ASSERT_TRUE(proxy);
  EXPECT_EQ(threadCount(), threadsBefore + 1);

  std::vector<TestFd> clients;
  for (int i = 0; i < 40; ++i) {
    clients.push_back(connectTcp(*ns_, "127.0.0.1", 15001));
    ASSERT_TRUE(clients.back().valid());
    ASSERT_TRUE(sendAll(clients.back().get(), pattern(100'000, static_cast<unsigned>(i))));
  }
  for (int i = 0; i < 20; ++i) {
    clients.push_back(connectTcp(*ns_, i % 2 ? "::1" : "127.0.0.1", 15053));
    ASSERT_TRUE(clients.back().valid());
    ASSERT_TRUE(sendAll(clients.back().get(), lengthPrefixed(dnsQuery(9, "open.conn", 1))));
    ASSERT_TRUE(readTcpDnsMessage(clients.back().get()));
  }
  ASSERT_TRUE(proxy->waitForEvents(60, 5s));
  EXPECT_EQ(proxy->openConnections(), 60u);

  auto t0 = std::chrono::steady_clock::now();
  proxy->stop();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, kPromptStop) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  EXPECT_EQ(threadCountSettled(threadsBefore), threadsBefore);
  EXPECT_EQ(proxy->openConnections(), 0u);

  // Every client sees its connection end, no listener is left.
  for (auto& fd : clients) {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof(buf), 0)) > 0) {
    }
    EXPECT_TRUE(n == 0 || errno == ECONNRESET) << std::strerror(errno);
  }
  EXPECT_EQ(connectErrno(*ns_, "127.0.0.1", 15008), ECONNREFUSED);
  EXPECT_EQ(connectErrno(*ns_, "::1", 15053), ECONNREFUSED);

  auto t1 = std::chrono::steady_clock::now();
  proxy->stop();  // idempotent
  proxy.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 10ms);
}

// ---- The binary ------------------------------------------------------------------------

#ifdef SLUICE_BUILD_DIR
/// A child process with stdout and stderr on pipes.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(err[1]);
    out_ = TestFd(out[0]);
    err_ = TestFd(err[0]);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool running() const { return pid_ > 0; }
  /// One line (without '\n') from stdout (or stderr); nullopt after 5 s.
  std::optional<std::string> line(bool fromStderr = false) {
    int fd = fromStderr ? err_.get() : out_.get();
    std::string& buf = fromStderr ? errBuf_ : outBuf_;
    auto deadline = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      auto nl = buf.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return std::nullopt;
      }
      char tmp[4096];
      ssize_t n = ::read(fd, tmp, sizeof(tmp));
      if (n <= 0) return std::nullopt;
      buf.append(tmp, static_cast<size_t>(n));
    }
  }
  /// Sends sig (0: none) and returns the exit status (-1: killed/timeout).
  int finish(int sig) {
    if (sig != 0) ::kill(pid_, sig);
    for (int i = 0; i < 500; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  TestFd out_, err_;
  std::string outBuf_, errBuf_;
};

std::string binary() { return std::string(SLUICE_BUILD_DIR) + "/sluice-standin"; }

TEST_F(StandIn, BinaryPrintsOneJsonLinePerEvent) {
  if (!std::filesystem::exists(binary())) GTEST_SKIP() << binary() << " not built";
  Child child({binary(), "--netns", ns_->path(), "--mark", "0x539"});
  ASSERT_TRUE(child.running());
  ASSERT_EQ(child.line(), "{\"ready\":true}");

  TestFd fd = connectTcp(*ns_, "127.0.0.1", 15008);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(readToEof(fd.get()), "hbone\n");
  EXPECT_EQ(child.line(), "{\"listener\":\"hbone\",\"port\":15008,\"orig_dst\":\"127.0.0.1:15008\","
                          "\"orig_dst_from\":\"local address\",\"peer\":\"" + str(localOf(fd.get())) +
                              "\",\"detail\":\"\"}");
  TestFd udp = udpClient(*ns_, "::1", 15053);
  ASSERT_TRUE(udpExchange(udp.get(), dnsQuery(1, "demo.example", 28)));
  EXPECT_EQ(child.line(), "{\"listener\":\"dns-udp\",\"port\":15053,\"orig_dst\":\"[::1]:15053\","
                          "\"orig_dst_from\":\"datagram\",\"peer\":\"" + str(localOf(udp.get())) +
                          "\",\"detail\":\"demo.example AAAA\"}");
  EXPECT_EQ(child.finish(SIGTERM), 0);
}

TEST_F(StandIn, BinaryReportsStartFailure) {
  if (!std::filesystem::exists(binary())) GTEST_SKIP() << binary() << " not built";
  Child child({binary(), "--netns", "/run/netns/sluice-standin-missing"});
  ASSERT_TRUE(child.running());
  EXPECT_EQ(child.line(true),
            "sluice-standin: netns /run/netns/sluice-standin-missing: No such file or directory");
  EXPECT_EQ(child.finish(0), 1);

  Child help({binary(), "--help"});
  auto first = help.line();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rfind("Usage: sluice-standin", 0), 0u);
  EXPECT_EQ(help.finish(0), 0);
}
#endif

}  // namespace
}  // namespace sluice
