// The agent's API on its unix socket: the listener, one thread per
// connection (shared with the metrics listener), requests dispatched.
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
#include "userspace/api/client.h"
#include "userspace/agent/kube/wiring.h"

#include "userspace/agent/io.h"

namespace sluice::agent {

using nlohmann::json;

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

Result<json> Agent::dispatch(const Request& req) {
  if (req.op == Op::Add && options_.istioSwitch == IstioSwitchMode::HandBack) {
    // sluice-cni passes the pod on: Istio's node agent enrolls it.
    AddResult r;
    r.enrolled = false;
    r.reason = "this node is being handed back to Istio's node agent (sluiced --istio-hand-back)";
    r.pod.id = req.pod.id.empty() ? defaultPodId(req.pod.netnsPath) : req.pod.id;
    return encodeAddResult(r);
  }
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
    case Op::Log:
      // sluice-cni's line for one command (the runtime keeps its stderr in
      // kubelet's journal only): here `kubectl logs` shows it.
      spdlog::info("sluice-cni: {}", *req.message);
      return json::object();
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

}  // namespace sluice::agent
