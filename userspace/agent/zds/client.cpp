#include "userspace/agent/zds/client.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "userspace/agent/zds/wire.h"

namespace sluice::zds {

const char* clientEventName(ClientEvent::Kind kind) {
  switch (kind) {
    case ClientEvent::Kind::Connected: return "connected";
    case ClientEvent::Kind::Disconnected: return "disconnected";
    case ClientEvent::Kind::ReadError: return "read-error";
    case ClientEvent::Kind::ProtocolError: return "protocol-error";
  }
  return "?";
}

struct Client::Impl {
  explicit Impl(ClientOptions o) : options(std::move(o)) {}

  ClientOptions options;
  Fd stopFd;
  std::thread thread;
  std::mutex stopMutex;
  std::atomic<bool> isConnected{false};

  void run();
  /// Sleeps, or returns false as soon as stop() began.
  bool pause(std::chrono::milliseconds d) const;
  Result<Fd> connectOnce() const;
  void serve(int sock, uint64_t id);
  void event(ClientEvent::Kind kind, uint64_t id, std::string detail) const {
    if (kind == ClientEvent::Kind::Connected) {
      spdlog::info("zds client: connected to {} (connection {})", options.socketPath, id);
    } else {
      spdlog::warn("zds client: connection {} {}: {}", id, clientEventName(kind), detail);
    }
    if (options.onEvent) options.onEvent(ClientEvent{kind, id, std::move(detail)});
  }
};

bool Client::Impl::pause(std::chrono::milliseconds d) const {
  pollfd p{stopFd.get(), POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(d.count()));
  } while (rc < 0 && errno == EINTR);
  return rc == 0;
}

Result<Fd> Client::Impl::connectOnce() const {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.socketPath.size() >= sizeof(addr.sun_path)) {
    return Error::msg("socket path '" + options.socketPath + "' too long", ENAMETOOLONG);
  }
  std::memcpy(addr.sun_path, options.socketPath.c_str(), options.socketPath.size() + 1);
  Fd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Error::fromErrno(errno, "socket");
  int rc;
  do {
    rc = ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return Error::fromErrno(errno, "connect " + options.socketPath);
  return sock;
}

void Client::Impl::run() {
  ::pthread_setname_np(::pthread_self(), "zds-client");
  auto backoff = options.initialBackoff;
  uint64_t id = 0;
  for (;;) {
    auto sock = connectOnce();
    if (!sock) {
      // Nobody listens (yet): the agent may be starting or restarting.
      spdlog::debug("zds client: {}; retrying in {} ms", sock.error().message, backoff.count());
      if (!pause(backoff)) return;
      backoff = std::min(backoff * 2, options.maxBackoff);
      continue;
    }
    ++id;
    auto hello = encodeHello();
    Status sent = hello ? sendDatagram(sock->get(), *hello, -1, after(options.writeTimeout), stopFd.get())
                        : Status(hello.error());
    if (!sent) {
      if (sent.error().code == ECANCELED) return;
      event(ClientEvent::Kind::Disconnected, id, "hello: " + sent.error().message);
      if (!pause(backoff)) return;
      backoff = std::min(backoff * 2, options.maxBackoff);
      continue;
    }
    backoff = options.initialBackoff;
    isConnected = true;
    event(ClientEvent::Kind::Connected, id, "");
    serve(sock->get(), id);
    isConnected = false;
    if (!pause(std::chrono::milliseconds(0))) return;
  }
}

void Client::Impl::serve(int sock, uint64_t id) {
  bool afterSnapshot = false;
  // Answers with an error ack (best effort) and ends the connection.
  auto reject = [&](ClientEvent::Kind kind, const std::string& prefix, const std::string& why) {
    auto ack = encodeAck(prefix + why);
    if (ack) (void)sendDatagram(sock, *ack, -1, after(options.writeTimeout), stopFd.get());
    event(kind, id, why);
  };
  for (;;) {
    // ztunnel waits for requests without a deadline: the agent may have
    // nothing to say for hours.
    auto d = receiveDatagram(sock, Clock::time_point::max(), stopFd.get());
    if (!d) {
      if (d.error().code == ECANCELED) return;
      if (d.error().code == EPROTO) return reject(ClientEvent::Kind::ReadError, "failure to read message : ", d.error().message);
      return event(ClientEvent::Kind::Disconnected, id, d.error().message);
    }
    if (d->eof) return event(ClientEvent::Kind::Disconnected, id, "the agent closed the connection");
    if (d->fds.size() > 1) {
      return reject(ClientEvent::Kind::ReadError, "failure to read message : ",
                    "expected 1 fd, got " + std::to_string(d->fds.size()));
    }
    auto req = decodeRequest(d->bytes);
    if (!req) return reject(ClientEvent::Kind::ReadError, "failure to read message : ", req.error().message);
    bool isAdd = req->type == RequestType::Add;
    if (isAdd && d->fds.empty()) {
      return reject(ClientEvent::Kind::ReadError, "failure to read message : ", "add without a netns fd (no control message)");
    }
    if (!isAdd && !d->fds.empty()) {
      return reject(ClientEvent::Kind::ReadError, "failure to read message : ",
                    std::string("unexpected fd with a ") + requestTypeName(req->type) + " request");
    }
    if (isAdd && !req->hasWorkloadInfo) {
      return reject(ClientEvent::Kind::ProtocolError, "failure to process message : ",
                    "workload_info is required but not present (uid " + req->workload.uid + ")");
    }
    if (afterSnapshot && req->type == RequestType::Keep) {
      return reject(ClientEvent::Kind::ProtocolError, "failure to process message : ", "pod keep received after snapshot");
    }
    if (afterSnapshot && req->type == RequestType::SnapshotSent) {
      return reject(ClientEvent::Kind::ProtocolError, "failure to process message : ", "pod snapshot received already");
    }
    ClientRequest cr;
    cr.request = std::move(*req);
    if (isAdd) cr.netns = std::move(d->fds.front());
    cr.connection = id;
    cr.afterSnapshot = afterSnapshot;
    std::string error = options.handler ? options.handler(cr) : std::string();
    if (cr.request.type == RequestType::SnapshotSent) afterSnapshot = true;
    auto ack = encodeAck(error);
    Status sent = ack ? sendDatagram(sock, *ack, -1, after(options.writeTimeout), stopFd.get()) : Status(ack.error());
    if (!sent) {
      if (sent.error().code == ECANCELED) return;
      return event(ClientEvent::Kind::Disconnected, id, "ack: " + sent.error().message);
    }
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() { stop(); }

Result<std::unique_ptr<Client>> Client::start(ClientOptions options) {
  if (options.socketPath.empty()) return Error::msg("zds client: empty socket path", EINVAL);
  if (options.initialBackoff.count() <= 0 || options.maxBackoff < options.initialBackoff) {
    return Error::msg("zds client: back-off must be positive and initial <= max", EINVAL);
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->stopFd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->stopFd.valid()) return Error::fromErrno(errno, "zds client: eventfd");
  Impl* p = impl.get();
  p->thread = std::thread([p] { p->run(); });
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

void Client::stop() {
  std::lock_guard lock(impl_->stopMutex);
  if (!impl_->thread.joinable()) return;
  uint64_t one = 1;
  if (::write(impl_->stopFd.get(), &one, sizeof(one)) < 0) {
    spdlog::error("zds client: cannot wake its thread: {}", std::strerror(errno));
  }
  impl_->thread.join();
}

bool Client::connected() const { return impl_->isConnected.load(); }

}  // namespace sluice::zds
