#include "loader/sysctl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "base/fd.h"

// Why the calling thread matters: /proc/sys/net is resolved against the
// network namespace of the thread doing the path lookup (the kernel's net
// sysctl table is chosen by current->nsproxy->net_ns), not that of the
// process or its main thread. Opening the file here, on the calling thread,
// therefore reads and writes the namespace that thread is in, e.g. the one
// runInNetns() joined. An open fd stays bound to the namespace it was opened
// in, so nothing here caches fds.

namespace sluice {
namespace {

constexpr const char* kWhitespace = " \t\r\n";

std::string trim(const std::string& s) {
  auto first = s.find_first_not_of(kWhitespace);
  if (first == std::string::npos) return "";
  auto last = s.find_last_not_of(kWhitespace);
  return s.substr(first, last - first + 1);
}

// Maps a sysctl name to its /proc/sys path, refusing anything that could
// escape /proc/sys.
Result<std::string> sysctlPath(const std::string& name) {
  if (name.empty() || name.front() == '/') {
    return Error::msg(
        "sysctl name \"" + name + "\": must be a relative path like net/ipv4/ip_forward", EINVAL);
  }
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") {
      return Error::msg("sysctl name \"" + name + "\": empty, '.' or '..' path component", EINVAL);
    }
    start = end + 1;
  }
  return "/proc/sys/" + name;
}

// The whole value of the open /proc/sys file @p fd, trimmed.
Result<std::string> readAll(int fd, const std::string& path) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return trim(out);
}

// Writes @p v at offset 0 of the open /proc/sys file @p fd in one call:
// proc handlers parse each write separately (a short or split write would
// be taken as a separate value), numeric ones only at offset 0, and reject
// bad input here with e.g. EINVAL.
Status writeAll(int fd, const std::string& path, const std::string& v) {
  ssize_t n;
  do {
    n = ::pwrite(fd, v.data(), v.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Error::fromErrno(errno, "write \"" + v + "\" to " + path);
  if (static_cast<size_t>(n) != v.size()) return Error::msg("write \"" + v + "\" to " + path + ": short write", EIO);
  return {};
}

}  // namespace

Result<std::string> readSysctl(const std::string& name) {
  auto path = sysctlPath(name);
  SLUICE_TRY(path);
  Fd fd(::open(path->c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::fromErrno(errno, *path);
  return readAll(fd.get(), *path);
}

Status writeSysctl(const std::string& name, const std::string& value) {
  auto path = sysctlPath(name);
  SLUICE_TRY(path);
  std::string v = trim(value);
  Fd fd(::open(path->c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::fromErrno(errno, *path);
  SLUICE_TRY(writeAll(fd.get(), *path, v));
  spdlog::debug("sysctl {} = {}", name, v);
  return {};
}

Result<std::optional<std::string>> ensureSysctl(const std::string& name, const std::string& value) {
  auto path = sysctlPath(name);
  SLUICE_TRY(path);
  std::string v = trim(value);
  Fd fd(::open(path->c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return Error::fromErrno(errno, *path);
  auto before = readAll(fd.get(), *path);
  SLUICE_TRY(before);
  if (*before == v) return std::optional<std::string>();
  SLUICE_TRY(writeAll(fd.get(), *path, v));
  spdlog::debug("sysctl {} = {} (was {})", name, v, *before);
  return std::optional<std::string>(*before);
}

}  // namespace sluice
