#include "userspace/agent/io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>

namespace sluice::agent {

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

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

}  // namespace sluice::agent
