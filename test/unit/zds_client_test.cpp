// zds::Client (ztunnel's side of ZDS, used by the node proxy stand-in):
// against a scripted agent (a raw SEQPACKET listener in the test) for the
// rules ztunnel enforces, and against the real zds::Server end to end.
//
//   FakeAgent / zds::Server (test) <--SEQPACKET-- zds::Client --> handler (test)
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "test/common/tempdir.h"
#include "test/common/zds_peers.h"
#include "userspace/agent/zds/client.h"
#include "userspace/agent/zds/server.h"
#include "userspace/agent/zds/wire.h"
#include "test/standin/node_proxy.h"

namespace sluice::zds {
namespace {

using namespace std::chrono_literals;
using test::eventually;
using test::FakeAgent;
using test::zdsRequest;

Fd podFd(const std::string& name) { return Fd(::memfd_create(name.c_str(), MFD_CLOEXEC)); }

/// What the handler saw.
struct Seen {
  Request request;
  std::pair<dev_t, ino_t> netns{0, 0};
  bool afterSnapshot = false;
  uint64_t connection = 0;
};

class ZdsClient : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }
  std::string path() const { return dir_.file("zds.sock"); }

  /// Starts a client whose handler records every request and answers
  /// answers_[uid] (default "").
  void startClient() {
    ClientOptions o;
    o.socketPath = path();
    o.initialBackoff = 5ms;
    o.maxBackoff = 40ms;
    o.handler = [this](ClientRequest& r) {
      std::lock_guard lock(mu_);
      Seen s{r.request, r.netns.valid() ? test::fileIdOf(r.netns.get()) : std::make_pair(dev_t{0}, ino_t{0}),
             r.afterSnapshot, r.connection};
      seen_.push_back(s);
      auto it = answers_.find(r.request.workload.uid);
      return it == answers_.end() ? std::string() : it->second;
    };
    o.onEvent = [this](const ClientEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(std::string(clientEventName(e.kind)) + ": " + e.detail);
    };
    auto c = Client::start(o);
    ASSERT_TRUE(c.ok()) << c.error().message;
    client_ = std::move(*c);
  }
  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }
  std::vector<std::string> events() {
    std::lock_guard lock(mu_);
    return events_;
  }

  test::TempDir dir_{"zdsc"};
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::vector<std::string> events_;
  std::map<std::string, std::string> answers_;
  std::unique_ptr<Client> client_;
};

TEST_F(ZdsClient, RetriesUntilTheAgentListensThenSaysHello) {
  startClient();
  std::this_thread::sleep_for(100ms);  // several failed attempts
  EXPECT_FALSE(client_->connected());
  FakeAgent agent(path());
  ASSERT_TRUE(agent.ok());
  auto conn = agent.accept();  // checks the V1 hello
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  EXPECT_TRUE(eventually([&] { return client_->connected(); }));
}

TEST_F(ZdsClient, HandlerGetsEachRequestAndItsAnswerIsTheAck) {
  FakeAgent agent(path());
  ASSERT_TRUE(agent.ok());
  answers_["u-bad"] = "failure to start proxy : busy";
  startClient();
  auto conn = agent.accept();
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  Fd ns = podFd("pod");
  auto a = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::Add, "u1"), ns.get());
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(*a, "");
  auto k = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::Keep, "u2"));
  ASSERT_TRUE(k.ok()) << k.error().message;
  auto s = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::SnapshotSent));
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto bad = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::Add, "u-bad"), ns.get());
  ASSERT_TRUE(bad.ok()) << bad.error().message;
  EXPECT_EQ(*bad, "failure to start proxy : busy");  // the connection stays
  auto d = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::Del, "u1"));
  ASSERT_TRUE(d.ok()) << d.error().message;

  auto v = seen();
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0].request.type, RequestType::Add);
  EXPECT_EQ(v[0].request.workload.uid, "u1");
  EXPECT_EQ(v[0].request.workload.name, "name-u1");
  EXPECT_EQ(v[0].request.workload.ns, "ns-u1");
  EXPECT_EQ(v[0].request.workload.serviceAccount, "sa-u1");
  EXPECT_EQ(v[0].netns, test::fileIdOf(ns.get()));
  EXPECT_FALSE(v[0].afterSnapshot);
  EXPECT_EQ(v[1].request.type, RequestType::Keep);
  EXPECT_EQ(v[2].request.type, RequestType::SnapshotSent);
  EXPECT_FALSE(v[2].afterSnapshot);
  EXPECT_TRUE(v[3].afterSnapshot);
  EXPECT_EQ(v[4].request.type, RequestType::Del);
  EXPECT_EQ(v[4].request.workload.uid, "u1");
}

// Framing violations: error ack "failure to read message : …", the
// connection dropped, a new one made; the handler never sees them.
TEST_F(ZdsClient, ReadErrorsAreAnsweredThenTheConnectionIsMadeAgain) {
  FakeAgent agent(path());
  ASSERT_TRUE(agent.ok());
  startClient();
  Fd a = podFd("a"), b = podFd("b");
  auto add = *encodeRequest(zdsRequest(RequestType::Add, "u1"));
  auto del = *encodeRequest(zdsRequest(RequestType::Del, "u1"));
  struct Case {
    const char* what;
    std::string bytes;
    std::vector<int> fds;
    std::string ack;
  };
  std::vector<Case> cases = {
      {"add without fd", add, {}, "failure to read message : add without a netns fd (no control message)"},
      {"del with an fd", del, {a.get()}, "failure to read message : unexpected fd with a del request"},
      {"two fds", add, {a.get(), b.get()}, "failure to read message : expected 1 fd, got 2"},
      {"garbage", std::string("\x0a\x7f\x01", 3), {}, "failure to read message : datagram does not parse as WorkloadRequest (0a 7f 01)"},
      {"oversize", std::string(1500, '\x1a'), {}, "failure to read message : truncated message (longer than 1024 bytes)"},
      {"no payload", std::string("\x20\x01", 2), {}, "failure to read message : WorkloadRequest without payload (20 01)"},
  };
  // One connection open on each side, now and at the end: the same count
  // of fds, unless a rejected request's fd leaked.
  auto conn = agent.accept();
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  size_t before = test::openFdCount();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    auto ack = FakeAgent::exchangeRaw(conn->get(), c.bytes, c.fds);
    ASSERT_TRUE(ack.ok()) << ack.error().message;
    EXPECT_EQ(*ack, c.ack);
    EXPECT_TRUE(FakeAgent::closedByPeer(conn->get()));
    // The client makes a new connection at once.
    conn = agent.accept();
    ASSERT_TRUE(conn.ok()) << conn.error().message;
  }
  EXPECT_TRUE(seen().empty());
  auto ev = events();
  EXPECT_EQ(std::count_if(ev.begin(), ev.end(), [](const std::string& e) { return e.rfind("read-error: ", 0) == 0; }), 6);
  // A leak shows as more fds than before; fewer is a descriptor some other
  // thread held only for a moment when `before` was counted.
  EXPECT_TRUE(eventually([&] { return client_->connected() && test::openFdCount() <= before; }))
      << test::openFdCount() << " fds open, " << before << " before";
}

// Conversation violations: error ack "failure to process message : …" and
// the connection dropped (ztunnel would exit here).
TEST_F(ZdsClient, ProtocolErrorsAreAnsweredThenTheConnectionIsDropped) {
  FakeAgent agent(path());
  ASSERT_TRUE(agent.ok());
  startClient();
  Fd ns = podFd("pod");
  {
    auto conn = agent.accept();
    ASSERT_TRUE(conn.ok());
    // add{uid "u1"} without workload_info, with its fd.
    auto ack = FakeAgent::exchangeRaw(conn->get(), std::string("\x0a\x04\x0a\x02\x75\x31", 6), {ns.get()});
    ASSERT_TRUE(ack.ok()) << ack.error().message;
    EXPECT_EQ(*ack, "failure to process message : workload_info is required but not present (uid u1)");
    EXPECT_TRUE(FakeAgent::closedByPeer(conn->get()));
  }
  {
    auto conn = agent.accept();
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(FakeAgent::exchange(conn->get(), zdsRequest(RequestType::Keep, "u1")).ok());  // fine before
    ASSERT_TRUE(FakeAgent::exchange(conn->get(), zdsRequest(RequestType::SnapshotSent)).ok());
    auto ack = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::Keep, "u1"));
    ASSERT_TRUE(ack.ok()) << ack.error().message;
    EXPECT_EQ(*ack, "failure to process message : pod keep received after snapshot");
    EXPECT_TRUE(FakeAgent::closedByPeer(conn->get()));
  }
  {
    auto conn = agent.accept();
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(FakeAgent::exchange(conn->get(), zdsRequest(RequestType::SnapshotSent)).ok());
    auto ack = FakeAgent::exchange(conn->get(), zdsRequest(RequestType::SnapshotSent));
    ASSERT_TRUE(ack.ok()) << ack.error().message;
    EXPECT_EQ(*ack, "failure to process message : pod snapshot received already");
    EXPECT_TRUE(FakeAgent::closedByPeer(conn->get()));
  }
  // The handler saw only the valid requests; every new connection starts
  // before its snapshot again.
  auto v = seen();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].request.type, RequestType::Keep);
  EXPECT_EQ(v[2].request.type, RequestType::SnapshotSent);
  EXPECT_FALSE(v[2].afterSnapshot);
  EXPECT_NE(v[0].connection, v[2].connection);
}

TEST_F(ZdsClient, ReconnectsWhenTheAgentGoesAway) {
  startClient();
  {
    // The listener goes before the connection (conn outlives first): the
    // client, reconnecting at once, must not reach a listener about to close,
    // which would reset that connection and count it.
    Result<Fd> conn = Error::msg("not accepted", EIO);
    FakeAgent first(path());
    ASSERT_TRUE(first.ok());
    conn = first.accept();
    ASSERT_TRUE(conn.ok());
  }  // listener, then connection, gone
  EXPECT_TRUE(eventually([&] { return !client_->connected(); }));
  FakeAgent second(path());
  ASSERT_TRUE(second.ok());
  auto conn = second.accept();
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  // The client reports the connection just after its hello went out.
  ASSERT_TRUE(eventually([&] { return events().size() == 3; })) << events().size();
  auto ev = events();
  EXPECT_EQ(ev[0], "connected: ");
  EXPECT_EQ(ev[2], "connected: ");
  EXPECT_EQ(ev[1], "disconnected: the agent closed the connection");
}

TEST_F(ZdsClient, StartErrors) {
  ClientOptions o;
  auto empty = Client::start(o);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message, "zds client: empty socket path");
  o.socketPath = path();
  o.initialBackoff = 0ms;
  auto zero = Client::start(o);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message, "zds client: back-off must be positive and initial <= max");
}

// The defaults are ztunnel's: reconnect 20 ms doubling to 15 s, a failed
// pod retried every 5 s, per-pod IPv6 detection and backlog 128.
TEST(ZdsDefaults, AreZtunnels) {
  ClientOptions c;
  EXPECT_EQ(c.initialBackoff, 20ms);
  EXPECT_EQ(c.maxBackoff, 15000ms);
  EXPECT_EQ(c.writeTimeout, 5000ms);
  NodeProxyConfig n;
  EXPECT_EQ(n.initialBackoff, 20ms);
  EXPECT_EQ(n.maxBackoff, 15000ms);
  EXPECT_EQ(n.retryInterval, 5000ms);
  EXPECT_TRUE(n.proxy.detectIpv6);
  EXPECT_EQ(n.proxy.backlog, 128);
  EXPECT_EQ(n.proxy.mark, 0x539u);
  EXPECT_TRUE(n.proxy.reuseport);
  EXPECT_TRUE(n.proxy.transparent);
}

// Both sides of the protocol as sluice builds them, end to end.
TEST_F(ZdsClient, AgainstTheRealServer) {
  Fd a = podFd("a");
  ServerOptions so;
  so.socketPath = path();
  so.snapshot = [&] {
    std::vector<SnapshotEntry> v;
    v.push_back({{"snap-a", "a", "ns", "sa"}, Fd(::dup(a.get()))});
    v.push_back({{"snap-keep", "k", "ns", "sa"}, Fd()});
    return v;
  };
  auto server = Server::start(so);
  ASSERT_TRUE(server.ok()) << server.error().message;
  answers_["refused"] = "failure to start proxy : nope";
  startClient();
  ASSERT_TRUE(eventually([&] {
    auto p = (*server)->peers();
    return p.size() == 1 && p[0].snapshotDone;
  }));
  Fd b = podFd("b");
  Status added = (*server)->add({"u-b", "b", "ns", "sa"}, b.get());
  EXPECT_TRUE(added.ok()) << added.error().message;
  Status refused = (*server)->add({"refused", "r", "ns", "sa"}, b.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, EPROTO);
  EXPECT_EQ(refused.error().message, "ztunnel refused pod ns/r (uid refused) on connection 1: failure to start proxy : nope");
  EXPECT_TRUE((*server)->del("u-b").ok());

  auto v = seen();
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(v[0].request.workload.uid, "snap-a");
  EXPECT_EQ(v[0].netns, test::fileIdOf(a.get()));
  EXPECT_EQ(v[1].request.type, RequestType::Keep);
  EXPECT_EQ(v[2].request.type, RequestType::SnapshotSent);
  EXPECT_EQ(v[3].request.workload.uid, "u-b");
  EXPECT_EQ(v[3].netns, test::fileIdOf(b.get()));
  EXPECT_TRUE(v[3].afterSnapshot);
  EXPECT_EQ(v[5].request.type, RequestType::Del);

  // The server restarts: the client comes back and gets a new snapshot.
  (*server)->stop();
  auto again = Server::start(so);
  ASSERT_TRUE(again.ok()) << again.error().message;
  ASSERT_TRUE(eventually([&] {
    auto p = (*again)->peers();
    return p.size() == 1 && p[0].snapshotDone;
  }));
  v = seen();
  ASSERT_EQ(v.size(), 9u);
  EXPECT_EQ(v[6].request.workload.uid, "snap-a");
  EXPECT_NE(v[6].connection, v[0].connection);
  EXPECT_FALSE(v[6].afterSnapshot);
}

}  // namespace
}  // namespace sluice::zds
