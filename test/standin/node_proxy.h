// The stand-in as a node proxy: like ztunnel in Istio's in-pod mode, one
// process serves every pod of the node. It gets the pods over ZDS from the
// node agent (zds::Client) and runs one ProxyStandIn inside each pod's
// network namespace, opened from the fd the agent handed over.
//
// ztunnel's per-pod rules, reproduced here:
//   - Add of a new uid: start its proxy; same uid + same netns ((st_dev,
//     st_ino) of the fd): success, nothing done; same uid + another netns:
//     stop the old proxy, start a new one.
//   - A proxy that cannot start (a port already bound in the pod by an app
//     without SO_REUSEPORT, …): error ack "failure to start proxy : …", the
//     connection stays, and that pod is retried every retryInterval.
//   - Del: the pod's listeners are closed at once.
//   - Snapshot: after a (re)connection, SnapshotSent stops every running
//     proxy whose uid the snapshot did not name (Add or Keep), and a Del
//     before SnapshotSent takes a uid back out of the snapshot.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "test/standin/standin.h"

namespace sluice {

/// Something the node proxy did or saw.
struct NodeProxyEvent {
  /// ZDS: "connected" | "disconnected" | "read-error" | "protocol-error" |
  /// "add" | "keep" | "del" | "snapshot";
  /// proxies: "proxy-started" | "proxy-stopped" | "proxy-start-failed";
  /// traffic: "connection" (a per-pod ProxyEvent, in `proxy`).
  std::string type;
  /// The ZDS connection it belongs to (1, 2, …); 0 for proxy events.
  uint64_t connection = 0;
  /// The pod (empty for connection-level events).
  std::string uid;
  std::string name;
  std::string ns;
  /// add/keep/del/snapshot: the ack sent ("" = success); proxy-*: why;
  /// connection-level events: what happened.
  std::string detail;
  /// type "connection": what the pod's proxy recorded.
  ProxyEvent proxy;
};

struct NodeProxyConfig {
  /// The agent's ZDS socket.
  std::string zdsPath;
  /// Each pod's proxy: ports, mark, reuseport, transparent, DNS answers.
  /// netnsPath/netnsFd/onEvent are set per pod; detectIpv6 and backlog 128
  /// are ztunnel's behaviour and are set by default here.
  StandInConfig proxy = defaultProxyConfig();
  /// How often a pod whose proxy failed to start is tried again.
  std::chrono::milliseconds retryInterval{5000};
  /// ZDS reconnect back-off (20 ms doubling to 15 s, as ztunnel).
  std::chrono::milliseconds initialBackoff{20};
  std::chrono::milliseconds maxBackoff{15000};
  /// Called for every event after it was recorded, from the stand-in's
  /// threads (ZDS client, retry timer, a pod's proxy). Must not call stop().
  std::function<void(const NodeProxyEvent&)> onEvent;

  /// StandInConfig with ztunnel's per-pod choices (detectIpv6, backlog 128).
  static StandInConfig defaultProxyConfig();
};

/// One node proxy; thread-safe.
class NodeProxyStandIn {
 public:
  /// Starts connecting to config.zdsPath (nobody listening yet is fine).
  static Result<std::unique_ptr<NodeProxyStandIn>> start(NodeProxyConfig config);
  /// stop().
  ~NodeProxyStandIn();
  NodeProxyStandIn(const NodeProxyStandIn&) = delete;
  NodeProxyStandIn& operator=(const NodeProxyStandIn&) = delete;

  /// Disconnects and stops every pod's proxy. Idempotent.
  void stop();

  /// Every event so far, in order.
  std::vector<NodeProxyEvent> events() const;
  /// Waits until some recorded event matches @p match; false on time-out.
  bool waitFor(const std::function<bool(const NodeProxyEvent&)>& match, std::chrono::milliseconds timeout) const;
  /// Waits for an event of @p type (and @p uid, when not empty).
  bool waitForEvent(const std::string& type, const std::string& uid, std::chrono::milliseconds timeout) const;
  /// Forgets the events recorded so far.
  void clearEvents();

  /// Uids whose proxy runs, sorted.
  std::vector<std::string> runningPods() const;
  /// Connections of pod @p uid its proxy relayed (the upstream connected)
  /// on @p listener ("outbound", "inbound").
  size_t relayed(const std::string& uid, const std::string& listener = "outbound") const;
  /// Uids whose proxy failed to start and is retried, sorted.
  std::vector<std::string> pendingPods() const;
  /// Whether a ZDS connection is up.
  bool connected() const;

 private:
  struct State;
  explicit NodeProxyStandIn(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace sluice
