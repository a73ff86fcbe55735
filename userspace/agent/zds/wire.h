// The ZDS wire: protobuf messages (zds.proto) encoded one per
// SOCK_SEQPACKET datagram, with the pod's netns fd as SCM_RIGHTS ancillary
// data. Both sides of the protocol (zds::Server, zds::Client) go through
// these functions only, so the framing rules live in one place:
//   - a datagram carries exactly one message, no length prefix;
//   - the receiver reads into a kMaxMessageSize buffer; MSG_TRUNC and
//     MSG_CTRUNC are errors;
//   - a message that encodes to zero bytes is never sent (ztunnel reads a
//     0-byte datagram as the end of the connection);
//   - every received fd is owned by an Fd at once, so no error path leaks one.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "userspace/agent/zds/workload.h"

namespace google::protobuf {
class MessageLite;
}

namespace sluice::zds {

using Clock = std::chrono::steady_clock;

/// Both sides read into a buffer of this size; a longer datagram is an error.
inline constexpr size_t kMaxMessageSize = 1024;

// ---- Encoding ----------------------------------------------------------------

/// Serialises @p message; fails (EPROTO) when it would be 0 bytes, which a
/// peer cannot tell from end-of-connection, or (EMSGSIZE) longer than
/// kMaxMessageSize, which the peer would read truncated.
Result<std::string> encodeMessage(const google::protobuf::MessageLite& message);

/// ZdsHello{version V1} (ztunnel's first datagram).
Result<std::string> encodeHello();

/// A WorkloadRequest. Add always carries workload_info (ztunnel treats an
/// Add without it as a protocol error), even when all its fields are empty.
Result<std::string> encodeRequest(const Request& request);

/// WorkloadResponse{ack{error}} ("" = success; the wrapper makes even the
/// success ack 2 bytes long).
Result<std::string> encodeAck(const std::string& error);

// ---- Decoding ----------------------------------------------------------------

/// Checks a hello: must parse as ZdsHello with version V1 (EPROTO otherwise).
Status decodeHello(std::string_view bytes);

/// Parses a WorkloadRequest; EPROTO when it does not parse or has no payload.
/// Whether an Add carries workload_info is reported, not judged here.
Result<Request> decodeRequest(std::string_view bytes);

/// Parses a WorkloadResponse and returns its ack's error text ("" =
/// success); EPROTO when it does not parse or carries no ack.
Result<std::string> decodeAck(std::string_view bytes);

/// @p bytes as "0a 00 ..." for logs and test messages.
std::string hex(std::string_view bytes);

// ---- Datagrams -----------------------------------------------------------------

/// One received datagram.
struct Datagram {
  std::string bytes;
  /// Every fd that came in SCM_RIGHTS, owned (closed unless moved out).
  std::vector<Fd> fds;
  /// The peer closed the connection (recvmsg returned 0 bytes).
  bool eof = false;
};

/// Sends @p bytes as one datagram on @p sock, with @p passFd in SCM_RIGHTS
/// when >= 0 (the fd is duplicated into the peer; ours stays open). Waits at
/// most until @p deadline for room in the socket (ETIMEDOUT), returns
/// ECANCELED as soon as @p cancelFd (an eventfd, -1 for none) is readable.
/// Refuses an empty or oversize message (EPROTO / EMSGSIZE) without sending.
Status sendDatagram(int sock, std::string_view bytes, int passFd, Clock::time_point deadline,
                    int cancelFd = -1);

/// Receives one datagram from @p sock, waiting at most until @p deadline
/// (ETIMEDOUT) or until @p cancelFd is readable (ECANCELED). A datagram
/// longer than kMaxMessageSize (MSG_TRUNC) or with truncated ancillary data
/// (MSG_CTRUNC) is an error (EPROTO); the fds that did arrive are closed.
Result<Datagram> receiveDatagram(int sock, Clock::time_point deadline, int cancelFd = -1);

/// A deadline @p timeout from now.
inline Clock::time_point after(std::chrono::milliseconds timeout) { return Clock::now() + timeout; }

}  // namespace sluice::zds
