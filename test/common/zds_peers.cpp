#include "test/common/zds_peers.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

namespace sluice::test {

namespace {

sockaddr_un unixAddr(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

}  // namespace

std::pair<dev_t, ino_t> fileIdOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

std::pair<dev_t, ino_t> fileIdOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {0, 0};
  return {st.st_dev, st.st_ino};
}

namespace {

size_t entries(const char* dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

}  // namespace

size_t openFdCount() { return entries("/proc/self/fd"); }

size_t threadCount() { return entries("/proc/self/task"); }

bool sendWithFds(int sock, const std::string& data, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  return ::sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
}

zds::ServerOptions testServerOptions(const std::string& path, std::chrono::milliseconds deadline) {
  zds::ServerOptions o;
  o.socketPath = path;
  o.helloTimeout = deadline;
  o.writeTimeout = deadline;
  o.ackTimeout = deadline;
  o.idleCheckInterval = deadline / 2;
  return o;
}

zds::Request zdsRequest(zds::RequestType type, const std::string& uid) {
  zds::Request r;
  r.type = type;
  r.workload.uid = uid;
  if (type == zds::RequestType::Add) {
    r.workload.name = "name-" + uid;
    r.workload.ns = "ns-" + uid;
    r.workload.serviceAccount = "sa-" + uid;
  }
  return r;
}

// ---- FakeZtunnel -------------------------------------------------------------------

FakeZtunnel::FakeZtunnel(const std::string& path) {
  auto addr = unixAddr(path);
  sock_ = Fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (::connect(sock_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) sock_.reset();
}

bool FakeZtunnel::hello() { return sendRaw(std::string("\x08\x01", 2)); }

bool FakeZtunnel::ack(const std::string& error) {
  auto b = zds::encodeAck(error);
  return b.ok() && sendRaw(*b);
}

Result<ReceivedRequest> FakeZtunnel::request(std::chrono::milliseconds timeout) {
  auto d = zds::receiveDatagram(sock_.get(), zds::after(timeout));
  if (!d) return d.error();
  if (d->eof) return Error::msg("EOF", EPIPE);
  auto r = zds::decodeRequest(d->bytes);
  if (!r) return r.error();
  return ReceivedRequest{*r, std::move(d->fds)};
}

Result<std::vector<ReceivedRequest>> FakeZtunnel::snapshot(const std::map<std::string, std::string>& errors) {
  std::vector<ReceivedRequest> got;
  for (;;) {
    auto r = request();
    if (!r) return r.error();
    bool done = r->request.type == zds::RequestType::SnapshotSent;
    auto e = errors.find(r->request.workload.uid);
    if (!ack(e == errors.end() || done ? "" : e->second)) return Error::msg("ack failed", EIO);
    if (done) return got;
    got.push_back(std::move(*r));
  }
}

Result<std::vector<ReceivedRequest>> FakeZtunnel::handshake() {
  if (!hello()) return Error::msg("hello failed", EIO);
  return snapshot();
}

bool FakeZtunnel::closedByServer(std::chrono::milliseconds timeout) {
  auto deadline = zds::after(timeout);
  for (;;) {
    auto d = zds::receiveDatagram(sock_.get(), deadline);
    if (!d) return d.error().code != ETIMEDOUT;  // ECONNRESET counts
    if (d->eof) return true;
  }
}

// ---- FakeAgent ---------------------------------------------------------------------

FakeAgent::FakeAgent(const std::string& path) : path_(path) {
  auto addr = unixAddr(path);
  listen_ = Fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_.get(), 8) != 0) {
    listen_.reset();
  }
}

FakeAgent::~FakeAgent() {
  if (listen_.valid()) ::unlink(path_.c_str());
}

Result<Fd> FakeAgent::accept(std::chrono::milliseconds timeout) {
  pollfd p{listen_.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return Error::msg("nobody connected", ETIMEDOUT);
  Fd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn.valid()) return Error::fromErrno(errno, "accept");
  auto hello = zds::receiveDatagram(conn.get(), zds::after(timeout));
  if (!hello) return hello.error();
  if (hello->eof) return Error::msg("closed before its hello", EPIPE);
  SLUICE_TRY(zds::decodeHello(hello->bytes));
  return conn;
}

Result<std::string> FakeAgent::exchangeRaw(int conn, const std::string& bytes, const std::vector<int>& fds,
                                           std::chrono::milliseconds timeout) {
  if (!sendWithFds(conn, bytes, fds)) return Error::fromErrno(errno, "sendmsg");
  auto d = zds::receiveDatagram(conn, zds::after(timeout));
  if (!d) return d.error();
  if (d->eof) return Error::msg("EOF instead of an ack", EPIPE);
  return zds::decodeAck(d->bytes);
}

Result<std::string> FakeAgent::exchange(int conn, const zds::Request& request, int fd,
                                        std::chrono::milliseconds timeout) {
  auto b = zds::encodeRequest(request);
  if (!b) return b.error();
  return exchangeRaw(conn, *b, fd >= 0 ? std::vector<int>{fd} : std::vector<int>{}, timeout);
}

bool FakeAgent::closedByPeer(int conn, std::chrono::milliseconds timeout) {
  auto deadline = zds::after(timeout);
  for (;;) {
    auto d = zds::receiveDatagram(conn, deadline);
    if (!d) return d.error().code != ETIMEDOUT;
    if (d->eof) return true;
  }
}

}  // namespace sluice::test
