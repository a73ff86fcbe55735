#include "userspace/agent/zds/wire.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "userspace/agent/zds/zds.pb.h"

namespace sluice::zds {

namespace pb = istio::workload::zds;

const char* requestTypeName(RequestType type) {
  switch (type) {
    case RequestType::Add: return "add";
    case RequestType::Keep: return "keep";
    case RequestType::Del: return "del";
    case RequestType::SnapshotSent: return "snapshot_sent";
  }
  return "?";
}

// ---- Encoding ----------------------------------------------------------------

Result<std::string> encodeMessage(const google::protobuf::MessageLite& message) {
  std::string out;
  if (!message.SerializeToString(&out)) {
    return Error::msg("cannot encode " + message.GetTypeName(), EPROTO);
  }
  if (out.empty()) {
    return Error::msg("refusing to send " + message.GetTypeName() +
                          " as a 0-byte datagram (the peer would read it as end of connection)",
                      EPROTO);
  }
  if (out.size() > kMaxMessageSize) {
    return Error::msg(message.GetTypeName() + " encodes to " + std::to_string(out.size()) +
                          " bytes, more than the peer reads (" + std::to_string(kMaxMessageSize) + ")",
                      EMSGSIZE);
  }
  return out;
}

Result<std::string> encodeHello() {
  pb::ZdsHello hello;
  hello.set_version(pb::V1);
  return encodeMessage(hello);
}

Result<std::string> encodeRequest(const Request& request) {
  pb::WorkloadRequest msg;
  switch (request.type) {
    case RequestType::Add: {
      auto* add = msg.mutable_add();
      add->set_uid(request.workload.uid);
      auto* info = add->mutable_workload_info();  // present even when empty
      info->set_name(request.workload.name);
      info->set_namespace_(request.workload.ns);
      info->set_service_account(request.workload.serviceAccount);
      break;
    }
    case RequestType::Keep: msg.mutable_keep()->set_uid(request.workload.uid); break;
    case RequestType::Del: msg.mutable_del()->set_uid(request.workload.uid); break;
    case RequestType::SnapshotSent: msg.mutable_snapshot_sent(); break;
  }
  return encodeMessage(msg);
}

Result<std::string> encodeAck(const std::string& error) {
  pb::WorkloadResponse msg;
  msg.mutable_ack()->set_error(error);
  return encodeMessage(msg);
}

// ---- Decoding ----------------------------------------------------------------

Status decodeHello(std::string_view bytes) {
  pb::ZdsHello hello;
  if (!hello.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Error::msg("hello does not parse as ZdsHello (" + hex(bytes) + ")", EPROTO);
  }
  if (hello.version() != pb::V1) {
    return Error::msg("hello with unsupported version " + std::to_string(hello.version()) +
                          " (want 1, V1) (" + hex(bytes) + ")",
                      EPROTO);
  }
  return {};
}

Result<Request> decodeRequest(std::string_view bytes) {
  pb::WorkloadRequest msg;
  if (!msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Error::msg("datagram does not parse as WorkloadRequest (" + hex(bytes) + ")", EPROTO);
  }
  Request r;
  switch (msg.payload_case()) {
    case pb::WorkloadRequest::kAdd:
      r.type = RequestType::Add;
      r.workload.uid = msg.add().uid();
      r.hasWorkloadInfo = msg.add().has_workload_info();
      r.workload.name = msg.add().workload_info().name();
      r.workload.ns = msg.add().workload_info().namespace_();
      r.workload.serviceAccount = msg.add().workload_info().service_account();
      break;
    case pb::WorkloadRequest::kKeep:
      r.type = RequestType::Keep;
      r.workload.uid = msg.keep().uid();
      break;
    case pb::WorkloadRequest::kDel:
      r.type = RequestType::Del;
      r.workload.uid = msg.del().uid();
      break;
    case pb::WorkloadRequest::kSnapshotSent: r.type = RequestType::SnapshotSent; break;
    case pb::WorkloadRequest::PAYLOAD_NOT_SET:
      return Error::msg("WorkloadRequest without payload (" + hex(bytes) + ")", EPROTO);
  }
  return r;
}

Result<std::string> decodeAck(std::string_view bytes) {
  pb::WorkloadResponse msg;
  if (!msg.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Error::msg("datagram does not parse as WorkloadResponse (" + hex(bytes) + ")", EPROTO);
  }
  if (!msg.has_ack()) return Error::msg("WorkloadResponse without ack (" + hex(bytes) + ")", EPROTO);
  return msg.ack().error();
}

std::string hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  constexpr size_t kShown = 64;
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < kShown; ++i) {
    if (i) out += ' ';
    auto b = static_cast<unsigned char>(bytes[i]);
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  if (bytes.size() > kShown) out += " ... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

// ---- Datagrams -----------------------------------------------------------------

namespace {

// Room for several fds, so a peer that sends two is told "2 fds" instead of
// a bare truncation; more than this is MSG_CTRUNC (the kernel closes the
// ones that did not fit).
constexpr size_t kMaxFdsPerDatagram = 8;

/// Waits until @p sock has @p events, the deadline passes (ETIMEDOUT) or
/// @p cancelFd becomes readable (ECANCELED).
Status waitFor(int sock, short events, Clock::time_point deadline, int cancelFd) {
  for (;;) {
    std::array<pollfd, 2> fds{};
    fds[0] = {sock, events, 0};
    nfds_t n = 1;
    if (cancelFd >= 0) fds[n++] = {cancelFd, POLLIN, 0};
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    int rc = ::poll(fds.data(), n, static_cast<int>(std::clamp<int64_t>(left, 0, 60'000)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return Error::fromErrno(errno, "poll");
    }
    if (n > 1 && fds[1].revents) return Error::msg("cancelled", ECANCELED);
    // POLLHUP / POLLERR: let the following call report what happened.
    if (fds[0].revents) return {};
    if (Clock::now() >= deadline) return Error::msg("timed out", ETIMEDOUT);
  }
}

}  // namespace

Status sendDatagram(int sock, std::string_view bytes, int passFd, Clock::time_point deadline,
                    int cancelFd) {
  if (bytes.empty()) {
    return Error::msg("refusing to send a 0-byte datagram (the peer would read it as end of connection)",
                      EPROTO);
  }
  if (bytes.size() > kMaxMessageSize) {
    return Error::msg("refusing to send a " + std::to_string(bytes.size()) + "-byte datagram (the peer reads " +
                          std::to_string(kMaxMessageSize) + ")",
                      EMSGSIZE);
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (passFd >= 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &passFd, sizeof(int));
  }
  for (;;) {
    // MSG_DONTWAIT + poll: a peer that stopped reading fills its receive
    // queue, and a blocking sendmsg would then ignore our deadline.
    ssize_t n = ::sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      // SOCK_SEQPACKET sends a datagram whole or not at all.
      return {};
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Error::fromErrno(errno, "sendmsg");
    SLUICE_TRY(waitFor(sock, POLLOUT, deadline, cancelFd));
  }
}

Result<Datagram> receiveDatagram(int sock, Clock::time_point deadline, int cancelFd) {
  for (;;) {
    SLUICE_TRY(waitFor(sock, POLLIN, deadline, cancelFd));
    Datagram d;
    std::array<char, kMaxMessageSize> buf;
    alignas(cmsghdr) std::array<char, CMSG_SPACE(kMaxFdsPerDatagram * sizeof(int))> control{};
    iovec iov{buf.data(), buf.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return Error::fromErrno(errno, "recvmsg");
    }
    // Take ownership of every fd first, so each error below closes them.
    size_t otherControl = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          d.fds.emplace_back(fd);
        }
      } else {
        ++otherControl;
      }
    }
    if (msg.msg_flags & MSG_TRUNC) {
      return Error::msg("truncated message (longer than " + std::to_string(kMaxMessageSize) + " bytes)", EPROTO);
    }
    if (msg.msg_flags & MSG_CTRUNC) return Error::msg("truncated ancillary data", EPROTO);
    if (otherControl) return Error::msg("unexpected ancillary data (not SCM_RIGHTS)", EPROTO);
    if (n == 0) {
      // A 0-byte datagram and the end of the connection look the same.
      d.eof = true;
      return d;
    }
    d.bytes.assign(buf.data(), static_cast<size_t>(n));
    return d;
  }
}

}  // namespace sluice::zds
