// A small Kubernetes API client over libcurl: GET, chunked lists, watch
// streams and merge patches, with in-cluster or explicit configuration.
//
// Errors are sluice::Error with a one-line message that names the request:
//   "GET /api/v1/pods?...: HTTP 401 Unauthorized: Unauthorized"
//   "watch /api/v1/pods?...: no data for 3000 ms (stalled stream)"
// Error::code is the HTTP status (300-599) when the API server answered
// with an error, and an errno (< 300: ETIMEDOUT, ECONNREFUSED, ECONNRESET,
// EPROTO for TLS, ECANCELED when stopped, EIO otherwise) when it did not.
//
// Threading: a Client is safe to use from several threads at once; each call
// runs its own transfer. Every call can be cancelled through a
// std::stop_token (it returns within ~100 ms with ECANCELED).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace sluice::kube {

/// Where the service account's files are mounted in a pod.
inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";

struct ClientConfig {
  /// "https://HOST:PORT" (no trailing slash).
  std::string apiUrl;
  /// Bearer token file, re-read when it changes (kubelet rotates projected
  /// tokens); "" sends no token.
  std::string tokenFile;
  /// CA bundle that signed the API server's certificate; "" uses the
  /// system's CAs.
  std::string caFile;
  std::chrono::milliseconds connectTimeout{5000};
  /// Whole-request limit of get/list/patch (not of watches).
  std::chrono::milliseconds requestTimeout{30000};
  std::string userAgent = "sluiced";
};

/// The configuration of a pod's service account: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
/// with DIR/token and DIR/ca.crt. Errors name what is missing.
Result<ClientConfig> inClusterConfig(const std::string& serviceAccountDir = kServiceAccountDir);

/// Checks an explicit configuration (--kube-api URL --kube-token-file F
/// --kube-ca-file F): an http(s) URL, readable files.
Result<ClientConfig> explicitConfig(const std::string& apiUrl, const std::string& tokenFile, const std::string& caFile);

/// True when @p e is the API server's answer with HTTP status @p status.
inline bool isHttpStatus(const Error& e, int status) { return e.code == status; }
/// 410 Gone / Expired: the resourceVersion (or continue token) is compacted.
inline bool isGone(const Error& e) { return isHttpStatus(e, 410); }
inline bool isNotFound(const Error& e) { return isHttpStatus(e, 404); }

/// The Error of a Kubernetes Status object (HTTP error bodies and watch
/// ERROR events): code from Status.code, "CONTEXT: HTTP 410 Expired: MESSAGE".
Error statusError(const nlohmann::json& status, const std::string& context, int httpStatus = 0);

/// Query parameters of a list.
struct ListOptions {
  std::string fieldSelector;
  std::string labelSelector;
  /// "" = most recent (a consistent read), "0" = any.
  std::string resourceVersion;
  /// Page size (0 = everything at once) and the previous page's token.
  int limit = 0;
  std::string continueToken;
};

/// One page of a list.
struct ListPage {
  std::vector<nlohmann::json> items;
  std::string resourceVersion;  ///< of the list (the snapshot it reflects)
  std::string continueToken;    ///< "" on the last page
};

struct WatchOptions {
  std::string fieldSelector;
  std::string labelSelector;
  /// Events after this version; "" or "0" start with the current objects as
  /// ADDED.
  std::string resourceVersion;
  bool allowBookmarks = true;
  /// timeoutSeconds: the server ends the stream after this (0 = its default).
  std::chrono::seconds timeout{0};
  /// No byte for this long ends the watch with ETIMEDOUT (0 = never):
  /// catches a stream that is open but dead (a half-open TCP connection, a
  /// server that stopped sending).
  std::chrono::milliseconds stallTimeout{0};
  /// Called (on the calling thread) once the server has accepted the watch
  /// (HTTP 200 headers received), before any event.
  std::function<void()> onOpen;
};

enum class WatchEventType { Added, Modified, Deleted, Bookmark, Error };
/// "ADDED", "MODIFIED", ...
const char* toString(WatchEventType t);

struct WatchEvent {
  WatchEventType type = WatchEventType::Added;
  nlohmann::json object;  ///< the object; a Status for Error
};

/// How a watch that did not fail ended.
enum class WatchEnd {
  Closed,   ///< the server ended the stream (timeoutSeconds)
  Stopped,  ///< the handler returned false
};

class Client {
 public:
  static Result<std::unique_ptr<Client>> create(ClientConfig config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientConfig& config() const { return config_; }

  /// GET PATH: the object.
  Result<nlohmann::json> get(const std::string& path, std::stop_token stop = {});

  /// One page of a list at PATH (/api/v1/pods, /api/v1/namespaces, ...).
  Result<ListPage> list(const std::string& path, const ListOptions& options, std::stop_token stop = {});

  /// Streams watch events of PATH to @p onEvent (on the calling thread)
  /// until the server ends the stream, the handler returns false, an error,
  /// or @p stop. An ERROR event is delivered like the others.
  Result<WatchEnd> watch(const std::string& path, const WatchOptions& options,
                         const std::function<bool(WatchEvent&&)>& onEvent, std::stop_token stop = {});

  /// PATCH PATH with an application/merge-patch+json body: the object after.
  Result<nlohmann::json> mergePatch(const std::string& path, const nlohmann::json& patch, std::stop_token stop = {});
  /// PATCH PATH with an application/json-patch+json body (RFC 6902
  /// operations): the object after. A "test" that fails is HTTP 422.
  Result<nlohmann::json> jsonPatch(const std::string& path, const nlohmann::json& operations, std::stop_token stop = {});

  /// The token the next request sends (re-read when the file changed);
  /// exposed for tests and for the agent's status.
  Result<std::string> token(bool forceReload = false);

 private:
  struct Request;
  /// A libcurl multi + easy pair; the multi's connection cache outlives a
  /// request, so pooled handles reuse connections.
  struct Handle;
  static constexpr size_t kPoolSize = 8;
  explicit Client(ClientConfig config);
  std::unique_ptr<Handle> acquire();
  void release(std::unique_ptr<Handle> h);
  /// Runs one request; retries once with a re-read token after a 401.
  Result<long> perform(Request& req, std::stop_token stop);
  Result<long> performOnce(Request& req, const std::string& token, std::stop_token stop);
  Result<nlohmann::json> sendPatch(const std::string& path, const nlohmann::json& body, const char* contentType,
                                   std::stop_token stop);
  /// libcurl's write callback (userdata: the Request).
  static size_t onData(char* data, size_t size, size_t n, void* userdata);
  /// libcurl's header callback: notices the end of a 200 answer's headers.
  static size_t onHeader(char* data, size_t size, size_t n, void* userdata);

  ClientConfig config_;
  std::mutex poolMu_;
  std::vector<std::unique_ptr<Handle>> pool_;
  std::mutex tokenMu_;
  std::string token_;
  struct FileStamp {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t mtimeNs = 0;
    int64_t ctimeNs = 0;
    off_t size = -1;
    bool operator==(const FileStamp&) const = default;
  } tokenStamp_;
};

/// /api/v1/pods (all namespaces) or /api/v1/namespaces/NS/pods.
std::string podsPath(const std::string& namespaceName = "");
/// /api/v1/namespaces/NS/pods/NAME.
std::string podPath(const std::string& namespaceName, const std::string& name);
/// /api/v1/namespaces/NS/pods/NAME/status (the subresource the agent patches).
std::string podStatusPath(const std::string& namespaceName, const std::string& name);
/// /api/v1/namespaces.
std::string namespacesPath();
/// /api/v1/namespaces/NAME.
std::string namespacePath(const std::string& name);
/// /api/v1/nodes/NAME.
std::string nodePath(const std::string& name);
/// /apis/apps/v1/namespaces/NS/daemonsets/NAME.
std::string daemonSetPath(const std::string& namespaceName, const std::string& name);

}  // namespace sluice::kube
