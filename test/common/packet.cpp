#include "test/common/packet.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace sluice::test {

// ---------------------------------------------------------------- helpers

namespace {

void put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
void put32(Bytes& b, uint32_t v) {
  put16(b, static_cast<uint16_t>(v >> 16));
  put16(b, static_cast<uint16_t>(v));
}
void set16(Bytes& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v >> 8);
  b[off + 1] = static_cast<uint8_t>(v);
}
uint16_t get16(const Bytes& b, size_t off) { return static_cast<uint16_t>(b[off] << 8 | b[off + 1]); }

uint32_t sumBytes(const uint8_t* data, size_t len, uint32_t sum) {
  for (size_t i = 0; i + 1 < len; i += 2) sum += static_cast<uint32_t>(data[i] << 8 | data[i + 1]);
  if (len & 1) sum += static_cast<uint32_t>(data[len - 1] << 8);
  return sum;
}

uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// Sum of the TCP/UDP/ICMPv6 pseudo-header (not folded, not complemented).
uint32_t pseudoSum(const IpAddr& src, const IpAddr& dst, uint8_t proto, size_t l4len) {
  uint32_t sum = 0;
  sum = sumBytes(src.b.data(), src.size(), sum);
  sum = sumBytes(dst.b.data(), dst.size(), sum);
  if (src.family == AF_INET) {
    sum += proto;
    sum += static_cast<uint32_t>(l4len);
  } else {
    sum += static_cast<uint32_t>(l4len >> 16) + static_cast<uint32_t>(l4len & 0xffff);
    sum += proto;
  }
  return sum;
}

const char* protoName(uint8_t p) {
  switch (p) {
    case IPPROTO_TCP: return "TCP";
    case IPPROTO_UDP: return "UDP";
    case IPPROTO_ICMP: return "ICMP";
    case IPPROTO_ICMPV6: return "ICMPv6";
    default: return nullptr;
  }
}

std::string flagString(uint8_t f) {
  static const char* names = "FSRPAUEC";
  std::string s;
  for (int i = 0; i < 8; i++)
    if (f & (1 << i)) s += names[i];
  return s.empty() ? "." : s;
}

std::string hostPort(const IpAddr& a, std::optional<uint16_t> port) {
  std::string s = a.family == AF_INET6 ? "[" + a.str() + "]" : a.str();
  if (port) s += ":" + std::to_string(*port);
  return s;
}

}  // namespace

uint16_t inetChecksum(const uint8_t* data, size_t len, uint32_t initial) {
  return static_cast<uint16_t>(~fold(sumBytes(data, len, initial)));
}

// ----------------------------------------------------------------- IpAddr

IpAddr IpAddr::parse(std::string_view text) {
  IpAddr a;
  std::string s(text);
  if (inet_pton(AF_INET, s.c_str(), a.b.data()) == 1) {
    a.family = AF_INET;
  } else if (inet_pton(AF_INET6, s.c_str(), a.b.data()) == 1) {
    a.family = AF_INET6;
  } else {
    std::fprintf(stderr, "packet.cpp: bad address '%s' in a test case\n", s.c_str());
    std::abort();
  }
  return a;
}

std::string IpAddr::str() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (family == AF_INET || family == AF_INET6) inet_ntop(family, b.data(), buf, sizeof(buf));
  return buf;
}

size_t IpAddr::size() const { return family == AF_INET6 ? 16 : 4; }

// ----------------------------------------------------------------- Packet

Packet Packet::tcp(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport,
                   uint8_t flags) {
  Packet p;
  p.src_ = IpAddr::parse(src);
  p.dst_ = IpAddr::parse(dst);
  if (p.src_.family != p.dst_.family) std::abort();
  p.proto_ = IPPROTO_TCP;
  p.sport_ = sport;
  p.dport_ = dport;
  p.tcpFlags_ = flags;
  if (flags & tcpflag::ACK) p.ack_ = 5000;
  return p;
}

Packet Packet::udp(std::string_view src, uint16_t sport, std::string_view dst, uint16_t dport) {
  Packet p = tcp(src, sport, dst, dport, 0);
  p.proto_ = IPPROTO_UDP;
  p.payload_ = {0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};  // a DNS header
  return p;
}

Packet Packet::icmp(std::string_view src, std::string_view dst) {
  Packet p = tcp(src, 0, dst, 0, 0);
  p.proto_ = static_cast<uint8_t>(p.src_.family == AF_INET ? int{IPPROTO_ICMP} : int{IPPROTO_ICMPV6});
  p.payload_ = {'p', 'i', 'n', 'g'};
  return p;
}

Packet Packet::raw(uint16_t ethertype, Bytes payload) {
  Packet p;
  p.isRaw_ = true;
  p.ethertype_ = ethertype;
  p.rawPayload_ = std::move(payload);
  return p;
}

Packet Packet::arp(std::string_view sender, std::string_view target) {
  IpAddr s = IpAddr::parse(sender), t = IpAddr::parse(target);
  Bytes b;
  put16(b, 1);        // hardware type: Ethernet
  put16(b, kEthIPv4);  // protocol type
  b.push_back(6);
  b.push_back(4);
  put16(b, 1);  // request
  for (uint8_t m : {0x02, 0x00, 0x00, 0x00, 0x00, 0x02}) b.push_back(m);
  b.insert(b.end(), s.b.begin(), s.b.begin() + 4);
  for (int i = 0; i < 6; i++) b.push_back(0);
  b.insert(b.end(), t.b.begin(), t.b.begin() + 4);
  return raw(kEthArp, std::move(b));
}

Packet& Packet::src(std::string_view addr, uint16_t port) {
  src_ = IpAddr::parse(addr);
  sport_ = port;
  return *this;
}
Packet& Packet::dst(std::string_view addr, uint16_t port) {
  dst_ = IpAddr::parse(addr);
  dport_ = port;
  return *this;
}
Packet& Packet::payload(Bytes data) {
  payload_ = std::move(data);
  return *this;
}
Packet& Packet::payload(std::string_view text) { return payload(Bytes(text.begin(), text.end())); }
Packet& Packet::ethertype(uint16_t type) {
  ethertype_ = type;
  return *this;
}
Packet& Packet::macs(const std::array<uint8_t, 6>& src, const std::array<uint8_t, 6>& dst) {
  srcMac_ = src;
  dstMac_ = dst;
  return *this;
}
Packet& Packet::ipId(uint32_t id) {
  ipId_ = id;
  return *this;
}
Packet& Packet::ipv4Options(unsigned words) {
  ipv4OptWords_ = words;
  return *this;
}
Packet& Packet::ihlField(uint8_t ihl) {
  ihlOverride_ = ihl;
  return *this;
}
Packet& Packet::versionField(uint8_t version) {
  versionOverride_ = version;
  return *this;
}
Packet& Packet::fragment(bool moreFragments, uint16_t offset8) {
  mf_ = moreFragments;
  fragOffset_ = offset8;
  fragmented_ = true;
  if (src_.family == AF_INET6) exts_.push_back({ext6::FRAGMENT, 8});
  return *this;
}
Packet& Packet::dontFragment() {
  df_ = true;
  return *this;
}
Packet& Packet::ext(uint8_t type, unsigned len) {
  exts_.push_back({type, len});
  return *this;
}
Packet& Packet::tcpOptions(unsigned words) {
  tcpOptWords_ = words;
  return *this;
}
Packet& Packet::tcpDataOffsetField(uint8_t doff) {
  doffOverride_ = doff;
  return *this;
}
Packet& Packet::tcpFlags(uint8_t flags) {
  tcpFlags_ = flags;
  return *this;
}
Packet& Packet::seq(uint32_t s, uint32_t a) {
  seq_ = s;
  ack_ = a;
  return *this;
}
Packet& Packet::udpChecksumZero() {
  udpCsumZero_ = true;
  return *this;
}
Packet& Packet::truncate(size_t len) {
  truncate_ = len;
  return *this;
}

Bytes Packet::bytes() const {
  Bytes f(dstMac_.begin(), dstMac_.end());
  f.insert(f.end(), srcMac_.begin(), srcMac_.end());
  uint16_t et = ethertype_ ? ethertype_ : (src_.family == AF_INET6 ? kEthIPv6 : kEthIPv4);
  put16(f, et);
  if (isRaw_) {
    f.insert(f.end(), rawPayload_.begin(), rawPayload_.end());
    if (truncate_ && *truncate_ < f.size()) f.resize(*truncate_);
    return f;
  }

  // L4 first: its length goes into the IP header.
  Bytes l4;
  if (proto_ == IPPROTO_TCP) {
    put16(l4, sport_);
    put16(l4, dport_);
    put32(l4, seq_);
    put32(l4, ack_);
    uint8_t doff = doffOverride_ ? *doffOverride_ : static_cast<uint8_t>(5 + tcpOptWords_);
    l4.push_back(static_cast<uint8_t>(doff << 4));
    l4.push_back(tcpFlags_);
    put16(l4, 65535);  // window
    put16(l4, 0);      // checksum
    put16(l4, 0);      // urgent pointer
    for (unsigned i = 0; i < tcpOptWords_ * 4; i++) l4.push_back(1);  // NOP
    l4.insert(l4.end(), payload_.begin(), payload_.end());
    set16(l4, 16, inetChecksum(l4.data(), l4.size(), pseudoSum(src_, dst_, proto_, l4.size())));
  } else if (proto_ == IPPROTO_UDP) {
    put16(l4, sport_);
    put16(l4, dport_);
    put16(l4, static_cast<uint16_t>(8 + payload_.size()));
    put16(l4, 0);
    l4.insert(l4.end(), payload_.begin(), payload_.end());
    if (!udpCsumZero_) {
      uint16_t c = inetChecksum(l4.data(), l4.size(), pseudoSum(src_, dst_, proto_, l4.size()));
      set16(l4, 6, c ? c : 0xffff);
    }
  } else if (proto_ == IPPROTO_ICMP || proto_ == IPPROTO_ICMPV6) {
    l4.push_back(proto_ == IPPROTO_ICMP ? 8 : 128);  // echo request
    l4.push_back(0);
    put16(l4, 0);
    put16(l4, 0x4242);  // identifier
    put16(l4, 1);       // sequence
    l4.insert(l4.end(), payload_.begin(), payload_.end());
    uint32_t initial = proto_ == IPPROTO_ICMPV6 ? pseudoSum(src_, dst_, proto_, l4.size()) : 0;
    set16(l4, 2, inetChecksum(l4.data(), l4.size(), initial));
  } else {
    l4 = payload_;
  }

  if (src_.family == AF_INET) {
    size_t l3 = f.size();
    size_t hlen = 20 + 4 * ipv4OptWords_;
    uint8_t ihl = ihlOverride_ ? *ihlOverride_ : static_cast<uint8_t>(hlen / 4);
    uint8_t ver = versionOverride_ ? *versionOverride_ : 4;
    f.push_back(static_cast<uint8_t>(ver << 4 | (ihl & 0xf)));
    f.push_back(0);  // tos
    put16(f, static_cast<uint16_t>(hlen + l4.size()));
    put16(f, static_cast<uint16_t>(ipId_ ? ipId_ : 0x1234));  // id
    put16(f, static_cast<uint16_t>((df_ ? 0x4000 : 0) | (mf_ ? 0x2000 : 0) | (fragOffset_ & 0x1fff)));
    f.push_back(64);  // ttl
    f.push_back(proto_);
    put16(f, 0);  // checksum
    f.insert(f.end(), src_.b.begin(), src_.b.begin() + 4);
    f.insert(f.end(), dst_.b.begin(), dst_.b.begin() + 4);
    for (unsigned i = 0; i < ipv4OptWords_ * 4; i++) f.push_back(i + 1 == ipv4OptWords_ * 4 ? 0 : 1);  // NOPs, EOL
    set16(f, l3 + 10, inetChecksum(f.data() + l3, hlen));
  } else {
    Bytes exts;
    for (size_t i = 0; i < exts_.size(); i++) {
      uint8_t next = i + 1 < exts_.size() ? exts_[i + 1].type : proto_;
      const Ext& e = exts_[i];
      size_t start = exts.size();
      exts.push_back(next);
      switch (e.type) {
        case ext6::FRAGMENT:
          exts.push_back(0);
          put16(exts, static_cast<uint16_t>(fragOffset_ << 3 | (mf_ ? 1 : 0)));
          put32(exts, ipId_ ? ipId_ : 0xabcdef01);
          break;
        case ext6::AH:
          exts.push_back(static_cast<uint8_t>(e.len / 4 - 2));
          put16(exts, 0);
          put32(exts, 0x100);  // SPI
          put32(exts, 1);      // sequence
          while (exts.size() - start < e.len) exts.push_back(0);  // ICV
          break;
        case ext6::ROUTING:
          exts.push_back(static_cast<uint8_t>(e.len / 8 - 1));
          exts.push_back(0);  // routing type 0
          exts.push_back(0);  // segments left: nothing to route
          while (exts.size() - start < e.len) exts.push_back(0);
          break;
        default:  // hop-by-hop, destination options: one PadN option
          exts.push_back(static_cast<uint8_t>(e.len / 8 - 1));
          exts.push_back(1);
          exts.push_back(static_cast<uint8_t>(e.len - 4));
          while (exts.size() - start < e.len) exts.push_back(0);
          break;
      }
    }
    uint8_t ver = versionOverride_ ? *versionOverride_ : 6;
    f.push_back(static_cast<uint8_t>(ver << 4));
    f.push_back(0);
    put16(f, 0);  // flow label
    put16(f, static_cast<uint16_t>(exts.size() + l4.size()));
    f.push_back(exts_.empty() ? proto_ : exts_[0].type);
    f.push_back(64);  // hop limit
    f.insert(f.end(), src_.b.begin(), src_.b.end());
    f.insert(f.end(), dst_.b.begin(), dst_.b.end());
    f.insert(f.end(), exts.begin(), exts.end());
  }
  f.insert(f.end(), l4.begin(), l4.end());
  if (truncate_ && *truncate_ < f.size()) f.resize(*truncate_);
  return f;
}

std::string Packet::describe() const { return describeFrame(bytes()); }

std::vector<Bytes> Packet::fragments(size_t firstBytes) const {
  Bytes whole = bytes();
  const size_t l3 = 14;
  if (firstBytes == 0 || firstBytes % 8 != 0) std::abort();
  std::vector<Bytes> out;
  if (src_.family == AF_INET) {
    size_t hlen = (whole[l3] & 0xf) * 4u;
    Bytes body(whole.begin() + static_cast<long>(l3 + hlen), whole.end());
    if (firstBytes >= body.size()) std::abort();
    for (int part = 0; part < 2; part++) {
      size_t from = part == 0 ? 0 : firstBytes;
      size_t to = part == 0 ? firstBytes : body.size();
      Bytes f(whole.begin(), whole.begin() + static_cast<long>(l3 + hlen));
      f.insert(f.end(), body.begin() + static_cast<long>(from), body.begin() + static_cast<long>(to));
      set16(f, l3 + 2, static_cast<uint16_t>(hlen + to - from));
      set16(f, l3 + 6, static_cast<uint16_t>((df_ ? 0x4000 : 0) | (part == 0 ? 0x2000 : 0) | (from / 8)));
      set16(f, l3 + 10, 0);
      set16(f, l3 + 10, inetChecksum(f.data() + l3, hlen));
      out.push_back(std::move(f));
    }
    return out;
  }
  // IPv6: the fragmentable part is everything after the fixed header.
  const size_t fixed = l3 + 40;
  Bytes body(whole.begin() + static_cast<long>(fixed), whole.end());
  if (firstBytes >= body.size()) std::abort();
  uint8_t next = whole[l3 + 6];
  for (int part = 0; part < 2; part++) {
    size_t from = part == 0 ? 0 : firstBytes;
    size_t to = part == 0 ? firstBytes : body.size();
    Bytes f(whole.begin(), whole.begin() + static_cast<long>(fixed));
    f[l3 + 6] = ext6::FRAGMENT;
    f.push_back(next);
    f.push_back(0);
    put16(f, static_cast<uint16_t>(from / 8 << 3 | (part == 0 ? 1 : 0)));
    put32(f, ipId_ ? ipId_ : 0xabcdef01);
    f.insert(f.end(), body.begin() + static_cast<long>(from), body.begin() + static_cast<long>(to));
    set16(f, l3 + 4, static_cast<uint16_t>(8 + to - from));
    out.push_back(std::move(f));
  }
  return out;
}

// ----------------------------------------------------------------- parser

bool ParsedPacket::checksumsOk() const {
  if (!error.empty() || !l4ChecksumOk || !*l4ChecksumOk) return false;
  return family != AF_INET || (ipv4ChecksumOk && *ipv4ChecksumOk);
}

ParsedPacket parsePacket(const Bytes& b) {
  ParsedPacket p;
  if (b.size() < 14) {
    p.error = "shorter than an Ethernet header";
    return p;
  }
  p.ethertype = get16(b, 12);
  p.l3Off = 14;
  size_t l4len = 0;
  if (p.ethertype == kEthIPv4) {
    if (b.size() < p.l3Off + 20) {
      p.error = "truncated IPv4 header";
      return p;
    }
    uint8_t ver = b[p.l3Off] >> 4, ihl = b[p.l3Off] & 0xf;
    if (ver != 4 || ihl < 5) {
      p.error = "bad IPv4 version/ihl " + std::to_string(ver) + "/" + std::to_string(ihl);
      return p;
    }
    if (b.size() < p.l3Off + ihl * 4u) {
      p.error = "truncated IPv4 options";
      return p;
    }
    p.family = AF_INET;
    p.src.family = p.dst.family = AF_INET;
    std::copy(b.begin() + p.l3Off + 12, b.begin() + p.l3Off + 16, p.src.b.begin());
    std::copy(b.begin() + p.l3Off + 16, b.begin() + p.l3Off + 20, p.dst.b.begin());
    p.proto = b[p.l3Off + 9];
    p.ipv4ChecksumOk = inetChecksum(b.data() + p.l3Off, ihl * 4u) == 0;
    p.fragment = (get16(b, p.l3Off + 6) & 0x3fff) != 0;
    p.l4Off = p.l3Off + ihl * 4u;
    size_t tot = get16(b, p.l3Off + 2);
    l4len = tot >= ihl * 4u ? tot - ihl * 4u : 0;
  } else if (p.ethertype == kEthIPv6) {
    if (b.size() < p.l3Off + 40) {
      p.error = "truncated IPv6 header";
      return p;
    }
    if (b[p.l3Off] >> 4 != 6) {
      p.error = "bad IPv6 version";
      return p;
    }
    p.family = AF_INET6;
    p.src.family = p.dst.family = AF_INET6;
    std::copy(b.begin() + p.l3Off + 8, b.begin() + p.l3Off + 24, p.src.b.begin());
    std::copy(b.begin() + p.l3Off + 24, b.begin() + p.l3Off + 40, p.dst.b.begin());
    size_t payloadLen = get16(b, p.l3Off + 4);
    uint8_t next = b[p.l3Off + 6];
    size_t off = p.l3Off + 40;
    for (;;) {
      if (next != ext6::HOPOPTS && next != ext6::ROUTING && next != ext6::DSTOPTS && next != ext6::AH &&
          next != ext6::FRAGMENT)
        break;
      if (b.size() < off + 2) {
        p.error = "truncated IPv6 extension header";
        return p;
      }
      size_t len = next == ext6::AH ? (b[off + 1] + 2u) * 4 : next == ext6::FRAGMENT ? 8 : (b[off + 1] + 1u) * 8;
      if (next == ext6::FRAGMENT) {
        if (b.size() < off + 4) {
          p.error = "truncated IPv6 fragment header";
          return p;
        }
        p.fragment = true;
      }
      next = b[off];
      off += len;
      p.extHeaders++;
    }
    p.proto = next;
    p.l4Off = off;
    size_t extLen = off - p.l3Off - 40;
    l4len = payloadLen >= extLen ? payloadLen - extLen : 0;
  } else {
    p.error = "not IP";
    return p;
  }

  size_t avail = b.size() > p.l4Off ? b.size() - p.l4Off : 0;
  if (p.proto == IPPROTO_TCP || p.proto == IPPROTO_UDP) {
    if (avail >= 4) {
      p.sport = get16(b, p.l4Off);
      p.dport = get16(b, p.l4Off + 2);
    }
  }
  size_t csumOff = 0;
  if (p.proto == IPPROTO_TCP) {
    if (avail >= 14) p.tcpFlags = b[p.l4Off + 13];
    if (avail < 20) {
      p.error = "truncated TCP header";
      return p;
    }
    if ((b[p.l4Off + 12] >> 4) < 5) {
      p.error = "TCP data offset below 5";
      return p;
    }
    csumOff = 16;
  } else if (p.proto == IPPROTO_UDP) {
    if (avail < 8) {
      p.error = "truncated UDP header";
      return p;
    }
    csumOff = 6;
  } else if (p.proto == IPPROTO_ICMP || p.proto == IPPROTO_ICMPV6) {
    if (avail < 4) {
      p.error = "truncated ICMP header";
      return p;
    }
    csumOff = 2;
  } else {
    p.error = "unknown L4 protocol " + std::to_string(p.proto);
    return p;
  }
  p.l4Checksum = get16(b, p.l4Off + csumOff);
  if (p.fragment) {
    p.error = "fragment: L4 checksum not checkable";
    return p;
  }
  if (l4len > avail) {
    p.error = "L4 truncated (" + std::to_string(avail) + " of " + std::to_string(l4len) + " bytes)";
    return p;
  }
  if (p.proto == IPPROTO_UDP && p.family == AF_INET && *p.l4Checksum == 0) {
    p.l4ChecksumOk = true;  // no checksum (RFC 768)
  } else {
    uint32_t initial = p.proto == IPPROTO_ICMP ? 0 : pseudoSum(p.src, p.dst, p.proto, l4len);
    p.l4ChecksumOk = inetChecksum(b.data() + p.l4Off, l4len, initial) == 0;
  }
  return p;
}

std::string ParsedPacket::describe() const {
  std::ostringstream o;
  if (family == 0) {
    char et[8];
    std::snprintf(et, sizeof(et), "0x%04x", ethertype);
    o << "ethertype " << et;
  } else {
    o << (family == AF_INET ? "IPv4 " : "IPv6 ");
    if (const char* n = protoName(proto))
      o << n;
    else
      o << "proto " << int(proto);
    o << " " << hostPort(src, sport) << " -> " << hostPort(dst, dport);
    if (tcpFlags) o << " [" << flagString(*tcpFlags) << "]";
    if (extHeaders) o << " ext-hdrs=" << extHeaders;
    if (fragment) o << " fragment";
    if (ipv4ChecksumOk) o << (*ipv4ChecksumOk ? " ip-csum ok" : " ip-csum BAD");
    if (l4ChecksumOk) o << (*l4ChecksumOk ? " l4-csum ok" : " l4-csum BAD");
  }
  if (!error.empty()) o << " (" << error << ")";
  return o.str();
}

std::string hexdump(const Bytes& b) {
  std::string s;
  char buf[24];
  for (size_t i = 0; i < b.size(); i++) {
    if (i % 16 == 0) {
      std::snprintf(buf, sizeof(buf), "%s%04zx:", i ? "\n" : "", i);
      s += buf;
    }
    std::snprintf(buf, sizeof(buf), " %02x", b[i]);
    s += buf;
  }
  return s;
}

std::string describeFrame(const Bytes& frame) {
  return parsePacket(frame).describe() + " (" + std::to_string(frame.size()) + " bytes)\n" + hexdump(frame);
}

}  // namespace sluice::test
