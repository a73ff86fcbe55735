// sluiced's command line (pure, unit-tested).
#pragma once

#include <string>
#include <vector>

#include "userspace/agent/agent.h"
#include "userspace/agent/kube/options.h"

namespace sluice::agent {

struct DaemonArgs {
  bool help = false;
  bool version = false;
  AgentOptions agent;
  std::string logFormat = "text";
  std::string logLevel = "info";
};

/// Parses argv without argv[0]; errors are one-line usage errors. @p env
/// gives NODE_NAME and KUBERNETES_SERVICE_HOST (kube/options.h).
Result<DaemonArgs> parseDaemonArgs(const std::vector<std::string>& args, const EnvLookup& env = processEnv);
std::string daemonUsage();

}  // namespace sluice::agent
