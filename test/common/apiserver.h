// The test Kubernetes API server (test/apiserver/apiserver.py) as an RAII
// fixture: a child process with its own directory (CA, certificate, token)
// and ports, killed and reaped by the destructor even when a test failed.
// Tests change the cluster and inject faults through its admin port.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/result.h"
#include "test/common/tempdir.h"
#include "userspace/agent/kube/client.h"
#include "test/common/topology.h"

namespace sluice::test {

/// What a test pod looks like; podObject() turns it into the API's JSON.
struct TestPod {
  std::string namespaceName = "default";
  std::string name;
  std::string uid;  ///< "" lets the server pick one
  std::string node = "node-a";
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> ips;  ///< status.podIPs (and podIP = the first)
  std::string phase = "Running";
  bool hostNetwork = false;
  std::string serviceAccount = "default";
};

/// The Pod object of @p p.
nlohmann::json podObject(const TestPod& p);
/// A Namespace object.
nlohmann::json namespaceObject(const std::string& name, const std::map<std::string, std::string>& labels = {});

class TestApiServer {
 public:
  /// Starts the server (python3) and waits until it is ready (≤ 20 s).
  /// @p window: watch events kept before compaction (0 = all).
  static Result<std::unique_ptr<TestApiServer>> start(int window = 0);
  ~TestApiServer();
  TestApiServer(const TestApiServer&) = delete;
  TestApiServer& operator=(const TestApiServer&) = delete;

  /// https://127.0.0.1:PORT
  std::string url() const;
  uint16_t port() const { return apiPort_; }
  std::string caFile() const { return dir_.file("ca.crt"); }
  /// A CA that signed nothing the server presents.
  std::string otherCaFile() const { return dir_.file("other-ca.crt"); }
  /// The token file a client reads (accepted by the server).
  std::string tokenFile() const { return dir_.file("token"); }
  /// url(), tokenFile(), caFile(), with short time-outs for tests.
  kube::ClientConfig clientConfig() const;

  /// Writes @p token to tokenFile() and makes it the only accepted one.
  Status rotateToken(const std::string& token);

  // ---- the cluster (atomic batches through the admin port) ----
  /// Runs admin ops ({"op": "create"|"update"|"patch"|"delete", ...}) at once.
  Result<nlohmann::json> apply(const nlohmann::json& ops);
  Result<nlohmann::json> createNamespace(const std::string& name, const std::map<std::string, std::string>& labels = {});
  /// Replaces the namespace's labels (a merge patch that nulls the old ones).
  Status setNamespaceLabels(const std::string& name, const std::map<std::string, std::string>& labels);
  Status deleteNamespace(const std::string& name);
  /// The created pod (with its uid and resourceVersion).
  Result<nlohmann::json> createPod(const TestPod& p);
  Status patchPod(const std::string& ns, const std::string& name, const nlohmann::json& mergePatch);
  Status deletePod(const std::string& ns, const std::string& name);
  /// The node agent's own pod (sluice-system/sluice-node-x, hostNetwork,
  /// on node-a): on a real node it always runs, so the controller never sees
  /// an empty node (which it does not trust to remove pods).
  Status createNodeAgentPod();
  /// The object as the server holds it now; nullopt when absent.
  Result<std::optional<nlohmann::json>> object(const std::string& kind, const std::string& ns, const std::string& name);
  /// Annotation @p key of pod NS/NAME now; nullopt when the pod or the
  /// annotation is absent (or the server cannot be asked).
  std::optional<std::string> podAnnotation(const std::string& ns, const std::string& name, const std::string& key);

  // ---- faults and observations ----
  /// POST /admin/fault with @p body (see apiserver.py: fail, drop, stall,
  /// slow, down, up, compact, window, gone_mode, bookmark, bookmark_interval).
  Status fault(const nlohmann::json& body);
  /// Every merge patch received on pods (oldest first).
  Result<nlohmann::json> patches();
  /// Every API request (method, path, kind list|watch|get|patch, status, token).
  Result<nlohmann::json> requests();
  /// Requests of one kind (list, watch, get, patch) whose path contains @p pathPart.
  Result<int> countRequests(const std::string& kind, const std::string& pathPart = "");
  /// {"rv", "compacted", "watchers", "up", "events"}.
  Result<nlohmann::json> state();
  /// The server's log.
  std::string log() const;

 private:
  TestApiServer() : dir_("apiserver") {}
  Result<nlohmann::json> admin(const std::string& method, const std::string& path, const nlohmann::json& body = nullptr);

  TempDir dir_;
  pid_t pid_ = -1;
  uint16_t apiPort_ = 0;
  uint16_t adminPort_ = 0;
};

/// A test with its own API server, a client of it, and the namespace "shop".
class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override;
  /// A running pod of "shop" on @p node with IP 10.1.0.1.
  static TestPod shopPod(const std::string& name, const std::string& node = "node-a");

  std::unique_ptr<TestApiServer> server_;
  std::unique_ptr<kube::Client> client_;
};


}  // namespace sluice::test
