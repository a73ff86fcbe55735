// A small HTTPS GET against the Kubernetes API for sluice-cni, which must
// stay one static executable: OpenSSL (libssl.a / libcrypto.a), the
// kubeconfig's CA and bearer token, a connection to the server's IP:PORT
// (no name resolution), HTTP/1.1 with Connection: close. Istio's plugin
// asks the API the same two questions with client-go
// (istio/istio cni/pkg/plugin/plugin.go isAmbientPod: GET the pod, GET its
// namespace).
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "userspace/cni/kubeconfig.h"

namespace sluice::cni {

struct HttpResponse {
  int status = 0;
  std::string body;
};

/// Parses a whole HTTP/1.1 response as read until the server closed the
/// connection: status line, headers, a body by Content-Length, chunked
/// transfer coding, or up to the end. Errors (EPROTO) say what is wrong.
Result<HttpResponse> parseHttpResponse(const std::string& raw);

/// "https://10.96.0.1:443" -> host "10.96.0.1", port 443; "[fd00::1]:6443"
/// too. Errors (EINVAL) when the host is not an IP address.
struct ServerAddress {
  std::string host;
  uint16_t port = 443;
};
Result<ServerAddress> parseServer(const std::string& server);

/// GET @p path with the credentials; the whole exchange within @p timeout.
/// Errors: ECONNREFUSED/ETIMEDOUT/... (cannot reach), EPROTO (TLS or HTTP).
Result<HttpResponse> httpsGet(const KubeCredentials& creds, const std::string& path, std::chrono::milliseconds timeout);

/// GET of one API object: its JSON on 200; otherwise an error naming the
/// path and the status (the API's Status message when it sent one), with
/// code ENOENT for 404, EACCES for 401/403, EIO for other statuses.
Result<nlohmann::json> kubeGetObject(const KubeCredentials& creds, const std::string& path,
                                     std::chrono::milliseconds timeout);

}  // namespace sluice::cni
