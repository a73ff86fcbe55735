// The reference model: the redirection contract as plain C++.
//
// Written from docs/redirection.md and the README's "Fail closed on what
// cannot be judged", in the contract's own order:
//  1. What is the frame, as the stack will see it after TC (Ethernet type,
//     IP header, the IPv6 extension chain, fragments, the transport header)?
//     What the stack may still take for TCP but cannot be seen from here is
//     "unjudged" and must be dropped and counted at the pod's interfaces.
//  2. Which rule (1-9) applies to it, with the pod's options?
//  3. What a BPF_PROG_TEST_RUN shows of that decision (the tags that carry a
//     decision from pod_egress to pod_ingress, the counters, the rewrite).
// Facts of the test-run environment the model relies on (see harness.h and
// pod_programs_test.cpp): bpf_redirect() shows as TC_ACT_REDIRECT, and
// bpf_sk_assign() works only at a real TC ingress, so a hand-off to a proxy
// socket shows as a drop counted in dropped_pkts whether the proxy listens or
// not; the test-run skb's socket is a dummy, never an app's TCP socket.
#include "test/bpf/fuzz_model.h"

#include <linux/pkt_cls.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace sluice::test::fuzz {
namespace {

// ------------------------------------------------------------ the spec's values

constexpr uint16_t kOutboundPort = 15001;
constexpr uint16_t kInboundPort = 15006;
constexpr uint16_t kHbonePort = 15008;
constexpr uint16_t kDnsListenerPort = 15053;
constexpr uint32_t kProxyMark = 0x539, kMarkMask = 0xfff, kReturnMark = 0x111;

const IpAddr& probeAddr(int family) {
  static const IpAddr v4 = IpAddr::parse("169.254.7.127");
  static const IpAddr v6 = IpAddr::parse("fd16:9254:7127:1337:ffff:ffff:ffff:ffff");
  return family == AF_INET ? v4 : v6;
}

bool isLoopback(const IpAddr& a) {
  if (a.family == AF_INET) return a.b[0] == 127;  // 127.0.0.0/8
  static const IpAddr one = IpAddr::parse("::1");
  return a == one;
}

// ---------------------------------------------------- the frame, as the stack sees it

enum class Kind {
  Refused,     // test-run refuses it: shorter than Ethernet + the fixed IP header
  NotIp,       // another ethertype: not sluice's
  Unjudged,    // may be TCP for the stack, cannot be judged here
  Other,       // IP, neither TCP nor UDP (or a later UDP fragment): not sluice's
  Transport,   // a whole TCP or UDP header, not a fragment
  UdpFragment  // the first (or an atomic) fragment of a UDP datagram, ports known
};

struct View {
  Kind kind = Kind::NotIp;
  int family = 0;
  IpAddr src, dst;
  uint8_t proto = 0;
  size_t l3 = 14, l4 = 0;
  uint8_t flags = 0;
  uint16_t sport = 0, dport = 0;
};

uint16_t be16(const Bytes& b, size_t off) { return static_cast<uint16_t>(b[off] << 8 | b[off + 1]); }

bool isExtHeader(uint8_t nh) {
  return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS || nh == IPPROTO_AH ||
         nh == IPPROTO_FRAGMENT;
}

// How many extension headers the contract promises to look through: more
// than that and the packet cannot be judged.
constexpr int kExtHeadersWalked = 6;

View see(const Bytes& b) {
  View v;
  if (b.size() < 14) return {.kind = Kind::Refused};
  const uint16_t type = be16(b, 12);
  bool fragment = false;  // a first or atomic fragment
  if (type == 0x0800) {
    if (b.size() < 14 + 20) return {.kind = Kind::Refused};
    const uint8_t version = b[14] >> 4, ihl = b[14] & 0xf;
    if (version != 4 || ihl < 5) return {.kind = Kind::Unjudged};
    v.family = AF_INET;
    v.src.family = v.dst.family = AF_INET;
    std::memcpy(v.src.b.data(), &b[26], 4);
    std::memcpy(v.dst.b.data(), &b[30], 4);
    v.proto = b[23];
    v.l4 = 14 + ihl * 4u;
    const uint16_t frag = be16(b, 20);
    if (frag & 0x1fff) {
      // A later fragment: no transport header. TCP is reassembled by the
      // stack after TC: unjudged. The rest is not sluice's.
      v.kind = v.proto == IPPROTO_TCP ? Kind::Unjudged : Kind::Other;
      return v;
    }
    fragment = frag & 0x2000;
  } else if (type == 0x86dd) {
    if (b.size() < 14 + 40) return {.kind = Kind::Refused};
    if ((b[14] >> 4) != 6) return {.kind = Kind::Unjudged};
    v.family = AF_INET6;
    v.src.family = v.dst.family = AF_INET6;
    std::memcpy(v.src.b.data(), &b[22], 16);
    std::memcpy(v.dst.b.data(), &b[38], 16);
    uint8_t nh = b[20];
    size_t off = 14 + 40;
    int walked = 0;
    while (isExtHeader(nh)) {
      if (walked == kExtHeadersWalked) return {.kind = Kind::Unjudged};
      walked++;
      if (nh == IPPROTO_FRAGMENT) {
        if (off + 4 > b.size()) return {.kind = Kind::Unjudged};
        const uint8_t next = b[off];
        const uint16_t offset = be16(b, off + 2) & 0xfff8;
        off += 8;
        if (offset) {
          // A later fragment: only its next header to go by; when that is
          // an extension header the payload's protocol is unknown.
          v.proto = next;
          v.kind = next == IPPROTO_TCP || isExtHeader(next) ? Kind::Unjudged : Kind::Other;
          return v;
        }
        fragment = true;  // first fragment, or atomic (a whole packet to the stack)
        nh = next;
        continue;
      }
      if (off + 2 > b.size()) return {.kind = Kind::Unjudged};
      const uint8_t next = b[off];
      off += nh == IPPROTO_AH ? (b[off + 1] + 2u) * 4 : (b[off + 1] + 1u) * 8;
      nh = next;
    }
    v.proto = nh;
    v.l4 = off;
  } else if (type == 0x8100 || type == 0x88a8) {
    // A VLAN tag still in the frame: the stack may strip it and deliver
    // what is behind it.
    return {.kind = Kind::Unjudged};
  } else {
    return {.kind = Kind::NotIp};
  }

  if (v.proto == IPPROTO_TCP) {
    if (fragment) return {.kind = Kind::Unjudged};
    if (v.l4 + 20 > b.size()) return {.kind = Kind::Unjudged};
    const unsigned doff = b[v.l4 + 12] >> 4;
    if (doff < 5 || v.l4 + doff * 4 > b.size()) return {.kind = Kind::Unjudged};
    v.flags = b[v.l4 + 13];
  } else if (v.proto == IPPROTO_UDP) {
    if (v.l4 + (fragment ? 4 : 8) > b.size()) return {.kind = Kind::Unjudged};
  } else {
    v.kind = Kind::Other;
    return v;
  }
  v.sport = be16(b, v.l4);
  v.dport = be16(b, v.l4 + 2);
  v.kind = fragment ? Kind::UdpFragment : Kind::Transport;
  return v;
}

// Connection set-up: SYN alone among SYN/ACK/RST/FIN (ECN and the rest
// may ride along), what the stack takes for a new connection.
bool isSetup(uint8_t flags) { return (flags & 0x17) == 0x02; }

// ------------------------------------------------------ checksums (RFC 1624)

// The one's complement checksum at @p off after the covered data changed by
// @p delta (the one's complement sum of the old words complemented plus the
// new ones), as the kernel's incremental fix-up computes it: the result is
// the complement of a non-zero folded sum, so never 0xffff from TCP. UDP
// (@p udp): a checksum of 0 means "none" and stays 0, and a result of 0 is
// written 0xffff (RFC 768).
void csumAdjust(Bytes& b, size_t off, uint64_t delta, bool udp) {
  uint16_t old = be16(b, off);
  if (udp && old == 0) return;
  uint64_t s = delta + (0xffffffffull - old);
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  uint16_t out = static_cast<uint16_t>(~s & 0xffff);
  if (udp && out == 0) out = 0xffff;
  b[off] = static_cast<uint8_t>(out >> 8);
  b[off + 1] = static_cast<uint8_t>(out);
}

// delta for replacing @p from with @p to (16-bit words).
uint64_t wordsDelta(const uint8_t* from, const uint8_t* to, size_t len) {
  uint64_t d = 0;
  for (size_t i = 0; i < len; i += 2) {
    d += static_cast<uint16_t>(~(from[i] << 8 | from[i + 1]));
    d += static_cast<uint16_t>(to[i] << 8 | to[i + 1]);
  }
  return d;
}

// Rewrites the source (or destination) address and port of the parsed
// transport packet, fixing the IPv4 header checksum and the transport
// checksum (pseudo-header included).
void rewrite(Bytes& b, const View& v, bool source, const IpAddr& addr, uint16_t port) {
  const size_t alen = v.family == AF_INET ? 4 : 16;
  const size_t aoff = v.family == AF_INET ? (source ? 26 : 30) : (source ? 22 : 38);
  const size_t poff = v.l4 + (source ? 0 : 2);
  const bool udp = v.proto == IPPROTO_UDP;
  const size_t coff = v.l4 + (udp ? 6 : 16);
  uint8_t newPort[2] = {static_cast<uint8_t>(port >> 8), static_cast<uint8_t>(port)};
  const uint64_t addrDelta = wordsDelta(&b[aoff], addr.b.data(), alen);
  const uint64_t portDelta = wordsDelta(&b[poff], newPort, 2);
  if (v.family == AF_INET) csumAdjust(b, 24, addrDelta, false);
  csumAdjust(b, coff, addrDelta, udp);
  csumAdjust(b, coff, portDelta, udp);
  std::memcpy(&b[aoff], addr.b.data(), alen);
  b[poff] = newPort[0];
  b[poff + 1] = newPort[1];
}

// The reset an app gets when its proxy socket is gone: the packet mirrored
// (addresses, ports, sequence and acknowledgment numbers swapped), flags
// RST|ACK, the rest kept.
void mirrorAsReset(Bytes& b, const View& v) {
  const size_t alen = v.family == AF_INET ? 4 : 16;
  const size_t soff = v.family == AF_INET ? 26 : 22;
  for (size_t i = 0; i < alen; i++) std::swap(b[soff + i], b[soff + alen + i]);
  for (size_t i = 0; i < 2; i++) std::swap(b[v.l4 + i], b[v.l4 + 2 + i]);
  for (size_t i = 0; i < 4; i++) std::swap(b[v.l4 + 4 + i], b[v.l4 + 8 + i]);
  uint8_t before[2] = {b[v.l4 + 12], b[v.l4 + 13]};
  uint8_t after[2] = {b[v.l4 + 12], 0x14};
  csumAdjust(b, v.l4 + 16, wordsDelta(before, after, 2), false);
  b[v.l4 + 13] = 0x14;
}

// ----------------------------------------------------------------- the pod

NatClient natClient(const IpAddr& a, uint16_t port, uint8_t proto) {
  NatClient c;
  c.family = a.family;
  std::memcpy(c.addr.data(), a.b.data(), a.size());
  c.port = port;
  c.proto = proto;
  return c;
}

// A local socket owns the packet's flow as its receiver: its local end is
// the destination and its peer the source. Listeners never do.
// A local socket owns v's connection (at @p port instead of v's
// destination port, when given: where a NAT in the pod keeps it).
bool owned(const Env& env, const View& v, uint16_t port = 0) {
  const uint16_t local = port ? port : v.dport;
  for (const Conn& c : env.conns)
    if (c.local == v.dst && c.localPort == local && c.peer == v.src && c.peerPort == v.sport) return true;
  return false;
}

struct Outcome {
  Prediction p;
  const Env& env;
  void count(__u64 sluice_pod_stats::*field) {
    if (env.enrolled) p.counts.*field += 1;
  }
  Prediction& drop(const std::string& why) {
    p.verdict = TC_ACT_SHOT;
    count(&sluice_pod_stats::dropped_pkts);
    p.why = why;
    return p;
  }
  Prediction& next(const std::string& why) {
    p.verdict = kNext;
    p.why = why;
    return p;
  }
  // A hand-off to a proxy socket: test-run cannot assign one (see the top
  // of this file), so it ends as the fail-closed drop.
  Prediction& handOff(const std::string& why) { return drop(why + " (hand-off: not possible in test-run)"); }
};

Prediction egress(const View& v, const Bytes& frame, uint32_t mark, const Env& env) {
  Outcome o{{.mark = mark, .out = frame}, env};
  if (!env.settings) return o.next("no settings: nothing is touched");
  if ((mark & kMarkMask) == kProxyMark) return o.next("rule 5: the proxy's own traffic");
  if (!env.enrolled) return o.next("not enrolled");
  const bool dnsCapture = env.flags & SLUICE_POD_DNS_CAPTURE;
  switch (v.kind) {
    case Kind::Refused: break;
    case Kind::NotIp:
    case Kind::Other: return o.next("not TCP/UDP: rule 5");
    case Kind::Unjudged: return o.drop("fail closed: cannot be judged");
    case Kind::UdpFragment:
      if (v.dport == 53 && dnsCapture) return o.drop("fail closed: a DNS query in fragments cannot be translated");
      return o.next("rule 5: other UDP");
    case Kind::Transport: break;
  }
  auto loop = [&](enum sluice_tag tag, const std::string& why) -> Prediction& {
    o.p.verdict = TC_ACT_REDIRECT;
    o.p.mark = SLUICE_TAG_MAGIC | tag;
    o.p.why = why;
    return o.p;
  };
  auto captureDns = [&](enum sluice_tag tag, const std::string& why) -> Prediction& {
    NatResolver r;
    std::memcpy(r.addr.data(), v.dst.b.data(), v.dst.size());
    r.port = v.dport;
    o.p.natRecorded = {natClient(v.src, v.sport, v.proto), r};
    rewrite(o.p.out, v, false, v.src, kDnsListenerPort);
    return loop(tag, why);
  };
  if (v.proto == IPPROTO_UDP) {
    if (v.dport == 53 && dnsCapture) return captureDns(SLUICE_TAG_DNS_UDP, "rule 3: UDP DNS query");
    return o.next("rule 5: other UDP");
  }
  // TCP.
  if (isLoopback(v.dst)) return o.next("rule 5: TCP to loopback");
  if (v.dst == probeAddr(v.family)) return o.next("rule 1: the probe address is not captured");
  if (v.dport == 53 && dnsCapture) {
    if (isSetup(v.flags)) return captureDns(SLUICE_TAG_DNS_TCP, "rule 2: TCP DNS set-up");
    auto it = env.nat.find(natClient(v.src, v.sport, IPPROTO_TCP));
    if (it != env.nat.end() && it->second.port == v.dport &&
        std::memcmp(it->second.addr.data(), v.dst.b.data(), v.dst.size()) == 0)
      return captureDns(SLUICE_TAG_OWNED, "rule 2: later packet of a captured TCP DNS flow");
  }
  if (isSetup(v.flags)) return loop(SLUICE_TAG_OUTBOUND, "rule 1: outbound set-up");
  if (owned(env, v))
    return loop(v.flags & tcpflag::SYN ? SLUICE_TAG_OWNED : SLUICE_TAG_OWNED_DATA,
                "rules 1/4: a later packet of a flow a local socket owns");
  return o.next("rules 1/4: a later packet no local socket owns");
}

Prediction ingress(const View& v, const Bytes& frame, uint32_t mark, const Env& env) {
  Outcome o{{.mark = mark, .out = frame}, env};
  const bool tagged = (mark & SLUICE_TAG_MASK) == SLUICE_TAG_MAGIC;
  if (tagged && (mark & ~SLUICE_TAG_MASK) == SLUICE_TAG_OWNED_DATA) {
    // pod_egress found the flow's proxy socket: delivered locally as it is.
    if (!env.settings) {
      o.p.verdict = TC_ACT_SHOT;
      o.p.why = "OWNED_DATA without settings: cannot be delivered";
      return o.p;
    }
    o.p.verdict = TC_ACT_OK;
    o.p.mark = kReturnMark;
    o.count(&sluice_pod_stats::owned_pkts);
    o.p.why = "OWNED_DATA: delivered locally to the proxy's socket";
    return o.p;
  }
  if (tagged) {
    if (!env.settings || !env.enrolled) return o.next("tagged, but no pod: not touched");
    const uint32_t tag = mark & ~SLUICE_TAG_MASK;
    o.p.mark = kReturnMark;  // every looped packet is for a local socket
    if (v.kind != Kind::Transport) return o.drop("looped packet that is not a whole TCP/UDP packet");
    if (tag == SLUICE_TAG_DNS_UDP) {
      if (v.proto != IPPROTO_UDP) return o.drop("DNS_UDP tag on TCP");
      return env.listeners ? o.handOff("rule 3: to the DNS listener") : o.drop("rule 3: no DNS listener");
    }
    if (v.proto != IPPROTO_TCP) return o.drop("looped UDP without the DNS_UDP tag");
    if (tag == SLUICE_TAG_OWNED && !(v.flags & tcpflag::SYN)) {
      if (owned(env, v)) {
        o.p.verdict = TC_ACT_OK;
        o.count(&sluice_pod_stats::owned_pkts);
        o.p.why = "OWNED: its proxy socket is there, delivered locally";
        return o.p;
      }
      mirrorAsReset(o.p.out, v);
      o.p.verdict = TC_ACT_OK;
      o.count(&sluice_pod_stats::dropped_pkts);
      o.p.why = "OWNED: the proxy socket is gone, the app gets a reset";
      return o.p;
    }
    if (owned(env, v)) return o.handOff("a retransmitted set-up to the socket that owns it");
    if (!isSetup(v.flags)) return o.drop("looped later packet whose socket is gone");
    if (tag == SLUICE_TAG_DNS_TCP)
      return env.listeners ? o.handOff("rule 2: to the DNS listener") : o.drop("rule 2: no DNS listener");
    if (tag == SLUICE_TAG_OUTBOUND)
      return env.listeners ? o.handOff("rule 1: to 15001") : o.drop("rule 1: no 15001 listener");
    return o.drop("unknown tag");
  }

  // Arriving at the pod. Rules 9 and 6: only TCP set-up is sluice's.
  switch (v.kind) {
    case Kind::Refused: break;
    case Kind::NotIp:
    case Kind::Other:
    case Kind::UdpFragment: return o.next("rule 9: not TCP");
    case Kind::Unjudged:
      if (!env.settings || !env.enrolled) return o.next("unjudged, but no pod");
      return o.drop("fail closed: cannot be judged");
    case Kind::Transport: break;
  }
  if (v.proto != IPPROTO_TCP) return o.next("rule 9: not TCP");
  if (!env.settings || !env.enrolled) return o.next("not enrolled");
  const bool setup = isSetup(v.flags);
  for (uint32_t i : env.reroute)
    if (i == env.ifindex) {
      if (!setup) return o.next("virtual interface: only set-up is redirected");
      return env.listeners ? o.handOff("virtual interface: to 15001 (Istio: -i IF -p tcp REDIRECT 15001)")
                           : o.drop("virtual interface: no 15001 listener");
    }
  if (!(env.flags & SLUICE_POD_INBOUND_CAPTURE)) return o.next("inbound capture off");
  if (v.dport == kHbonePort) return o.next("rule 7: HBONE");
  if (v.src == probeAddr(v.family)) return o.next("rule 8: from the probe address");
  if (isLoopback(v.dst)) return o.next("to loopback: not inbound");
  if (setup) return env.listeners ? o.handOff("rule 6: to 15006") : o.drop("rule 6: no 15006 listener");
  // Rule 6, a later segment: a local socket's if one owns its connection;
  // one no socket owns (a SYN-cookie ACK, a stray) goes where its SYN would.
  if (owned(env, v)) return o.next("rule 6: a later segment goes to the socket that owns it");
  if (owned(env, v, kInboundPort))
    return o.handOff("rule 6: a later segment of a connection a NAT in the pod keeps at 15006");
  return env.listeners ? o.handOff("rule 6: a segment no socket owns (SYN cookie) to 15006")
                       : o.drop("rule 6: a segment no socket owns, no 15006 listener");
}

Prediction loEgress(const View& v, const Bytes& frame, uint32_t mark, const Env& env) {
  Outcome o{{.mark = mark, .out = frame}, env};
  if (!env.settings) return o.next("no settings");
  if (v.kind != Kind::Transport || v.sport != kDnsListenerPort) return o.next("not from the DNS listener");
  auto it = env.nat.find(natClient(v.dst, v.dport, v.proto));
  if (it == env.nat.end()) return o.next("rules 2/3: no recorded query for this client");
  // The listener answers from loopback (UDP) or the pod's own address
  // (TCP, the query was translated to it): the destination.
  if (!isLoopback(v.src) && v.src != v.dst) return o.next("rules 2/3: not the DNS listener's answer");
  IpAddr resolver;
  resolver.family = v.family;
  std::memcpy(resolver.b.data(), it->second.addr.data(), resolver.size());
  rewrite(o.p.out, v, true, resolver, it->second.port);
  o.count(&sluice_pod_stats::dns_answers);
  return o.next("rules 2/3: the answer gets the resolver back");
}

// ------------------------------------------------------------------ the node

SnatKey snatKey(const IpAddr& pod, uint16_t podPort, uint16_t port) {
  SnatKey k;
  k.family = pod.family;
  std::memcpy(k.pod.data(), pod.b.data(), pod.size());
  k.podPort = podPort;
  k.port = port;
  return k;
}

// A connection's FINs, and whether this packet finishes it: a reset, or
// the first packet without FIN once both sides sent theirs (the last ACK).
void track(Prediction& p, const SnatKey& k, SnatConn c, uint8_t flags, uint16_t fin) {
  const uint16_t before = c.flags;
  if (flags & tcpflag::FIN) c.flags |= fin;
  p.snatSet = {k, c};
  const bool both = (before & (SLUICE_SNAT_FIN_OUT | SLUICE_SNAT_FIN_IN)) == (SLUICE_SNAT_FIN_OUT | SLUICE_SNAT_FIN_IN);
  if ((flags & tcpflag::RST) || (both && !(flags & tcpflag::FIN))) {
    p.snatForget = k;
    p.keepClosed = !(flags & tcpflag::RST);
  }
}

// Rule 10, the probe's way in: TCP from a socket of the node (a test-run skb
// always has one) to an enrolled pod's address leaves with the probe source.
Prediction hostEgress(const View& v, const Bytes& frame, uint32_t mark, const Env& env) {
  Outcome o{{.mark = mark, .out = frame}, env};
  if (!env.settings) return o.next("no settings");
  if (v.kind != Kind::Transport || v.proto != IPPROTO_TCP) return o.next("rule 10: only whole TCP packets");
  bool toPod = false;
  for (const IpAddr& a : env.podAddrs) toPod |= a == v.dst;
  if (!toPod) return o.next("rule 10: not to an enrolled pod's address");
  const IpAddr& probe = probeAddr(v.family);
  if (v.src == probe) return o.next("rule 10: already from the probe address");
  auto mine = [&](const std::pair<const SnatKey, SnatConn>& e) {
    return e.first.family == v.family && std::memcmp(e.first.pod.data(), v.dst.b.data(), v.dst.size()) == 0 &&
           e.first.podPort == v.dport && e.second.prober == v.src && e.second.proberPort == v.sport;
  };
  auto live = std::find_if(env.snat.begin(), env.snat.end(), mine);
  if (live != env.snat.end()) {
    rewrite(o.p.out, v, true, probe, live->first.port);
    track(o.p, live->first, live->second, v.flags, SLUICE_SNAT_FIN_OUT);
    return o.next("rule 10: a packet of a translated probe connection");
  }
  if (isSetup(v.flags)) {
    SnatConn c{v.src, v.sport, 0};
    const SnatKey own = snatKey(v.dst, v.dport, v.sport);
    o.count(&sluice_pod_stats::probe_conns);
    if (!env.snat.count(own)) {
      rewrite(o.p.out, v, true, probe, v.sport);
      o.p.closedErase = own;
      track(o.p, own, c, v.flags, SLUICE_SNAT_FIN_OUT);
      return o.next("rule 10: a new probe connection keeps its port");
    }
    o.p.portToChoose = true;
    o.p.snatSet = {own, c};  // the port is filled in by choosePort
    rewrite(o.p.out, v, true, probe, v.sport);
    return o.next("rule 10: a new probe connection whose port is taken gets another");
  }
  auto closed = std::find_if(env.snatClosed.begin(), env.snatClosed.end(), mine);
  if (closed != env.snatClosed.end()) {
    rewrite(o.p.out, v, true, probe, closed->first.port);
    return o.next("rule 10: a late packet of a finished probe connection");
  }
  return o.next("rule 10: not a translated connection (set up before enrollment, or forgotten)");
}

// Rule 10, the replies: the pod's answers to the probe address go back to
// the prober.
Prediction hostIngress(const View& v, const Bytes& frame, uint32_t mark, const Env& env) {
  Outcome o{{.mark = mark, .out = frame}, env};
  if (!env.settings) return o.next("no settings");
  if (v.kind != Kind::Transport || v.proto != IPPROTO_TCP) return o.next("rule 10: only whole TCP packets");
  if (v.dst != probeAddr(v.family)) return o.next("rule 10: not to the probe address");
  const SnatKey k = snatKey(v.src, v.sport, v.dport);
  if (auto it = env.snat.find(k); it != env.snat.end()) {
    rewrite(o.p.out, v, false, it->second.prober, it->second.proberPort);
    track(o.p, k, it->second, v.flags, SLUICE_SNAT_FIN_IN);
    return o.next("rule 10: a reply of a translated probe connection");
  }
  if (auto it = env.snatClosed.find(k); it != env.snatClosed.end()) {
    rewrite(o.p.out, v, false, it->second.prober, it->second.proberPort);
    return o.next("rule 10: a late reply of a finished probe connection");
  }
  return o.next("rule 10: no translated connection");
}

}  // namespace

std::string choosePort(Prediction& p, const Bytes& frame, const Bytes& got, const Env& env) {
  const View v = see(frame);
  if (got.size() < v.l4 + 2) return "the program's output is too short to hold the chosen port";
  const uint16_t port = be16(got, v.l4);
  SnatKey k = p.snatSet->first;
  k.port = port;
  if (port == v.sport) return "the program kept the prober's port, which another prober holds";
  if (port < 1024) return "the program chose port " + std::to_string(port) + ", outside 1024-65535";
  if (env.snat.count(k)) return "the program chose port " + std::to_string(port) + ", which another connection holds";
  p.out = frame;
  rewrite(p.out, v, true, probeAddr(v.family), port);
  SnatConn c = p.snatSet->second;
  p.snatSet.reset();
  p.closedErase = k;
  track(p, k, c, v.flags, SLUICE_SNAT_FIN_OUT);
  p.portToChoose = false;
  return "";
}

Prediction predict(Prog prog, const Bytes& frame, uint32_t mark, const Env& env) {
  const View v = see(frame);
  if (v.kind == Kind::Refused) return {.refused = true, .why = "shorter than Ethernet + the fixed IP header"};
  switch (prog) {
    case Prog::Egress: return egress(v, frame, mark, env);
    case Prog::Ingress: return ingress(v, frame, mark, env);
    case Prog::LoEgress: return loEgress(v, frame, mark, env);
    case Prog::HostEgress: return hostEgress(v, frame, mark, env);
    case Prog::HostIngress: return hostIngress(v, frame, mark, env);
  }
  return {.refused = true, .why = "no model for this program"};
}

void apply(const Prediction& p, Env& env) {
  if (p.natRecorded) env.nat[p.natRecorded->first] = p.natRecorded->second;
  if (p.closedErase) env.snatClosed.erase(*p.closedErase);
  if (p.snatSet) env.snat[p.snatSet->first] = p.snatSet->second;
  if (p.snatForget) {
    if (p.keepClosed) env.snatClosed[*p.snatForget] = env.snat[*p.snatForget];
    env.snat.erase(*p.snatForget);
  }
}

}  // namespace sluice::test::fuzz
