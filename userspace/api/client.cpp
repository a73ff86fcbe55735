#include "userspace/api/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace sluice::agent {

using nlohmann::json;

bool noAgent(const Error& e) { return e.code == ENOENT || e.code == ECONNREFUSED || e.code == ENOTDIR; }

Result<Client> Client::connect(const std::string& socketPath, std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  if (socketPath.empty() || socketPath.size() >= sizeof(addr.sun_path))
    return Error::msg("agent socket path '" + socketPath + "' is empty or too long", EINVAL);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error::fromErrno(errno, "socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socketPath.data(), socketPath.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return Error::fromErrno(errno, "connect to the agent at " + socketPath);
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return Client(std::move(fd), socketPath);
}

Result<std::string> Client::roundTrip(const std::string& line) {
  std::string out = line;
  if (out.empty() || out.back() != '\n') out += '\n';
  size_t sent = 0;
  while (sent < out.size()) {
    ssize_t n = ::send(fd_.get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, "send to the agent at " + path_);
    }
    sent += static_cast<size_t>(n);
  }
  for (;;) {
    auto nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string resp = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return resp;
    }
    char buf[8192];
    ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return Error::msg("the agent at " + path_ + " did not answer in time", ETIMEDOUT);
      return Error::fromErrno(errno, "read from the agent at " + path_);
    }
    if (n == 0) return Error::msg("the agent at " + path_ + " closed the connection without an answer", ECONNRESET);
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

Result<json> Client::call(const Request& req) {
  auto line = roundTrip(encodeRequest(req).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  SLUICE_TRY(line);
  return decodeResponse(*line);
}

Result<AddResult> Client::add(const PodSpec& spec) {
  Request r;
  r.op = Op::Add;
  r.pod = spec;
  auto res = call(r);
  SLUICE_TRY(res);
  return decodeAddResult(*res);
}

Result<PodInfo> Client::addPod(const PodSpec& spec) {
  auto r = add(spec);
  SLUICE_TRY(r);
  if (!r->enrolled)
    return Error::msg("pod " + r->pod.id + " was not enrolled: " + r->reason +
                          " (the agent decides from Kubernetes which pods are in the mesh)",
                      ECANCELED);
  return r->pod;
}

Status Client::removePod(const std::string& id) {
  Request r;
  r.op = Op::Remove;
  r.id = id;
  auto res = call(r);
  SLUICE_TRY(res);
  return {};
}

Status Client::log(const std::string& message) {
  Request r;
  r.op = Op::Log;
  r.message = message;
  SLUICE_TRY(call(r));
  return {};
}

Result<std::string> Client::removePodByNetns(const std::string& netnsPath) {
  Request r;
  r.op = Op::Remove;
  r.netns = netnsPath;
  auto res = call(r);
  SLUICE_TRY(res);
  if (!res->is_object() || !(*res)["id"].is_string()) return Error::msg("malformed response from the agent", EPROTO);
  return (*res)["id"].get<std::string>();
}

namespace {

// A result that is an array, each element decoded by `decode`.
template <typename T>
Result<std::vector<T>> decodeArray(const Result<json>& res, Result<T> (*decode)(const json&)) {
  SLUICE_TRY(res);
  if (!res.value().is_array()) return Error::msg("malformed response from the agent", EPROTO);
  std::vector<T> out;
  for (const auto& e : res.value()) {
    auto item = decode(e);
    SLUICE_TRY(item);
    out.push_back(*item);
  }
  return out;
}

}  // namespace

Result<std::vector<PodInfo>> Client::listPods() {
  Request r;
  r.op = Op::List;
  return decodeArray(call(r), decodePodInfo);
}

Result<std::vector<PodCounters>> Client::stats(const std::optional<std::string>& id) {
  Request r;
  r.op = Op::Stats;
  r.id = id;
  return decodeArray(call(r), decodeCounters);
}

Result<Health> Client::health() {
  Request r;
  r.op = Op::Health;
  auto res = call(r);
  SLUICE_TRY(res);
  return decodeHealth(*res);
}

Result<CheckReport> Client::check(const std::string& id) {
  Request r;
  r.op = Op::Check;
  r.id = id;
  auto res = call(r);
  SLUICE_TRY(res);
  return decodeCheck(*res);
}

}  // namespace sluice::agent
