// A client of sluiced's unix socket API (docs/agent-api.md): what sluicectl
// and sluice-cni use to talk to the agent.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "base/fd.h"
#include "userspace/api/protocol.h"

namespace sluice::agent {

class Client {
 public:
  /// Connects to the agent's socket. ENOENT / ECONNREFUSED mean no agent
  /// is listening there (callers may fall back to working directly).
  static Result<Client> connect(const std::string& socketPath,
                                std::chrono::milliseconds timeout = std::chrono::seconds(30));

  /// Sends one request and reads its response line; the agent's error
  /// comes back as an Error with its errno and message.
  Result<nlohmann::json> call(const Request& req);
  /// Sends a raw line (tests of malformed input) and returns the raw
  /// response line.
  Result<std::string> roundTrip(const std::string& line);

  /// add: the pod enrolled, or (an agent deciding from Kubernetes) left
  /// alone with the reason.
  Result<AddResult> add(const PodSpec& spec);
  /// add() of a pod that must be enrolled: "not in the mesh" is an error
  /// (ECANCELED) naming the agent's reason.
  Result<PodInfo> addPod(const PodSpec& spec);
  Status removePod(const std::string& id);
  Result<std::string> removePodByNetns(const std::string& netnsPath);  ///< returns the id removed
  Result<std::vector<PodInfo>> listPods();
  Result<std::vector<PodCounters>> stats(const std::optional<std::string>& id);
  Result<Health> health();
  Result<CheckReport> check(const std::string& id);
  /// Puts one line (sluice-cni's outcome of a command) into the agent's log.
  Status log(const std::string& message);

 private:
  explicit Client(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  Fd fd_;
  std::string path_;
  std::string buffered_;
};

/// True for the errors of connect() that mean "no agent there".
bool noAgent(const Error& e);

}  // namespace sluice::agent
