#include "test/common/raw_link.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace sluice::test {

Result<Mac> linkMac(const TestNetns& ns, const std::string& ifname) {
  Mac mac{};
  SLUICE_TRY(ns.run([&]() -> Status {
    Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Error::fromErrno(errno, "socket");
    struct ifreq ifr {};
    std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
    if (::ioctl(s.get(), SIOCGIFHWADDR, &ifr) != 0)
      return Error::fromErrno(errno, "SIOCGIFHWADDR " + ifname + " in " + ns.name());
    std::memcpy(mac.data(), ifr.ifr_hwaddr.sa_data, mac.size());
    return {};
  }));
  return mac;
}

Result<std::unique_ptr<RawLink>> RawLink::open(const TestNetns& ns, const std::string& ifname) {
  std::unique_ptr<RawLink> l(new RawLink());
  SLUICE_TRY(ns.run([&]() -> Status {
    l->ifindex_ = static_cast<int>(::if_nametoindex(ifname.c_str()));
    if (!l->ifindex_) return Error::fromErrno(errno, "no interface " + ifname + " in " + ns.name());
    l->sock_ = Fd(::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL)));
    if (!l->sock_.valid()) return Error::fromErrno(errno, "AF_PACKET socket in " + ns.name());
    sockaddr_ll sll{};
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = l->ifindex_;
    if (::bind(l->sock_.get(), reinterpret_cast<sockaddr*>(&sll), sizeof(sll)) != 0)
      return Error::fromErrno(errno, "bind AF_PACKET to " + ifname);
    return {};
  }));
  auto mac = linkMac(ns, ifname);
  SLUICE_TRY(mac);
  l->mac_ = *mac;
  l->wake_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!l->wake_.valid()) return Error::fromErrno(errno, "eventfd");
  l->thread_ = std::thread([raw = l.get()] { raw->capture(); });
  return l;
}

RawLink::~RawLink() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
    thread_.join();
  }
}

void RawLink::capture() {
  for (;;) {
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {sock_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (!fds[1].revents) continue;
    uint8_t buf[9216];
    sockaddr_ll from{};
    socklen_t len = sizeof(from);
    ssize_t n = ::recvfrom(sock_.get(), buf, sizeof(buf), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &len);
    if (n <= 0) continue;
    CapturedFrame f;
    f.bytes.assign(buf, buf + n);
    f.outgoing = from.sll_pkttype == PACKET_OUTGOING;
    f.parsed = parsePacket(f.bytes);
    {
      std::lock_guard lock(mutex_);
      frames_.push_back(std::move(f));
    }
    cv_.notify_all();
  }
}

Status RawLink::send(const Bytes& frame, uint16_t protocol) {
  sockaddr_ll to{};
  to.sll_family = AF_PACKET;
  to.sll_ifindex = ifindex_;
  to.sll_protocol = htons(protocol);
  to.sll_halen = 6;
  std::memcpy(to.sll_addr, frame.data(), 6);
  ssize_t n = ::sendto(sock_.get(), frame.data(), frame.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  if (n != static_cast<ssize_t>(frame.size())) return Error::fromErrno(errno, "send a crafted frame");
  return {};
}

std::optional<CapturedFrame> RawLink::waitFor(const std::function<bool(const CapturedFrame&)>& match,
                                              std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  size_t seen = 0;
  std::optional<CapturedFrame> found;
  cv_.wait_for(lock, timeout, [&] {
    for (; seen < frames_.size(); seen++)
      if (match(frames_[seen])) {
        found = frames_[seen];
        return true;
      }
    return false;
  });
  return found;
}

std::vector<CapturedFrame> RawLink::captured(const std::function<bool(const CapturedFrame&)>& match) const {
  std::lock_guard lock(mutex_);
  std::vector<CapturedFrame> out;
  for (const auto& f : frames_)
    if (match(f)) out.push_back(f);
  return out;
}

Result<CraftedHandshake> craftedHandshake(RawLink& link, const std::vector<Bytes>& syn, uint16_t synProtocol,
                                          Packet ack, uint32_t synSeq, std::chrono::milliseconds timeout) {
  const ParsedPacket mine = parsePacket(ack.bytes());
  CraftedHandshake r;
  for (const auto& frame : syn) {
    Status st = link.send(frame, synProtocol);
    if (!st.ok() && st.error().code != ENOBUFS) return st.error();
    r.refusedSends += !st.ok();
  }
  auto synAck = link.waitFor(
      [&](const CapturedFrame& f) {
        const ParsedPacket& p = f.parsed;
        return p.proto == IPPROTO_TCP && p.tcpFlags && (*p.tcpFlags & (tcpflag::SYN | tcpflag::ACK)) ==
                                                           (tcpflag::SYN | tcpflag::ACK) &&
               p.src == mine.dst && p.dst == mine.src && p.sport == mine.dport && p.dport == mine.sport;
      },
      timeout);
  if (!synAck) return r;
  r.synAckSeen = true;
  r.synAck = synAck->parsed.describe();
  const Bytes& b = synAck->bytes;
  size_t off = synAck->parsed.l4Off;
  uint32_t theirSeq = static_cast<uint32_t>(b[off + 4]) << 24 | static_cast<uint32_t>(b[off + 5]) << 16 |
                      static_cast<uint32_t>(b[off + 6]) << 8 | b[off + 7];
  SLUICE_TRY(link.send(ack.tcpFlags(tcpflag::ACK).seq(synSeq + 1, theirSeq + 1).bytes()));
  return r;
}

}  // namespace sluice::test
