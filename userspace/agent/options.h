// sluiced's command line (pure, unit-tested).
#pragma once

#include <string>
#include <vector>

#include "userspace/agent/agent.h"

namespace sluice::agent {

struct DaemonArgs {
  bool help = false;
  bool version = false;
  AgentOptions agent;
  std::string logFormat = "text";
  std::string logLevel = "info";
};

/// Parses argv without argv[0]; errors are one-line usage errors.
Result<DaemonArgs> parseDaemonArgs(const std::vector<std::string>& args);
std::string daemonUsage();

}  // namespace sluice::agent
