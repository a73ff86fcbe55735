// Crafted frames on a real interface: an AF_PACKET socket in a test
// namespace, as an app with CAP_NET_RAW (granted to containers by default)
// can open one. What it sends goes through the interface's TC egress hook
// like any frame of the stack (the socket does not ask for
// PACKET_QDISC_BYPASS); what the interface sends and receives is captured by
// a thread of its own (AF_PACKET taps see incoming frames before TC ingress
// and outgoing ones after TC egress).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/result.h"
#include "test/common/packet.h"
#include "test/common/topology.h"

namespace sluice::test {

using Mac = std::array<uint8_t, 6>;

/// The hardware address of interface @p ifname in @p ns.
Result<Mac> linkMac(const TestNetns& ns, const std::string& ifname);

/// One frame the interface sent (outgoing) or received.
struct CapturedFrame {
  Bytes bytes;
  bool outgoing = false;
  ParsedPacket parsed;
};

class RawLink {
 public:
  /// Opens the socket on @p ifname inside @p ns and starts capturing.
  static Result<std::unique_ptr<RawLink>> open(const TestNetns& ns, const std::string& ifname);
  ~RawLink();
  RawLink(const RawLink&) = delete;
  RawLink& operator=(const RawLink&) = delete;

  /// The interface's own hardware address.
  const Mac& mac() const { return mac_; }

  /// Sends @p frame as it is. @p protocol (host byte order) is the
  /// sll_protocol of the send, which becomes skb->protocol; 0 lets the
  /// kernel take it from the frame's ethertype.
  Status send(const Bytes& frame, uint16_t protocol = 0);

  /// The first frame captured since open() that matches, waiting up to
  /// @p timeout for it.
  std::optional<CapturedFrame> waitFor(const std::function<bool(const CapturedFrame&)>& match,
                                       std::chrono::milliseconds timeout);
  /// Every frame captured so far that matches.
  std::vector<CapturedFrame> captured(const std::function<bool(const CapturedFrame&)>& match) const;

 private:
  RawLink() = default;
  void capture();

  Fd sock_;
  Fd wake_;
  int ifindex_ = 0;
  Mac mac_{};
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<CapturedFrame> frames_;
};

/// A TCP handshake driven with crafted frames: @p syn (one frame, or the
/// fragments of one SYN) is sent on @p link; when a SYN|ACK for it comes by
/// (in either direction) within @p timeout, the final ACK is sent as an
/// ordinary unfragmented frame built from @p ack (its sequence numbers are
/// filled in). Returns whether a SYN|ACK came.
struct CraftedHandshake {
  /// Sends of the SYN's frames that the kernel refused (a TC drop at the
  /// sender's egress answers the AF_PACKET send with ENOBUFS).
  int refusedSends = 0;
  bool synAckSeen = false;
  std::string synAck;  ///< describe() of the SYN|ACK frame
};
Result<CraftedHandshake> craftedHandshake(RawLink& link, const std::vector<Bytes>& syn, uint16_t synProtocol,
                                          Packet ack, uint32_t synSeq, std::chrono::milliseconds timeout);

}  // namespace sluice::test
