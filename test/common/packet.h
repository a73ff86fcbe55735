// A small Ethernet/IPv4/IPv6/TCP/UDP/ICMP packet builder and parser for the
// BPF_PROG_TEST_RUN tests and the netns tests' crafted frames (sent on
// AF_PACKET sockets, test/common/raw_link.h): packets are described field by
// field and built with correct checksums, never written as hex by hand. The
// parser reads any frame (including malformed ones) back into fields and
// checks every checksum from scratch, pseudo-header included.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::test {

using Bytes = std::vector<uint8_t>;

/// An IPv4 or IPv6 address, bytes in network order (IPv4: first 4 bytes).
struct IpAddr {
  int family = 0;  ///< AF_INET or AF_INET6
  std::array<uint8_t, 16> b{};

  /// Parses a textual v4 or v6 address; aborts the test program on a typo.
  static IpAddr parse(std::string_view text);
  std::string str() const;
  size_t size() const;  ///< 4 or 16
  bool operator==(const IpAddr&) const = default;
};

namespace tcpflag {
constexpr uint8_t FIN = 0x01, SYN = 0x02, RST = 0x04, PSH = 0x08, ACK = 0x10, URG = 0x20,
                  ECE = 0x40, CWR = 0x80;
}

constexpr uint16_t kEthIPv4 = 0x0800;
constexpr uint16_t kEthIPv6 = 0x86dd;
constexpr uint16_t kEthArp = 0x0806;

/// IPv6 extension header numbers the builder knows.
namespace ext6 {
constexpr uint8_t HOPOPTS = 0, ROUTING = 43, FRAGMENT = 44, AH = 51, DSTOPTS = 60;
}

/// Description of one frame. Build with the static constructors, adjust
/// with the chainable setters, turn into bytes with bytes().
class Packet {
 public:
  static Packet tcp(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport,
                    uint8_t flags = tcpflag::SYN);
  static Packet udp(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport);
  /// ICMP echo request (ICMPv6 for v6 addresses).
  static Packet icmp(std::string_view src, std::string_view dst);
  /// A non-IP frame: Ethernet header with @p ethertype, then @p payload.
  static Packet raw(uint16_t ethertype, Bytes payload);
  /// An ARP request (who-has @p target tell @p sender), IPv4 over Ethernet.
  static Packet arp(std::string_view sender, std::string_view target);

  // ---- chainable adjustments ----
  Packet& src(std::string_view addr, uint16_t port);
  Packet& dst(std::string_view addr, uint16_t port);
  Packet& payload(Bytes data);
  Packet& payload(std::string_view text);
  /// Ethertype in the Ethernet header (default from the address family).
  Packet& ethertype(uint16_t type);
  /// Ethernet addresses (default: to 02:00:00:00:00:01 from 02:00:00:00:00:02).
  Packet& macs(const std::array<uint8_t, 6>& src, const std::array<uint8_t, 6>& dst);
  /// IPv4 identification / IPv6 fragment identification (default 0x1234 /
  /// 0xabcdef01): the reassembly key of fragments.
  Packet& ipId(uint32_t id);
  /// IPv4 options of @p words 32-bit words (NOPs ended by EOL): ihl 5+words.
  Packet& ipv4Options(unsigned words);
  /// Writes @p ihl into the header as is, without changing the layout.
  Packet& ihlField(uint8_t ihl);
  /// Writes @p version into the IP header as is.
  Packet& versionField(uint8_t version);
  /// IPv4: the MF flag and fragment offset (8-byte units). IPv6: appends a
  /// fragment extension header with the same meaning.
  Packet& fragment(bool moreFragments, uint16_t offset8);
  /// IPv4: sets DF (which does not make the packet a fragment).
  Packet& dontFragment();
  /// Appends an IPv6 extension header of @p type, @p len bytes in total
  /// (multiple of 8; AH: multiple of 4, at least 12).
  Packet& ext(uint8_t type, unsigned len = 8);
  /// TCP options of @p words 32-bit words (NOPs): data offset 5+words.
  Packet& tcpOptions(unsigned words);
  /// Writes @p doff into the TCP header as is, without changing the layout.
  Packet& tcpDataOffsetField(uint8_t doff);
  Packet& tcpFlags(uint8_t flags);
  Packet& seq(uint32_t seq, uint32_t ack = 0);
  /// UDP over IPv4 without checksum (0).
  Packet& udpChecksumZero();
  /// Cuts the built frame to @p len bytes (headers keep their full-length
  /// values and checksums: a truncated capture, not a shorter packet).
  Packet& truncate(size_t len);

  Bytes bytes() const;
  std::string describe() const;
  /// The packet as two real fragments that the receiver's stack reassembles
  /// into bytes(): the first carries the first @p firstBytes bytes (a
  /// multiple of 8) of what follows the IPv4 header / the IPv6 header, the
  /// second the rest. IPv4: MF and offsets in the header; IPv6: a fragment
  /// header right after the fixed header (every extension header of the
  /// packet goes into the fragmentable part).
  std::vector<Bytes> fragments(size_t firstBytes) const;

  int family() const { return src_.family; }
  uint8_t proto() const { return proto_; }

 private:
  Packet() = default;

  uint16_t ethertype_ = 0;  // 0: from the family
  std::array<uint8_t, 6> srcMac_{0x02, 0, 0, 0, 0, 0x02}, dstMac_{0x02, 0, 0, 0, 0, 0x01};
  uint32_t ipId_ = 0;  // 0: the defaults above
  Bytes rawPayload_;        // non-IP frames
  bool isRaw_ = false;

  IpAddr src_, dst_;
  uint8_t proto_ = 0;
  uint16_t sport_ = 0, dport_ = 0;
  uint8_t tcpFlags_ = 0;
  uint32_t seq_ = 1000, ack_ = 0;
  unsigned ipv4OptWords_ = 0;
  std::optional<uint8_t> ihlOverride_, versionOverride_, doffOverride_;
  bool df_ = false, mf_ = false;
  uint16_t fragOffset_ = 0;
  bool fragmented_ = false;
  struct Ext {
    uint8_t type;
    unsigned len;
  };
  std::vector<Ext> exts_;
  unsigned tcpOptWords_ = 0;
  bool udpCsumZero_ = false;
  Bytes payload_;
  std::optional<size_t> truncate_;
};

/// A frame read back field by field. Missing layers stay empty; `error`
/// says where parsing stopped on a malformed frame.
struct ParsedPacket {
  uint16_t ethertype = 0;
  int family = 0;  ///< AF_INET, AF_INET6 or 0 (not IP / unreadable)
  IpAddr src, dst;
  uint8_t proto = 0;  ///< L4 protocol after any IPv6 extension headers
  size_t l3Off = 0, l4Off = 0;
  unsigned extHeaders = 0;
  bool fragment = false;
  std::optional<uint16_t> sport, dport;
  std::optional<uint8_t> tcpFlags;
  std::optional<bool> ipv4ChecksumOk;  ///< IPv4 header checksum
  std::optional<uint16_t> l4Checksum;  ///< raw TCP/UDP/ICMP checksum field
  std::optional<bool> l4ChecksumOk;    ///< recomputed, pseudo-header included
  std::string error;                   ///< empty: parsed to the end

  /// Both checksums present and valid (UDP v4 checksum 0 counts as valid).
  bool checksumsOk() const;
  std::string describe() const;
};

ParsedPacket parsePacket(const Bytes& frame);

/// "IPv4 TCP 10.0.0.1:1 -> 10.0.0.2:2 [S] csum ok" plus a hex dump.
std::string describeFrame(const Bytes& frame);
std::string hexdump(const Bytes& frame);

/// The Internet checksum (RFC 1071) of @p data, folded and complemented.
uint16_t inetChecksum(const uint8_t* data, size_t len, uint32_t initial = 0);

}  // namespace sluice::test
