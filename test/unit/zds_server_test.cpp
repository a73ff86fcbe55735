// zds::Server (the node agent's side of ZDS) against scripted fake ztunnels:
// raw SOCK_SEQPACKET sockets in the test that say exactly what each test
// needs, including everything a misbehaving peer can do. Pods' namespaces
// are stood in for by memfds (each has its own (st_dev, st_ino), which is
// what travels and what ztunnel compares); test/netns/zds_test.cpp does the
// same with real network namespaces.
//
//   test thread(s) --add/del--> zds::Server --SEQPACKET--> FakeZtunnel (test)
//                               listening on /tmp/sluice-zds-XXXX/zds.sock
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "test/common/tempdir.h"
#include "test/common/zds_peers.h"
#include "userspace/agent/metrics.h"
#include "userspace/agent/zds/server.h"
#include "userspace/agent/zds/wire.h"

namespace sluice::zds {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

using NetnsId = std::pair<dev_t, ino_t>;
using test::eventually;
using test::FakeZtunnel;
using test::threadCount;

NetnsId idOf(int fd) { return test::fileIdOf(fd); }

/// A stand-in for a pod's netns fd: a memfd has an inode of its own.
Fd podFd(const std::string& name) { return Fd(::memfd_create(name.c_str(), MFD_CLOEXEC)); }

WorkloadInfo pod(const std::string& uid) { return {uid, "name-" + uid, "ns-" + uid, "sa-" + uid}; }

size_t openFds() { return test::openFdCount(); }

/// Short deadlines, so failure paths take milliseconds.
ServerOptions shortOptions(const std::string& path) { return test::testServerOptions(path, 200ms); }

/// A snapshot of one pod @p uid with its own (memfd) namespace.
std::function<std::vector<SnapshotEntry>()> snapshotOf(const std::string& uid) {
  return [uid] {
    std::vector<SnapshotEntry> v;
    v.push_back({pod(uid), podFd(uid)});
    return v;
  };
}

class ZdsServer : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }

  std::unique_ptr<Server> startServer(ServerOptions o) {
    o.observer = &counts_;
    auto s = Server::start(std::move(o));
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<Server> startServer() { return startServer(shortOptions(path())); }
  std::string path() const { return dir_.file("zds.sock"); }

  /// add() on another thread: it returns only once the fake ztunnel acked.
  static std::future<Status> addAsync(Server& server, const std::string& uid, int fd) {
    return std::async(std::launch::async, [&server, uid, fd] { return server.add(pod(uid), fd); });
  }

  std::string metrics(const Server& s) {
    std::string out;
    counts_.render(out, s.peers().size());
    return out;
  }

  TempDir dir_{"zds"};
  sluice::agent::ZdsMetrics counts_;  ///< what the server counts, as the agent renders it
};

// ---- Hello -------------------------------------------------------------------------

TEST_F(ZdsServer, SilentPeerIsDroppedAtTheHelloDeadline) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel silent(path());
  ASSERT_TRUE(silent.ok());
  EXPECT_TRUE(silent.closedByServer());
  EXPECT_TRUE(server->peers().empty());
  // The server still serves the next one.
  FakeZtunnel good(path());
  ASSERT_TRUE(good.handshake().ok());
  EXPECT_EQ(server->peers().size(), 1u);
  auto m = metrics(*server);
  EXPECT_NE(m.find("sluice_ztunnel_dropped_total{reason=\"hello_timeout\"} 1\n"), std::string::npos) << m;
}

TEST_F(ZdsServer, AnythingButAV1HelloDropsTheConnection) {
  auto server = startServer();
  ASSERT_TRUE(server);
  struct Case {
    const char* what;
    std::string bytes;
    bool withFd;
  };
  std::vector<Case> cases = {
      {"an ack instead", std::string("\x0a\x00", 2), false},
      {"version 2", std::string("\x08\x02", 2), false},
      {"garbage", std::string("\xff\xff\xff", 3), false},
      {"a V1 hello with an fd", std::string("\x08\x01", 2), true},
  };
  for (const auto& c : cases) {
    FakeZtunnel peer(path());
    ASSERT_TRUE(peer.ok());
    Fd extra = podFd("extra");
    ASSERT_TRUE(peer.sendRaw(c.bytes, c.withFd ? std::vector<int>{extra.get()} : std::vector<int>{})) << c.what;
    EXPECT_TRUE(peer.closedByServer()) << c.what;
  }
  EXPECT_TRUE(server->peers().empty());
}

// ---- Snapshot ----------------------------------------------------------------------

TEST_F(ZdsServer, SnapshotSendsEveryPodInOrderWithItsFdThenSnapshotSent) {
  Fd a = podFd("a"), b = podFd("b");
  NetnsId idA = idOf(a.get()), idB = idOf(b.get());
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> acks;
  auto o = shortOptions(path());
  o.snapshot = [&] {
    std::vector<SnapshotEntry> v;
    v.push_back({pod("u-a"), Fd(::dup(a.get()))});
    v.push_back({pod("u-keep"), Fd()});  // netns could not be opened: Keep
    v.push_back({pod("u-b"), Fd(::dup(b.get()))});
    return v;
  };
  o.onSnapshotAck = [&](const std::string& uid, const std::string& error) {
    std::lock_guard lock(mu);
    acks.emplace_back(uid, error);
  };
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  auto snap = peer.snapshot({{"u-b", "failure to start proxy : boom"}});
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  ASSERT_EQ(snap->size(), 3u);

  const test::ReceivedRequest& ra = (*snap)[0];
  EXPECT_EQ(ra.request.type, RequestType::Add);
  EXPECT_TRUE(ra.request.hasWorkloadInfo);
  EXPECT_EQ(ra.request.workload.uid, "u-a");
  EXPECT_EQ(ra.request.workload.name, "name-u-a");
  EXPECT_EQ(ra.request.workload.ns, "ns-u-a");
  EXPECT_EQ(ra.request.workload.serviceAccount, "sa-u-a");
  ASSERT_EQ(ra.fds.size(), 1u);
  EXPECT_EQ(idOf(ra.fds[0].get()), idA);

  const test::ReceivedRequest& rk = (*snap)[1];
  EXPECT_EQ(rk.request.type, RequestType::Keep);
  EXPECT_EQ(rk.request.workload.uid, "u-keep");
  EXPECT_TRUE(rk.fds.empty());

  const test::ReceivedRequest& rb = (*snap)[2];
  EXPECT_EQ(rb.request.type, RequestType::Add);
  EXPECT_EQ(rb.request.workload.uid, "u-b");
  ASSERT_EQ(rb.fds.size(), 1u);
  EXPECT_EQ(idOf(rb.fds[0].get()), idB);

  // Every snapshot ack reaches the owner, error text included, in order.
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return acks.size() == 3;
  }));
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(acks[0], std::make_pair(std::string("u-a"), std::string("")));
    EXPECT_EQ(acks[1], std::make_pair(std::string("u-keep"), std::string("")));
    EXPECT_EQ(acks[2], std::make_pair(std::string("u-b"), std::string("failure to start proxy : boom")));
  }
  // An error ack in the snapshot is no reason to drop the connection.
  ASSERT_TRUE(eventually([&] { return server->peers().size() == 1 && server->peers()[0].snapshotDone; }));
  auto m = metrics(*server);
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"add\",result=\"ok\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"add\",result=\"error\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"keep\",result=\"ok\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"snapshot_sent\",result=\"ok\"} 1\n"), std::string::npos) << m;
}

TEST_F(ZdsServer, SnapshotEntryWithABadFdIsReportedAndSkipped) {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> acks;
  auto o = shortOptions(path());
  o.snapshot = [] {
    std::vector<SnapshotEntry> v;
    v.push_back({pod("u-bad"), Fd(100000)});  // not an open fd
    v.push_back({pod("u-good"), podFd("p")});
    return v;
  };
  o.onSnapshotAck = [&](const std::string& uid, const std::string& error) {
    std::lock_guard lock(mu);
    acks.emplace_back(uid, error);
  };
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  auto snap = peer.snapshot();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  ASSERT_EQ(snap->size(), 1u);
  EXPECT_EQ((*snap)[0].request.workload.uid, "u-good");
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return acks.size() == 2;
  }));
  std::lock_guard lock(mu);
  EXPECT_EQ(acks[0], std::make_pair(std::string("u-bad"), std::string("netns fd 100000: sendmsg: Bad file descriptor")));
  EXPECT_EQ(acks[1], std::make_pair(std::string("u-good"), std::string("")));
}

TEST_F(ZdsServer, EmptySnapshotIsJustSnapshotSent) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  auto r = peer.request();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->request.type, RequestType::SnapshotSent);
  EXPECT_TRUE(r->fds.empty());
}

TEST_F(ZdsServer, EachConnectionGetsAFreshSnapshot) {
  std::atomic<int> calls{0};
  auto o = shortOptions(path());
  o.snapshot = [&] {
    int n = ++calls;
    std::vector<SnapshotEntry> v;
    for (int i = 0; i < n; ++i) v.push_back({pod("u" + std::to_string(i)), podFd("p")});
    return v;
  };
  auto server = startServer(o);
  ASSERT_TRUE(server);
  {
    FakeZtunnel first(path());
    auto s = first.handshake();
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->size(), 1u);
  }
  // The reconnecting ztunnel gets the pods as they are now.
  FakeZtunnel again(path());
  auto s = again.handshake();
  ASSERT_TRUE(s.ok()) << s.error().message;
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[1].request.workload.uid, "u1");
}

TEST_F(ZdsServer, MisbehaviourDuringTheSnapshotDropsTheConnection) {
  auto o = shortOptions(path());
  o.snapshot = snapshotOf("u1");
  auto server = startServer(o);
  ASSERT_TRUE(server);
  for (bool garbage : {false, true}) {
    SCOPED_TRACE(garbage ? "garbage instead of the ack" : "no ack (silence past the deadline)");
    FakeZtunnel peer(path());
    ASSERT_TRUE(peer.hello());
    ASSERT_TRUE(peer.request().ok());
    if (garbage) {
      ASSERT_TRUE(peer.sendRaw(std::string("\xde\xad", 2)));
    }
    EXPECT_TRUE(peer.closedByServer());
    EXPECT_TRUE(eventually([&] { return server->peers().empty(); }));
  }
}

// ---- Add / Del ---------------------------------------------------------------------

TEST_F(ZdsServer, AddSendsTheFdAndWaitsForTheAck) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u1", ns.get());
  auto r = peer.request();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->request.type, RequestType::Add);
  EXPECT_EQ(r->request.workload.uid, "u1");
  EXPECT_EQ(r->request.workload.name, "name-u1");
  ASSERT_EQ(r->fds.size(), 1u);
  EXPECT_EQ(idOf(r->fds[0].get()), idOf(ns.get()));
  // Not answered yet: add() is still waiting.
  EXPECT_EQ(f.wait_for(50ms), std::future_status::timeout);
  ASSERT_TRUE(peer.ack());
  Status st = f.get();
  EXPECT_TRUE(st.ok()) << st.error().message;

  auto d = std::async(std::launch::async, [&] { return server->del("u1"); });
  auto rd = peer.request();
  ASSERT_TRUE(rd.ok()) << rd.error().message;
  EXPECT_EQ(rd->request.type, RequestType::Del);
  EXPECT_EQ(rd->request.workload.uid, "u1");
  EXPECT_TRUE(rd->fds.empty());
  ASSERT_TRUE(peer.ack("ignored: no such pod"));
  Status ds = d.get();
  EXPECT_TRUE(ds.ok()) << ds.error().message;  // a Del's ack text is ignored

  auto m = metrics(*server);
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"add\",result=\"ok\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"del\",result=\"error\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_ack_duration_seconds_count 3\n"), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE sluice_ztunnel_ack_duration_seconds histogram\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_connections 1\n"), std::string::npos) << m;
}

TEST_F(ZdsServer, StrictlyOneRequestThenOneAck) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  Fd a = podFd("a"), b = podFd("b");
  auto fa = addAsync(*server, "u-a", a.get());
  auto fb = addAsync(*server, "u-b", b.get());
  auto first = peer.request();
  ASSERT_TRUE(first.ok()) << first.error().message;
  // The second request waits for the first one's ack.
  auto early = peer.request(100ms);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code, ETIMEDOUT);
  ASSERT_TRUE(peer.ack());
  auto second = peer.request();
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_NE(first->request.workload.uid, second->request.workload.uid);
  ASSERT_TRUE(peer.ack());
  EXPECT_TRUE(fa.get().ok());
  EXPECT_TRUE(fb.get().ok());
}

TEST_F(ZdsServer, ErrorAckFailsTheAddWithZtunnelsText) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u1", ns.get());
  ASSERT_TRUE(peer.request().ok());
  ASSERT_TRUE(peer.ack("failure to start proxy : address in use"));
  Status st = f.get();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EPROTO);
  EXPECT_EQ(st.error().message,
            "ztunnel refused pod ns-u1/name-u1 (uid u1) on connection 1: failure to start proxy : address in use");
  // The connection stays: the next add goes through.
  auto g = addAsync(*server, "u2", ns.get());
  ASSERT_TRUE(peer.request().ok());
  ASSERT_TRUE(peer.ack());
  EXPECT_TRUE(g.get().ok());
}

TEST_F(ZdsServer, NoConnectionAddFailsRetryablyDelSucceeds) {
  auto server = startServer();
  ASSERT_TRUE(server);
  Fd ns = podFd("pod");
  Status st = server->add(pod("u1"), ns.get());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EAGAIN);
  EXPECT_EQ(st.error().message, "no ztunnel connection");
  Status d = server->del("u1");
  EXPECT_TRUE(d.ok()) << d.error().message;
  auto m = metrics(*server);
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"add\",result=\"no_connection\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"del\",result=\"no_connection\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_connections 0\n"), std::string::npos) << m;

  Status bad = server->add(pod("u1"), -1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EINVAL);
  EXPECT_EQ(bad.error().message, "zds add u1: no netns fd");
}

TEST_F(ZdsServer, AckTimeoutFailsTheAddAndDropsTheConnection) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u1", ns.get());
  ASSERT_TRUE(peer.request().ok());
  Status st = f.get();  // never acked
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ETIMEDOUT);
  EXPECT_EQ(st.error().message,
            "ztunnel did not answer the add of pod ns-u1/name-u1 (uid u1) on connection 1: no ack within 200 ms "
            "(connection dropped)");
  EXPECT_TRUE(peer.closedByServer());
  EXPECT_TRUE(server->peers().empty());
  auto m = metrics(*server);
  EXPECT_NE(m.find("sluice_ztunnel_requests_total{type=\"add\",result=\"timeout\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("sluice_ztunnel_dropped_total{reason=\"deadline\"} 1\n"), std::string::npos) << m;
}

TEST_F(ZdsServer, WriteTimeoutWhenZtunnelStopsReading) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  // Shrink our receive queue so the server's writes soon find no room, then
  // never read: dels pile up until a write misses its deadline.
  int small = 1;
  ::setsockopt(peer.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  Status last;
  for (int i = 0; i < 5000 && last.ok(); ++i) {
    // Each del needs an ack; send acks without reading the requests.
    ASSERT_TRUE(peer.ack());
    last = server->del("u" + std::to_string(i));
  }
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.error().code, ETIMEDOUT) << last.error().message;
  EXPECT_NE(last.error().message.find("could not write within 200 ms"), std::string::npos) << last.error().message;
  EXPECT_TRUE(eventually([&] { return server->peers().empty(); }));
}

// ---- Several connections --------------------------------------------------------

TEST_F(ZdsServer, AddsGoToTheNewestDelsToAllAndFallBackWhenTheNewestLeaves) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel older(path());
  ASSERT_TRUE(older.handshake().ok());
  FakeZtunnel newer(path());
  ASSERT_TRUE(newer.handshake().ok());
  auto peers = server->peers();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_LT(peers[0].id, peers[1].id);  // newest last
  EXPECT_EQ(peers[1].pid, ::getpid());
  EXPECT_EQ(peers[1].uid, ::getuid());

  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u1", ns.get());
  auto r = newer.request();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->request.type, RequestType::Add);
  ASSERT_TRUE(newer.ack());
  EXPECT_TRUE(f.get().ok());
  // The older one saw nothing.
  EXPECT_EQ(older.request(50ms).error().code, ETIMEDOUT);

  // A del goes to both, one after the other, oldest first.
  auto d = std::async(std::launch::async, [&] { return server->del("u1"); });
  auto ro = older.request();
  ASSERT_TRUE(ro.ok()) << ro.error().message;
  EXPECT_EQ(ro->request.type, RequestType::Del);
  EXPECT_EQ(newer.request(50ms).error().code, ETIMEDOUT);  // not before the older one acked
  ASSERT_TRUE(older.ack());
  auto rn = newer.request();
  ASSERT_TRUE(rn.ok()) << rn.error().message;
  EXPECT_EQ(rn->request.type, RequestType::Del);
  EXPECT_EQ(rn->request.workload.uid, "u1");
  ASSERT_TRUE(newer.ack());
  EXPECT_TRUE(d.get().ok());

  // The newest leaves (before any idle check noticed): the add finds it
  // broken and goes to the older one.
  newer.close();
  auto g = addAsync(*server, "u2", ns.get());
  auto r2 = older.request();
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_EQ(r2->request.workload.uid, "u2");
  ASSERT_TRUE(older.ack());
  Status st = g.get();
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_TRUE(eventually([&] { return server->peers().size() == 1; }));
}

TEST_F(ZdsServer, AddIssuedDuringTheSnapshotIsQueuedBehindIt) {
  auto o = shortOptions(path());
  o.ackTimeout = 2s;
  o.snapshot = snapshotOf("old");
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  auto first = peer.request();  // the snapshot's Add, not acked yet
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->request.workload.uid, "old");
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "new", ns.get());
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(peer.ack());
  auto snapSent = peer.request();
  ASSERT_TRUE(snapSent.ok());
  EXPECT_EQ(snapSent->request.type, RequestType::SnapshotSent);
  ASSERT_TRUE(peer.ack());
  auto queued = peer.request();
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queued->request.type, RequestType::Add);
  EXPECT_EQ(queued->request.workload.uid, "new");
  ASSERT_TRUE(peer.ack());
  EXPECT_TRUE(f.get().ok());
}

// The agent's snapshot callback takes the lock its add path holds while it
// calls add(): add() must not wait for a connection whose callback runs.
TEST_F(ZdsServer, AddNeverWaitsForASnapshotCallbackThatNeedsTheCallersLock) {
  std::mutex agentLock;
  std::atomic<bool> inCallback{false};
  auto o = shortOptions(path());
  std::atomic<int> calls{0};
  o.snapshot = [&] {
    if (++calls == 1) return std::vector<SnapshotEntry>{};  // the older connection
    inCallback = true;
    std::lock_guard lock(agentLock);  // blocks while the "agent" is inside add()
    std::vector<SnapshotEntry> v;
    return v;  // the registry as read: without "u1"
  };
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel older(path());
  ASSERT_TRUE(older.handshake().ok());

  Fd ns = podFd("pod");
  std::unique_lock held(agentLock);
  FakeZtunnel newer(path());
  ASSERT_TRUE(newer.hello());
  ASSERT_TRUE(eventually([&] { return inCallback.load(); }));
  // The newest is preparing its snapshot: the add goes to the older one.
  auto f = addAsync(*server, "u1", ns.get());
  auto r = older.request();
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(older.ack());
  Status st = f.get();
  EXPECT_TRUE(st.ok()) << st.error().message;
  held.unlock();
  // The newer connection's snapshot was read without u1: it gets the Add
  // after its snapshot.
  auto snap = newer.snapshot();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  EXPECT_TRUE(snap->empty());
  auto replay = newer.request();
  ASSERT_TRUE(replay.ok()) << replay.error().message;
  EXPECT_EQ(replay->request.type, RequestType::Add);
  EXPECT_EQ(replay->request.workload.uid, "u1");
  ASSERT_EQ(replay->fds.size(), 1u);
  EXPECT_EQ(idOf(replay->fds[0].get()), idOf(ns.get()));
  ASSERT_TRUE(newer.ack());
}

TEST_F(ZdsServer, AddWithOnlyAPreparingConnectionFailsRetryably) {
  std::mutex agentLock;
  std::atomic<bool> inCallback{false};
  auto o = shortOptions(path());
  o.snapshot = [&] {
    inCallback = true;
    std::lock_guard lock(agentLock);
    return std::vector<SnapshotEntry>{};
  };
  auto server = startServer(o);
  ASSERT_TRUE(server);
  std::unique_lock held(agentLock);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  ASSERT_TRUE(eventually([&] { return inCallback.load(); }));
  Fd ns = podFd("pod");
  Status st = server->add(pod("u1"), ns.get());  // with the "agent lock" held: must return
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EAGAIN);
  EXPECT_EQ(st.error().message,
            "no ztunnel connection ready (a ztunnel just connected; its snapshot is being prepared)");
  // A del neither waits: the preparing connection gets it after its snapshot.
  Status d = server->del("u0");
  EXPECT_TRUE(d.ok()) << d.error().message;
  held.unlock();
  auto snap = peer.snapshot();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  auto del = peer.request();
  ASSERT_TRUE(del.ok()) << del.error().message;
  EXPECT_EQ(del->request.type, RequestType::Del);
  EXPECT_EQ(del->request.workload.uid, "u0");
  ASSERT_TRUE(peer.ack());
}

TEST_F(ZdsServer, SnapshotAckCallbackNeverBlocksAnAdd) {
  // onSnapshotAck takes the lock the agent holds around add(): the add,
  // queued behind the snapshot, must still complete.
  std::mutex agentLock;
  std::atomic<int> acked{0};
  auto o = shortOptions(path());
  o.ackTimeout = 2s;
  o.snapshot = snapshotOf("s1");
  o.onSnapshotAck = [&](const std::string&, const std::string&) {
    std::lock_guard lock(agentLock);
    ++acked;
  };
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  ASSERT_TRUE(peer.request().ok());  // snapshot's Add
  std::unique_lock held(agentLock);
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u1", ns.get());
  ASSERT_TRUE(peer.ack());
  auto s = peer.request();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->request.type, RequestType::SnapshotSent);
  ASSERT_TRUE(peer.ack());
  auto a = peer.request();
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(peer.ack());
  EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(acked.load(), 0);  // still waiting for the lock
  held.unlock();
  EXPECT_TRUE(eventually([&] { return acked.load() == 1; }));
}

// ---- Idle checks -------------------------------------------------------------------

TEST_F(ZdsServer, IdleCheckNoticesEof) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  ASSERT_EQ(server->peers().size(), 1u);
  peer.close();
  EXPECT_TRUE(eventually([&] { return server->peers().empty(); }));
  auto m = metrics(*server);
  EXPECT_NE(m.find("sluice_ztunnel_connections 0\n"), std::string::npos) << m;
  // Noticed by the keepalive read, with no request pending.
  EXPECT_NE(m.find("sluice_ztunnel_dropped_total{reason=\"keepalive\"} 1\n"), std::string::npos) << m;
}

TEST_F(ZdsServer, IdleConnectionStaysAcrossManyChecks) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  std::this_thread::sleep_for(500ms);  // five idle checks
  EXPECT_EQ(server->peers().size(), 1u);
  EXPECT_EQ(peer.request(10ms).error().code, ETIMEDOUT);  // checks send nothing
}

// ---- Misbehaving peers -----------------------------------------------------------

// Each way of misbehaving loses that connection only: the older, well
// behaved connection serves the next add.
TEST_F(ZdsServer, MisbehavingPeerLosesItsConnectionOthersKeepServing) {
  struct Case {
    const char* what;
    std::function<void(FakeZtunnel&)> answer;  ///< instead of an ack
    int code;
    std::string message;
  };
  Fd extra = podFd("extra");
  std::vector<Case> cases = {
      {"garbage datagram", [](FakeZtunnel& p) { p.sendRaw(std::string("\xff\xff\xff", 3)); }, EPROTO,
       "protocol error: datagram does not parse as WorkloadResponse (ff ff ff)"},
      {"oversize datagram", [](FakeZtunnel& p) { p.sendRaw(std::string(2000, '\x0a')); }, EPROTO,
       "protocol error: truncated message (longer than 1024 bytes)"},
      {"wrong message (a hello)", [](FakeZtunnel& p) { p.sendRaw(std::string("\x08\x01", 2)); }, EPROTO,
       "protocol error: WorkloadResponse without ack (08 01)"},
      {"fd on an ack", [&](FakeZtunnel& p) { p.sendRaw(*encodeAck(""), {extra.get()}); }, EPROTO,
       "protocol error: ack came with 1 fd(s)"},
      {"silence past the deadline", [](FakeZtunnel&) {}, ETIMEDOUT, "no ack within 200 ms"},
  };
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel good(path());
  ASSERT_TRUE(good.handshake().ok());
  Fd ns = podFd("pod");
  size_t before = openFds();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    FakeZtunnel bad(path());
    ASSERT_TRUE(bad.handshake().ok());
    auto f = addAsync(*server, "u1", ns.get());
    auto r = bad.request();
    ASSERT_TRUE(r.ok()) << r.error().message;
    c.answer(bad);
    Status st = f.get();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, c.code);
    EXPECT_NE(st.error().message.find(c.message), std::string::npos) << st.error().message;
    EXPECT_TRUE(bad.closedByServer());
    ASSERT_TRUE(eventually([&] { return server->peers().size() == 1; }));
    // The good one serves the next add.
    auto g = addAsync(*server, "u2", ns.get());
    auto rg = good.request();
    ASSERT_TRUE(rg.ok()) << rg.error().message;
    EXPECT_EQ(rg->request.workload.uid, "u2");
    ASSERT_TRUE(good.ack());
    EXPECT_TRUE(g.get().ok());
  }
  EXPECT_EQ(openFds(), before);
}

TEST_F(ZdsServer, UnsolicitedMessageOnAnIdleConnectionDropsIt) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel good(path());
  ASSERT_TRUE(good.handshake().ok());
  FakeZtunnel chatty(path());
  ASSERT_TRUE(chatty.handshake().ok());
  ASSERT_TRUE(chatty.ack());  // nobody asked
  EXPECT_TRUE(chatty.closedByServer());
  ASSERT_TRUE(eventually([&] { return server->peers().size() == 1; }));
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u1", ns.get());
  ASSERT_TRUE(good.request().ok());
  ASSERT_TRUE(good.ack());
  EXPECT_TRUE(f.get().ok());
}

// ---- Limits (Istio's ztunnelserver.go) --------------------------------------------

/// The value of the metric line starting with @p series ("name{labels}").
uint64_t metricValue(const std::string& text, const std::string& series) {
  auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? UINT64_MAX : std::stoull(text.substr(at + series.size() + 2));
}

// Ten ztunnels connect at once: every connect succeeds at once (they wait
// in the backlog, none is refused), and they are accepted one per interval
// — n accepts take at least n - 1 intervals, a burst of one.
TEST_F(ZdsServer, AcceptsAtMostFiveASecondTheRestWaitInTheBacklog) {
  const auto interval = ServerOptions{}.acceptInterval;
  ASSERT_EQ(interval, 200ms) << "Istio's rate.NewLimiter(5, 1)";
  auto server = startServer();
  ASSERT_TRUE(server);
  auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<FakeZtunnel>> peers;
  for (int i = 0; i < 10; ++i) {
    peers.push_back(std::make_unique<FakeZtunnel>(path()));
    ASSERT_TRUE(peers.back()->ok()) << "connection " << i << " refused";
    ASSERT_TRUE(peers.back()->hello());
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    auto snap = peers[i]->snapshot();
    ASSERT_TRUE(snap.ok()) << "connection " << i << ": " << snap.error().message;
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, 9 * interval);
  EXPECT_EQ(server->peers().size(), 10u);
  auto m = metrics(*server);
  EXPECT_EQ(metricValue(m, "sluice_ztunnel_accepts_total{result=\"served\"}"), 10u) << m;
  EXPECT_EQ(metricValue(m, "sluice_ztunnel_accepts_total{result=\"gone\"}"), 0u) << m;
  EXPECT_GE(metricValue(m, "sluice_ztunnel_accept_throttled_total"), 1u) << m;
}

// A ztunnel reconnecting in a tight loop for three seconds (a crash loop:
// some of its connections give up before they are accepted, some once they
// got the first snapshot message): the server accepts at most at the limit,
// its threads stay within what the limit and the deadlines allow, nothing
// is left once the loop stops, and a well-behaved ztunnel is served after.
TEST_F(ZdsServer, TightReconnectLoopIsAcceptedAtTheLimitAndLeavesNothingBehind) {
  auto o = shortOptions(path());
  o.snapshot = snapshotOf("p1");
  // A served connection lives at most: the hello, then one snapshot Add and
  // SnapshotSent, each written and acked within its deadline.
  const auto lifetime = o.helloTimeout + 2 * (o.writeTimeout + o.ackTimeout);
  const size_t maxConcurrent = 1 + lifetime / o.acceptInterval;
  auto server = startServer(o);
  ASSERT_TRUE(server);
  const size_t fdsBefore = openFds();
  const size_t threadsBefore = threadCount();

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path().c_str(), sizeof(addr.sun_path) - 1);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> connects{0}, backlogFull{0};
  auto loop = [&](bool untilServed) {
    while (!stop) {
      // As ztunnel connects: non-blocking, so a full backlog is EAGAIN.
      Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
        if (errno == EAGAIN) backlogFull++;
        continue;
      }
      connects++;
      test::sendWithFds(s.get(), std::string("\x08\x01", 2));
      if (untilServed) {
        pollfd p{s.get(), POLLIN, 0};
        ::poll(&p, 1, 100);
      }
    }
  };
  const size_t loopThreads = 3;
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> loops;
  loops.emplace_back(loop, false);
  loops.emplace_back(loop, false);
  loops.emplace_back(loop, true);
  size_t maxThreads = 0;
  while (std::chrono::steady_clock::now() - start < 3s) {
    maxThreads = std::max(maxThreads, threadCount() - loopThreads);
    std::this_thread::sleep_for(20ms);
  }
  stop = true;
  for (auto& t : loops) t.join();
  EXPECT_TRUE(eventually([&] { return server->peers().empty() && threadCount() == threadsBefore && openFds() == fdsBefore; }, 10s))
      << "threads " << threadCount() << " (before " << threadsBefore << "), fds " << openFds() << " (before "
      << fdsBefore << ")";
  auto elapsed = std::chrono::steady_clock::now() - start;
  auto m = metrics(*server);
  const uint64_t served = metricValue(m, "sluice_ztunnel_accepts_total{result=\"served\"}");
  const uint64_t gone = metricValue(m, "sluice_ztunnel_accepts_total{result=\"gone\"}");
  // The limit: one accept per interval, plus the first.
  EXPECT_LE(served, 1 + static_cast<uint64_t>(elapsed / o.acceptInterval)) << m;
  EXPECT_GE(served, 1u) << m;
  EXPECT_GT(connects.load(), served) << "the loop never outran the limit";
  EXPECT_GE(metricValue(m, "sluice_ztunnel_accept_throttled_total"), 1u) << m;
  EXPECT_LE(maxThreads, threadsBefore + maxConcurrent + 1)
      << "served " << served << ", gone " << gone << ", connects " << connects << ", backlog full " << backlogFull;
  std::cerr << "tight loop: " << connects << " connects (" << backlogFull << " found the backlog full), " << served
            << " served, " << gone << " closed as gone, at most " << maxThreads - threadsBefore
            << " connection threads at once (bound " << maxConcurrent << ")\n";

  // A well-behaved ztunnel now: served as usual.
  FakeZtunnel good(path());
  auto snap = good.handshake();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  ASSERT_EQ(snap->size(), 1u);
  EXPECT_EQ((*snap)[0].request.workload.uid, "p1");
  Fd ns = podFd("pod");
  auto f = addAsync(*server, "u2", ns.get());
  auto r = good.request();
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(good.ack());
  EXPECT_TRUE(f.get().ok());
}

// A ztunnel that says hello, reads the snapshot's first Add and never acks
// it: dropped at the ack deadline. An add made meanwhile (queued behind the
// snapshot) fails retryably, as Istio's agent fails it ("connection closed
// before response received": the pod stays partially enrolled, "pending",
// and is retried).
TEST_F(ZdsServer, PeerThatNeverAcksIsDroppedAtTheDeadlineAndTheAddFailsRetryably) {
  auto o = test::testServerOptions(path(), 1s);
  o.snapshot = snapshotOf("p1");
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.hello());
  auto first = peer.request();
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->request.workload.uid, "p1");
  Fd ns = podFd("pod");
  Status st = server->add(pod("u2"), ns.get());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EAGAIN);
  // Queued behind the snapshot (the usual case), or after the drop when
  // this thread was slower than the deadline.
  EXPECT_EQ(st.error().message.rfind("no ztunnel connection", 0), 0u) << st.error().message;
  EXPECT_TRUE(peer.closedByServer());
  EXPECT_TRUE(server->peers().empty());
  auto m = metrics(*server);
  EXPECT_EQ(metricValue(m, "sluice_ztunnel_dropped_total{reason=\"deadline\"}"), 1u) << m;
  EXPECT_EQ(metricValue(m, "sluice_ztunnel_requests_total{type=\"add\",result=\"timeout\"}"), 1u) << m;
}

// ---- Resources ---------------------------------------------------------------------

TEST_F(ZdsServer, NoFdLeakedAfterAThousandAddDelCycles) {
  // A roomy ack deadline: this counts fds, and on a loaded machine a
  // 200 ms one expires now and then among 2000 round trips.
  auto server = startServer(test::testServerOptions(path(), 5s));
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  std::atomic<bool> stop{false};
  std::thread ztunnel([&] {
    while (!stop) {
      auto r = peer.request(100ms);
      if (!r) continue;
      // Error acks now and then, as a struggling ztunnel would send.
      peer.ack(r->request.workload.uid == "u500" ? "failure to start proxy : busy" : "");
    }  // received fds close here
  });
  Fd ns = podFd("pod");
  size_t before = openFds();
  int failures = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string uid = "u" + std::to_string(i);
    if (!server->add(pod(uid), ns.get()).ok()) ++failures;
    if (!server->del(uid).ok()) ++failures;
  }
  stop = true;
  ztunnel.join();
  EXPECT_EQ(failures, 1);  // u500's error ack
  EXPECT_EQ(openFds(), before);
}

TEST_F(ZdsServer, StopClosesConnectionsAndUnlinksTheSocket) {
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  ASSERT_TRUE(std::filesystem::exists(path()));
  // Whoever connects gets every pod's netns: the socket is root's only.
  struct stat file {};
  ASSERT_EQ(::stat(path().c_str(), &file), 0);
  EXPECT_EQ(file.st_mode & 0777, 0600u);
  EXPECT_TRUE(S_ISSOCK(file.st_mode));
  server->stop();
  EXPECT_TRUE(peer.closedByServer());
  EXPECT_FALSE(std::filesystem::exists(path()));
  Fd ns = podFd("pod");
  Status st = server->add(pod("u1"), ns.get());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EAGAIN);
  EXPECT_EQ(st.error().message, "no ztunnel connection (the zds server is stopping)");
  server->stop();  // idempotent
}

// Another node agent serves the socket (Istio's, or another sluiced):
// without --ztunnel-socket-takeover the agent refuses to start, naming the
// path, and leaves the socket alone (ztunnel stays with the other agent).
TEST_F(ZdsServer, ASocketAnotherAgentServesIsNeverTaken) {
  auto other = startServer();
  ASSERT_TRUE(other);
  auto second = Server::start(shortOptions(path()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, EADDRINUSE);
  EXPECT_EQ(second.error().message,
            "zds: " + path() + " is served by another node agent (Istio's, or another sluiced): refusing to take it "
            "while it answers; stop that agent, or start with --ztunnel-socket-takeover to wait until it stops");
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok()) << "the other agent lost its socket";
  EXPECT_EQ(other->peers().size(), 1u);

  // Any listener counts, not only a ZDS server: a stream socket too.
  other->stop();
  Fd foreign(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(foreign.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(foreign.get(), 4), 0);
  auto third = Server::start(shortOptions(path()));
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, EADDRINUSE);
}

// With the takeover on, the agent waits (saying so) while the other agent
// serves, and listens once it stopped; the old agent's stop leaves the new
// socket in place, and ztunnel, reconnecting, reaches the new agent.
TEST_F(ZdsServer, TakeoverWaitsForTheOtherAgentThenServes) {
  auto old = startServer();
  ASSERT_TRUE(old);
  ServerOptions o = shortOptions(path());
  o.takeOver = true;
  o.takeOverPoll = std::chrono::milliseconds(20);
  auto fresh = startServer(std::move(o));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(fresh->waiting(), "another node agent serves " + path() + ": waiting for it to stop");
  {
    FakeZtunnel early(path());
    ASSERT_TRUE(early.handshake().ok());
    EXPECT_EQ(old->peers().size(), 1u) << "ztunnel must reach the agent that serves the socket";
    EXPECT_EQ(fresh->peers().size(), 0u);
  }
  old->stop();
  for (int i = 0; i < 500 && !fresh->waiting().empty(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(fresh->waiting(), "") << "still waiting after the other agent stopped";
  ASSERT_TRUE(std::filesystem::exists(path())) << "the old agent's stop removed the new agent's socket";
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  EXPECT_EQ(fresh->peers().size(), 1u);
  fresh->stop();
  EXPECT_FALSE(std::filesystem::exists(path()));
}

// Stopped while it still waits: nothing was bound, the other's socket stays.
TEST_F(ZdsServer, TakeoverStoppedWhileWaitingLeavesTheOthersSocket) {
  auto old = startServer();
  ASSERT_TRUE(old);
  ServerOptions o = shortOptions(path());
  o.takeOver = true;
  auto fresh = startServer(std::move(o));
  ASSERT_TRUE(fresh);
  EXPECT_FALSE(fresh->waiting().empty());
  fresh->stop();
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
  EXPECT_EQ(old->peers().size(), 1u);
}

TEST_F(ZdsServer, StartErrors) {
  ASSERT_TRUE(test::writeTextFile(path(), "not a socket"));
  auto notSocket = Server::start(shortOptions(path()));
  ASSERT_FALSE(notSocket.ok());
  EXPECT_EQ(notSocket.error().code, EEXIST);
  EXPECT_EQ(notSocket.error().message, "zds: refusing to replace '" + path() + "': it exists and is not a socket");

  auto tooLong = Server::start(shortOptions("/tmp/" + std::string(120, 'x')));
  ASSERT_FALSE(tooLong.ok());
  EXPECT_EQ(tooLong.error().code, ENAMETOOLONG);
  EXPECT_EQ(tooLong.error().message, "zds: socket path '/tmp/" + std::string(120, 'x') + "' is longer than 107 bytes");

  auto noDir = Server::start(shortOptions(dir_.file("missing/zds.sock")));
  ASSERT_FALSE(noDir.ok());
  EXPECT_EQ(noDir.error().message, "zds: bind " + dir_.file("missing/zds.sock") + ": No such file or directory");

  auto empty = Server::start(shortOptions(""));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message, "zds: empty socket path");
}

TEST_F(ZdsServer, StaleSocketFileIsReplaced) {
  {
    // A socket file left by a crashed agent: bound, then its owner gone.
    Fd stale(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path().c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(stale.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ASSERT_TRUE(std::filesystem::exists(path()));
  auto server = startServer();
  ASSERT_TRUE(server);
  FakeZtunnel peer(path());
  ASSERT_TRUE(peer.handshake().ok());
}

// With the protocol's real deadlines (5 s): a ztunnel that connects and says
// nothing is dropped after five seconds, not before.
TEST_F(ZdsServer, DefaultDeadlinesAreTheProtocols) {
  ServerOptions o;
  EXPECT_EQ(o.helloTimeout, 5000ms);
  EXPECT_EQ(o.writeTimeout, 5000ms);
  EXPECT_EQ(o.ackTimeout, 5000ms);
  EXPECT_EQ(o.idleCheckInterval, 5000ms);
  o.socketPath = path();
  auto server = startServer(o);
  ASSERT_TRUE(server);
  FakeZtunnel silent(path());
  ASSERT_TRUE(silent.ok());
  EXPECT_FALSE(silent.closedByServer(4500ms));
  EXPECT_TRUE(silent.closedByServer(5000ms));
}

}  // namespace
}  // namespace sluice::zds
