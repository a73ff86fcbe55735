// A TCP relay between two network namespaces, for tests whose process runs
// somewhere a service cannot be reached from: e.g. a sluiced started in a
// node netns (so its probe SNAT covers the pods' host veths) whose Kubernetes
// API stand-in listens on 127.0.0.1 of the test's own netns.
//
//   node netns                            the test's own netns
//   127.0.0.1:P (listener, socketIn) ───▶ 127.0.0.1:P (TestApiServer)
//
// Each accepted connection gets a fresh upstream connection, opened by the
// relay's thread in the netns it runs in (the test's own, which no test
// thread ever leaves), and bytes are copied both ways with half-closes kept
// (a FIN one way is a shutdown(SHUT_WR) the other). Nothing here changes
// any netns' configuration.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "test/common/topology.h"

namespace sluice::test {

class TcpRelay {
 public:
  /// Listens on @p listen inside @p ns and relays every connection to
  /// @p upstream, connected from the caller's netns.
  static Result<std::unique_ptr<TcpRelay>> start(const TestNetns& ns, const Endpoint& listen, const Endpoint& upstream);
  /// Closes the listener and every relayed connection, joins every thread.
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  /// Connections accepted so far.
  size_t accepted() const { return accepted_; }

 private:
  TcpRelay() = default;
  void acceptLoop();
  /// Copies both ways until both directions ended or the relay stops.
  void pump(Fd client, Fd server);
  /// Writes all of @p n bytes to @p fd; false when it broke or we stop.
  bool writeAll(int fd, const char* data, size_t n);

  Endpoint upstream_;
  Fd listen_;
  Fd stop_;  ///< eventfd: readable once the relay stops (never read)
  std::thread acceptor_;
  struct Pump {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  /// Joins the pumps that ended (the acceptor's thread).
  void reap();

  std::mutex mu_;
  std::vector<Pump> pumps_;
  std::atomic<size_t> accepted_{0};
};

}  // namespace sluice::test
