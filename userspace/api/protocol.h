// The agent's API on its unix socket: one JSON object per line each way.
// Documented in docs/agent-api.md; this header is the one definition of the
// wire format (encoders and decoders), shared by sluiced, sluicectl and
// sluice-cni.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/pod_types.h"
#include "base/pod_stats.h"
#include "base/result.h"

namespace sluice::agent {

/// Bumped when a request or response changes incompatibly. The agent
/// answers requests of this version only, naming the one it speaks.
inline constexpr int kProtocolVersion = 1;

/// Where sluiced listens and its clients look.
inline constexpr const char* kDefaultSocket = "/var/run/sluice/agent.sock";

/// A request line larger than this is refused (and the connection closed).
inline constexpr size_t kMaxRequestBytes = 64 * 1024;

enum class Op { Add, Remove, List, Stats, Health, Check, Log };

const char* opName(Op op);
Result<Op> parseOp(const std::string& name);

/// A decoded request. Which fields mean something depends on op:
///   add:    pod (PodSpec; netns required)
///   remove: id or netns (exactly one)
///   stats:  id (optional)
///   check:  id (required): is the pod enrolled and intact?
///   list, health: nothing
///   log:    message (required, one line, at most kMaxLogMessage bytes):
///           what sluice-cni did with one command, for the agent's log
struct Request {
  Op op = Op::Health;
  PodSpec pod;
  std::optional<std::string> id;
  std::optional<std::string> netns;
  std::optional<std::string> message;
};

/// The longest message a log request carries.
inline constexpr size_t kMaxLogMessage = 4096;

/// What add answers. An agent that decides from Kubernetes which pods are
/// in the mesh (docs/kubernetes.md) may leave a pod alone: then `enrolled`
/// is false, `reason` says why, and nothing in the pod was touched. On the
/// wire an enrolled pod is its PodInfo plus "enrolled": true (and "reason"
/// when the agent decided); a pod left alone is {"id", "enrolled": false,
/// "reason"}, which an older client reads as a pod enrolled with nothing
/// attached — it passes the pod through unchanged, as it should.
struct AddResult {
  bool enrolled = true;
  /// Why the agent enrolled the pod or left it alone ("" when it did not
  /// decide: no Kubernetes, or no pod identity in the request).
  std::string reason;
  /// The enrolled pod; only its id when not enrolled.
  PodInfo pod;
};

/// What health answers.
struct Health {
  std::string version;     ///< sluice build version
  int protocol = kProtocolVersion;
  std::string bpffsRoot;
  std::string capture;     ///< the agent's default capture (--capture)
  std::string tcMode;      ///< the agent's default attach mode
  uint64_t pods = 0;
  uint64_t uptimeSeconds = 0;
  uint64_t reconciles = 0;  ///< completed sweeps
  std::string lastReconcileError;  ///< "" when the last sweep was clean
  std::string ztunnelSocket;        ///< "" when the agent hands no pod to a node proxy
  uint64_t ztunnelConnections = 0;  ///< node proxies connected over ZDS
  /// Non-empty while another node agent serves ztunnelSocket and this one
  /// waits for it to stop (--ztunnel-socket-takeover): what it waits for.
  std::string ztunnelWaiting;
  /// A switch with Istio's node agent (--istio-takeover, --istio-hand-back):
  /// "takeover: done", "takeover: N pod(s) not switched yet; …",
  /// "hand-back: …"; "" when neither runs.
  std::string istio;
  std::string kubeApi;              ///< "" without Kubernetes; "in cluster" or the URL
  bool kubeSynced = false;          ///< caches listed, start-up reconciliation done
  /// "host": the bpffs outlives the agent's mount namespace; "private": it
  /// goes with it (started with --allow-private-bpffs); "": not reported.
  std::string bpffsScope;
  std::string bpffsScopeWhy;  ///< how the agent decided, one phrase
  /// What keeps the agent from being ready (/readyz), one line each: empty
  /// when ready; nullopt when the agent does not report it (an older one).
  /// On the wire "ready" (bool) and "not_ready" (array or null).
  std::optional<std::vector<std::string>> notReady;
};

/// What check answers for an enrolled pod.
struct CheckReport {
  std::string id;
  bool intact = false;
  std::vector<std::string> problems;  ///< what is missing or wrong
};

nlohmann::json encodeRequest(const Request& r);
/// Errors name the bad field (EINVAL) or an unsupported version (EPROTO).
Result<Request> decodeRequest(const std::string& line);

nlohmann::json encodePodSpec(const PodSpec& s);
Result<PodSpec> decodePodSpec(const nlohmann::json& j);
nlohmann::json encodePodInfo(const PodInfo& p);
Result<PodInfo> decodePodInfo(const nlohmann::json& j);

nlohmann::json encodeAddResult(const AddResult& r);
/// An answer without "enrolled" (an older agent's) is an enrolled pod.
Result<AddResult> decodeAddResult(const nlohmann::json& j);

nlohmann::json encodeCounters(const PodCounters& c);
Result<PodCounters> decodeCounters(const nlohmann::json& j);
nlohmann::json encodeHealth(const Health& h);
Result<Health> decodeHealth(const nlohmann::json& j);
nlohmann::json encodeCheck(const CheckReport& c);
Result<CheckReport> decodeCheck(const nlohmann::json& j);

/// {"version":1,"ok":true,"result":...} as one line with its newline.
std::string okResponse(const nlohmann::json& result);
/// {"version":1,"ok":false,"error":{"errno":N,"code":"ENOENT","message":"..."}}.
std::string errorResponse(const Error& e);
/// Decodes a response line: the result, or the Error the agent sent.
Result<nlohmann::json> decodeResponse(const std::string& line);

/// "ENOENT" for 2, "EIO" for unknown values; and back (0 for unknown names).
std::string errnoName(int code);
int errnoFromName(const std::string& name);

}  // namespace sluice::agent
