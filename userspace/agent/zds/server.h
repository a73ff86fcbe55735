// The node agent's side of ZDS: a SOCK_SEQPACKET listener that ztunnel
// connects to; each connection says hello, gets a snapshot of every enrolled
// pod (its netns fd or a Keep), then one request at a time, each answered by
// one ack. Adds go to the newest connection, deletes to all of them.
//
// Threads: one accepting thread, one thread per connection (it owns that
// socket: only it sends and reads), one notifier thread for onSnapshotAck.
// add()/del() hand their request to a connection's thread and wait for the
// ack; they may be called from any thread.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "userspace/agent/zds/workload.h"

namespace sluice::zds {

/// One pod of a snapshot: its netns (invalid Fd: sent as KeepWorkload, no fd).
struct SnapshotEntry {
  WorkloadInfo workload;
  Fd netns;
};

/// A connected ztunnel (after its hello), from SO_PEERCRED.
struct Peer {
  uint64_t id;        ///< connection number, 1, 2, … in accept order
  pid_t pid;
  uid_t uid;
  gid_t gid;
  bool snapshotDone;  ///< SnapshotSent was acked
};

/// A request's type and its result, as Observer::request names them.
inline constexpr std::array<const char*, 4> kRequestTypes = {"add", "del", "keep", "snapshot_sent"};
inline constexpr std::array<const char*, 4> kRequestResults = {"ok", "error", "timeout", "no_connection"};
/// What became of an accepted connection, as Observer::accepted names it:
/// "served" (it got a thread), "gone" (its peer had closed it while it
/// waited in the backlog: closed at once, no thread).
inline constexpr std::array<const char*, 2> kAcceptResults = {"served", "gone"};
/// Why the server dropped a connection, as Observer::dropped names it:
/// "hello_timeout" (no hello within helloTimeout), "no_hello" (closed, or
/// anything but a V1 hello, first), "deadline" (a request not written or not
/// acked within writeTimeout / ackTimeout), "protocol" (a malformed or
/// unsolicited message), "closed" (the peer went away during a request),
/// "keepalive" (the idle check's read found the peer gone).
inline constexpr std::array<const char*, 6> kDropReasons = {"hello_timeout", "no_hello", "deadline",
                                                            "protocol",      "closed",   "keepalive"};

/// What the server counts, told as it happens; whoever exports metrics (the
/// agent) implements it, so the server knows nothing of their format. Called
/// on the server's threads, several at once: implementations are
/// thread-safe and never call back into the server.
class Observer {
 public:
  virtual ~Observer() = default;
  /// A request ended: @p type one of kRequestTypes, @p result one of
  /// kRequestResults ("error": an error ack or a broken connection).
  virtual void request(const std::string& type, const std::string& result) = 0;
  /// An ack came @p seconds after its request was sent.
  virtual void acked(double seconds) = 0;
  /// A connection was accepted: @p result one of kAcceptResults.
  virtual void accepted(const std::string& result) { (void)result; }
  /// The accept rate limit (ServerOptions::acceptInterval) held back a
  /// connection that was waiting in the backlog.
  virtual void acceptThrottled() {}
  /// A connection was dropped (not at stop()): @p reason one of kDropReasons.
  virtual void dropped(const std::string& reason) { (void)reason; }
};

/// Connections found already closed by their peer that one allowed accept
/// may skip (ServerOptions::acceptInterval): bounds the accept loop's work
/// while it drains a backlog a reconnecting peer left behind.
inline constexpr int kGonePerAccept = 1024;

/// How the server listens and what it asks its owner.
struct ServerOptions {
  /// Removes a stale socket file first (refuses to remove anything that is
  /// not a socket, or a socket another process still serves), listens
  /// SOCK_SEQPACKET.
  std::string socketPath;
  /// When another process serves socketPath (another node agent: Istio's,
  /// or another sluiced): false, start() fails naming it; true, start()
  /// returns at once and the server waits until that process stops
  /// serving (probing every takeOverPoll), then listens (waiting() says so
  /// meanwhile). ztunnel reconnects by itself.
  bool takeOver = false;
  std::chrono::milliseconds takeOverPoll{250};
  /// Wait for the hello; write a request; read its ack; between idle checks.
  std::chrono::milliseconds helloTimeout{5000}, writeTimeout{5000}, ackTimeout{5000}, idleCheckInterval{5000};
  /// The accept rate limit, Istio's (`rate.NewLimiter(5, 1)` waited on
  /// before each accept): one accept per interval, a burst of one. Those
  /// that come faster wait in the listen backlog (somaxconn long, as Go's
  /// listener), never refused. A connection its peer closed while it waited
  /// there is closed at once without using the allowance (at most
  /// kGonePerAccept of them per allowed accept). Zero: no limit.
  std::chrono::milliseconds acceptInterval{200};
  /// Called for each new connection after its hello: the pods to snapshot
  /// (read fresh each time). Runs on that connection's thread with no lock of
  /// the server held; it may take the owner's locks even while another thread
  /// holding them is inside add()/del() (those never wait for a connection
  /// whose snapshot callback has not returned). Null: an empty snapshot.
  std::function<std::vector<SnapshotEntry>()> snapshot;
  /// Called for each new connection after its hello, before its snapshot,
  /// on that connection's thread with no lock of the server held: the agent
  /// learns the node proxy's process (SO_PEERCRED) before the proxy gets any
  /// pod to open sockets for. Null: nothing.
  std::function<void(const Peer&)> onConnected;
  /// Called with every snapshot ack (error "" = success) so the agent can
  /// record hand-off state. Runs on the server's notifier thread, in ack
  /// order, never while add()/del() wait for it; may take the owner's locks.
  std::function<void(const std::string& uid, const std::string& error)> onSnapshotAck;
  /// Told every request's result and every ack's latency; borrowed, it
  /// outlives the server. Null: nothing is counted.
  Observer* observer = nullptr;
};


/// The ZDS server. Thread-safe.
class Server {
 public:
  /// Listens on options.socketPath and starts accepting.
  static Result<std::unique_ptr<Server>> start(ServerOptions options);
  /// stop().
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Non-empty while the server waits for another process to stop serving
  /// its socket (ServerOptions::takeOver): what it waits for.
  std::string waiting() const;

  /// Another process has put its own socket at the path this server
  /// listens on (another node agent took it over): new ztunnel connections
  /// go there now.
  bool socketReplaced() const;

  /// Closes every connection and the listener, joins threads, unlinks the
  /// socket file (unless another process has replaced it since). Waits for a
  /// snapshot callback that is running and for onSnapshotAck calls already
  /// queued: do not call it while holding a lock those callbacks take.
  /// Idempotent.
  void stop();

  /// AddWorkload + its ack on the newest connection (the next newest when
  /// that one is gone or breaks while sending). Fails — retryable, with a
  /// clear message — when no ztunnel is connected ("no ztunnel connection",
  /// EAGAIN), on a send/ack time-out (ETIMEDOUT; that connection is
  /// dropped), or on an error ack (EPROTO, the message contains ztunnel's ack
  /// text). An add issued while the newest connection is still sending its
  /// snapshot is queued behind the snapshot on that connection. A connection
  /// whose snapshot callback is still running is not waited for: it gets the
  /// Add queued behind its snapshot once this add succeeded elsewhere; when
  /// it is the only one, add fails with EAGAIN ("no ztunnel connection ready").
  /// @p netnsFd is borrowed (duplicated where it must outlive the call).
  Status add(const WorkloadInfo& workload, int netnsFd);

  /// DelWorkload to every connection, one after the other (oldest first);
  /// ack texts are ignored (logged); succeeds with no connection. A
  /// connection that times out or breaks is dropped and the call fails
  /// (ETIMEDOUT / EPROTO / EPIPE …) after trying the others; the dropped
  /// ztunnel learns of the removal from its next snapshot. Connections still
  /// preparing their snapshot get the Del queued behind it, unwaited.
  Status del(const std::string& uid);

  /// The connections that said hello, newest last.
  std::vector<Peer> peers() const;

  /// The listening socket's path.
  const std::string& socketPath() const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::zds
