#include "test/bpf/fuzz_generator.h"

#include <netinet/in.h>

#include <array>

namespace sluice::test::fuzz {
namespace {

using namespace tcpflag;

// Addresses the rules single out, and some that are near them.
const std::array<const char*, 13> kPool4 = {kV4.pod,  kV4.pod2,    kV4.remote,        kV4.resolver, kV4.resolver2,
                                            kV4.probe, "127.0.0.1", "127.1.2.3",       "0.0.0.0",    "255.255.255.255",
                                            "224.0.0.1", "169.254.7.126", "10.1.0.255"};
const std::array<const char*, 13> kPool6 = {kV6.pod,  kV6.pod2, kV6.remote,        kV6.resolver, kV6.resolver2,
                                            kV6.probe, "::1",    "::2",             "::",         "::ffff:10.1.0.5",
                                            "ff02::1", "fd16:9254:7127:1337:ffff:ffff:ffff:fffe", "fe80::1"};
const std::array<uint16_t, 16> kPorts = {53,    15001, 15006, 15008, 15009, 15053, 15054, kServerPort,
                                         kClientPort, 40000, 40001, 80,    443,   0,     65535, 5353};
const std::array<uint8_t, 8> kCommonFlags = {SYN, SYN | ACK, ACK, FIN | ACK, RST, SYN | ECE | CWR, PSH | ACK, RST | ACK};
constexpr size_t kMaxFrame = 3072;
const std::array<uint16_t, 8> kOddEthertypes = {0x8100, 0x88a8, 0x88b5, 0x0806, 0x0000, 0xffff, 0x86dd, 0x0800};

}  // namespace

std::string Generator::address(bool v4) {
  if (chance(4)) {
    IpAddr a;
    a.family = v4 ? AF_INET : AF_INET6;
    for (size_t i = 0; i < a.size(); i++) a.b[i] = static_cast<uint8_t>(below(256));
    return a.str();
  }
  return v4 ? kPool4[below(kPool4.size())] : kPool6[below(kPool6.size())];
}

uint16_t Generator::port() { return chance(10) ? static_cast<uint16_t>(below(65536)) : kPorts[below(kPorts.size())]; }

uint32_t Generator::mark() {
  const uint32_t r = below(100);
  switch (prog_) {
    case Prog::Egress:
      if (r < 50) return 0;
      if (r < 65) return std::array<uint32_t, 3>{0x539, 0x1539, 0xfffff539}[below(3)];
      if (r < 75) return std::array<uint32_t, 2>{0x53a, 0x111}[below(2)];
      if (r < 85) return SLUICE_TAG_MAGIC | below(7);
      return static_cast<uint32_t>(rng_());
    case Prog::Ingress:
      if (r < 35) return 0;
      if (r < 75) return SLUICE_TAG_MAGIC | below(7);
      if (r < 80) return SLUICE_TAG_MAGIC | below(65536);
      if (r < 85) return 0x51cd0001;
      return static_cast<uint32_t>(rng_());
    default:  // nothing in the pod and node programs reads it but pod_egress/pod_ingress
      return r < 80 ? 0 : static_cast<uint32_t>(rng_());
  }
}

// A frame built field by field, aimed at the program: the ends its rules
// look at come up often.
Packet Generator::structured(bool v4) {
  const Family& f = v4 ? kV4 : kV6;
  std::string src = address(v4), dst = address(v4);
  uint16_t sport = port(), dport = port();
  switch (prog_) {
    case Prog::Egress:
      if (chance(60)) src = f.pod;
      if (chance(30)) dport = 53;
      break;
    case Prog::Ingress:
      if (chance(50)) dst = f.pod;
      if (chance(30)) src = f.pod;  // what pod_egress loops
      break;
    case Prog::LoEgress:
      if (chance(60)) sport = SLUICE_DEFAULT_DNS_PORT;
      if (chance(60)) dst = f.pod;
      if (chance(50)) src = chance(50) ? f.loopback : f.pod;
      if (chance(50)) dport = chance(50) ? 40000 : 40001;
      break;
    case Prog::HostEgress:  // the node's sockets (probers) towards pods
      if (chance(60)) dst = chance(80) ? f.pod : f.pod2;
      if (chance(50)) src = chance(50) ? f.remote : f.resolver;
      if (chance(60)) sport = static_cast<uint16_t>(40000 + below(3));
      if (chance(60)) dport = chance(50) ? 8080 : 15008;
      break;
    case Prog::HostIngress:  // the pods' replies to the probe address
      if (chance(60)) src = f.pod;
      if (chance(60)) dst = f.probe;
      if (chance(60)) sport = chance(50) ? 8080 : 15008;
      if (chance(60)) dport = static_cast<uint16_t>(40000 + below(3));
      break;
  }
  // The sandbox's connection (pod:kClientPort <-> remote:kServerPort), either way.
  if (chance(10)) {
    const bool fwd = chance(50);
    src = fwd ? f.pod : f.remote;
    dst = fwd ? f.remote : f.pod;
    sport = fwd ? kClientPort : kServerPort;
    dport = fwd ? kServerPort : kClientPort;
  }

  const uint32_t kind = below(100);
  const uint8_t flags = chance(50) ? static_cast<uint8_t>(below(256)) : kCommonFlags[below(kCommonFlags.size())];
  Packet p = kind < 55   ? Packet::tcp(src, sport, dst, dport, flags)
             : kind < 85 ? Packet::udp(src, sport, dst, dport)
                         : Packet::icmp(src, dst);
  const bool tcp = kind < 55, udp = kind >= 55 && kind < 85;
  // Probers open many connections: two with the same port meet.
  if (tcp && prog_ == Prog::HostEgress && chance(30)) p.tcpFlags(SYN);
  if (tcp) p.seq(static_cast<uint32_t>(rng_()), static_cast<uint32_t>(rng_()));
  if (chance(50)) p.ipId(static_cast<uint32_t>(rng_()) | 1);

  if (v4) {
    if (chance(15)) p.ipv4Options(1 + below(10));
    if (chance(15)) p.dontFragment();
    if (chance(15)) {
      static const std::array<uint16_t, 4> offsets = {0, 1, 185, 0x1fff};
      p.fragment(chance(50), chance(20) ? static_cast<uint16_t>(below(0x2000)) : offsets[below(offsets.size())]);
    }
    if (chance(3)) p.ihlField(static_cast<uint8_t>(below(16)));
  } else if (chance(40)) {
    const unsigned n = 1 + below(8);
    bool fragmented = false;
    for (unsigned i = 0; i < n; i++) {
      switch (below(7)) {
        case 0: p.ext(ext6::HOPOPTS, 8 * (1 + below(3))); break;
        case 1: p.ext(ext6::ROUTING, 8 * (1 + below(3))); break;
        case 2:  // now and then a long one: headers beyond the first 1024 bytes
          p.ext(ext6::DSTOPTS, 8 * (1 + (chance(5) ? below(256) : below(8))));
          break;
        case 3: p.ext(ext6::AH, 12 + 4 * below(4)); break;
        case 4:
          if (!fragmented) {
            fragmented = true;
            static const std::array<uint16_t, 4> offsets = {0, 0, 3, 185};
            p.fragment(chance(50), chance(20) ? static_cast<uint16_t>(below(0x2000)) : offsets[below(offsets.size())]);
          }
          break;
        case 5: p.ext(253, 8); break;  // experimental: not an extension header to the stack
        default: p.ext(59, 8); break;  // no next header
      }
    }
  }
  if (chance(3)) p.versionField(static_cast<uint8_t>(below(16)));
  if (tcp && chance(15)) p.tcpOptions(1 + below(10));
  if (tcp && chance(3)) p.tcpDataOffsetField(static_cast<uint8_t>(below(16)));
  if (udp && v4 && chance(10)) p.udpChecksumZero();
  if (chance(30)) {
    Bytes data(chance(10) ? 200 + below(1300) : 1 + below(48));
    for (auto& c : data) c = static_cast<uint8_t>(below(256));
    p.payload(std::move(data));
  }
  if (chance(5)) p.ethertype(kOddEthertypes[below(kOddEthertypes.size())]);
  return p;
}

Input Generator::next() {
  Input in;
  in.mark = mark();
  const bool v4 = chance(50);
  if (chance(2)) {
    // Garbage behind an IP (or any) ethertype.
    in.frame.resize(14 + below(200));
    for (auto& c : in.frame) c = static_cast<uint8_t>(below(256));
    const uint32_t t = below(3);
    if (t < 2) {
      in.frame[12] = t == 0 ? 0x08 : 0x86;
      in.frame[13] = t == 0 ? 0x00 : 0xdd;
    }
    return in;
  }
  in.frame = structured(v4).bytes();
  Bytes& b = in.frame;
  if (chance(3)) {  // another transport protocol
    const uint8_t proto = static_cast<uint8_t>(below(256));
    if (v4 && b.size() > 23) b[23] = proto;
    if (!v4 && b.size() > 20 && b[20] != 0 && b[20] != 43 && b[20] != 44 && b[20] != 51 && b[20] != 60) b[20] = proto;
  }
  if (chance(5) && b.size() > 19) {  // a wrong length field
    const size_t off = v4 ? 16 : 18;
    b[off] = static_cast<uint8_t>(below(256));
    b[off + 1] = static_cast<uint8_t>(below(256));
  }
  if (chance(8)) {  // flipped bytes anywhere after the MACs
    for (unsigned i = 0, n = 1 + below(4); i < n; i++) b[12 + below(static_cast<uint32_t>(b.size() - 12))] ^= 1u << below(8);
  }
  if (chance(10)) b.resize(14 + below(static_cast<uint32_t>(b.size() - 13)));  // truncated: 14..size bytes
  if (chance(3)) {
    for (unsigned i = 0, n = 1 + below(32); i < n; i++) b.push_back(static_cast<uint8_t>(below(256)));
  }
  // BPF_PROG_TEST_RUN takes at most a page less headroom and
  // skb_shared_info (3712 bytes on x86-64), and refuses more with EINVAL
  // (OversizedFrameRefusedByTestRun): a longer frame is cut, a capture of
  // its first 3 KiB.
  if (b.size() > kMaxFrame) b.resize(kMaxFrame);
  return in;
}

}  // namespace sluice::test::fuzz
