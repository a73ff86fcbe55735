// Reading and writing /proc/sys values in the calling thread's namespace.
#pragma once

#include <optional>
#include <string>

#include "base/result.h"

namespace sluice {

/// Reads /proc/sys/@p name, e.g. "net/ipv4/conf/eth0/accept_local", with
/// surrounding whitespace trimmed. @p name uses '/' separators (interface
/// names may contain dots) and must be relative without ".." components.
/// Everything under net/ is the calling thread's network namespace.
Result<std::string> readSysctl(const std::string& name);

/// Writes @p value (trimmed) to /proc/sys/@p name in the calling thread's
/// network namespace. Same naming rules as readSysctl.
Status writeSysctl(const std::string& name, const std::string& value);

/// Gives /proc/sys/@p name the value @p value (trimmed) unless it has it,
/// with one open for both the read and the write (the first open of a
/// /proc/sys/net path in a network namespace is the slow one, see
/// docs/benchmarks.md). Returns the value before when it was changed,
/// nullopt when it was already @p value. Same naming rules as readSysctl.
Result<std::optional<std::string>> ensureSysctl(const std::string& name, const std::string& value);

}  // namespace sluice
