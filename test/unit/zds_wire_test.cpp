// The ZDS wire (userspace/agent/zds/wire.h): the byte vectors of the
// protocol both ways, the rule that no 0-byte message is ever produced, parse
// errors, and the datagram framing over a real SOCK_SEQPACKET socketpair
// (truncation, fds, deadlines).
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/fd.h"
#include "test/common/zds_peers.h"
#include "userspace/agent/zds/wire.h"
#include "userspace/agent/zds/zds.pb.h"

namespace sluice::zds {
namespace {

using namespace std::chrono_literals;
namespace pb = istio::workload::zds;

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s += static_cast<char>(c);
  return s;
}

Request add(const std::string& uid, const std::string& name, const std::string& ns, const std::string& sa) {
  Request r;
  r.type = RequestType::Add;
  r.workload = {uid, name, ns, sa};
  return r;
}

Request withUid(RequestType type, const std::string& uid) {
  Request r;
  r.type = type;
  r.workload.uid = uid;
  return r;
}

// ---- Byte vectors, encoding --------------------------------------------------------

TEST(ZdsWire, HelloEncodesToTheSpecBytes) {
  auto b = encodeHello();
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(hex(*b), "08 01");
}

TEST(ZdsWire, RequestsEncodeToTheSpecBytes) {
  struct Case {
    const char* what;
    Request request;
    std::string want;
  };
  std::vector<Case> cases = {
      {"snapshot_sent", Request{}, "1a 00"},
      {"keep u1", withUid(RequestType::Keep, "u1"), "2a 04 0a 02 75 31"},
      {"del u1 (uid is field 2)", withUid(RequestType::Del, "u1"), "12 04 12 02 75 31"},
      {"add u1 n/ns/sa", add("u1", "n", "ns", "sa"), "0a 11 0a 02 75 31 12 0b 0a 01 6e 12 02 6e 73 1a 02 73 61"},
  };
  for (const auto& c : cases) {
    auto b = encodeRequest(c.request);
    ASSERT_TRUE(b.ok()) << c.what << ": " << b.error().message;
    EXPECT_EQ(hex(*b), c.want) << c.what;
  }
}

TEST(ZdsWire, AcksEncodeToTheSpecBytes) {
  auto ok = encodeAck("");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(hex(*ok), "0a 00");
  auto boom = encodeAck("boom");
  ASSERT_TRUE(boom.ok()) << boom.error().message;
  EXPECT_EQ(hex(*boom), "0a 06 0a 04 62 6f 6f 6d");
}

TEST(ZdsWire, AddAlwaysCarriesWorkloadInfoEvenWhenEmpty) {
  // ztunnel rejects an Add without workload_info; an empty one is still sent.
  auto b = encodeRequest(add("u1", "", "", ""));
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(hex(*b), "0a 06 0a 02 75 31 12 00");
}

// ---- No 0-byte message -----------------------------------------------------------

TEST(ZdsWire, NoZeroByteMessageIsEverProduced) {
  // The smallest messages of each kind are still at least 2 bytes.
  EXPECT_EQ(encodeRequest(Request{})->size(), 2u);           // snapshot_sent
  EXPECT_EQ(encodeAck("")->size(), 2u);                       // success ack
  EXPECT_EQ(encodeRequest(withUid(RequestType::Del, ""))->size(), 2u);
  EXPECT_EQ(encodeRequest(withUid(RequestType::Keep, ""))->size(), 2u);
  // A bare message that encodes to nothing is refused, not sent.
  std::vector<std::unique_ptr<google::protobuf::MessageLite>> empties;
  empties.push_back(std::make_unique<pb::Ack>());
  empties.push_back(std::make_unique<pb::SnapshotSent>());
  empties.push_back(std::make_unique<pb::ZdsHello>());
  empties.push_back(std::make_unique<pb::WorkloadResponse>());
  empties.push_back(std::make_unique<pb::WorkloadRequest>());
  for (const auto& m : empties) {
    auto b = encodeMessage(*m);
    ASSERT_FALSE(b.ok()) << m->GetTypeName() << " produced " << hex(*b);
    EXPECT_EQ(b.error().code, EPROTO);
    EXPECT_EQ(b.error().message, "refusing to send " + m->GetTypeName() +
                                     " as a 0-byte datagram (the peer would read it as end of connection)");
  }
}

TEST(ZdsWire, OversizeMessageIsRefused) {
  auto b = encodeRequest(add("u1", std::string(1100, 'x'), "ns", "sa"));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, EMSGSIZE);
  EXPECT_EQ(b.error().message,
            "istio.workload.zds.WorkloadRequest encodes to 1121 bytes, more than the peer reads (1024)");
}

// ---- Decoding ----------------------------------------------------------------------

TEST(ZdsWire, SpecBytesDecode) {
  EXPECT_TRUE(decodeHello(bytes({0x08, 0x01})).ok());

  auto snap = decodeRequest(bytes({0x1a, 0x00}));
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  EXPECT_EQ(snap->type, RequestType::SnapshotSent);

  auto keep = decodeRequest(bytes({0x2a, 0x04, 0x0a, 0x02, 0x75, 0x31}));
  ASSERT_TRUE(keep.ok()) << keep.error().message;
  EXPECT_EQ(keep->type, RequestType::Keep);
  EXPECT_EQ(keep->workload.uid, "u1");

  auto del = decodeRequest(bytes({0x12, 0x04, 0x12, 0x02, 0x75, 0x31}));
  ASSERT_TRUE(del.ok()) << del.error().message;
  EXPECT_EQ(del->type, RequestType::Del);
  EXPECT_EQ(del->workload.uid, "u1");

  auto a = decodeRequest(
      bytes({0x0a, 0x11, 0x0a, 0x02, 0x75, 0x31, 0x12, 0x0b, 0x0a, 0x01, 0x6e, 0x12, 0x02, 0x6e, 0x73, 0x1a, 0x02, 0x73, 0x61}));
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->type, RequestType::Add);
  EXPECT_TRUE(a->hasWorkloadInfo);
  EXPECT_EQ(a->workload.uid, "u1");
  EXPECT_EQ(a->workload.name, "n");
  EXPECT_EQ(a->workload.ns, "ns");
  EXPECT_EQ(a->workload.serviceAccount, "sa");

  auto ok = decodeAck(bytes({0x0a, 0x00}));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(*ok, "");
  auto boom = decodeAck(bytes({0x0a, 0x06, 0x0a, 0x04, 0x62, 0x6f, 0x6f, 0x6d}));
  ASSERT_TRUE(boom.ok()) << boom.error().message;
  EXPECT_EQ(*boom, "boom");
}

TEST(ZdsWire, AddWithoutWorkloadInfoIsReported) {
  // add{uid "u1"} only: parses, but ztunnel's side must see it lacks the info.
  auto a = decodeRequest(bytes({0x0a, 0x04, 0x0a, 0x02, 0x75, 0x31}));
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->type, RequestType::Add);
  EXPECT_FALSE(a->hasWorkloadInfo);
}

TEST(ZdsWire, OldDelFieldNumberIsNotAUid) {
  // del{field 1 "u1"}: the uid is field 2, so this Del names no pod.
  auto d = decodeRequest(bytes({0x12, 0x04, 0x0a, 0x02, 0x75, 0x31}));
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->type, RequestType::Del);
  EXPECT_EQ(d->workload.uid, "");
}

TEST(ZdsWire, ParseErrors) {
  // Garbage: a length running past the end.
  auto garbage = decodeRequest(bytes({0x0a, 0x7f, 0x01}));
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.error().code, EPROTO);
  EXPECT_EQ(garbage.error().message, "datagram does not parse as WorkloadRequest (0a 7f 01)");

  auto badAck = decodeAck(bytes({0xff, 0xff, 0xff}));
  ASSERT_FALSE(badAck.ok());
  EXPECT_EQ(badAck.error().message, "datagram does not parse as WorkloadResponse (ff ff ff)");

  // Wrong type: a hello where an ack belongs has no ack in it.
  auto helloAsAck = decodeAck(bytes({0x08, 0x01}));
  ASSERT_FALSE(helloAsAck.ok());
  EXPECT_EQ(helloAsAck.error().message, "WorkloadResponse without ack (08 01)");

  // Wrong type: an ack where a hello belongs is no V1 hello.
  auto ackAsHello = decodeHello(bytes({0x0a, 0x00}));
  ASSERT_FALSE(ackAsHello.ok());
  EXPECT_EQ(ackAsHello.error().message, "hello with unsupported version 0 (want 1, V1) (0a 00)");

  auto v2 = decodeHello(bytes({0x08, 0x02}));
  ASSERT_FALSE(v2.ok());
  EXPECT_EQ(v2.error().message, "hello with unsupported version 2 (want 1, V1) (08 02)");

  auto helloGarbage = decodeHello(bytes({0x08}));
  ASSERT_FALSE(helloGarbage.ok());
  EXPECT_EQ(helloGarbage.error().message, "hello does not parse as ZdsHello (08)");

  // Wrong type: an ack where a request belongs parses as an Add with no
  // workload_info, which the receiving side then rejects.
  auto ackAsRequest = decodeRequest(bytes({0x0a, 0x00}));
  ASSERT_TRUE(ackAsRequest.ok());
  EXPECT_FALSE(ackAsRequest->hasWorkloadInfo);

  // A request with only an unknown field has no payload.
  auto unknown = decodeRequest(bytes({0x20, 0x01}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().message, "WorkloadRequest without payload (20 01)");
}

// ---- Datagrams -------------------------------------------------------------------

/// A connected SOCK_SEQPACKET pair.
struct Pair {
  Fd a, b;
  Pair() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0) {
      a = Fd(fds[0]);
      b = Fd(fds[1]);
    }
  }
};

bool sendRaw(int sock, const std::string& data, const std::vector<int>& fds) {
  return test::sendWithFds(sock, data, fds);
}
std::pair<dev_t, ino_t> idOf(int fd) { return test::fileIdOf(fd); }
size_t openFds() { return test::openFdCount(); }

TEST(ZdsDatagram, MessageAndFdArriveTogether) {
  Pair p;
  ASSERT_TRUE(p.a.valid());
  Fd ns(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(ns.valid());
  auto b = encodeRequest(add("u1", "n", "ns", "sa"));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(sendDatagram(p.a.get(), *b, ns.get(), after(1s)).ok());
  auto d = receiveDatagram(p.b.get(), after(1s));
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->bytes, *b);
  ASSERT_EQ(d->fds.size(), 1u);
  EXPECT_EQ(idOf(d->fds[0].get()), idOf(ns.get()));
  EXPECT_TRUE(::fcntl(d->fds[0].get(), F_GETFD) & FD_CLOEXEC);
}

TEST(ZdsDatagram, EmptyAndOversizeAreNotSent) {
  Pair p;
  Status empty = sendDatagram(p.a.get(), "", -1, after(1s));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code, EPROTO);
  EXPECT_EQ(empty.error().message,
            "refusing to send a 0-byte datagram (the peer would read it as end of connection)");
  Status big = sendDatagram(p.a.get(), std::string(1025, 'x'), -1, after(1s));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, EMSGSIZE);
  EXPECT_EQ(big.error().message, "refusing to send a 1025-byte datagram (the peer reads 1024)");
  // Nothing reached the peer.
  auto d = receiveDatagram(p.b.get(), after(50ms));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ETIMEDOUT);
}

TEST(ZdsDatagram, TruncatedMessageIsAnErrorAndItsFdsAreClosed) {
  Pair p;
  Fd ns(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  size_t before = openFds();
  ASSERT_TRUE(sendRaw(p.a.get(), std::string(1025, '\x0a'), {ns.get()}));
  auto d = receiveDatagram(p.b.get(), after(1s));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, EPROTO);
  EXPECT_EQ(d.error().message, "truncated message (longer than 1024 bytes)");
  EXPECT_EQ(openFds(), before);
  // Exactly 1024 bytes is not truncated.
  ASSERT_TRUE(sendRaw(p.a.get(), std::string(1024, 'x'), {}));
  auto full = receiveDatagram(p.b.get(), after(1s));
  ASSERT_TRUE(full.ok()) << full.error().message;
  EXPECT_EQ(full->bytes.size(), 1024u);
}

TEST(ZdsDatagram, TruncatedAncillaryDataIsAnErrorAndNoFdLeaks) {
  Pair p;
  std::vector<Fd> many;
  std::vector<int> raw;
  for (int i = 0; i < 12; ++i) {
    many.emplace_back(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    raw.push_back(many.back().get());
  }
  size_t before = openFds();
  ASSERT_TRUE(sendRaw(p.a.get(), bytes({0x1a, 0x00}), raw));
  auto d = receiveDatagram(p.b.get(), after(1s));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, EPROTO);
  EXPECT_EQ(d.error().message, "truncated ancillary data");
  EXPECT_EQ(openFds(), before);
}

TEST(ZdsDatagram, SeveralFdsAreAllReceivedAndOwned) {
  Pair p;
  Fd a(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  Fd b(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  size_t before = openFds();
  {
    ASSERT_TRUE(sendRaw(p.a.get(), bytes({0x1a, 0x00}), {a.get(), b.get()}));
    auto d = receiveDatagram(p.b.get(), after(1s));
    ASSERT_TRUE(d.ok()) << d.error().message;
    ASSERT_EQ(d->fds.size(), 2u);
    EXPECT_EQ(idOf(d->fds[0].get()), idOf(a.get()));
    EXPECT_EQ(idOf(d->fds[1].get()), idOf(b.get()));
  }
  EXPECT_EQ(openFds(), before);
}

TEST(ZdsDatagram, DeadlineCancelAndEof) {
  Pair p;
  auto quiet = receiveDatagram(p.b.get(), after(30ms));
  ASSERT_FALSE(quiet.ok());
  EXPECT_EQ(quiet.error().code, ETIMEDOUT);

  Fd cancel(::eventfd(1, EFD_CLOEXEC));
  auto cancelled = receiveDatagram(p.b.get(), after(10s), cancel.get());
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.error().code, ECANCELED);

  p.a.reset();
  auto eof = receiveDatagram(p.b.get(), after(1s));
  ASSERT_TRUE(eof.ok()) << eof.error().message;
  EXPECT_TRUE(eof->eof);

  Status broken = sendDatagram(p.b.get(), "\x1a\x00", -1, after(1s));
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().code, EPIPE);
}

TEST(ZdsDatagram, SendTimesOutWhenThePeerStopsReading) {
  Pair p;
  std::string msg(1000, 'x');
  Status st;
  // Fill the peer's queue; the send that finds no room waits for the deadline.
  for (int i = 0; i < 100000 && st.ok(); ++i) st = sendDatagram(p.a.get(), msg, -1, after(50ms));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ETIMEDOUT);
}

}  // namespace
}  // namespace sluice::zds
