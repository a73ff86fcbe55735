// A real sluiced process for tests: unique socket, its log in a file, killed
// (SIGKILL) and reaped by the destructor if still running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "userspace/api/client.h"

namespace sluice::test {

class AgentProcess {
 public:
  /// Starts build/sluiced --bpffs ROOT --socket SOCKET --metrics-address off
  /// --reconcile-interval 0 EXTRA... and waits until it answers health.
  /// With an empty socket a unique one under /tmp is used. With a
  /// netnsPath the agent runs in that netns (its node netns), via nsenter.
  /// With a @p binary, that sluiced instead of this build's (the upgrade
  /// tests run an older release's). A @p wrapper (e.g. unshare ...) is run
  /// with the agent's argv appended.
  static Result<std::unique_ptr<AgentProcess>> start(const std::string& bpffsRoot, std::vector<std::string> extra = {},
                                                     std::string socket = "", const std::string& netnsPath = "",
                                                     const std::string& binary = "",
                                                     const std::vector<std::string>& wrapper = {});
  ~AgentProcess();
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  const std::string& socket() const { return socket_; }
  pid_t pid() const { return pid_; }
  /// A new connection to the agent.
  Result<agent::Client> client() const;
  /// Sends sig and waits for the exit; the exit code (128+N for signal N).
  int stop(int sig, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  /// What the agent logged so far.
  std::string log() const;
  /// Waits until its health says the Kubernetes informers synced (listed
  /// and reconciled once: kube_synced).
  bool waitKubeSynced(std::chrono::milliseconds timeout = std::chrono::seconds(15)) const;

 private:
  AgentProcess() = default;
  pid_t pid_ = -1;
  std::string socket_;
  std::string logPath_;
  bool ownsSocketName_ = false;
};

/// A loopback TCP port that was free a moment ago (bind 0, read, close) for
/// an agent's --metrics-address; 0 on failure.
uint16_t freeLoopbackPort();

/// Starts sluiced with these arguments and returns its exit code and log
/// (for start-up failures); the process is killed after the timeout.
struct AgentRun {
  int exitCode = -1;
  std::string log;
};
AgentRun runAgentExpectingExit(const std::vector<std::string>& args, std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                const std::vector<std::string>& wrapper = {});

/// Spawns argv (argv[0] a path) with stdin from /dev/null and stdout and
/// stderr appended to @p logPath; the child's pid.
Result<pid_t> spawnWithLog(const std::vector<std::string>& argv, const std::string& logPath);

/// Waits for @p pid up to @p timeout: its exit code (128+N for signal N), or
/// -1 on time-out.
int waitExit(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace sluice::test
