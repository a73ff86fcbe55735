#include "test/common/topology.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "loader/bpffs.h"
#include "loader/features.h"
#include "loader/netns.h"
#include "loader/sysctl.h"

extern char** environ;

namespace sluice::test {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> gNetnsCounter{0};
std::atomic<int> gBpffsCounter{0};

constexpr const char* kNetnsDir = "/run/netns";
constexpr const char* kBpffsPrefix = "sluice-t-";
// Tags of the namespaces these fixtures make; only those are swept as stale.
const std::set<std::string> kSweptTags = {"node", "pod", "bare"};

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

bool pidIsGone(pid_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

/// Waits until fd is readable (or writable with @p out); false on time-out.
Result<bool> waitFd(int fd, bool out, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, static_cast<short>(out ? POLLOUT : POLLIN), 0};
    int n = ::poll(&p, 1, remainingMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, "poll");
    }
    return n > 0;
  }
}

Status setNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return Error::fromErrno(errno, "fcntl F_GETFL");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) != 0) return Error::fromErrno(errno, "fcntl F_SETFL");
  return {};
}

void putU16(std::string& s, uint16_t v) {
  s += static_cast<char>(v >> 8);
  s += static_cast<char>(v & 0xff);
}

uint16_t getU16(const std::string& s, size_t off) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[off]) << 8 | static_cast<uint8_t>(s[off + 1]));
}

/// Skips a (possibly compressed) DNS name at off; returns the offset after it,
/// or 0 when malformed. Collects the labels when @p name is given.
size_t skipName(const std::string& m, size_t off, std::string* name) {
  for (int guard = 0; guard < 128; guard++) {
    if (off >= m.size()) return 0;
    uint8_t len = static_cast<uint8_t>(m[off]);
    if (len == 0) return off + 1;
    if ((len & 0xc0) == 0xc0) return off + 2 <= m.size() ? off + 2 : 0;
    if (off + 1 + len > m.size()) return 0;
    if (name) {
      if (!name->empty()) *name += '.';
      name->append(m, off + 1, len);
    }
    off += 1 + len;
  }
  return 0;
}

/// `ip` commands run one after the other by one shell; stops at the first
/// failure, whose stderr becomes the error.
Status ipScript(const std::vector<std::string>& lines) {
  std::string script = "set -e\n";
  for (const auto& l : lines) script += l + "\n";
  auto r = sh(script);
  if (r.exitCode != 0) return Error::msg("setting up the topology failed: " + r.describe());
  return {};
}

}  // namespace

// ---- Processes -----------------------------------------------------------------

std::string CommandResult::describe() const {
  std::string s = timedOut ? "timed out" : "exit " + std::to_string(exitCode);
  s += ", stdout: '" + out + "', stderr: '" + err + "'";
  return s;
}

Result<std::unique_ptr<Subprocess>> Subprocess::start(const std::vector<std::string>& argv) {
  if (argv.empty()) return Error::msg("Subprocess: empty argv", EINVAL);
  int outPipe[2], errPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0) return Error::fromErrno(errno, "pipe2");
  Fd outRead(outPipe[0]), outWrite(outPipe[1]);
  if (::pipe2(errPipe, O_CLOEXEC) != 0) return Error::fromErrno(errno, "pipe2");
  Fd errRead(errPipe[0]), errWrite(errPipe[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, outWrite.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, errWrite.get(), 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Error::fromErrno(rc, "spawn " + argv[0]);

  auto p = std::unique_ptr<Subprocess>(new Subprocess());
  p->pid_ = pid;
  p->out_ = std::move(outRead);
  p->err_ = std::move(errRead);
  return p;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
}

void Subprocess::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

CommandResult Subprocess::wait(std::chrono::milliseconds timeout) {
  CommandResult r;
  if (pid_ <= 0) return r;
  auto deadline = Clock::now() + timeout;
  while (out_.valid() || err_.valid()) {
    pollfd fds[2];
    int n = 0;
    Fd* owners[2];
    for (Fd* f : {&out_, &err_}) {
      if (!f->valid()) continue;
      fds[n] = pollfd{f->get(), POLLIN, 0};
      owners[n++] = f;
    }
    int ready = ::poll(fds, static_cast<nfds_t>(n), remainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      r.timedOut = true;
      break;
    }
    for (int i = 0; i < n; i++) {
      if (!fds[i].revents) continue;
      char buf[4096];
      ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        (owners[i] == &out_ ? r.out : r.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        owners[i]->reset();
      }
    }
  }
  if (r.timedOut) ::kill(pid_, SIGKILL);
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  out_.reset();
  err_.reset();
  if (WIFEXITED(st)) r.exitCode = WEXITSTATUS(st);
  else if (WIFSIGNALED(st)) r.exitCode = 128 + WTERMSIG(st);
  return r;
}

CommandResult runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  auto p = Subprocess::start(argv);
  if (!p.ok()) {
    CommandResult r;
    r.err = p.error().message;
    return r;
  }
  return (*p)->wait(timeout);
}

CommandResult sh(const std::string& commandLine, std::chrono::milliseconds timeout) {
  return runCommand({"/bin/sh", "-c", commandLine}, timeout);
}

std::string builtBinary(const std::string& name) { return std::string(SLUICE_BUILD_DIR) + "/" + name; }

// ---- Namespaces and bpffs ------------------------------------------------------

void cleanupStaleTestState() {
  static std::once_flag once;
  std::call_once(once, [] {
    // sluice-<tag>-<pid>-<n>
    if (DIR* d = ::opendir(kNetnsDir)) {
      std::vector<std::string> stale;
      while (dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name.rfind("sluice-", 0) != 0) continue;
        auto last = name.rfind('-');
        auto mid = last == std::string::npos ? std::string::npos : name.rfind('-', last - 1);
        if (mid == std::string::npos || mid <= 7) continue;
        std::string tag = name.substr(7, mid - 7);
        if (!kSweptTags.count(tag)) continue;
        pid_t pid = static_cast<pid_t>(std::atoi(name.substr(mid + 1, last - mid - 1).c_str()));
        if (pidIsGone(pid)) stale.push_back(name);
      }
      ::closedir(d);
      for (const auto& n : stale) runCommand({"ip", "netns", "del", n});
    }
    // /sys/fs/bpf/sluice-t-<pid>-<n>
    if (DIR* d = ::opendir("/sys/fs/bpf")) {
      std::vector<std::string> stale;
      while (dirent* e = ::readdir(d)) {
        std::string name = e->d_name;
        if (name.rfind(kBpffsPrefix, 0) != 0) continue;
        pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + std::strlen(kBpffsPrefix)));
        if (pidIsGone(pid)) stale.push_back("/sys/fs/bpf/" + name);
      }
      ::closedir(d);
      for (const auto& p : stale) (void)removeTree(p);
    }
  });
}

TestNetns::TestNetns(const std::string& tag) {
  cleanupStaleTestState();
  name_ = "sluice-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(gNetnsCounter++);
  auto r = runCommand({"ip", "netns", "add", name_});
  if (r.exitCode != 0) {
    error_ = "ip netns add " + name_ + ": " + r.describe();
    removed_ = true;
    return;
  }
  r = ip("link set lo up");
  if (r.exitCode != 0) error_ = "ip -n " + name_ + " link set lo up: " + r.describe();
}

TestNetns::~TestNetns() { remove(); }

void TestNetns::remove() {
  if (removed_) return;
  removed_ = true;
  runCommand({"ip", "netns", "del", name_});
}

std::string TestNetns::path() const { return std::string(kNetnsDir) + "/" + name_; }

Status TestNetns::run(const std::function<Status()>& fn) const {
  auto ns = openNetns(path());
  SLUICE_TRY(ns);
  return runInNetns(ns->get(), fn);
}

Result<uint64_t> TestNetns::cookie() const {
  uint64_t cookie = 0;
  SLUICE_TRY(run([&]() -> Status {
    auto c = currentNetnsCookie();
    SLUICE_TRY(c);
    cookie = *c;
    return {};
  }));
  return cookie;
}

CommandResult TestNetns::ip(const std::string& args) const { return sh("ip -n " + name_ + " " + args); }

Result<std::string> TestNetns::sysctl(const std::string& key) const {
  std::string value;
  Status st = run([&]() -> Status {
    auto v = readSysctl(key);
    SLUICE_TRY(v);
    value = *v;
    return {};
  });
  SLUICE_TRY(st);
  return value;
}

Status TestNetns::setSysctl(const std::string& key, const std::string& value) const {
  return run([&]() -> Status { return writeSysctl(key, value); });
}

TestBpffs::TestBpffs() {
  cleanupStaleTestState();
  root_ = std::string("/sys/fs/bpf/") + kBpffsPrefix + std::to_string(::getpid()) + "-" +
          std::to_string(gBpffsCounter++);
}

TestBpffs::~TestBpffs() { (void)removeTree(root_); }

std::string TestBpffs::linkDir(const std::string& id) const { return root_ + "/links/" + id; }

// ---- Addresses -----------------------------------------------------------------

Endpoint Endpoint::of(const std::string& ip, uint16_t port) {
  Endpoint e;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&e.ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&e.ss);
  if (::inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    e.len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    e.len = sizeof(sockaddr_in6);
  }
  return e;
}

Endpoint Endpoint::fromSockaddr(const sockaddr* sa, socklen_t len) {
  Endpoint e;
  if (len > sizeof(e.ss)) len = sizeof(e.ss);
  std::memcpy(&e.ss, sa, len);
  e.len = len;
  return e;
}

Endpoint Endpoint::any(int family, uint16_t port) { return of(family == AF_INET ? "0.0.0.0" : "::", port); }

uint16_t Endpoint::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

Endpoint Endpoint::withPort(uint16_t p) const {
  Endpoint e = *this;
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&e.ss)->sin_port = htons(p);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&e.ss)->sin6_port = htons(p);
  return e;
}

std::string Endpoint::ip() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
    return buf;
  }
  if (family() == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
      ::inet_ntop(AF_INET, &a.s6_addr[12], buf, sizeof(buf));
      return buf;
    }
    ::inet_ntop(AF_INET6, &a, buf, sizeof(buf));
    return buf;
  }
  return "?";
}

std::string Endpoint::str() const {
  std::string a = ip();
  if (family() == AF_INET6 && a.find(':') != std::string::npos) a = "[" + a + "]";
  return a + ":" + std::to_string(port());
}

// ---- Sockets -------------------------------------------------------------------

Result<Fd> socketIn(const TestNetns& ns, int family, int type) {
  Fd fd;
  Status st = ns.run([&]() -> Status {
    fd = Fd(::socket(family, type | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return Error::fromErrno(errno, "socket in " + ns.name());
    return {};
  });
  SLUICE_TRY(st);
  timeval tv{};
  tv.tv_sec = kIoTimeout.count() / 1000;
  tv.tv_usec = (kIoTimeout.count() % 1000) * 1000;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

Result<Fd> tcpConnect(const TestNetns& ns, const Endpoint& dst, const ConnectOptions& options) {
  auto fd = socketIn(ns, dst.family(), SOCK_STREAM);
  SLUICE_TRY(fd);
  int s = fd->get();
  if (options.mark) {
    int m = static_cast<int>(options.mark);
    if (::setsockopt(s, SOL_SOCKET, SO_MARK, &m, sizeof(m)) != 0) return Error::fromErrno(errno, "SO_MARK");
  }
  if (options.bind && ::bind(s, options.bind->raw(), options.bind->len) != 0)
    return Error::fromErrno(errno, "bind " + options.bind->str());
  SLUICE_TRY(setNonBlocking(s, true));
  std::string what = "connect from " + ns.name() + " to " + dst.str();
  if (::connect(s, dst.raw(), dst.len) != 0) {
    if (errno != EINPROGRESS) return Error::fromErrno(errno, what);
    auto ready = waitFd(s, true, Clock::now() + options.timeout);
    SLUICE_TRY(ready);
    if (!*ready)
      return Error{ETIMEDOUT, what + ": no answer within " + std::to_string(options.timeout.count()) + " ms"};
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Error::fromErrno(err, what);
  }
  SLUICE_TRY(setNonBlocking(s, false));
  return std::move(*fd);
}

Result<std::string> readSome(int fd, size_t max, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  std::string got;
  while (got.size() < max) {
    auto ready = waitFd(fd, false, deadline);
    SLUICE_TRY(ready);
    if (!*ready) {
      if (got.empty()) return Error{ETIMEDOUT, "read: nothing within " + std::to_string(timeout.count()) + " ms"};
      break;
    }
    char buf[4096];
    ssize_t n = ::recv(fd, buf, std::min(sizeof(buf), max - got.size()), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (!got.empty()) break;
      return Error::fromErrno(errno, "read");
    }
    if (n == 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

std::string echoOrError(int fd, const std::string& payload) {
  auto r = echoRoundTrip(fd, payload);
  return r.ok() ? *r : "error: " + r.error().message;
}

Result<std::string> echoRoundTrip(int fd, const std::string& payload, std::chrono::milliseconds timeout) {
  size_t sent = 0;
  while (sent < payload.size()) {
    ssize_t n = ::send(fd, payload.data() + sent, payload.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, "send");
    }
    sent += static_cast<size_t>(n);
  }
  return readSome(fd, payload.size(), timeout);
}

Endpoint localOf(int fd) {
  Endpoint e;
  e.len = sizeof(e.ss);
  if (::getsockname(fd, e.raw(), &e.len) != 0) e.len = 0;
  return e;
}

Endpoint peerOf(int fd) {
  Endpoint e;
  e.len = sizeof(e.ss);
  if (::getpeername(fd, e.raw(), &e.len) != 0) e.len = 0;
  return e;
}

namespace {

/// A socket bound to @p addr inside @p ns, with an eventfd to stop its thread.
Result<Fd> boundSocket(const TestNetns& ns, const Endpoint& addr, int type) {
  auto fd = socketIn(ns, addr.family(), type);
  SLUICE_TRY(fd);
  int one = 1;
  ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr.family() == AF_INET6) ::setsockopt(fd->get(), SOL_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  if (::bind(fd->get(), addr.raw(), addr.len) != 0)
    return Error::fromErrno(errno, "bind " + addr.str() + " in " + ns.name());
  return std::move(*fd);
}

}  // namespace

Result<std::unique_ptr<TcpServer>> TcpServer::start(const TestNetns& ns, const Endpoint& addr, bool closeAfterEcho) {
  auto fd = boundSocket(ns, addr, SOCK_STREAM);
  SLUICE_TRY(fd);
  if (::listen(fd->get(), 64) != 0) return Error::fromErrno(errno, "listen " + addr.str());
  auto s = std::unique_ptr<TcpServer>(new TcpServer());
  s->local_ = localOf(fd->get());
  s->closeAfterEcho_ = closeAfterEcho;
  s->listen_ = std::move(*fd);
  s->wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->wake_.valid()) return Error::fromErrno(errno, "eventfd");
  SLUICE_TRY(setNonBlocking(s->listen_.get(), true));
  s->thread_ = std::thread([raw = s.get()] { raw->serve(); });
  return s;
}

TcpServer::~TcpServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
    thread_.join();
  }
}

void TcpServer::serve() {
  std::vector<Fd> conns;
  for (;;) {
    std::vector<pollfd> fds = {{wake_.get(), POLLIN, 0}, {listen_.get(), POLLIN, 0}};
    for (const auto& c : conns) fds.push_back({c.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents) {
      for (;;) {
        Endpoint peer;
        peer.len = sizeof(peer.ss);
        int c = ::accept4(listen_.get(), peer.raw(), &peer.len, SOCK_CLOEXEC);
        if (c < 0) break;
        timeval tv{1, 0};
        ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        conns.emplace_back(c);
        {
          std::lock_guard lock(mutex_);
          peers_.push_back(peer);
        }
        cv_.notify_all();
      }
    }
    std::vector<size_t> closed;
    for (size_t i = 2; i < fds.size(); i++) {
      if (!fds[i].revents) continue;
      char buf[4096];
      ssize_t n = ::recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        if (::send(fds[i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n || closeAfterEcho_) closed.push_back(i - 2);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        closed.push_back(i - 2);
      }
    }
    for (auto it = closed.rbegin(); it != closed.rend(); ++it) conns.erase(conns.begin() + static_cast<long>(*it));
  }
}

std::vector<Endpoint> TcpServer::peers() const {
  std::lock_guard lock(mutex_);
  return peers_;
}

size_t TcpServer::accepted() const {
  std::lock_guard lock(mutex_);
  return peers_.size();
}

bool TcpServer::waitForAccepts(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return peers_.size() >= n; });
}

Result<std::unique_ptr<UdpServer>> UdpServer::start(const TestNetns& ns, const Endpoint& addr) {
  auto fd = boundSocket(ns, addr, SOCK_DGRAM);
  SLUICE_TRY(fd);
  auto s = std::unique_ptr<UdpServer>(new UdpServer());
  s->local_ = localOf(fd->get());
  s->sock_ = std::move(*fd);
  s->wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->wake_.valid()) return Error::fromErrno(errno, "eventfd");
  s->thread_ = std::thread([raw = s.get()] { raw->serve(); });
  return s;
}

UdpServer::~UdpServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
    thread_.join();
  }
}

void UdpServer::serve() {
  for (;;) {
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {sock_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (!fds[1].revents) continue;
    char buf[4096];
    Endpoint from;
    from.len = sizeof(from.ss);
    ssize_t n = ::recvfrom(sock_.get(), buf, sizeof(buf), MSG_DONTWAIT, from.raw(), &from.len);
    if (n < 0) continue;
    // Recorded before the echo: a client that has its answer finds the
    // query in received().
    {
      std::lock_guard lock(mutex_);
      received_.push_back(Datagram{from, std::string(buf, static_cast<size_t>(n))});
    }
    cv_.notify_all();
    ::sendto(sock_.get(), buf, static_cast<size_t>(n), MSG_DONTWAIT, from.raw(), from.len);
  }
}

std::vector<Datagram> UdpServer::received() const {
  std::lock_guard lock(mutex_);
  return received_;
}

bool UdpServer::waitForDatagrams(size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return cv_.wait_for(lock, timeout, [&] { return received_.size() >= n; });
}

Result<UdpReply> udpExchange(const TestNetns& ns, const Endpoint& dst, const std::string& payload, bool connected,
                             std::chrono::milliseconds timeout) {
  auto fd = socketIn(ns, dst.family(), SOCK_DGRAM);
  SLUICE_TRY(fd);
  int s = fd->get();
  std::string what = "udp from " + ns.name() + " to " + dst.str();
  if (connected) {
    if (::connect(s, dst.raw(), dst.len) != 0) return Error::fromErrno(errno, what + ": connect");
    if (::send(s, payload.data(), payload.size(), 0) < 0) return Error::fromErrno(errno, what + ": send");
  } else if (::sendto(s, payload.data(), payload.size(), 0, dst.raw(), dst.len) < 0) {
    return Error::fromErrno(errno, what + ": sendto");
  }
  auto ready = waitFd(s, false, Clock::now() + timeout);
  SLUICE_TRY(ready);
  if (!*ready) return Error{ETIMEDOUT, what + ": no answer within " + std::to_string(timeout.count()) + " ms"};
  UdpReply r;
  char buf[4096];
  r.from.len = sizeof(r.from.ss);
  ssize_t n = ::recvfrom(s, buf, sizeof(buf), MSG_DONTWAIT, r.from.raw(), &r.from.len);
  if (n < 0) return Error::fromErrno(errno, what + ": recv");
  r.payload.assign(buf, static_cast<size_t>(n));
  return r;
}

// ---- DNS -----------------------------------------------------------------------

std::string dnsQuery(uint16_t id, const std::string& name, uint16_t qtype) {
  std::string q;
  putU16(q, id);
  putU16(q, 0x0100);  // RD
  putU16(q, 1);
  putU16(q, 0);
  putU16(q, 0);
  putU16(q, 0);
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    if (dot > start) {
      q += static_cast<char>(dot - start);
      q.append(name, start, dot - start);
    }
    start = dot + 1;
  }
  q += '\0';
  putU16(q, qtype);
  putU16(q, 1);  // IN
  return q;
}

std::optional<DnsAnswer> parseDnsAnswer(const std::string& m) {
  if (m.size() < 12) return std::nullopt;
  DnsAnswer a;
  a.id = getU16(m, 0);
  uint16_t flags = getU16(m, 2);
  a.response = flags & 0x8000;
  a.rcode = flags & 0xf;
  uint16_t qd = getU16(m, 4), an = getU16(m, 6);
  size_t off = 12;
  for (uint16_t i = 0; i < qd; i++) {
    off = skipName(m, off, i == 0 ? &a.question : nullptr);
    if (!off || off + 4 > m.size()) return std::nullopt;
    off += 4;
  }
  for (uint16_t i = 0; i < an; i++) {
    off = skipName(m, off, nullptr);
    if (!off || off + 10 > m.size()) return std::nullopt;
    uint16_t type = getU16(m, off);
    uint16_t rdlen = getU16(m, off + 8);
    off += 10;
    if (off + rdlen > m.size()) return std::nullopt;
    char buf[INET6_ADDRSTRLEN] = {};
    if (type == 1 && rdlen == 4) a.addresses.push_back(::inet_ntop(AF_INET, m.data() + off, buf, sizeof(buf)));
    if (type == 28 && rdlen == 16) a.addresses.push_back(::inet_ntop(AF_INET6, m.data() + off, buf, sizeof(buf)));
    off += rdlen;
  }
  return a;
}

// ---- The pod topology ------------------------------------------------------------

PodTopology::PodTopology() {
  Status st = build();
  if (!st.ok()) error_ = st.error().message;
}

Status PodTopology::build() {
  if (!node_.ok()) return Error::msg(node_.error());
  if (!pod_.ok()) return Error::msg(pod_.error());
  SLUICE_TRY(linkVeth("eth0", "vethpod", "02:00:0a:c8:00:02", "02:00:0a:c8:00:01", kPodV4, kNodeV4, kPodV6, kNodeV6,
                      24, 64));
  const std::string p = "ip -n " + pod_.name() + " ";
  return ipScript({
      p + "route add default via " + kNodeV4 + " dev eth0",
      p + "-6 route add default via " + kNodeV6 + " dev eth0",
  });
}

Status PodTopology::linkVeth(const std::string& podIf, const std::string& nodeIf, const std::string& podMac,
                             const std::string& nodeMac, const std::string& podV4, const std::string& nodeV4,
                             const std::string& podV6, const std::string& nodeV6, int prefixV4, int prefixV6) {
  const std::string n = "ip -n " + node_.name() + " ";
  const std::string p = "ip -n " + pod_.name() + " ";
  return ipScript({
      // Both ends are created directly in their namespaces: nothing ever
      // appears in the machine's own namespace, so names cannot collide.
      n + "link add " + nodeIf + " address " + nodeMac + " type veth peer name " + podIf + " address " + podMac +
          " netns " + pod_.name(),
      n + "addr add " + nodeV4 + "/" + std::to_string(prefixV4) + " dev " + nodeIf,
      n + "addr add " + nodeV6 + "/" + std::to_string(prefixV6) + " dev " + nodeIf + " nodad",
      p + "addr add " + podV4 + "/" + std::to_string(prefixV4) + " dev " + podIf,
      p + "addr add " + podV6 + "/" + std::to_string(prefixV6) + " dev " + podIf + " nodad",
      n + "link set " + nodeIf + " up",
      p + "link set " + podIf + " up",
      // Permanent neighbours (as xdp-tools' test_runner.sh): no ARP/ND timing.
      n + "neigh replace " + podV4 + " lladdr " + podMac + " dev " + nodeIf + " nud permanent",
      n + "neigh replace " + podV6 + " lladdr " + podMac + " dev " + nodeIf + " nud permanent",
      p + "neigh replace " + nodeV4 + " lladdr " + nodeMac + " dev " + podIf + " nud permanent",
      p + "neigh replace " + nodeV6 + " lladdr " + nodeMac + " dev " + podIf + " nud permanent",
  });
}

Status PodTopology::addVeth(const std::string& podIf, const std::string& nodeIf, int subnet) {
  if (subnet <= 0 || subnet > 250) return Error::msg("addVeth: subnet must be 1..250", EINVAL);
  char podMac[32], nodeMac[32];
  std::snprintf(podMac, sizeof(podMac), "02:00:0a:c8:%02x:02", subnet);
  std::snprintf(nodeMac, sizeof(nodeMac), "02:00:0a:c8:%02x:01", subnet);
  std::string s = std::to_string(subnet);
  return linkVeth(podIf, nodeIf, podMac, nodeMac, "10.200." + s + ".2", "10.200." + s + ".1", "fd00:200:" + s + "::2",
                  "fd00:200:" + s + "::1", 24, 64);
}

Status PodTopology::addProbeAddresses() {
  const std::string n = "ip -n " + node_.name() + " ";
  const std::string p = "ip -n " + pod_.name() + " ";
  return ipScript({
      n + "addr add " + kProbeV4 + "/32 dev vethpod",
      n + "addr add " + kProbeV6 + "/128 dev vethpod nodad",
      p + "route add " + kProbeV4 + "/32 via " + kNodeV4 + " dev eth0",
      p + "-6 route add " + kProbeV6 + "/128 via " + kNodeV6 + " dev eth0",
  });
}

}  // namespace sluice::test

namespace sluice::test {

// ---- ICMP ----------------------------------------------------------------------

namespace {

uint16_t inetChecksum(const uint8_t* p, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < n; i += 2) sum += static_cast<uint32_t>(p[i] << 8 | p[i + 1]);
  if (n & 1) sum += static_cast<uint32_t>(p[n - 1] << 8);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

}  // namespace

Status icmpEcho(const TestNetns& ns, const std::string& dstIp, std::chrono::milliseconds timeout) {
  Endpoint dst = Endpoint::of(dstIp, 0);
  if (!dst.valid()) return Error::msg("icmpEcho: bad address " + dstIp, EINVAL);
  bool v4 = dst.family() == AF_INET;
  Fd fd;
  SLUICE_TRY(ns.run([&]() -> Status {
    fd = Fd(::socket(dst.family(), SOCK_RAW | SOCK_CLOEXEC, v4 ? static_cast<int>(IPPROTO_ICMP) : static_cast<int>(IPPROTO_ICMPV6)));
    if (!fd.valid()) return Error::fromErrno(errno, "raw ICMP socket");
    return {};
  }));
  static std::atomic<uint16_t> seq{1};
  uint16_t id = static_cast<uint16_t>(::getpid()), sq = seq++;
  uint8_t pkt[16] = {static_cast<uint8_t>(v4 ? 8 : 128), 0, 0, 0, static_cast<uint8_t>(id >> 8),
                     static_cast<uint8_t>(id & 0xff), static_cast<uint8_t>(sq >> 8), static_cast<uint8_t>(sq & 0xff),
                     's', 'l', 'u', 'i', 'c', 'e', '!', '!'};
  if (v4) {
    uint16_t c = inetChecksum(pkt, sizeof(pkt));
    pkt[2] = static_cast<uint8_t>(c >> 8);
    pkt[3] = static_cast<uint8_t>(c & 0xff);
  }  // ICMPv6: the kernel fills the checksum of raw ICMPv6 sockets
  if (::sendto(fd.get(), pkt, sizeof(pkt), 0, dst.raw(), dst.len) < 0)
    return Error::fromErrno(errno, "send ICMP echo to " + dstIp);
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto ready = waitFd(fd.get(), false, deadline);
    SLUICE_TRY(ready);
    if (!*ready) return Error{ETIMEDOUT, "no ICMP echo reply from " + dstIp};
    uint8_t buf[1500];
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) continue;
    const uint8_t* icmp = buf;
    size_t len = static_cast<size_t>(n);
    if (v4) {  // raw IPv4 sockets see the IP header
      size_t ihl = (buf[0] & 0xf) * 4u;
      if (len < ihl + 8) continue;
      icmp += ihl;
      len -= ihl;
    }
    if (len < 8) continue;
    bool reply = icmp[0] == (v4 ? 0 : 129);
    if (reply && icmp[4] == (id >> 8) && icmp[5] == (id & 0xff) && icmp[6] == (sq >> 8) && icmp[7] == (sq & 0xff))
      return {};
  }
}

// ---- PodHarness ----------------------------------------------------------------

PodHarness::PodHarness(TcMode mode) : mode_(mode) {}

PodHarness::PodHarness(TcMode mode, CaptureMode capture) : mode_(mode), capture_(capture) {}

bool PodHarness::servesReuseport() const {
  return (capture_ == CaptureMode::Socket && !rerouted_) || kernelAssignsReuseport();
}

PodHarness::~PodHarness() {
  if (standIn_) standIn_->stop();
  if (dp_ && enrolled_) (void)dp_->removePod(podId_);
  standIn_.reset();
  dp_.reset();
}

Status PodHarness::open() {
  if (dp_) return {};
  if (!topo_.ok()) return Error::msg(topo_.error());
  DatapathOptions o;
  o.bpffsRoot = bpffs_.root();
  o.tcMode = mode_;
  o.capture = capture_;
  o.skLookupStubsAhead = stubsAhead_;
  o.podGuard = podGuard_;
  auto dp = Datapath::open(o);
  SLUICE_TRY(dp);
  dp_ = std::move(*dp);
  return {};
}

Result<PodInfo> PodHarness::enroll(PodSpec spec, const Handoff* hook) {
  SLUICE_TRY(open());
  if (spec.netnsPath.empty()) spec.netnsPath = pod().path();
  if (spec.id.empty()) spec.id = pod().name();
  auto info = dp_->addPod(spec, hook);
  SLUICE_TRY(info);
  podId_ = spec.id;
  enrolled_ = true;
  rerouted_ = !spec.rerouteIfaces.empty();
  return info;
}

Status PodHarness::unenroll() {
  if (!dp_ || !enrolled_) return Error::msg("PodHarness: no pod enrolled");
  Status st = dp_->removePod(podId_);
  if (st.ok()) enrolled_ = false;
  return st;
}

Status PodHarness::startStandIn(StandInConfig config) {
  if (standIn_) standIn_->stop();
  standIn_.reset();
  config.netnsPath = pod().path();
  // ztunnel's default where the capture serves it; without it where it
  // cannot (TC before 6.6).
  config.reuseport = config.reuseport && servesReuseport();
  auto s = ProxyStandIn::start(config);
  SLUICE_TRY(s);
  standIn_ = std::move(*s);
  return {};
}

void PodHarness::stopStandIn() {
  if (standIn_) standIn_->stop();
}

bool PodHarness::waitStandInIdle(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (standIn_ && standIn_->openConnections() != 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::vector<ProxyEvent> PodHarness::events() const { return standIn_ ? standIn_->events() : std::vector<ProxyEvent>{}; }

std::vector<ProxyEvent> PodHarness::events(const std::string& listener) const {
  std::vector<ProxyEvent> out;
  for (const auto& e : events())
    if (e.listener == listener) out.push_back(e);
  return out;
}

std::optional<ProxyEvent> PodHarness::waitForEvent(const std::string& listener, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    auto found = events(listener);
    if (!found.empty()) return found.front();
    if (!standIn_ || Clock::now() >= deadline) return std::nullopt;
    // Wake on any new event, then look again.
    size_t have = standIn_->events().size();
    standIn_->waitForEvents(have + 1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  }
}

sluice_pod_stats PodHarness::stats() {
  if (!dp_ || podId_.empty()) return {};
  auto s = dp_->stats(podId_);
  if (!s.ok() || s->empty()) return {};
  return s->front().stats;
}

std::string describe(const std::vector<ProxyEvent>& events) {
  if (events.empty()) return "(no stand-in events)";
  std::string s;
  for (const auto& e : events)
    s += "\n  " + e.listener + " :" + std::to_string(e.listenerPort) + " orig_dst=" + e.origDst + " peer=" + e.peer +
         " " + e.detail;
  return s;
}

std::string tcModeUnsupported(TcMode m) {
  if (m != TcMode::Tcx) return "";
  auto f = kernelFeatures();
  if (!f.ok() || f->tcx.present) return "";  // a failed probe: let the test fail on its own
  return "kernel " + f->release + " has no tcx (Linux 6.6+): " + f->tcx.how;
}

std::string socketCaptureUnsupported() {
  auto f = kernelFeatures();
  if (!f.ok()) return "";  // a failed probe: let the test fail on its own
  return socketUnavailableReason(*f);
}

std::string modeUnsupported(const ModeParam& m) {
  if (m.capture == CaptureMode::Socket) return socketCaptureUnsupported();
  return tcModeUnsupported(m.tc);
}

namespace {
// Every process the suites start (sluicectl, sluiced, in-process
// Datapaths) leaves the pod guard off unless a test turns it on: each
// private bpffs root would attach guards of its own, and the kernel's
// trampoline holds only so many (E2BIG, seen in the 6.1 guest), besides
// re-patching kernel text at each attach.
const bool kPodGuardOffInTests = [] { return ::setenv("SLUICE_POD_GUARD", "off", 0) == 0; }();
}  // namespace

void openHarness(std::unique_ptr<PodHarness>& h, const ModeParam& m, bool podGuard) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
  if (std::string why = modeUnsupported(m); !why.empty()) GTEST_SKIP() << why;
  h = std::make_unique<PodHarness>(m.tc, m.capture);
  if (podGuard) h->enablePodGuard();
  ASSERT_TRUE(h->topo().ok()) << h->topo().error();
  Status st = h->open();
  ASSERT_TRUE(st.ok()) << st.error().message;
}

bool kernelAssignsReuseport() {
  auto f = kernelFeatures();
  return !f.ok() || f->reuseportAssign.present;
}

StandInConfig testStandInConfig(CaptureMode capture) {
  StandInConfig c;
  c.reuseport = capture == CaptureMode::Socket || kernelAssignsReuseport();
  return c;
}

NodeProxyConfig testNodeProxyConfig(const std::string& zdsPath) {
  NodeProxyConfig c;
  c.zdsPath = zdsPath;
  c.proxy.reuseport = kernelAssignsReuseport();
  c.retryInterval = std::chrono::milliseconds(200);
  c.initialBackoff = std::chrono::milliseconds(5);
  c.maxBackoff = std::chrono::milliseconds(50);
  return c;
}

std::chrono::milliseconds scaledBound(std::chrono::milliseconds bound) {
  static const long factor = [] {
    const char* env = std::getenv("SLUICE_TEST_TIME_SCALE");
    long f = env ? std::strtol(env, nullptr, 10) : 1;
    return f >= 1 && f <= 100 ? f : 1L;
  }();
  return bound * factor;
}

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + scaledBound(timeout);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

Status connectAndEcho(const TestNetns& ns, const Endpoint& dst, std::chrono::milliseconds timeout) {
  auto c = tcpConnect(ns, dst, ConnectOptions{timeout});
  SLUICE_TRY(c);
  auto e = echoRoundTrip(c->get(), "x", timeout);
  SLUICE_TRY(e);
  if (*e != "x") return Error::msg("echo returned '" + *e + "'", EIO);
  return {};
}

std::string httpGetLoopback(uint16_t port, const std::string& path, std::chrono::milliseconds timeout) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return "connect failed";
  std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  if (::send(s.get(), req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) return "send failed";
  auto body = readSome(s.get(), 1 << 20, timeout);
  return body.ok() ? *body : body.error().message;
}

}  // namespace sluice::test
