// The metrics listener (HTTP: /metrics, /healthz, /readyz) and the metrics page.
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
    } else if (target == "/readyz") {
      // Ready when sluice can enroll a pod: each missing piece on a line.
      std::vector<std::string> missing = readiness();
      if (missing.empty()) {
        body = "ready\n";
      } else {
        status = "503 Service Unavailable";
        body = "not ready:\n";
        for (const auto& m : missing) body += "- " + m + "\n";
      }
    } else {
      status = "404 Not Found";
      body = "see /metrics, /healthz, /readyz\n";
    }
  }
  writeAll(fd, "HTTP/1.1 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\nConnection: close\r\n\r\n" + body);
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
  if (zds_) zdsMetrics_.render(out, zds_->peers().size());
  if (kube_) renderKubeMetrics(out, kube_->counters());
  return out;
}

}  // namespace sluice::agent
