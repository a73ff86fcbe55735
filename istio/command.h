// Runs a program of the node (iptables-save, nft, ipset, ...) in the
// calling thread's namespaces and collects what it prints.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "base/result.h"

namespace sluice::istio {

struct CommandOutput {
  int exitCode = -1;
  std::string out;
  std::string err;
};

/// Runs @p argv (argv[0] looked up in PATH, then /usr/sbin and /sbin) with
/// @p input on its stdin (at most 64 KiB; empty: /dev/null); killed after
/// @p timeout (ETIMEDOUT). ENOENT when the program
/// is not installed. The child starts in the calling thread's network
/// namespace (a thread inside runInNetns runs it in that netns).
Result<CommandOutput> runCommand(const std::vector<std::string>& argv,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10),
                                 const std::string& input = "");

}  // namespace sluice::istio
