// ztunnel's side of ZDS, for the node proxy stand-in and for tests: connects
// to the agent's socket (retrying with back-off while nobody listens), says
// hello, then reads one request at a time, hands it to a handler and sends
// the ack the handler decides. It enforces the rules ztunnel enforces:
//   - an Add without an fd, any other request with an fd, more than one fd,
//     a truncated or unparseable datagram: error ack "failure to read
//     message : …", then the connection is dropped and made again;
//   - an Add without workload_info, a Keep or a second SnapshotSent after the
//     snapshot: error ack "failure to process message : …" and the connection
//     is dropped (ztunnel exits there; the client reconnects, as a restarted
//     ztunnel would).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/fd.h"
#include "base/result.h"
#include "userspace/agent/zds/workload.h"

namespace sluice::zds {

/// A request as the handler sees it.
struct ClientRequest {
  Request request;
  /// Add: the pod's netns (owned; the handler may move it out).
  Fd netns;
  /// Which connection it came on (1, 2, … per Client).
  uint64_t connection = 0;
  /// True once this connection's SnapshotSent was handled.
  bool afterSnapshot = false;
};

/// Something that happened to the client's connection.
struct ClientEvent {
  enum class Kind {
    Connected,      ///< connected and hello sent: a new snapshot follows
    Disconnected,   ///< the agent closed the connection, or it broke
    ReadError,      ///< a request broke the framing rules; dropped
    ProtocolError,  ///< a request broke the conversation rules; dropped
  };
  Kind kind;
  uint64_t connection = 0;
  std::string detail;
};

/// "connected" | "disconnected" | "read-error" | "protocol-error".
const char* clientEventName(ClientEvent::Kind kind);

struct ClientOptions {
  std::string socketPath;
  /// Wait before the first retry while nobody listens; doubled per failure.
  std::chrono::milliseconds initialBackoff{20};
  std::chrono::milliseconds maxBackoff{15000};
  /// Deadline for writing the hello and each ack.
  std::chrono::milliseconds writeTimeout{5000};
  /// Handles one valid request; returns the ack's error text ("" = success).
  /// Runs on the client's thread.
  std::function<std::string(ClientRequest&)> handler;
  /// Connection events, on the client's thread.
  std::function<void(const ClientEvent&)> onEvent;
};

/// A ZDS client with its own thread. Thread-safe.
class Client {
 public:
  /// Starts connecting in the background (nobody listening is not an error).
  static Result<std::unique_ptr<Client>> start(ClientOptions options);
  /// stop().
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Closes the connection and joins the thread. Idempotent; must not be
  /// called from the handler or onEvent.
  void stop();

  /// Whether a connection is up (hello sent).
  bool connected() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::zds
