// Socket I/O and clock helpers shared by the agent's listeners (API,
// metrics) and its sweep.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "base/result.h"

namespace sluice::agent {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t);

/// steady_clock now, in ns since its epoch.
int64_t nowNs();

/// Waits until fd is readable or the deadline passes (ETIMEDOUT).
Status waitReadable(int fd, Clock::time_point deadline, const char* what);

/// Reads one line (without its newline) of at most `max` bytes, whole before
/// `deadline`: a client trickling bytes cannot hold its thread. EOF before
/// any byte gives an empty optional.
Result<std::optional<std::string>> readLine(int fd, std::string& buf, size_t max, Clock::time_point deadline);

/// Sends all of @p s (MSG_NOSIGNAL); gives up silently on an error.
void writeAll(int fd, const std::string& s);

}  // namespace sluice::agent
