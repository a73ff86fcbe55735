#include "userspace/agent/agent.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "loader/netns.h"
#include "loader/pod_guard.h"
#include "loader/privileges.h"
#include "userspace/agent/client.h"
#include "userspace/agent/kube_wiring.h"

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "dev"
#endif

namespace sluice::agent {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Waits until fd is readable or the deadline passes (ETIMEDOUT).
Status waitReadable(int fd, Clock::time_point deadline, const char* what) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Error::msg(std::string(what) + " not complete before the deadline", ETIMEDOUT);
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n > 0) return {};
    if (n < 0 && errno != EINTR) return Error::fromErrno(errno, "poll");
  }
}

// Reads one line (without its newline) of at most `max` bytes, whole before
// `deadline`: a client trickling bytes cannot hold its thread. EOF before
// any byte gives an empty optional.
Result<std::optional<std::string>> readLine(int fd, std::string& buf, size_t max, Clock::time_point deadline) {
  for (;;) {
    auto nl = buf.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return std::optional<std::string>(line);
    }
    if (buf.size() > max) return Error::msg("request larger than " + std::to_string(max) + " bytes", EMSGSIZE);
    SLUICE_TRY(waitReadable(fd, deadline, "request"));
    char chunk[8192];
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error::fromErrno(errno, "read request");
    }
    if (n == 0) {
      if (buf.empty()) return std::optional<std::string>();
      std::string line = std::move(buf);  // a last line without newline
      buf.clear();
      return std::optional<std::string>(line);
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
}

void writeAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

Result<HostPort> parseHostPort(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    return Error::msg("invalid address '" + s + "' (expected HOST:PORT, e.g. 127.0.0.1:9464)", EINVAL);
  HostPort hp;
  hp.host = s.substr(0, colon);
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']') hp.host = hp.host.substr(1, hp.host.size() - 2);
  std::string port = s.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) || std::stoul(port) > 65535)
    return Error::msg("invalid port in '" + s + "'", EINVAL);
  hp.port = static_cast<uint16_t>(std::stoul(port));
  in6_addr buf{};
  if (inet_pton(AF_INET, hp.host.c_str(), &buf) != 1 && inet_pton(AF_INET6, hp.host.c_str(), &buf) != 1)
    return Error::msg("invalid address '" + hp.host + "' in '" + s + "' (expected an IP address)", EINVAL);
  return hp;
}

Result<std::unique_ptr<Agent>> Agent::start(const AgentOptions& options) {
  std::unique_ptr<Agent> a(new Agent(options));
  if (!options.metricsAddress.empty()) SLUICE_TRY(parseHostPort(options.metricsAddress));
  // Another agent on the socket owns the state: never run two.
  if (auto other = Client::connect(options.socketPath, std::chrono::seconds(2)); other.ok())
    return Error::msg("another agent is already listening on " + options.socketPath, EADDRINUSE);
  if (options.kube.enabled()) {
    // Its token and CA are read before anything is loaded or pinned.
    auto k = KubeWiring::create(options.kube);
    SLUICE_TRY(k);
    a->kube_ = std::move(*k);
  }
  SLUICE_TRY(a->checkBpffs());
  // A long-running enroller: the pods' sk_lookup programs loaded ahead.
  DatapathOptions dopts = options.datapath;
  dopts.skLookupStubsAhead = kSkLookupStubsAhead;
  auto dp = Datapath::open(dopts);
  SLUICE_TRY(dp);
  a->dp_ = std::move(*dp);
  a->stopFd_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!a->stopFd_.valid()) return Error::fromErrno(errno, "eventfd");
  // Adopt what is enrolled before answering anyone.
  ReconcileReport r = a->reconcileNow();
  spdlog::info("sluiced {}: {} pod(s) enrolled; start-up sweep removed {}, found {} damaged, switched {} hook(s) to this build's programs",
               SLUICE_VERSION, r.pods, r.removed.size(), r.repaired.size(), r.programsReplaced);
  if (dopts.podGuard) {
    if (std::string why = podGuardUnsupported(); !why.empty())
      spdlog::warn("pod guard inactive: {}; apps of enrolled pods holding CAP_NET_RAW can send frames from packet "
                   "sockets past the proxy (remedy: drop CAP_NET_RAW, or enable the BPF LSM)",
                   why);
    else if (r.pods)
      a->dp_->ensurePodGuardFor();  // pods enrolled by a build without the guard
  }
  if (!options.ztunnelSocket.empty()) {
    // The node proxy connects when it likes; the agent only listens.
    zds::ServerOptions zo;
    zo.socketPath = options.ztunnelSocket;
    zo.helloTimeout = zo.writeTimeout = zo.ackTimeout = zo.idleCheckInterval = options.ztunnelTimeout;
    zo.snapshot = [p = a.get()] { return p->snapshot(); };
    // The proxy's cgroup is known before it gets a pod: its sockets' mark
    // counts from then on, an app's setting the same mark no longer does.
    zo.onConnected = [p = a.get()](const zds::Peer& peer) {
      auto id = p->dp_->addProxyProcess(peer.pid);
      if (id.ok())
        spdlog::info("node proxy pid {} runs in cgroup {}: the proxy mark counts only from its cgroups", peer.pid, *id);
      else
        spdlog::warn("node proxy pid {}: {}; its cgroup is not known, so its sockets' mark may not be honoured", peer.pid,
                     id.error().message);
    };
    // On the server's notifier thread, which nothing waits on: it may wait
    // for an add holding dpMu_.
    zo.onSnapshotAck = [p = a.get()](const std::string& uid, const std::string& error) {
      DpGuard g(*p);
      for (const auto& pod : p->dp_->listPods())
        if (pod.identity.uid == uid)
          (void)p->dp_->setHandoff(pod.id, error.empty() ? HandoffState::Acked : HandoffState::Failed, error);
    };
    // Node proxies gone since the last run leave the set.
    a->dp_->pruneProxyCgroups();
    auto server = zds::Server::start(std::move(zo));
    SLUICE_TRY(server);
    a->zds_ = std::move(*server);
    spdlog::info("ZDS: waiting for the node proxy (ztunnel) on {}", options.ztunnelSocket);
  } else if (Status st = a->dp_->clearProxyIdentity(); !st.ok()) {
    // Without a node proxy over ZDS no cgroup is learned: the mark alone.
    return Error::msg("reset the proxy identity to the mark alone: " + st.error().message, st.error().code);
  }
  // Before the API answers: an add must be decided from Kubernetes.
  if (a->kube_) SLUICE_TRY(a->kube_->start(a->kubeDataplane()));
  SLUICE_TRY(a->listenApi());
  SLUICE_TRY(a->listenMetrics());
  a->apiThread_ = std::thread([p = a.get()] { p->acceptLoop(p->apiFd_.get(), false); });
  if (a->metricsFd_.valid()) a->metricsThread_ = std::thread([p = a.get()] { p->acceptLoop(p->metricsFd_.get(), true); });
  if (options.reconcileInterval.count() > 0) a->reconcileThread_ = std::thread([p = a.get()] { p->reconcileLoop(); });
  if (!options.cniConfDir.empty()) {
    cni::WatchOptions w{options.cniConfDir, options.cniAgentSocket.empty() ? options.socketPath : options.cniAgentSocket};
    auto watcher = cni::ConfWatcher::start(w, [p = a.get()](const cni::WatchEvent& e) { p->metrics_.cniConf(e.restored); });
    SLUICE_TRY(watcher);
    a->cniWatcher_ = std::move(*watcher);
  }
  return a;
}

Status Agent::checkBpffs() {
  const std::string& root = options_.datapath.bpffsRoot;
  // Before the root is made: an unprivileged run must not leave one.
  SLUICE_TRY(checkPrivileges());
  SLUICE_TRY(ensureBpffsRoot(root));
  auto m = inspectBpffsMount(root);
  SLUICE_TRY(m);
  bpffsMount_ = *m;
  std::string where = "bpffs " + m->device + " at " + m->mountPoint + " (" + root + ")";
  if (m->outlivesNamespace) {
    spdlog::info("{} outlives this mount namespace: {}", where, m->why);
    return {};
  }
  std::string what = where + " is private to the agent's mount namespace (" + m->why +
                     "): its pinned maps and tcx links, and every pod's redirection with them, vanish with that "
                     "namespace when the agent exits";
  if (!options_.allowPrivateBpffs)
    return Error::msg(what + "; mount the host's /sys/fs/bpf here (hostPath, mountPropagation: Bidirectional) or "
                             "pass --allow-private-bpffs",
                      EPERM);
  spdlog::warn("--allow-private-bpffs: {}", what);
  return {};
}

Agent::~Agent() { stop(); }

void Agent::stop() {
  if (stopping_.exchange(true)) return;
  if (kube_) kube_->stop();  // no controller call into the datapath after this
  cniWatcher_.reset();
  if (stopFd_.valid()) {
    uint64_t one = 1;
    (void)!::write(stopFd_.get(), &one, sizeof(one));
  }
  {
    std::lock_guard<std::mutex> g(sweepMu_);
  }
  sweepCv_.notify_all();
  if (apiThread_.joinable()) apiThread_.join();
  if (metricsThread_.joinable()) metricsThread_.join();
  if (reconcileThread_.joinable()) reconcileThread_.join();
  reapConnections(true);
  // The node proxy keeps its pods' proxies across a dropped connection and
  // gets a snapshot from the next agent.
  if (zds_) zds_->stop();
  if (apiFd_.valid()) {
    apiFd_ = Fd();
    ::unlink(options_.socketPath.c_str());
  }
  metricsFd_ = Fd();
  spdlog::info("sluiced stopped; the data plane stays in place");
}

Status Agent::listenApi() {
  const std::string& path = options_.socketPath;
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Error::msg("socket path '" + path + "' is empty or longer than " + std::to_string(sizeof(addr.sun_path) - 1) + " bytes", EINVAL);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return Error::msg("create " + std::filesystem::path(path).parent_path().string() + ": " + ec.message(), ec.value());
  // Nobody answered on it (checked at start): a stale socket of a killed agent.
  if (::unlink(path.c_str()) == 0) spdlog::info("removed stale socket {}", path);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Root only: the socket is created 0600 (umask), then chmod-ed to be sure.
  mode_t old = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return Error::fromErrno(err, "bind " + path);
  if (::chmod(path.c_str(), 0600) != 0) return Error::fromErrno(errno, "chmod " + path);
  if (::listen(fd.get(), 64) != 0) return Error::fromErrno(errno, "listen on " + path);
  apiFd_ = std::move(fd);
  spdlog::info("API on unix socket {}", path);
  return {};
}

Status Agent::listenMetrics() {
  if (options_.metricsAddress.empty()) return {};
  auto hp = parseHostPort(options_.metricsAddress);
  SLUICE_TRY(hp);
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  if (hp->host.find(':') != std::string::npos) {
    family = AF_INET6;
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(hp->port);
    inet_pton(AF_INET6, hp->host.c_str(), &a6->sin6_addr);
    len = sizeof(*a6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(hp->port);
    inet_pton(AF_INET, hp->host.c_str(), &a4->sin_addr);
    len = sizeof(*a4);
  }
  Fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
    return Error::fromErrno(errno, "bind metrics address " + options_.metricsAddress);
  if (::listen(fd.get(), 16) != 0) return Error::fromErrno(errno, "listen on " + options_.metricsAddress);
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &blen);
  metricsPort_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                         : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  metricsFd_ = std::move(fd);
  spdlog::info("metrics on http://{}:{}/metrics", family == AF_INET6 ? "[" + hp->host + "]" : hp->host, metricsPort_);
  return {};
}

void Agent::reapConnections(bool all) {
  std::lock_guard<std::mutex> g(connMu_);
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (all && !it->done) ::shutdown(it->fd, SHUT_RDWR);
    if (all || it->done) {
      if (it->thread.joinable()) it->thread.join();
      ::close(it->fd);
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

void Agent::acceptLoop(int listenFd, bool metrics) {
  while (!stopping_) {
    pollfd fds[2] = {{listenFd, POLLIN, 0}, {stopFd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) spdlog::warn("accept: {}", std::strerror(errno));
      continue;
    }
    // A client that reads nothing must not hold its thread for ever
    // (requests have their deadline in readLine).
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    reapConnections(false);
    std::lock_guard<std::mutex> g(connMu_);
    size_t live = 0;
    for (const auto& k : conns_) live += k.metrics == metrics && !k.done;
    if (live >= options_.maxConnections) {
      // Answered at once and closed: a flood of clients costs no thread.
      std::string why = "too many connections (" + std::to_string(options_.maxConnections) + " served at once); try again";
      metrics_.connectionRefused(metrics);
      if (metrics)
        writeAll(fd, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: " +
                         std::to_string(why.size() + 1) + "\r\nConnection: close\r\n\r\n" + why + "\n");
      else
        writeAll(fd, errorResponse(Error::msg(why, EBUSY)));
      ::close(fd);
      continue;
    }
    Conn& c = conns_.emplace_back();
    c.fd = fd;
    c.metrics = metrics;
    c.thread = std::thread([this, &c, metrics] {
      if (metrics)
        serveMetrics(c.fd);
      else
        serveApi(c.fd);
      ::shutdown(c.fd, SHUT_RDWR);  // the client sees the end now
      c.done = true;                // the reaper closes the fd after joining
    });
  }
}

void Agent::serveApi(int fd) {
  std::string buf;
  while (!stopping_) {
    auto line = readLine(fd, buf, kMaxRequestBytes, Clock::now() + options_.requestDeadline);
    if (!line.ok()) {
      // An idle connection past the deadline just closes; a partial or
      // oversized request is told why.
      if (line.error().code == EMSGSIZE || (line.error().code == ETIMEDOUT && !buf.empty())) {
        metrics_.request("invalid", false);
        writeAll(fd, errorResponse(line.error().code == ETIMEDOUT
                                       ? Error::msg("request not complete within " +
                                                        std::to_string(options_.requestDeadline.count()) + " ms",
                                                    ETIMEDOUT)
                                       : line.error()));
        // The client may still be sending the rest of an oversized line:
        // closing now would fail its send (EPIPE) before it reads the
        // answer. Drain it, bounded by the deadline and 1 MiB.
        if (line.error().code == EMSGSIZE) {
          ::shutdown(fd, SHUT_WR);
          auto until = Clock::now() + options_.requestDeadline;
          char sink[8192];
          for (size_t drained = 0; drained < (1u << 20) && waitReadable(fd, until, "drain").ok();) {
            ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
            if (n <= 0) break;
            drained += static_cast<size_t>(n);
          }
        }
      }
      return;
    }
    if (!*line) return;  // client closed
    writeAll(fd, handle(**line));
  }
}

void Agent::serveMetrics(int fd) {
  // HTTP/1.0-style: read the request head, answer, close.
  std::string req;
  char chunk[2048];
  auto deadline = Clock::now() + options_.requestDeadline;
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos && req.size() < 16384) {
    if (!waitReadable(fd, deadline, "request").ok()) {
      if (!req.empty())
        writeAll(fd, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      return;
    }
    ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    req.append(chunk, static_cast<size_t>(n));
  }
  std::string first = req.substr(0, req.find('\n'));
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (first.rfind("GET ", 0) != 0) {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else {
    std::string target = first.substr(4, first.find(' ', 4) - 4);
    if (target == "/metrics") {
      body = renderMetrics();
    } else if (target == "/healthz") {
      // Without waiting on the agent: a wedged agent is what it reports.
      std::string why = wedged();
      if (why.empty()) {
        body = "ok\n";
      } else {
        status = "503 Service Unavailable";
        body = "wedged: " + why + "\n";
      }
    } else {
      status = "404 Not Found";
      body = "see /metrics\n";
    }
  }
  writeAll(fd, "HTTP/1.1 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\nConnection: close\r\n\r\n" + body);
}

void Agent::reconcileLoop() {
  std::unique_lock<std::mutex> lk(sweepMu_);
  while (!stopping_) {
    sweepCv_.wait_for(lk, options_.reconcileInterval, [this] { return stopping_.load(); });
    if (stopping_) return;
    lk.unlock();
    ReconcileReport r = reconcileNow();
    if (!r.removed.empty() || !r.repaired.empty() || r.programsReplaced)
      spdlog::info("sweep: removed {} pod(s) whose netns was gone, repaired {}, switched {} hook(s)", r.removed.size(),
                   r.repaired.size(), r.programsReplaced);
    if (kube_) kube_->resync();  // the registry as the sweep left it
    lk.lock();
  }
}

Agent::DpGuard::DpGuard(Agent& a) : a_(a), lk_(a.dpMu_) { a_.dpHeldSinceNs_.store(nowNs()); }
Agent::DpGuard::~DpGuard() { a_.dpHeldSinceNs_.store(0); }

std::string Agent::wedged() const {
  int64_t now = nowNs();
  auto secs = [](int64_t ns) { return std::to_string(ns / 1000000000) + " s"; };
  const int64_t bound = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.wedgedAfter).count();
  if (int64_t since = dpHeldSinceNs_.load(); since != 0 && now - since > bound)
    return "the datapath lock has been held for " + secs(now - since);
  if (options_.reconcileInterval.count() > 0) {
    int64_t last = lastReconcileNs_.load();
    const int64_t interval = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.reconcileInterval).count();
    if (last != 0 && now - last > interval + bound)
      return "no reconcile sweep for " + secs(now - last) + " (one every " + secs(interval) + " expected)";
  }
  return "";
}

ReconcileReport Agent::reconcileNow() {
  DpGuard g(*this);
  std::map<std::string, std::string> uids;  // of the pods the sweep may remove
  if (zds_)
    for (const auto& p : dp_->listPods()) uids[p.id] = p.identity.uid;
  ReconcileReport r = dp_->reconcile();
  if (zds_) {
    for (const auto& id : r.removed)
      if (!uids[id].empty()) (void)zds_->del(uids[id]);
    dp_->pruneProxyCgroups();
  }
  for (const auto& e : r.errors) spdlog::warn("sweep: {}", e);
  lastReconcileError_ = r.errors.empty() ? "" : r.errors.front();
  metrics_.reconciled(r.removed.size(), r.repaired.size(), r.programsReplaced, r.errors.size());
  reconciles_++;
  lastReconcileNs_.store(nowNs());
  return r;
}

Health Agent::health() {
  Health h;
  h.version = SLUICE_VERSION;
  h.bpffsRoot = options_.datapath.bpffsRoot;
  h.capture = captureModeName(options_.datapath.capture);
  h.tcMode = tcModeName(options_.datapath.tcMode);
  h.pods = dp_->listPods().size();
  h.uptimeSeconds = static_cast<uint64_t>(secondsSince(started_));
  h.reconciles = reconciles_;
  h.lastReconcileError = lastReconcileError_;
  if (zds_) {
    h.ztunnelSocket = options_.ztunnelSocket;
    h.ztunnelConnections = zds_->peers().size();
  }
  if (kube_) {
    h.kubeApi = kube_->apiDescription();
    h.kubeSynced = kube_->ready();
  }
  h.bpffsScope = bpffsMount_.outlivesNamespace ? "host" : "private";
  h.bpffsScopeWhy = bpffsMount_.why;
  return h;
}

Result<PodInfo> Agent::addLocked(PodSpec spec, bool handOffFatal) {
  // The pod's host-side interface is looked up in the agent's own netns.
  if (!spec.nodeNetnsPath) spec.nodeNetnsPath = "";
  auto t = Clock::now();
  Result<PodInfo> info = Error::msg("not enrolled", EINVAL);
  if (zds_) {
    if (spec.identity.uid.empty())
      return Error::msg("pod has no uid: this agent hands every pod to the node proxy (--ztunnel-socket), which "
                        "needs the pod's Kubernetes uid (sluice-cni takes it from CNI_ARGS K8S_POD_UID; "
                        "sluicectl: --uid)",
                        EINVAL);
    Handoff hook{[this, handOffFatal](const PodInfo& p) { return handOff(p, handOffFatal); },
                    [this](const PodInfo& p) { (void)zds_->del(p.identity.uid); }, handOffFatal};
    info = dp_->addPod(spec, &hook);
  } else {
    info = dp_->addPod(spec);
  }
  SLUICE_TRY(info);
  metrics_.addLatency(secondsSince(t));
  return info;
}

Result<std::string> Agent::removeLocked(const std::string& id) {
  auto t = Clock::now();
  std::string uid;
  for (const auto& p : dp_->listPods())
    if (p.id == id) uid = p.identity.uid;
  // Istio's order: probe SNAT and redirection out, then DelWorkload to
  // every node proxy connection (none connected: nobody to tell).
  SLUICE_TRY(dp_->removePod(id));
  if (zds_ && !uid.empty()) (void)zds_->del(uid);
  metrics_.removeLatency(secondsSince(t));
  return uid;
}

AgentDataplane Agent::kubeDataplane() {
  AgentDataplane d;
  d.add = [this](const PodSpec& spec, bool handOffFatal) {
    DpGuard g(*this);
    return addLocked(spec, handOffFatal);
  };
  d.remove = [this](const std::string& id) -> Status {
    DpGuard g(*this);
    SLUICE_TRY(removeLocked(id));
    return {};
  };
  d.list = [this] {
    DpGuard g(*this);
    return dp_->listPods();
  };
  d.update = [this](const std::string& id, const CaptureSettings& s) {
    DpGuard g(*this);
    return dp_->updatePodSettings(id, s);
  };
  return d;
}

Result<json> Agent::dispatch(const Request& req) {
  if (req.op == Op::Add && kube_) {
    // Asks the Kubernetes API first (up to seconds): not under dpMu_.
    auto r = kube_->add(req.pod);
    SLUICE_TRY(r);
    return encodeAddResult(*r);
  }
  DpGuard g(*this);
  switch (req.op) {
    case Op::Add: {
      auto info = addLocked(req.pod, true);
      SLUICE_TRY(info);
      return encodePodInfo(*info);
    }
    case Op::Remove: {
      std::string id;
      if (req.id) {
        id = *req.id;
      } else {
        auto found = dp_->podIdForNetns(*req.netns);
        SLUICE_TRY(found);
        id = *found;
      }
      auto uid = removeLocked(id);
      SLUICE_TRY(uid);
      if (kube_) kube_->removed(*uid);
      return json{{"id", id}};
    }
    case Op::List: {
      json arr = json::array();
      for (const auto& p : dp_->listPods()) arr.push_back(encodePodInfo(p));
      return arr;
    }
    case Op::Stats: {
      auto stats = dp_->stats(req.id);
      SLUICE_TRY(stats);
      json arr = json::array();
      for (const auto& c : *stats) arr.push_back(encodeCounters(c));
      return arr;
    }
    case Op::Health:
      return encodeHealth(health());
    case Op::Check: {
      auto c = dp_->checkPod(*req.id);
      SLUICE_TRY(c);
      CheckReport r;
      r.id = c->id;
      r.problems = c->problems;
      if (c->gone) r.problems.insert(r.problems.begin(), "its netns is gone");
      r.intact = r.problems.empty();
      return encodeCheck(r);
    }
  }
  return Error::msg("unhandled op", EINVAL);
}

Status Agent::handOff(const PodInfo& pod, bool takeBackOnRefusal) {
  auto fail = [&](const std::string& why) {
    spdlog::warn("hand-off of pod {} (uid {}, {}/{}) to the node proxy failed: {}", pod.id, pod.identity.uid,
                 pod.identity.ns, pod.identity.name, why);
    return Error::msg("hand-off to the node proxy failed: " + why + " (retryable)", EAGAIN);
  };
  auto ns = openNetnsWithCookie(pod.netnsPath, pod.netnsCookie);
  if (!ns.ok()) return fail(ns.error().message);
  Status st = zds_->add({pod.identity.uid, pod.identity.name, pod.identity.ns, pod.identity.serviceAccount}, ns->get());
  if (!st.ok()) {
    // It refused the pod (e.g. "failure to start proxy") and would retry it
    // on its own; the enrollment is rolled back, so take the pod back.
    // (A running pod keeps its enrollment: the node proxy keeps retrying.)
    if (st.error().code == EPROTO && takeBackOnRefusal) (void)zds_->del(pod.identity.uid);
    return fail(st.error().message);
  }
  return {};
}

std::vector<zds::SnapshotEntry> Agent::snapshot() {
  // Without dpMu_ (the registry is read entry by entry from its map): a pod
  // is in the registry before its AddWorkload is sent, and leaves it before
  // its DelWorkload, so a snapshot misses no pod the node proxy must keep.
  std::vector<zds::SnapshotEntry> out;
  for (const auto& p : dp_->listPods()) {
    if (p.identity.uid.empty()) {
      spdlog::warn("ZDS snapshot: pod {} has no uid (enrolled without an identity); the node proxy is not told of it", p.id);
      continue;
    }
    zds::SnapshotEntry e;
    e.workload = {p.identity.uid, p.identity.name, p.identity.ns, p.identity.serviceAccount};
    auto ns = openNetnsWithCookie(p.netnsPath, p.netnsCookie);
    if (ns.ok())
      e.netns = std::move(*ns);
    else
      spdlog::info("ZDS snapshot: pod {} netns: {}; sent without it (KeepWorkload)", p.id, ns.error().message);
    out.push_back(std::move(e));
  }
  return out;
}

std::string Agent::handle(const std::string& line) {
  auto req = decodeRequest(line);
  if (!req.ok()) {
    metrics_.request("invalid", false);
    spdlog::warn("refused request: {}", req.error().message);
    return errorResponse(req.error());
  }
  auto res = dispatch(*req);
  metrics_.request(opName(req->op), res.ok());
  if (!res.ok()) {
    spdlog::info("{} failed: {}", opName(req->op), res.error().message);
    return errorResponse(res.error());
  }
  return okResponse(*res);
}

std::string Agent::renderMetrics() {
  std::string out = metrics_.render();
  std::vector<PodCounters> counters;  // one per enrolled pod
  {
    DpGuard g(*this);
    auto stats = dp_->stats(std::nullopt);
    if (stats.ok()) counters = *stats;
  }
  size_t pods = counters.size();
  metricHeader(out, "sluice_pods_enrolled", "gauge", "Pods enrolled in redirection on this node.");
  out += "sluice_pods_enrolled " + std::to_string(pods) + "\n";
  metricHeader(out, "sluice_pod_redirected_connections_total", "counter",
               "Connections redirected to the node proxy, by pod and direction.");
  for (const auto& c : counters) {
    std::string pod = "pod=\"" + labelValue(c.id) + "\"";
    out += "sluice_pod_redirected_connections_total{" + pod + ",direction=\"outbound\"} " + std::to_string(c.stats.outbound_conns) + "\n";
    out += "sluice_pod_redirected_connections_total{" + pod + ",direction=\"inbound\"} " + std::to_string(c.stats.inbound_conns) + "\n";
    out += "sluice_pod_redirected_connections_total{" + pod + ",direction=\"dns_tcp\"} " + std::to_string(c.stats.dns_tcp_conns) + "\n";
  }
  metricHeader(out, "sluice_pod_dns_queries_total", "counter", "UDP DNS queries redirected to the proxy, by pod.");
  for (const auto& c : counters)
    out += "sluice_pod_dns_queries_total{pod=\"" + labelValue(c.id) + "\"} " + std::to_string(c.stats.dns_udp_queries) + "\n";
  metricHeader(out, "sluice_pod_probe_connections_total", "counter", "Kubelet probe connections SNATed on the node, by pod.");
  for (const auto& c : counters)
    out += "sluice_pod_probe_connections_total{pod=\"" + labelValue(c.id) + "\"} " + std::to_string(c.stats.probe_conns) + "\n";
  metricHeader(out, "sluice_pod_dropped_packets_total", "counter", "Packets dropped by the pod programs (fail closed), by pod.");
  for (const auto& c : counters)
    out += "sluice_pod_dropped_packets_total{pod=\"" + labelValue(c.id) + "\"} " + std::to_string(c.stats.dropped_pkts) + "\n";
  if (zds_) zds_->renderMetrics(out);
  if (kube_) kube_->renderMetrics(out);
  return out;
}

}  // namespace sluice::agent
