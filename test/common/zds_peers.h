// Scripted ZDS peers for tests: a raw SOCK_SEQPACKET "ztunnel" that talks to
// zds::Server exactly as a test tells it (including everything a misbehaving
// ztunnel can do), and a raw "agent" listener for testing zds::Client and the
// node proxy stand-in. Both use the real wire layer to read, and send raw
// bytes and fds so a test can break any rule on purpose.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "userspace/agent/zds/server.h"
#include "userspace/agent/zds/wire.h"
#include "test/common/topology.h"

namespace sluice::test {

using namespace std::chrono_literals;

/// (st_dev, st_ino) of an open fd: how ztunnel tells namespaces apart.
std::pair<dev_t, ino_t> fileIdOf(int fd);
/// (st_dev, st_ino) of a path ({0, 0} when it cannot be stat'ed).
std::pair<dev_t, ino_t> fileIdOf(const std::string& path);

/// Number of open fds of this process (/proc/self/fd).
size_t openFdCount();
/// Number of threads of this process (/proc/self/task).
size_t threadCount();

/// Sends @p data as one datagram with @p fds in one SCM_RIGHTS message.
bool sendWithFds(int sock, const std::string& data, const std::vector<int>& fds = {});


/// One request as a fake ztunnel received it.
struct ReceivedRequest {
  zds::Request request;
  std::vector<Fd> fds;
};

/// A scripted ztunnel: a raw SEQPACKET client of a zds::Server.
class FakeZtunnel {
 public:
  /// Connects (ok() false when that failed).
  explicit FakeZtunnel(const std::string& path);
  bool ok() const { return sock_.valid(); }
  int fd() const { return sock_.get(); }

  bool sendRaw(const std::string& data, const std::vector<int>& fds = {}) { return sendWithFds(fd(), data, fds); }
  bool hello();
  bool ack(const std::string& error = "");

  /// The next request; an error for EOF (EPIPE), time-out or anything undecodable.
  Result<ReceivedRequest> request(std::chrono::milliseconds timeout = 2s);
  /// Reads requests up to SnapshotSent, acking each ("" or errors[uid]);
  /// returns the snapshot's entries.
  Result<std::vector<ReceivedRequest>> snapshot(const std::map<std::string, std::string>& errors = {});
  /// hello + an acked snapshot.
  Result<std::vector<ReceivedRequest>> handshake();
  /// True when the server closes this connection within @p timeout
  /// (datagrams before the close are skipped).
  bool closedByServer(std::chrono::milliseconds timeout = 2s);
  void close() { sock_.reset(); }

 private:
  Fd sock_;
};

/// A scripted node agent: a raw SEQPACKET listener a zds::Client connects to.
class FakeAgent {
 public:
  /// Binds and listens on @p path (ok() false when that failed).
  explicit FakeAgent(const std::string& path);
  ~FakeAgent();
  bool ok() const { return listen_.valid(); }

  /// The next connection, after reading and checking its V1 hello.
  Result<Fd> accept(std::chrono::milliseconds timeout = 2s);
  /// Sends a request (with the fd, if >= 0) and reads its ack's text.
  static Result<std::string> exchange(int conn, const zds::Request& request, int fd = -1,
                                      std::chrono::milliseconds timeout = 2s);
  /// Sends raw bytes and fds and reads what comes back as an ack's text.
  static Result<std::string> exchangeRaw(int conn, const std::string& bytes, const std::vector<int>& fds,
                                         std::chrono::milliseconds timeout = 2s);
  /// True when the peer closes @p conn within @p timeout.
  static bool closedByPeer(int conn, std::chrono::milliseconds timeout = 2s);

 private:
  std::string path_;
  Fd listen_;
};

/// Server options for tests: @p deadline for the hello, each write and each
/// ack, idle checks every half of it, so failure paths take milliseconds.
zds::ServerOptions testServerOptions(const std::string& path, std::chrono::milliseconds deadline);

/// A Request of @p type for @p uid (Add: name/ns/sa derived from the uid).
zds::Request zdsRequest(zds::RequestType type, const std::string& uid = "");

}  // namespace sluice::test
