#include "userspace/agent/zds/server.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "userspace/agent/zds/wire.h"

namespace sluice::zds {

namespace {

using namespace std::chrono_literals;

// Istio's agent reads an idle connection this briefly: ztunnel never speaks
// unasked, so a time-out means "alive".
constexpr auto kIdleProbe = 10ms;

/// Where a connection is in its life; only the connection's thread moves it.
enum class ConnState {
  Hello,      ///< accepted, waiting for ZdsHello
  Preparing,  ///< said hello; the snapshot callback runs
  Snapshot,   ///< sending the snapshot; requests queue behind it
  Ready,      ///< one request, one ack
  Closed,
};

/// How one request/ack exchange ended.
enum class Outcome {
  Acked,      ///< an ack came (its text may be an error)
  Invalid,    ///< the request could not be encoded; nothing was sent
  Gone,       ///< the connection ended before the ack: another may be tried
  Timeout,    ///< write or ack deadline passed; connection dropped
  Protocol,   ///< a malformed answer; connection dropped
  Cancelled,  ///< the server is stopping
};

/// A request handed to a connection's thread.
struct Job {
  Request request;
  Fd netns;            ///< Add: our own duplicate of the pod's netns fd
  bool done = false;
  Outcome outcome = Outcome::Gone;
  std::string text;  ///< ack text, or what went wrong
};

struct Conn {
  uint64_t id = 0;
  Fd sock;
  ucred cred{};
  ConnState state = ConnState::Hello;
  bool snapshotDone = false;
  bool finished = false;  ///< its thread has nothing left to do
  std::deque<std::shared_ptr<Job>> queue;
  std::condition_variable cv;  ///< a job arrived, or stop
  std::thread thread;
};

std::string podName(const WorkloadInfo& w) {
  return (w.ns.empty() ? "?" : w.ns) + "/" + (w.name.empty() ? "?" : w.name);
}

std::string ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

/// The listen backlog Go's listeners (Istio's agent) use: somaxconn, so that
/// connections the accept rate limit holds back wait rather than being refused.
int listenBacklog() {
  std::ifstream f("/proc/sys/net/core/somaxconn");
  int n = 0;
  if (f >> n && n > 0) return std::min(n, 65535);
  return SOMAXCONN;
}

/// Whether the peer of an accepted connection has already closed its end
/// (it left while the connection waited in the backlog).
bool peerGone(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

/// Why a connection is dropped after an exchange ended @p o (nullptr: the
/// server is stopping, not counted).
const char* dropReason(Outcome o) {
  switch (o) {
    case Outcome::Timeout: return "deadline";
    case Outcome::Protocol: return "protocol";
    case Outcome::Gone: return "closed";
    default: return nullptr;
  }
}

}  // namespace

struct Server::Impl {
  explicit Impl(ServerOptions o) : options(std::move(o)) {}

  ServerOptions options;
  Fd listenFd;
  Fd stopFd;  ///< eventfd; readable once stop() began (never reset)
  dev_t fileDev = 0;
  ino_t fileIno = 0;
  std::thread acceptor;
  std::mutex stopMutex;

  mutable std::mutex mu;
  std::condition_variable jobDone;
  std::vector<std::shared_ptr<Conn>> all;   ///< every accepted connection whose thread is not joined
  std::vector<std::shared_ptr<Conn>> live;  ///< said hello, not closed; newest last
  uint64_t nextId = 1;
  bool stopping = false;

  std::thread notifier;
  std::deque<std::pair<std::string, std::string>> notes;
  std::condition_variable notesCv;
  bool notifierStop = false;

  std::string waitingFor;  ///< guarded by mu: see Server::waiting()

  /// Whether another process serves the socket at the path (a connection
  /// to it is accepted, or its backlog is full).
  bool servedByAnother(const sockaddr_un& addr) const;
  Status listen();
  /// takeOver: waits until the other server stops, then listens; false
  /// when stopped first.
  bool waitThenListen();
  void acceptLoop();
  /// Waits until the accept rate limit lets the next accept through; false
  /// when stopped first.
  bool acceptAllowance(Clock::time_point& nextToken);
  /// The next connection from the backlog whose peer is still there
  /// (closing at most kGonePerAccept whose peer left); invalid when stopped.
  Fd acceptLive();
  void serve(const std::shared_ptr<Conn>& conn);
  bool sendSnapshot(const std::shared_ptr<Conn>& conn);
  void serveRequests(const std::shared_ptr<Conn>& conn);
  /// One request and its ack on conn's socket (conn's thread only); logs
  /// the hand-off and counts it.
  Outcome exchange(Conn& conn, const Request& request, int netnsFd, std::string& text);
  /// Drops conn; @p reason (one of kDropReasons) is counted, nullptr when
  /// the server stops.
  void close(const std::shared_ptr<Conn>& conn, const std::string& why, const char* reason);
  void complete(const std::shared_ptr<Job>& job, Outcome outcome, std::string text);
  /// Queues a job on conn; false when conn is closed.
  bool enqueue(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Job>& job);
  void waitFor(const std::shared_ptr<Job>& job);
  void queueUnwaited(const std::vector<std::shared_ptr<Conn>>& conns, RequestType type, const WorkloadInfo& w,
                     int netnsFd);
  void count(const std::string& type, const std::string& result);
  void notifyLoop();
};

// ---- Listening and accepting ---------------------------------------------------

bool Server::Impl::servedByAnother(const sockaddr_un& addr) const {
  Fd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe.valid()) return false;
  if (::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return true;
  // EAGAIN: a listener whose backlog is full; ECONNREFUSED: a socket file
  // nobody listens on; EPROTOTYPE: not a SEQPACKET listener (not a ZDS
  // server, but someone's all the same).
  return errno == EAGAIN || errno == EINPROGRESS || errno == EPROTOTYPE;
}

Status Server::Impl::listen() {
  const std::string& path = options.socketPath;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty()) return Error::msg("zds: empty socket path", EINVAL);
  if (path.size() >= sizeof(addr.sun_path)) {
    return Error::msg("zds: socket path '" + path + "' is longer than " + std::to_string(sizeof(addr.sun_path) - 1) +
                          " bytes",
                      ENAMETOOLONG);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    // A socket left by an earlier agent: ztunnel would connect to nothing.
    if (!S_ISSOCK(st.st_mode)) {
      return Error::msg("zds: refusing to replace '" + path + "': it exists and is not a socket", EEXIST);
    }
    // One that another node agent serves: ztunnel would be split between
    // two agents, each sure it alone hands pods over.
    if (servedByAnother(addr)) {
      return Error::msg("zds: " + path + " is served by another node agent (Istio's, or another sluiced): refusing "
                        "to take it while it answers; stop that agent, or start with --ztunnel-socket-takeover to "
                        "wait until it stops",
                        EADDRINUSE);
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Error::fromErrno(errno, "zds: remove stale socket " + path);
    }
  }
  listenFd = Fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listenFd.valid()) return Error::fromErrno(errno, "zds: socket");
  if (::bind(listenFd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Error::fromErrno(errno, "zds: bind " + path);
  }
  // Whoever connects is handed every pod's network namespace: root only.
  if (::chmod(path.c_str(), 0600) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    return Error::fromErrno(err, "zds: chmod 0600 " + path);
  }
  if (::stat(path.c_str(), &st) == 0) {
    fileDev = st.st_dev;
    fileIno = st.st_ino;
  }
  if (::listen(listenFd.get(), listenBacklog()) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    return Error::fromErrno(err, "zds: listen " + path);
  }
  if (!stopFd.valid()) stopFd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stopFd.valid()) {
    int err = errno;
    ::unlink(path.c_str());
    return Error::fromErrno(err, "zds: eventfd");
  }
  return {};
}

bool Server::Impl::waitThenListen() {
  auto lastLog = std::chrono::steady_clock::now();
  for (;;) {
    pollfd stop{stopFd.get(), POLLIN, 0};
    if (::poll(&stop, 1, static_cast<int>(options.takeOverPoll.count())) > 0) return false;
    Status st = listen();
    if (st.ok()) {
      {
        std::lock_guard lock(mu);
        waitingFor.clear();
      }
      spdlog::info("zds: the other node agent stopped serving {}: listening on it now", options.socketPath);
      return true;
    }
    const bool served = st.error().code == EADDRINUSE;
    {
      std::lock_guard lock(mu);
      waitingFor = served ? "another node agent serves " + options.socketPath + ": waiting for it to stop"
                          : "cannot listen on " + options.socketPath + ": " + st.error().message;
    }
    if (auto now = std::chrono::steady_clock::now(); now - lastLog >= std::chrono::seconds(30)) {
      lastLog = now;
      spdlog::warn("zds: {}", waitingFor);
    }
  }
}

bool Server::Impl::acceptAllowance(Clock::time_point& nextToken) {
  if (options.acceptInterval.count() <= 0) return true;
  // Istio's limiter (rate.NewLimiter(5, 1), waited on before each accept):
  // a token every interval, a bucket of one. After an idle spell the next
  // connection is accepted at once; a peer that reconnects in a loop is
  // accepted once per interval and its other connections wait.
  bool waited = false;
  for (auto now = Clock::now(); now < nextToken; now = Clock::now()) {
    waited = true;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(nextToken - now);
    pollfd stop{stopFd.get(), POLLIN, 0};
    if (::poll(&stop, 1, static_cast<int>(left.count())) > 0) return false;
  }
  nextToken = std::max(Clock::now(), nextToken) + options.acceptInterval;
  if (waited && options.observer) {
    pollfd pending{listenFd.get(), POLLIN, 0};
    if (::poll(&pending, 1, 0) == 1) options.observer->acceptThrottled();
  }
  return true;
}

Fd Server::Impl::acceptLive() {
  int gone = 0;
  for (;;) {
    std::array<pollfd, 2> fds{};
    fds[0] = {listenFd.get(), POLLIN, 0};
    fds[1] = {stopFd.get(), POLLIN, 0};
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("zds: poll on the listener: {}", std::strerror(errno));
      return Fd();
    }
    if (fds[1].revents) return Fd();
    Fd sock(::accept4(listenFd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!sock.valid()) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      spdlog::error("zds: accept: {}", std::strerror(errno));
      // Out of fds or memory: do not spin; stop() still interrupts this.
      ::poll(&fds[1], 1, 100);
      continue;
    }
    // Its peer left while it waited in the backlog (a ztunnel that
    // reconnects in a loop leaves many): nothing to serve, no thread, and it
    // does not use the allowance.
    if (gone < kGonePerAccept && peerGone(sock.get())) {
      ++gone;
      if (options.observer) options.observer->accepted("gone");
      continue;
    }
    if (gone) spdlog::info("zds: closed {} connection(s) whose peer left while they waited to be accepted", gone);
    if (options.observer) options.observer->accepted("served");
    return sock;
  }
}

void Server::Impl::acceptLoop() {
  ::pthread_setname_np(::pthread_self(), "zds-accept");
  if (!listenFd.valid() && !waitThenListen()) return;
  Clock::time_point nextToken{};
  for (;;) {
    if (!acceptAllowance(nextToken)) return;
    Fd sock = acceptLive();
    if (!sock.valid()) return;
    auto conn = std::make_shared<Conn>();
    socklen_t len = sizeof(conn->cred);
    if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &conn->cred, &len) != 0) {
      spdlog::warn("zds: SO_PEERCRED: {}", std::strerror(errno));
      conn->cred = ucred{-1, static_cast<uid_t>(-1), static_cast<gid_t>(-1)};
    }
    conn->sock = std::move(sock);

    std::vector<std::shared_ptr<Conn>> finished;
    {
      std::lock_guard lock(mu);
      if (stopping) return;
      conn->id = nextId++;
      // Join the threads of connections that ended, so a peer reconnecting in
      // a loop does not pile them up.
      auto keep = std::partition(all.begin(), all.end(), [](const auto& c) { return !c->finished; });
      finished.assign(keep, all.end());
      all.erase(keep, all.end());
      all.push_back(conn);
      conn->thread = std::thread([this, conn] { serve(conn); });
    }
    for (auto& c : finished) c->thread.join();
  }
}

// ---- One connection ----------------------------------------------------------------

void Server::Impl::serve(const std::shared_ptr<Conn>& conn) {
  ::pthread_setname_np(::pthread_self(), "zds-conn");
  auto hello = receiveDatagram(conn->sock.get(), after(options.helloTimeout), stopFd.get());
  std::string bad;
  const char* reason = "no_hello";
  if (!hello) {
    if (hello.error().code == ETIMEDOUT) reason = "hello_timeout";
    bad = hello.error().code == ETIMEDOUT ? "no hello within " + ms(options.helloTimeout) : hello.error().message;
  } else if (hello->eof) {
    bad = "closed before its hello";
  } else if (!hello->fds.empty()) {
    bad = "hello came with " + std::to_string(hello->fds.size()) + " fd(s)";
  } else if (auto st = decodeHello(hello->bytes); !st) {
    bad = st.error().message;
  }
  if (!bad.empty()) {
    close(conn, bad, reason);
    return;
  }
  size_t count;
  {
    std::lock_guard lock(mu);
    if (stopping) {
      conn->state = ConnState::Closed;
      conn->finished = true;
      return;
    }
    conn->state = ConnState::Preparing;
    live.push_back(conn);
    count = live.size();
  }
  spdlog::info("zds: ztunnel connected (connection {}, pid {}, uid {}); {} connection(s)", conn->id, conn->cred.pid,
               conn->cred.uid, count);
  if (options.onConnected) options.onConnected(Peer{conn->id, conn->cred.pid, conn->cred.uid, conn->cred.gid, false});
  if (!sendSnapshot(conn)) return;
  serveRequests(conn);
}

bool Server::Impl::sendSnapshot(const std::shared_ptr<Conn>& conn) {
  std::vector<SnapshotEntry> entries;
  if (options.snapshot) {
    try {
      entries = options.snapshot();
    } catch (const std::exception& e) {
      close(conn, std::string("snapshot callback failed: ") + e.what(), nullptr);
      return false;
    }
  }
  {
    std::lock_guard lock(mu);
    conn->state = ConnState::Snapshot;
  }
  size_t adds = 0, keeps = 0, refused = 0;
  for (auto& entry : entries) {
    Request r;
    r.type = entry.netns.valid() ? RequestType::Add : RequestType::Keep;
    r.workload = entry.workload;
    std::string text;
    Outcome o = exchange(*conn, r, entry.netns.get(), text);
    // Not needed any more: close it now rather than at the end of a long snapshot.
    entry.netns.reset();
    if (o == Outcome::Invalid) {
      // This pod cannot be described on the wire; the rest still can.
      std::lock_guard lock(mu);
      notes.emplace_back(r.workload.uid, text);
      notesCv.notify_one();
      continue;
    }
    if (o != Outcome::Acked) {
      close(conn, "snapshot: " + text, dropReason(o));
      return false;
    }
    (r.type == RequestType::Add ? adds : keeps)++;
    if (!text.empty()) refused++;
    std::lock_guard lock(mu);
    notes.emplace_back(r.workload.uid, text);
    notesCv.notify_one();
  }
  Request done;
  done.type = RequestType::SnapshotSent;
  std::string text;
  if (Outcome o = exchange(*conn, done, -1, text); o != Outcome::Acked) {
    close(conn, "snapshot: " + text, dropReason(o));
    return false;
  }
  spdlog::info("zds: snapshot sent on connection {}: {} add(s), {} keep(s), {} refused{}", conn->id, adds, keeps,
               refused, text.empty() ? "" : "; SnapshotSent ack: " + text);
  std::lock_guard lock(mu);
  if (conn->state != ConnState::Closed) {
    conn->state = ConnState::Ready;
    conn->snapshotDone = true;
  }
  return true;
}

void Server::Impl::serveRequests(const std::shared_ptr<Conn>& conn) {
  auto nextCheck = Clock::now() + options.idleCheckInterval;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu);
      conn->cv.wait_until(lock, nextCheck, [&] { return stopping || !conn->queue.empty(); });
      if (stopping) break;
      if (!conn->queue.empty()) {
        job = std::move(conn->queue.front());
        conn->queue.pop_front();
      }
    }
    if (job) {
      std::string text;
      Outcome o = exchange(*conn, job->request, job->netns.get(), text);
      job->netns.reset();
      complete(job, o, text);
      if (o != Outcome::Acked && o != Outcome::Invalid) {
        close(conn, text, dropReason(o));
        return;
      }
      nextCheck = Clock::now() + options.idleCheckInterval;
      continue;
    }
    if (Clock::now() < nextCheck) continue;
    // Idle: a short read tells a live peer (nothing to read) from a gone one.
    auto d = receiveDatagram(conn->sock.get(), after(kIdleProbe), stopFd.get());
    if (!d) {
      if (d.error().code == ECANCELED) break;
      if (d.error().code != ETIMEDOUT) {
        close(conn, "idle check: " + d.error().message, "keepalive");
        return;
      }
    } else if (d->eof) {
      close(conn, "ztunnel closed the connection (idle check)", "keepalive");
      return;
    } else {
      close(conn, "protocol error: unsolicited message from ztunnel (" + hex(d->bytes) + ")", "protocol");
      return;
    }
    nextCheck = Clock::now() + options.idleCheckInterval;
  }
  close(conn, "server stopping", nullptr);
}

Outcome Server::Impl::exchange(Conn& conn, const Request& request, int netnsFd, std::string& text) {
  const char* type = requestTypeName(request.type);
  // One line per hand-off: what, which pod, which connection, how it ended.
  std::string what = type;
  if (request.type != RequestType::SnapshotSent) what += " uid=" + request.workload.uid;
  if (request.type == RequestType::Add) what += " pod=" + podName(request.workload);
  what += " conn=" + std::to_string(conn.id);
  auto start = Clock::now();
  auto elapsedMs = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };

  auto bytes = encodeRequest(request);
  if (!bytes) {
    text = bytes.error().message;
    count(type, "error");
    spdlog::warn("zds: {} result=error: {}", what, text);
    return Outcome::Invalid;
  }
  auto fail = [&](Outcome o, std::string why) {
    text = std::move(why);
    if (o == Outcome::Cancelled) {
      spdlog::debug("zds: {} result=cancelled (server stopping)", what);
      return o;
    }
    bool timeout = o == Outcome::Timeout;
    count(type, timeout ? "timeout" : "error");
    spdlog::warn("zds: {} result={}: {} after={:.3f}ms", what, timeout ? "timeout" : "error", text, elapsedMs());
    return o;
  };

  Status sent = sendDatagram(conn.sock.get(), *bytes, netnsFd, after(options.writeTimeout), stopFd.get());
  if (!sent) {
    int code = sent.error().code;
    if (code == ECANCELED) return fail(Outcome::Cancelled, "zds server stopping");
    if (code == ETIMEDOUT) return fail(Outcome::Timeout, "could not write within " + ms(options.writeTimeout));
    // Our fd, not the connection, is bad: nothing was sent.
    if (code == EBADF) return fail(Outcome::Invalid, "netns fd " + std::to_string(netnsFd) + ": " + sent.error().message);
    return fail(Outcome::Gone, "connection " + std::to_string(conn.id) + ": " + sent.error().message);
  }
  auto ack = receiveDatagram(conn.sock.get(), after(options.ackTimeout), stopFd.get());
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!ack) {
    int code = ack.error().code;
    if (code == ECANCELED) return fail(Outcome::Cancelled, "zds server stopping");
    if (code == ETIMEDOUT) return fail(Outcome::Timeout, "no ack within " + ms(options.ackTimeout));
    if (code == EPROTO) return fail(Outcome::Protocol, "protocol error: " + ack.error().message);
    return fail(Outcome::Gone, "connection " + std::to_string(conn.id) + ": " + ack.error().message);
  }
  if (ack->eof) return fail(Outcome::Gone, "connection " + std::to_string(conn.id) + " closed before the ack");
  if (!ack->fds.empty()) {
    return fail(Outcome::Protocol, "protocol error: ack came with " + std::to_string(ack->fds.size()) + " fd(s)");
  }
  auto ackText = decodeAck(ack->bytes);
  if (!ackText) return fail(Outcome::Protocol, "protocol error: " + ackText.error().message);
  text = *ackText;
  if (options.observer) options.observer->acked(seconds);
  count(type, text.empty() ? "ok" : "error");
  if (text.empty()) {
    spdlog::info("zds: {} result=ok ack={:.3f}ms", what, seconds * 1000);
  } else {
    spdlog::warn("zds: {} result=error ack: {} ack={:.3f}ms", what, text, seconds * 1000);
  }
  return Outcome::Acked;
}

void Server::Impl::close(const std::shared_ptr<Conn>& conn, const std::string& why, const char* reason) {
  std::deque<std::shared_ptr<Job>> orphans;
  size_t remaining;
  bool wasLive;
  bool stopped;
  {
    std::lock_guard lock(mu);
    stopped = stopping;
    wasLive = conn->state != ConnState::Hello;
    conn->state = ConnState::Closed;
    orphans.swap(conn->queue);
    live.erase(std::remove(live.begin(), live.end(), conn), live.end());
    remaining = live.size();
  }
  conn->sock.reset();
  if (!stopped && reason && options.observer) options.observer->dropped(reason);
  if (stopped) {
    spdlog::info("zds: closed ztunnel connection {} (server stopping)", conn->id);
  } else if (wasLive) {
    spdlog::warn("zds: dropped ztunnel connection {}: {}; {} connection(s) left", conn->id, why, remaining);
  } else {
    spdlog::warn("zds: dropped connection {} (pid {}) before its hello: {}", conn->id, conn->cred.pid, why);
  }
  for (auto& job : orphans) {
    complete(job, stopped ? Outcome::Cancelled : Outcome::Gone,
             "connection " + std::to_string(conn->id) + " closed before the request was sent (" + why + ")");
  }
  std::lock_guard lock(mu);
  conn->finished = true;
}

// ---- Jobs -----------------------------------------------------------------------

void Server::Impl::complete(const std::shared_ptr<Job>& job, Outcome outcome, std::string text) {
  job->netns.reset();
  std::lock_guard lock(mu);
  job->outcome = outcome;
  job->text = std::move(text);
  job->done = true;
  jobDone.notify_all();
}

bool Server::Impl::enqueue(const std::shared_ptr<Conn>& conn, const std::shared_ptr<Job>& job) {
  std::lock_guard lock(mu);
  if (conn->state == ConnState::Closed || stopping) return false;
  conn->queue.push_back(job);
  conn->cv.notify_one();
  return true;
}

void Server::Impl::waitFor(const std::shared_ptr<Job>& job) {
  std::unique_lock lock(mu);
  // The connection's thread finishes every job it took or dropped, within
  // its write and ack deadlines (or at stop()).
  jobDone.wait(lock, [&] { return job->done; });
}

void Server::Impl::queueUnwaited(const std::vector<std::shared_ptr<Conn>>& conns, RequestType type,
                                 const WorkloadInfo& w, int netnsFd) {
  for (const auto& c : conns) {
    auto job = std::make_shared<Job>();
    job->request.type = type;
    job->request.workload = w;
    if (netnsFd >= 0) {
      job->netns = Fd(::fcntl(netnsFd, F_DUPFD_CLOEXEC, 0));
      if (!job->netns.valid()) {
        spdlog::error("zds: cannot duplicate the netns fd of {}: {}", w.uid, std::strerror(errno));
        continue;
      }
    }
    if (enqueue(c, job)) {
      spdlog::info("zds: {} uid={} queued behind the snapshot of connection {}", requestTypeName(type), w.uid, c->id);
    }
  }
}

void Server::Impl::count(const std::string& type, const std::string& result) {
  if (options.observer) options.observer->request(type, result);
}

void Server::Impl::notifyLoop() {
  ::pthread_setname_np(::pthread_self(), "zds-notify");
  std::unique_lock lock(mu);
  for (;;) {
    notesCv.wait(lock, [&] { return notifierStop || !notes.empty(); });
    if (notes.empty()) return;  // stopping, everything delivered
    auto note = std::move(notes.front());
    notes.pop_front();
    lock.unlock();
    if (options.onSnapshotAck) options.onSnapshotAck(note.first, note.second);
    lock.lock();
  }
}

// ---- Server ---------------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

Result<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status listening = impl->listen();
  if (!listening.ok()) {
    if (!impl->options.takeOver || listening.error().code != EADDRINUSE) return listening.error();
    impl->stopFd = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!impl->stopFd.valid()) return Error::fromErrno(errno, "zds: eventfd");
    impl->waitingFor = "another node agent serves " + impl->options.socketPath + ": waiting for it to stop";
    spdlog::warn("zds: {} (--ztunnel-socket-takeover)", impl->waitingFor);
  }
  Impl* p = impl.get();
  p->notifier = std::thread([p] { p->notifyLoop(); });
  p->acceptor = std::thread([p] { p->acceptLoop(); });
  if (listening.ok()) spdlog::info("zds: listening on {}", p->options.socketPath);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

std::string Server::waiting() const {
  std::lock_guard lock(impl_->mu);
  return impl_->waitingFor;
}

bool Server::socketReplaced() const {
  std::lock_guard lock(impl_->mu);
  if (!impl_->waitingFor.empty() || impl_->fileIno == 0) return false;
  struct stat st {};
  if (::stat(impl_->options.socketPath.c_str(), &st) != 0) return false;
  return st.st_dev != impl_->fileDev || st.st_ino != impl_->fileIno;
}

void Server::stop() {
  Impl& s = *impl_;
  std::lock_guard stopLock(s.stopMutex);
  if (!s.acceptor.joinable()) return;
  {
    std::lock_guard lock(s.mu);
    s.stopping = true;
    for (auto& c : s.all) c->cv.notify_all();
  }
  uint64_t one = 1;
  if (::write(s.stopFd.get(), &one, sizeof(one)) < 0) {
    spdlog::error("zds: cannot wake the server's threads: {}", std::strerror(errno));
  }
  s.acceptor.join();
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard lock(s.mu);
    conns.swap(s.all);
  }
  for (auto& c : conns) c->thread.join();
  {
    std::lock_guard lock(s.mu);
    s.notifierStop = true;
    s.notesCv.notify_all();
  }
  s.notifier.join();
  s.listenFd.reset();
  // Unlink only our own socket: a newer agent may have replaced the file.
  struct stat st {};
  if (::stat(s.options.socketPath.c_str(), &st) == 0 && st.st_dev == s.fileDev && st.st_ino == s.fileIno) {
    ::unlink(s.options.socketPath.c_str());
  }
  spdlog::info("zds: stopped listening on {}", s.options.socketPath);
}

Status Server::add(const WorkloadInfo& workload, int netnsFd) {
  Impl& s = *impl_;
  if (netnsFd < 0) return Error::msg("zds add " + workload.uid + ": no netns fd", EINVAL);
  std::vector<uint64_t> tried;
  std::string lastGone;
  for (;;) {
    std::shared_ptr<Conn> target;
    bool preparing = false;
    {
      std::lock_guard lock(s.mu);
      if (s.stopping) return Error::msg("no ztunnel connection (the zds server is stopping)", EAGAIN);
      for (auto it = s.live.rbegin(); it != s.live.rend(); ++it) {
        const auto& c = *it;
        if (std::find(tried.begin(), tried.end(), c->id) != tried.end()) continue;
        if (c->state == ConnState::Preparing) {
          preparing = true;
          continue;
        }
        if (c->state == ConnState::Snapshot || c->state == ConnState::Ready) {
          target = c;
          break;
        }
      }
    }
    if (!target) {
      s.count("add", "no_connection");
      std::string msg = "no ztunnel connection";
      if (preparing) msg = "no ztunnel connection ready (a ztunnel just connected; its snapshot is being prepared)";
      if (!lastGone.empty()) msg += "; the last one went away: " + lastGone;
      spdlog::warn("zds: add uid={} pod={} result=no_connection: {}", workload.uid, podName(workload), msg);
      return Error::msg(msg, EAGAIN);
    }
    auto job = std::make_shared<Job>();
    job->request.type = RequestType::Add;
    job->request.workload = workload;
    job->netns = Fd(::fcntl(netnsFd, F_DUPFD_CLOEXEC, 0));
    if (!job->netns.valid()) return Error::fromErrno(errno, "zds add " + workload.uid + ": dup netns fd");
    tried.push_back(target->id);
    if (!s.enqueue(target, job)) continue;
    s.waitFor(job);
    std::string pod = podName(workload) + " (uid " + workload.uid + ")";
    switch (job->outcome) {
      case Outcome::Acked:
        if (!job->text.empty()) {
          return Error::msg("ztunnel refused pod " + pod + " on connection " + std::to_string(target->id) + ": " +
                                job->text,
                            EPROTO);
        }
        break;
      case Outcome::Gone:
        lastGone = job->text;
        continue;
      case Outcome::Timeout:
        return Error::msg("ztunnel did not answer the add of pod " + pod + " on connection " +
                              std::to_string(target->id) + ": " + job->text + " (connection dropped)",
                          ETIMEDOUT);
      case Outcome::Protocol:
        return Error::msg("ztunnel connection " + std::to_string(target->id) + " failed the add of pod " + pod + ": " +
                              job->text + " (connection dropped)",
                          EPROTO);
      case Outcome::Invalid:
        return Error::msg("zds add of pod " + pod + ": " + job->text, EINVAL);
      case Outcome::Cancelled:
        return Error::msg("no ztunnel connection (the zds server is stopping)", EAGAIN);
    }
    // Acked on target. Connections newer than target were still preparing
    // their snapshot when it was picked, or came later: their snapshot may
    // have been read before this pod was registered, so they get the Add too
    // (an Add of the same uid and netns again is a no-op for ztunnel).
    std::vector<std::shared_ptr<Conn>> newer;
    {
      std::lock_guard lock(s.mu);
      auto it = std::find(s.live.begin(), s.live.end(), target);
      if (it != s.live.end()) newer.assign(it + 1, s.live.end());
      else {
        for (const auto& c : s.live)
          if (c->id > target->id) newer.push_back(c);
      }
    }
    s.queueUnwaited(newer, RequestType::Add, workload, netnsFd);
    return {};
  }
}

Status Server::del(const std::string& uid) {
  Impl& s = *impl_;
  WorkloadInfo w;
  w.uid = uid;
  std::vector<std::shared_ptr<Conn>> targets;
  {
    std::lock_guard lock(s.mu);
    if (s.stopping) return {};
    for (const auto& c : s.live) {
      if (c->state == ConnState::Snapshot || c->state == ConnState::Ready) targets.push_back(c);
    }
  }
  if (targets.empty()) s.count("del", "no_connection");
  std::string failures;
  int code = 0;
  for (const auto& c : targets) {
    auto job = std::make_shared<Job>();
    job->request.type = RequestType::Del;
    job->request.workload = w;
    if (!s.enqueue(c, job)) continue;
    s.waitFor(job);
    if (job->outcome == Outcome::Timeout || job->outcome == Outcome::Protocol || job->outcome == Outcome::Invalid) {
      if (!failures.empty()) failures += "; ";
      failures += "connection " + std::to_string(c->id) + ": " + job->text;
      if (code == 0) code = job->outcome == Outcome::Timeout ? ETIMEDOUT : job->outcome == Outcome::Invalid ? EINVAL : EPROTO;
    }
  }
  // Connections that were preparing their snapshot, or came meanwhile, may
  // have read this pod before it was removed: they get the Del after their
  // snapshot, unwaited (their snapshot callback may need the caller's locks).
  std::vector<std::shared_ptr<Conn>> others;
  {
    std::lock_guard lock(s.mu);
    for (const auto& c : s.live) {
      if (std::find(targets.begin(), targets.end(), c) == targets.end()) others.push_back(c);
    }
  }
  s.queueUnwaited(others, RequestType::Del, w, -1);
  if (code) return Error::msg("zds del " + uid + ": " + failures + " (dropped; it reconciles at its next snapshot)", code);
  return {};
}

std::vector<Peer> Server::peers() const {
  std::lock_guard lock(impl_->mu);
  std::vector<Peer> out;
  for (const auto& c : impl_->live) {
    out.push_back(Peer{c->id, c->cred.pid, c->cred.uid, c->cred.gid, c->snapshotDone});
  }
  return out;
}

const std::string& Server::socketPath() const { return impl_->options.socketPath; }

}  // namespace sluice::zds
