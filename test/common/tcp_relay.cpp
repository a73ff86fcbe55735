#include "test/common/tcp_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>

namespace sluice::test {

namespace {

Status nonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return Error::fromErrno(errno, "O_NONBLOCK");
  return {};
}

}  // namespace

Result<std::unique_ptr<TcpRelay>> TcpRelay::start(const TestNetns& ns, const Endpoint& listen,
                                                   const Endpoint& upstream) {
  std::unique_ptr<TcpRelay> r(new TcpRelay());
  r->upstream_ = upstream;
  auto fd = socketIn(ns, listen.family(), SOCK_STREAM);
  SLUICE_TRY(fd);
  int one = 1;
  ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd->get(), listen.raw(), listen.len) != 0)
    return Error::fromErrno(errno, "relay: bind " + listen.str() + " in " + ns.name());
  if (::listen(fd->get(), 64) != 0) return Error::fromErrno(errno, "relay: listen");
  SLUICE_TRY(nonBlocking(fd->get()));
  r->listen_ = std::move(*fd);
  r->stop_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!r->stop_.valid()) return Error::fromErrno(errno, "relay: eventfd");
  TcpRelay* p = r.get();
  r->acceptor_ = std::thread([p] { p->acceptLoop(); });
  return r;
}

TcpRelay::~TcpRelay() {
  // The eventfd stays readable (nobody reads it): every poll wakes and ends.
  uint64_t one = 1;
  if (stop_.valid()) (void)!::write(stop_.get(), &one, sizeof(one));
  if (acceptor_.joinable()) acceptor_.join();
  std::lock_guard lock(mu_);
  for (auto& p : pumps_) p.thread.join();
}

void TcpRelay::reap() {
  std::lock_guard lock(mu_);
  for (auto it = pumps_.begin(); it != pumps_.end();) {
    if (!*it->done) {
      ++it;
      continue;
    }
    it->thread.join();
    it = pumps_.erase(it);
  }
}

void TcpRelay::acceptLoop() {
  for (;;) {
    std::array<pollfd, 2> fds{{{listen_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    reap();
    Fd client(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client.valid()) continue;
    accepted_++;
    // This thread never left the test's own netns: the upstream is there.
    Fd server(::socket(upstream_.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    // Unreachable: the client is closed, as a refused connection would be.
    if (!server.valid() || ::connect(server.get(), upstream_.raw(), upstream_.len) != 0) continue;
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard lock(mu_);
    pumps_.push_back({std::thread([this, done, c = std::move(client), s = std::move(server)]() mutable {
                        pump(std::move(c), std::move(s));
                        *done = true;
                      }),
                      done});
  }
}

bool TcpRelay::writeAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EINTR) return false;
    std::array<pollfd, 2> fds{{{fd, POLLOUT, 0}, {stop_.get(), POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return false;
    if (fds[1].revents) return false;
  }
  return true;
}

void TcpRelay::pump(Fd client, Fd server) {
  if (!nonBlocking(client.get()).ok() || !nonBlocking(server.get()).ok()) return;
  // open[i]: whether side i still sends (its bytes go to side 1 - i).
  std::array<int, 2> side{client.get(), server.get()};
  std::array<bool, 2> open{true, true};
  std::array<char, 16384> buf{};
  while (open[0] || open[1]) {
    std::array<pollfd, 3> fds{{{open[0] ? side[0] : -1, POLLIN, 0},
                               {open[1] ? side[1] : -1, POLLIN, 0},
                               {stop_.get(), POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[2].revents) return;
    for (int i = 0; i < 2; i++) {
      if (!open[i] || !fds[i].revents) continue;
      ssize_t n = ::recv(side[i], buf.data(), buf.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0) return;  // reset: closing both ends passes it on
      if (n == 0) {
        // Half-close: the FIN goes on, the other direction keeps flowing.
        ::shutdown(side[1 - i], SHUT_WR);
        open[i] = false;
        continue;
      }
      if (!writeAll(side[1 - i], buf.data(), static_cast<size_t>(n))) return;
    }
  }
}

}  // namespace sluice::test
