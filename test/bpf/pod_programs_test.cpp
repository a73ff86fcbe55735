// The pod programs (bpf/pod_tc.bpf.c) through BPF_PROG_TEST_RUN, one table
// per program, IPv4 and IPv6 for every row that applies: each spec rule
// (docs/redirection.md, rules 1-9) with its match and its near-miss.
//
// What test-run can and cannot show:
// - bpf_redirect() only records the target: the run returns
//   TC_ACT_REDIRECT and nothing is redirected. The egress decision is the
//   verdict, the tag left in skb->mark and the (possibly rewritten) frame.
// - bpf_sk_assign() works only at real TC ingress (skb_at_tc_ingress), so
//   an ingress case that reaches a proxy socket ends in TC_ACT_SHOT and a
//   dropped_pkts count here, the same as a missing socket; the hand-off to
//   the listener is proven by the netns tests with real traffic.
// - Test-run skbs are CHECKSUM_NONE, so the checksum checks here (output
//   compared byte for byte with a packet built with fresh checksums, and
//   every checksum recomputed, pseudo-header included) prove the full
//   checksum arithmetic only. BPF_F_PSEUDO_HDR changes nothing for
//   CHECKSUM_NONE (dropping it passes every test here); it matters for
//   CHECKSUM_PARTIAL skbs, i.e. a real pod's egress over a veth with
//   checksum offload, which only the netns tests see.
#include <gtest/gtest.h>
#include <unistd.h>

#include "loader/cgroup.h"
#include <netinet/in.h>

#include <string>
#include <vector>

#include "test/bpf/harness.h"
#include "test/common/packet.h"

namespace sluice::test {
namespace {

using namespace tcpflag;
using namespace std::literals;

constexpr uint16_t kApp = 40000;  // the app's ephemeral port
constexpr uint16_t kDnsPort = SLUICE_DEFAULT_DNS_PORT;
constexpr uint32_t kReturnMark = SLUICE_DEFAULT_RETURN_MARK;

std::string nm(const Family& f, const char* s) { return std::string(f.tag) + "_" + s; }

// ------------------------------------------------------------- pod_egress

std::vector<Case> egressCases() {
  std::vector<Case> cs;
  for (const Family* fp : kFamilies) {
    const Family& f = *fp;
    const bool v4 = &f == &kV4;
    auto tcp = [&](const char* dst, uint16_t dport, uint8_t flags = SYN) {
      return Packet::tcp(f.pod, kApp, dst, dport, flags);
    };
    auto udp = [&](const char* dst, uint16_t dport) { return Packet::udp(f.pod, kApp, dst, dport); };

    // Rule 1.
    cs.push_back({.name = nm(f, "syn_remote_redirected_outbound"),
                  .what = "rule 1: a SYN to a remote address loops to ingress tagged OUTBOUND, unchanged",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80),
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    cs.push_back({.name = nm(f, "syn_ecn_redirected_outbound"),
                  .what = "rule 1: an ECN set-up SYN (SYN|ECE|CWR) is still a SYN",
                  .prog = Prog::Egress, .in = tcp(f.remote, 443, SYN | ECE | CWR),
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    cs.push_back({.name = nm(f, "syn_from_probe_addr_redirected"),
                  .what = "rule 1 near-miss: only the probe address as destination is exempt",
                  .prog = Prog::Egress, .in = Packet::tcp(f.probe, kApp, f.remote, 80),
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    // Rule 5: proxy mark.
    cs.push_back({.name = nm(f, "syn_proxy_mark_passes"),
                  .what = "rule 5: the proxy's own SYN (mark 0x539) is left alone",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80), .mark = SLUICE_DEFAULT_PROXY_MARK});
    cs.push_back({.name = nm(f, "syn_proxy_mark_under_mask_passes"),
                  .what = "rule 5: mark 0x1539 is the proxy mark under the 0xfff mask",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80), .mark = 0x1539});
    cs.push_back({.name = nm(f, "syn_mark_near_proxy_redirected"),
                  .what = "rule 5 near-miss: mark 0x53a is not the proxy mark",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80), .mark = 0x53a,
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    cs.push_back({.name = nm(f, "syn_return_mark_redirected"),
                  .what = "rule 5 near-miss: the return mark 0x111 is not the proxy mark",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80), .mark = kReturnMark,
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    // Rule 1's exception and rule 5: probe address, loopback.
    cs.push_back({.name = nm(f, "syn_to_probe_addr_passes"),
                  .what = "rule 1: TCP to the probe SNAT address is not captured",
                  .prog = Prog::Egress, .in = tcp(f.probe, 8080)});
    cs.push_back({.name = nm(f, "syn_to_loopback_passes"),
                  .what = "rule 5: TCP to the loopback address is not captured",
                  .prog = Prog::Egress, .in = tcp(f.loopback, 80)});
    cs.push_back({.name = nm(f, "dns_tcp_syn_to_loopback_passes"),
                  .what = "rule 5 before rule 2: TCP DNS to the loopback address is not captured",
                  .prog = Prog::Egress, .in = tcp(f.loopback, 53)});
    if (v4) {
      cs.push_back({.name = nm(f, "syn_to_127_8_passes"),
                    .what = "rule 5: all of 127.0.0.0/8 is loopback",
                    .prog = Prog::Egress, .in = tcp("127.1.2.3", 80)});
    } else {
      cs.push_back({.name = nm(f, "syn_to_colon_colon_2_redirected"),
                    .what = "rule 5 near-miss: ::2 is not the IPv6 loopback address",
                    .prog = Prog::Egress, .in = tcp("::2", 80),
                    .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    }
    // Rule 2: TCP DNS.
    cs.push_back({.name = nm(f, "dns_tcp_syn_captured"),
                  .what = "rule 2: a TCP SYN to port 53 is translated to the pod's own address and port 15053, "
                          "tagged DNS_TCP, and the resolver recorded",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53),
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_DNS_TCP),
                  .out = tcp(f.resolver, 53).dst(f.pod, kDnsPort),
                  .natAdded = NatEntry{f.pod, kApp, IPPROTO_TCP, f.resolver, 53}});
    cs.push_back({.name = nm(f, "dns_tcp_syn_with_payload_captured"),
                  .what = "rule 2: TCP checksum fix-up covers the payload too (TFO-style data on the SYN)",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53).payload("\x00\x1d query bytes"sv).tcpOptions(3),
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_DNS_TCP),
                  .out = tcp(f.resolver, 53).payload("\x00\x1d query bytes"sv).tcpOptions(3).dst(f.pod, kDnsPort),
                  .natAdded = NatEntry{f.pod, kApp, IPPROTO_TCP, f.resolver, 53}});
    cs.push_back({.name = nm(f, "dns_tcp_syn_capture_off_outbound"),
                  .what = "rule 2 off (dns-capture false): a TCP SYN to port 53 is ordinary outbound (rule 1)",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53),
                  .pod = {.flags = SLUICE_POD_INBOUND_CAPTURE},
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OUTBOUND)});
    cs.push_back({.name = nm(f, "dns_tcp_syn_proxy_mark_passes"),
                  .what = "rule 5 before rule 2: the proxy's own TCP DNS is left alone",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53), .mark = SLUICE_DEFAULT_PROXY_MARK});
    cs.push_back({.name = nm(f, "dns_tcp_ack_of_captured_flow_rewritten"),
                  .what = "rule 2: a later packet of a captured TCP DNS flow is translated too, tagged OWNED",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53, ACK | PSH).payload("\x00\x05hello"sv),
                  .natSeed = {{f.pod, kApp, IPPROTO_TCP, f.resolver, 53}},
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OWNED),
                  .out = tcp(f.resolver, 53, ACK | PSH).payload("\x00\x05hello"sv).dst(f.pod, kDnsPort)});
    cs.push_back({.name = nm(f, "dns_tcp_ack_other_resolver_passes"),
                  .what = "rule 2 near-miss: the recorded flow went to another resolver; no owner either",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53, ACK),
                  .natSeed = {{f.pod, kApp, IPPROTO_TCP, f.resolver2, 53}}});
    cs.push_back({.name = nm(f, "dns_tcp_ack_udp_entry_passes"),
                  .what = "rule 2 near-miss: a UDP translation does not capture a TCP flow",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53, ACK),
                  .natSeed = {{f.pod, kApp, IPPROTO_UDP, f.resolver, 53}}});
    cs.push_back({.name = nm(f, "dns_tcp_ack_unrecorded_passes"),
                  .what = "rule 2 near-miss: a non-SYN to port 53 without a recorded flow nor owner",
                  .prog = Prog::Egress, .in = tcp(f.resolver, 53, ACK)});
    // Rule 3: UDP DNS.
    cs.push_back({.name = nm(f, "dns_udp_captured"),
                  .what = "rule 3: a UDP query to port 53 is translated to the pod's own address and port "
                          "15053, tagged DNS_UDP, and the resolver recorded",
                  .prog = Prog::Egress, .in = udp(f.resolver, 53),
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_DNS_UDP),
                  .out = udp(f.resolver, 53).dst(f.pod, kDnsPort),
                  .natAdded = NatEntry{f.pod, kApp, IPPROTO_UDP, f.resolver, 53}});
    if (v4) {
      cs.push_back({.name = nm(f, "dns_udp_zero_checksum_stays_zero"),
                    .what = "rule 3: a UDP/IPv4 query without checksum (0) keeps checksum 0 after translation",
                    .prog = Prog::Egress, .in = udp(f.resolver, 53).udpChecksumZero(),
                    .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_DNS_UDP),
                    .out = udp(f.resolver, 53).udpChecksumZero().dst(f.pod, kDnsPort),
                    .natAdded = NatEntry{f.pod, kApp, IPPROTO_UDP, f.resolver, 53}});
    }
    cs.push_back({.name = nm(f, "dns_udp_capture_off_passes"),
                  .what = "rule 3 off (dns-capture false): UDP to port 53 is left alone",
                  .prog = Prog::Egress, .in = udp(f.resolver, 53),
                  .pod = {.flags = SLUICE_POD_INBOUND_CAPTURE}});
    cs.push_back({.name = nm(f, "dns_udp_proxy_mark_passes"),
                  .what = "rule 5: the proxy's own DNS queries are left alone",
                  .prog = Prog::Egress, .in = udp(f.resolver, 53), .mark = SLUICE_DEFAULT_PROXY_MARK});
    cs.push_back({.name = nm(f, "udp_other_port_passes"),
                  .what = "rule 5: other UDP is left alone",
                  .prog = Prog::Egress, .in = udp(f.resolver, 5353)});
    cs.push_back({.name = nm(f, "udp_from_port_53_passes"),
                  .what = "rule 3 near-miss: UDP from port 53 (to another port) is not a query",
                  .prog = Prog::Egress, .in = Packet::udp(f.pod, 53, f.remote, kApp)});
    cs.push_back({.name = nm(f, "icmp_passes"),
                  .what = "rule 5: ICMP is left alone",
                  .prog = Prog::Egress, .in = Packet::icmp(f.pod, f.remote)});
    // Later packets: rules 1 and 4.
    cs.push_back({.name = nm(f, "ack_without_owner_passes"),
                  .what = "rules 1/4: a non-SYN that no local socket owns is left alone",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80, ACK)});
    cs.push_back({.name = nm(f, "synack_without_owner_passes"),
                  .what = "rule 1 near-miss: SYN|ACK is not connection set-up",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80, SYN | ACK)});
    cs.push_back({.name = nm(f, "syn_fin_passes"),
                  .what = "rule 1 near-miss: SYN|FIN (invalid) is not connection set-up",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80, SYN | FIN)});
    cs.push_back({.name = nm(f, "rst_without_owner_passes"),
                  .what = "rules 1/4: a RST that no local socket owns is left alone",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80, RST)});
    cs.push_back({.name = nm(f, "ack_owned_by_accepted_socket_redirected"),
                  .what = "rule 1: a later packet whose destination is the local end of an established "
                          "socket (the proxy's accepted one) loops to ingress tagged OWNED_DATA, unchanged",
                  .prog = Prog::Egress, .in = Packet::tcp(f.pod, kClientPort, f.remote, kServerPort, ACK),
                  .sockets = Sockets::Connection,
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OWNED_DATA)});
    cs.push_back({.name = nm(f, "ack_owned_by_connecting_socket_redirected"),
                  .what = "rule 4: a reply to a socket opened in the pod with a spoofed source (its local "
                          "end is the packet's destination) loops to ingress tagged OWNED_DATA",
                  .prog = Prog::Egress, .in = Packet::tcp(f.remote, kServerPort, f.pod, kClientPort, ACK),
                  .sockets = Sockets::Connection,
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OWNED_DATA)});
    cs.push_back({.name = nm(f, "fin_owned_redirected"),
                  .what = "rule 1: a FIN of an owned flow follows the flow",
                  .prog = Prog::Egress, .in = Packet::tcp(f.pod, kClientPort, f.remote, kServerPort, FIN | ACK),
                  .sockets = Sockets::Connection,
                  .verdict = TC_ACT_REDIRECT, .outMark = tagMark(SLUICE_TAG_OWNED_DATA)});
    cs.push_back({.name = nm(f, "ack_to_listener_only_passes"),
                  .what = "rules 1/4 near-miss: a listener on the destination is not an owner",
                  .prog = Prog::Egress, .in = Packet::tcp(f.pod2, 9999, f.remote, kServerPort, ACK),
                  .sockets = Sockets::Connection});
    cs.push_back({.name = nm(f, "ack_other_port_passes"),
                  .what = "rules 1/4 near-miss: same addresses, a port no socket has",
                  .prog = Prog::Egress, .in = Packet::tcp(f.pod, kClientPort, f.remote, kServerPort + 2, ACK),
                  .sockets = Sockets::Connection});
    // Enrollment and settings.
    cs.push_back({.name = nm(f, "not_enrolled_passes"),
                  .what = "a netns without a pod_config entry is not touched, not counted",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80), .pod = {.enrolled = false}});
    cs.push_back({.name = nm(f, "dns_not_enrolled_passes"),
                  .what = "a netns without a pod_config entry: no DNS capture, no dns_nat entry",
                  .prog = Prog::Egress, .in = udp(f.resolver, 53), .pod = {.enrolled = false}});
    cs.push_back({.name = nm(f, "settings_zero_passes"),
                  .what = "all-zero settings (loader has not written them): nothing is touched",
                  .prog = Prog::Egress, .in = tcp(f.remote, 80), .zeroSettings = true});
  }
  return cs;
}

// ------------------------------------------------------------ pod_ingress

std::vector<Case> ingressCases() {
  std::vector<Case> cs;
  for (const Family* fp : kFamilies) {
    const Family& f = *fp;
    auto in = [&](uint16_t dport, uint8_t flags = SYN) { return Packet::tcp(f.remote, kApp, f.pod, dport, flags); };
    auto looped = [&](const char* dst, uint16_t dport, uint8_t flags = SYN) {
      return Packet::tcp(f.pod, kApp, dst, dport, flags);
    };

    // Rule 6.
    cs.push_back({.name = nm(f, "syn_no_listener_dropped"),
                  .what = "rule 6, fail closed: a new inbound connection with no 15006 listener is dropped",
                  .prog = Prog::Ingress, .in = in(8080),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "syn_ecn_no_listener_dropped"),
                  .what = "rule 6: an ECN set-up SYN is captured as well",
                  .prog = Prog::Ingress, .in = in(8080, SYN | ECE | CWR),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "syn_port_15006_dropped"),
                  .what = "rule 6: a SYN straight to 15006 is captured like any port",
                  .prog = Prog::Ingress, .in = in(SLUICE_DEFAULT_INBOUND_PORT),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    // Rule 7.
    cs.push_back({.name = nm(f, "syn_hbone_passes"),
                  .what = "rule 7: TCP to 15008 is delivered normally",
                  .prog = Prog::Ingress, .in = in(SLUICE_DEFAULT_HBONE_PORT)});
    cs.push_back({.name = nm(f, "syn_port_15009_dropped"),
                  .what = "rule 7 near-miss: 15009 is not the HBONE port",
                  .prog = Prog::Ingress, .in = in(SLUICE_DEFAULT_HBONE_PORT + 1),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    // Rule 8.
    cs.push_back({.name = nm(f, "syn_from_probe_addr_passes"),
                  .what = "rule 8: TCP from the probe SNAT address is delivered to the app",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.probe, kApp, f.pod, 8080)});
    cs.push_back({.name = nm(f, "syn_to_probe_addr_dropped"),
                  .what = "rule 8 near-miss: only the probe address as *source* is exempt",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.remote, kApp, f.probe, 8080),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "syn_to_loopback_passes"),
                  .what = "a SYN to the loopback address is not captured",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.remote, kApp, f.loopback, 8080)});
    // Rule 6, later segments: a socket's if one owns the connection, else
    // (a SYN-cookie ACK, a stray) 15006's like the SYN -- none here: dropped.
    // The sandbox connection: the app's socket kPod:kClientPort connected to
    // kRemote:kServerPort, where a listener and the accepted socket are.
    auto owned = [&](uint8_t flags) { return Packet::tcp(f.remote, kServerPort, f.pod, kClientPort, flags); };
    cs.push_back({.name = nm(f, "ack_no_socket_no_listener_dropped"),
                  .what = "rule 6, SYN cookies: an ACK no socket owns goes to 15006 like its SYN (a cookie "
                          "ACK must not reach the app's listener); no 15006 listener: dropped",
                  .prog = Prog::Ingress, .in = in(8080, ACK).payload("data"sv),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "ack_owned_passes"),
                  .what = "rule 6 near-miss: an ACK of a connection a socket owns (one opened outwards) "
                          "goes to its owner",
                  .prog = Prog::Ingress, .in = owned(ACK), .sockets = Sockets::Connection});
    cs.push_back({.name = nm(f, "ack_owned_by_accepted_passes"),
                  .what = "rule 6 near-miss: an ACK of an accepted connection goes to its owner",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.pod, kClientPort, f.remote, kServerPort, ACK),
                  .sockets = Sockets::Connection});
    cs.push_back({.name = nm(f, "ack_to_listener_only_dropped"),
                  .what = "rule 6, SYN cookies: a listener on the destination is not an owner (the cookie "
                          "ACK's case): the ACK is 15006's, none here: dropped",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.pod, kClientPort + 1, f.remote, kServerPort, ACK),
                  .sockets = Sockets::Connection,
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "synack_owned_passes"),
                  .what = "rule 6: a SYN|ACK answering a connection opened outwards is never hijacked",
                  .prog = Prog::Ingress, .in = owned(SYN | ACK), .sockets = Sockets::Connection});
    cs.push_back({.name = nm(f, "synack_no_socket_dropped"),
                  .what = "rule 6 near-miss: a SYN|ACK nobody waits for is 15006's (it answers a reset); none: "
                          "dropped",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.remote, 443, f.pod, kApp, SYN | ACK),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "fin_owned_passes"),
                  .what = "rule 6: a FIN of a connection a socket owns goes to its owner",
                  .prog = Prog::Ingress, .in = owned(FIN | ACK), .sockets = Sockets::Connection});
    cs.push_back({.name = nm(f, "fin_no_socket_dropped"),
                  .what = "rule 6 near-miss: a FIN no socket owns is 15006's, never the app's listener's; "
                          "none: dropped",
                  .prog = Prog::Ingress, .in = in(8080, FIN | ACK),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "rst_owned_passes"),
                  .what = "rule 6: a RST of a connection a socket owns goes to its owner",
                  .prog = Prog::Ingress, .in = owned(RST), .sockets = Sockets::Connection});
    cs.push_back({.name = nm(f, "rst_no_socket_dropped"),
                  .what = "rule 6 near-miss: a RST no socket owns is 15006's (which ignores it); none: dropped",
                  .prog = Prog::Ingress, .in = in(8080, RST),
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "ack_no_socket_hbone_passes"),
                  .what = "rule 7 for later segments: an ACK to 15008 no socket owns is left to the stack",
                  .prog = Prog::Ingress, .in = in(SLUICE_DEFAULT_HBONE_PORT, ACK)});
    cs.push_back({.name = nm(f, "ack_no_socket_from_probe_addr_passes"),
                  .what = "rule 8 for later segments: an ACK from the probe address is left to the stack",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.probe, kApp, f.pod, 8080, ACK)});
    cs.push_back({.name = nm(f, "ack_no_socket_to_loopback_passes"),
                  .what = "an ACK to the loopback address is not inbound: left to the stack",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.remote, kApp, f.loopback, 8080, ACK)});
    cs.push_back({.name = nm(f, "ack_no_socket_capture_off_passes"),
                  .what = "bypass-inbound-capture: later segments are left to the stack as well",
                  .prog = Prog::Ingress, .in = in(8080, ACK), .pod = {.flags = SLUICE_POD_DNS_CAPTURE}});
    cs.push_back({.name = nm(f, "ack_no_socket_not_enrolled_passes"),
                  .what = "a netns without a pod_config entry: later segments not touched, not counted",
                  .prog = Prog::Ingress, .in = in(8080, ACK), .pod = {.enrolled = false}});
    // Rule 9.
    cs.push_back({.name = nm(f, "udp_passes"),
                  .what = "rule 9: non-TCP inbound is untouched (UDP, even to port 53)",
                  .prog = Prog::Ingress, .in = Packet::udp(f.remote, kApp, f.pod, 53)});
    cs.push_back({.name = nm(f, "icmp_passes"),
                  .what = "rule 9: ICMP inbound is untouched",
                  .prog = Prog::Ingress, .in = Packet::icmp(f.remote, f.pod)});
    // Per-pod options.
    cs.push_back({.name = nm(f, "inbound_capture_off_passes"),
                  .what = "bypass-inbound-capture: rule 6 off",
                  .prog = Prog::Ingress, .in = in(8080), .pod = {.flags = SLUICE_POD_DNS_CAPTURE}});
    cs.push_back({.name = nm(f, "reroute_iface_syn_outbound_dropped"),
                  .what = "virtual interfaces: a SYN arriving on a reroute interface goes to 15001 "
                          "(none here: dropped), even with inbound capture off",
                  .prog = Prog::Ingress, .in = in(8080),
                  .pod = {.flags = SLUICE_POD_DNS_CAPTURE, .reroute = {1}},
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "reroute_iface_last_slot_dropped"),
                  .what = "virtual interfaces: the 8th (last) reroute slot is matched too",
                  .prog = Prog::Ingress, .in = in(8080),
                  .pod = {.flags = SLUICE_POD_DNS_CAPTURE, .reroute = {2, 3, 4, 5, 6, 7, 8, 1}},
                  .verdict = TC_ACT_SHOT, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "reroute_other_iface_passes"),
                  .what = "virtual interfaces near-miss: another interface is listed, not this one",
                  .prog = Prog::Ingress, .in = in(8080),
                  .pod = {.flags = SLUICE_POD_DNS_CAPTURE, .reroute = {7}}});
    cs.push_back({.name = nm(f, "reroute_iface_ack_passes"),
                  .what = "virtual interfaces: only set-up is redirected",
                  .prog = Prog::Ingress, .in = in(8080, ACK),
                  .pod = {.flags = SLUICE_POD_DNS_CAPTURE, .reroute = {1}}});
    cs.push_back({.name = nm(f, "reroute_iface_ack_capture_on_passes"),
                  .what = "virtual interfaces: only set-up is redirected, with inbound capture on too (a "
                          "later segment there is not rule 6's)",
                  .prog = Prog::Ingress, .in = in(8080, ACK),
                  .pod = {.flags = SLUICE_POD_DNS_CAPTURE | SLUICE_POD_INBOUND_CAPTURE, .reroute = {1}}});
    cs.push_back({.name = nm(f, "reroute_iface_udp_passes"),
                  .what = "virtual interfaces: only TCP is redirected",
                  .prog = Prog::Ingress, .in = Packet::udp(f.remote, kApp, f.pod, 53),
                  .pod = {.flags = SLUICE_POD_DNS_CAPTURE, .reroute = {1}}});
    // Packets pod_egress looped back (tagged).
    cs.push_back({.name = nm(f, "tagged_outbound_no_listener_dropped"),
                  .what = "rule 1 at ingress, fail closed: a SYN tagged OUTBOUND gets the return mark and "
                          "is dropped when 15001 has no listener",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80), .mark = tagMark(SLUICE_TAG_OUTBOUND),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_outbound_hbone_port_dropped"),
                  .what = "rule 1: outbound to port 15008 of another host is captured as well",
                  .prog = Prog::Ingress, .in = looped(f.remote, SLUICE_DEFAULT_HBONE_PORT),
                  .mark = tagMark(SLUICE_TAG_OUTBOUND),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "wrong_magic_is_ordinary_inbound"),
                  .what = "tag near-miss: mark 0x51cd0001 is not sluice's tag; the SYN to 15008 is "
                          "ordinary inbound (rule 7) and the mark is kept",
                  .prog = Prog::Ingress, .in = in(SLUICE_DEFAULT_HBONE_PORT), .mark = 0x51cd0001});
    cs.push_back({.name = nm(f, "tagged_dns_tcp_no_listener_dropped"),
                  .what = "rule 2 at ingress, fail closed: no TCP DNS listener",
                  .prog = Prog::Ingress, .in = looped(f.pod, kDnsPort), .mark = tagMark(SLUICE_TAG_DNS_TCP),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_dns_udp_no_listener_dropped"),
                  .what = "rule 3 at ingress, fail closed: no UDP DNS listener",
                  .prog = Prog::Ingress, .in = Packet::udp(f.pod, kApp, f.pod, kDnsPort),
                  .mark = tagMark(SLUICE_TAG_DNS_UDP),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_dns_udp_on_tcp_dropped"),
                  .what = "a DNS_UDP tag on a TCP packet is inconsistent: dropped",
                  .prog = Prog::Ingress, .in = looped(f.pod, kDnsPort), .mark = tagMark(SLUICE_TAG_DNS_UDP),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_owned_with_owner_delivered_locally"),
                  .what = "a packet tagged OWNED whose proxy socket exists is delivered locally with the return "
                          "mark, to the socket the stack finds",
                  .prog = Prog::Ingress, .in = Packet::tcp(f.pod, kClientPort, f.remote, kServerPort, ACK),
                  .mark = tagMark(SLUICE_TAG_OWNED), .sockets = Sockets::Connection,
                  .verdict = TC_ACT_OK, .outMark = kReturnMark, .counts = {.owned_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_owned_without_owner_reset"),
                  .what = "a packet tagged OWNED whose proxy socket is gone becomes a reset to the app: mirrored, "
                          "RST|ACK, seq = the app's ack; delivered locally, counted as dropped (it never leaves "
                          "the pod, and the app learns at once)",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80, ACK).seq(1000, 5000),
                  .mark = tagMark(SLUICE_TAG_OWNED), .verdict = TC_ACT_OK, .outMark = kReturnMark,
                  .out = Packet::tcp(f.remote, 80, f.pod, kApp, RST | ACK).seq(5000, 1000),
                  .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_owned_data_segment_without_owner_reset"),
                  .what = "the same for a data segment: the reset keeps the payload (the receiver ignores it), "
                          "so every checksum is only adjusted for the flags",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80, ACK | PSH).seq(7, 9).payload("leak?"sv),
                  .mark = tagMark(SLUICE_TAG_OWNED), .verdict = TC_ACT_OK, .outMark = kReturnMark,
                  .out = Packet::tcp(f.remote, 80, f.pod, kApp, RST | ACK).seq(9, 7).payload("leak?"sv),
                  .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_owned_data_delivered_locally"),
                  .what = "a packet tagged OWNED_DATA (egress: TCP without SYN, a proxy socket owns it) is "
                          "delivered locally with the return mark, unparsed, and counted",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80, ACK), .mark = tagMark(SLUICE_TAG_OWNED_DATA),
                  .verdict = TC_ACT_OK, .outMark = kReturnMark, .counts = {.owned_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_owned_syn_without_owner_dropped"),
                  .what = "a SYN tagged OWNED (egress never tags one so) takes the owner lookup: none, dropped",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80, SYN), .mark = tagMark(SLUICE_TAG_OWNED),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_unknown_tag_dropped"),
                  .what = "an unknown tag value is dropped",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80), .mark = SLUICE_TAG_MAGIC | 9,
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    cs.push_back({.name = nm(f, "tagged_icmp_dropped"),
                  .what = "a tagged packet that is not TCP/UDP is dropped (fail closed)",
                  .prog = Prog::Ingress, .in = Packet::icmp(f.pod, f.remote),
                  .mark = tagMark(SLUICE_TAG_OUTBOUND),
                  .verdict = TC_ACT_SHOT, .outMark = kReturnMark, .counts = {.dropped_pkts = 1}});
    // Enrollment and settings.
    cs.push_back({.name = nm(f, "not_enrolled_passes"),
                  .what = "a netns without a pod_config entry is not touched",
                  .prog = Prog::Ingress, .in = in(8080), .pod = {.enrolled = false}});
    cs.push_back({.name = nm(f, "tagged_not_enrolled_passes"),
                  .what = "a netns without a pod_config entry is not touched, even with a tag",
                  .prog = Prog::Ingress, .in = looped(f.remote, 80), .mark = tagMark(SLUICE_TAG_OUTBOUND),
                  .pod = {.enrolled = false}});
    cs.push_back({.name = nm(f, "settings_zero_passes"),
                  .what = "all-zero settings: nothing is touched",
                  .prog = Prog::Ingress, .in = in(8080), .zeroSettings = true});
  }
  return cs;
}

// ---------------------------------------------------------- pod_lo_egress

std::vector<Case> loEgressCases() {
  std::vector<Case> cs;
  for (const Family* fp : kFamilies) {
    const Family& f = *fp;
    const bool v4 = &f == &kV4;
    const NatEntry udpEntry{f.pod, kApp, IPPROTO_UDP, f.resolver, 53};
    const NatEntry tcpEntry{f.pod, kApp, IPPROTO_TCP, f.resolver, 53};
    auto udpAnswer = [&] { return Packet::udp(f.loopback, kDnsPort, f.pod, kApp); };
    auto tcpAnswer = [&](uint8_t flags = SYN | ACK) { return Packet::tcp(f.pod, kDnsPort, f.pod, kApp, flags); };

    cs.push_back({.name = nm(f, "udp_answer_gets_resolver_source"),
                  .what = "rule 3: the DNS listener's UDP answer leaves with the resolver's address and port 53",
                  .prog = Prog::LoEgress, .in = udpAnswer(), .natSeed = {udpEntry},
                  .out = udpAnswer().src(f.resolver, 53), .counts = {.dns_answers = 1}});
    if (v4) {
      cs.push_back({.name = nm(f, "udp_answer_zero_checksum_stays_zero"),
                    .what = "rule 3: a UDP/IPv4 answer without checksum keeps checksum 0",
                    .prog = Prog::LoEgress, .in = udpAnswer().udpChecksumZero(), .natSeed = {udpEntry},
                    .out = udpAnswer().udpChecksumZero().src(f.resolver, 53), .counts = {.dns_answers = 1}});
    }
    cs.push_back({.name = nm(f, "udp_answer_without_entry_unchanged"),
                  .what = "rule 3 near-miss: no recorded query, the answer is left alone",
                  .prog = Prog::LoEgress, .in = udpAnswer()});
    cs.push_back({.name = nm(f, "udp_answer_other_source_port_unchanged"),
                  .what = "rule 3 near-miss: from port 15054, not the DNS port",
                  .prog = Prog::LoEgress, .in = udpAnswer().src(f.loopback, kDnsPort + 1),
                  .natSeed = {udpEntry}});
    cs.push_back({.name = nm(f, "udp_answer_other_client_port_unchanged"),
                  .what = "rule 3 near-miss: the entry is for another client port",
                  .prog = Prog::LoEgress, .in = udpAnswer(),
                  .natSeed = {{f.pod, kApp + 1, IPPROTO_UDP, f.resolver, 53}}});
    cs.push_back({.name = nm(f, "udp_answer_tcp_entry_unchanged"),
                  .what = "rule 3 near-miss: a TCP translation does not apply to a UDP answer",
                  .prog = Prog::LoEgress, .in = udpAnswer(), .natSeed = {tcpEntry}});
    cs.push_back({.name = nm(f, "udp_answer_other_netns_entry_unchanged"),
                  .what = "rule 3 near-miss: the entry belongs to another pod's netns (cookie)",
                  .prog = Prog::LoEgress, .in = udpAnswer(),
                  .natSeed = {{f.pod, kApp, IPPROTO_UDP, f.resolver, 53, 1}}});
    cs.push_back({.name = nm(f, "udp_from_foreign_address_unchanged"),
                  .what = "rule 3 near-miss: only the listener's answers (from loopback or the pod's own "
                          "address) are translated, not a foreign source that happens to use port 15053",
                  .prog = Prog::LoEgress, .in = Packet::udp(f.remote, kDnsPort, f.pod, kApp),
                  .natSeed = {udpEntry}});
    cs.push_back({.name = nm(f, "tcp_answer_gets_resolver_source"),
                  .what = "rule 2: the DNS listener's TCP answer (from the pod's own address) leaves with "
                          "the resolver's address and port 53",
                  .prog = Prog::LoEgress, .in = tcpAnswer(), .natSeed = {tcpEntry},
                  .out = tcpAnswer().src(f.resolver, 53), .counts = {.dns_answers = 1}});
    cs.push_back({.name = nm(f, "tcp_answer_data_gets_resolver_source"),
                  .what = "rule 2: a data segment of the TCP answer, checksum over the payload",
                  .prog = Prog::LoEgress, .in = tcpAnswer(ACK | PSH).payload("\x00\x07" "answer!"sv),
                  .natSeed = {tcpEntry},
                  .out = tcpAnswer(ACK | PSH).payload("\x00\x07" "answer!"sv).src(f.resolver, 53),
                  .counts = {.dns_answers = 1}});
    cs.push_back({.name = nm(f, "tcp_answer_without_entry_unchanged"),
                  .what = "rule 2 near-miss: no recorded query",
                  .prog = Prog::LoEgress, .in = tcpAnswer()});
    cs.push_back({.name = nm(f, "tcp_answer_udp_entry_unchanged"),
                  .what = "rule 2 near-miss: a UDP translation does not apply to TCP",
                  .prog = Prog::LoEgress, .in = tcpAnswer(), .natSeed = {udpEntry}});
    cs.push_back({.name = nm(f, "tcp_other_source_port_unchanged"),
                  .what = "rule 2 near-miss: from another port of the pod",
                  .prog = Prog::LoEgress, .in = tcpAnswer().src(f.pod, 8080), .natSeed = {tcpEntry}});
    cs.push_back({.name = nm(f, "settings_zero_unchanged"),
                  .what = "all-zero settings: nothing is touched",
                  .prog = Prog::LoEgress, .in = udpAnswer(), .zeroSettings = true, .natSeed = {udpEntry}});
  }
  return cs;
}

TEST_P(PacketCase, Run) { runCase(sb(), GetParam()); }

INSTANTIATE_TEST_SUITE_P(Egress, PacketCase, ::testing::ValuesIn(egressCases()), caseName);
INSTANTIATE_TEST_SUITE_P(Ingress, PacketCase, ::testing::ValuesIn(ingressCases()), caseName);
INSTANTIATE_TEST_SUITE_P(LoEgress, PacketCase, ::testing::ValuesIn(loEgressCases()), caseName);

// ------------------------------------------------------ multi-step flows

// Rule 3 end to end through both translations: the query captured at
// pod_egress, then the listener's answer through pod_lo_egress reaches the
// app from exactly the resolver address and port it asked.
TEST_F(SandboxTest, DnsUdpQueryThenAnswerRoundTrip) {
  ASSERT_TRUE(sb().writeSettings().ok());
  ASSERT_TRUE(sb().enroll({}).ok());
  for (const Family* fp : kFamilies) {
    const Family& f = *fp;
    SCOPED_TRACE(f.tag);
    auto q = sb().run(Prog::Egress, Packet::udp(f.pod, kApp, f.resolver, 53).bytes());
    ASSERT_TRUE(q.ok()) << q.error().message;
    EXPECT_EQ(verdictName(q->verdict), "TC_ACT_REDIRECT");
    ParsedPacket pq = parsePacket(q->out);
    EXPECT_EQ(pq.dst.str(), f.pod);
    EXPECT_EQ(pq.dport, kDnsPort);

    // The listener bound to loopback answers the query's (unchanged) source.
    auto a = sb().run(Prog::LoEgress, Packet::udp(f.loopback, kDnsPort, pq.src.str(), *pq.sport).bytes());
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(verdictName(a->verdict), verdictName(kNext));
    ParsedPacket pa = parsePacket(a->out);
    EXPECT_EQ(pa.src.str(), f.resolver) << pa.describe();
    EXPECT_EQ(pa.sport, 53);
    EXPECT_EQ(pa.dst.str(), f.pod);
    EXPECT_EQ(pa.dport, kApp);
    EXPECT_TRUE(pa.checksumsOk()) << pa.describe();
  }
  EXPECT_EQ(describeCounters(sb().counters().value_or(sluice_pod_stats{})), "dns_answers=2");
}

// Rule 5 with the proxy's identity (issue 12): once the check is on, the
// proxy mark exempts a packet only when its socket's cgroup is one of the
// proxy's. (BPF_PROG_TEST_RUN's packet socket is made by the test process,
// so its cgroup is the test process's.)
TEST_F(SandboxTest, ProxyMarkCountsOnlyFromTheProxysCgroups) {
  ASSERT_TRUE(sb().writeSettings().ok());
  ASSERT_TRUE(sb().enroll({}).ok());
  auto self = cgroupIdOfPid(::getpid());
  ASSERT_TRUE(self.ok()) << self.error().message;
  PodPrograms& p = sb().programs();
  for (const Family* fp : kFamilies) {
    const Family& f = *fp;
    SCOPED_TRACE(f.tag);
    auto syn = Packet::tcp(f.pod, kApp, f.remote, 80).bytes();
    auto verdict = [&]() {
      auto r = sb().run(Prog::Egress, syn, SLUICE_DEFAULT_PROXY_MARK);
      EXPECT_TRUE(r.ok()) << r.error().message;
      return r.ok() ? verdictName(r->verdict) : "";
    };
    ASSERT_TRUE(p.proxyIdentity.update(0, sluice_proxy_identity{}).ok());
    EXPECT_EQ(verdict(), verdictName(kNext)) << "check off: the mark alone exempts (Istio), handed on";
    ASSERT_TRUE(p.proxyIdentity.update(0, sluice_proxy_identity{1, 0}).ok());
    EXPECT_EQ(verdict(), "TC_ACT_REDIRECT") << "check on, no proxy cgroup: a marked SYN is an app's";
    ASSERT_TRUE(p.proxyCgroups.update(*self + 1000000, sluice_proxy_cgroup{1, 0, 0}).ok());
    EXPECT_EQ(verdict(), "TC_ACT_REDIRECT") << "another cgroup's mark does not count";
    ASSERT_TRUE(p.proxyCgroups.update(*self, sluice_proxy_cgroup{1, 0, 0}).ok());
    EXPECT_EQ(verdict(), verdictName(kNext)) << "the proxy's cgroup with the mark is exempt, handed on";
    ASSERT_TRUE(p.proxyCgroups.erase(*self).ok());
    ASSERT_TRUE(p.proxyCgroups.erase(*self + 1000000).ok());
  }
}

// Rule 2 end to end: SYN captured, SYN|ACK restored, the app's next segment
// translated again, and the answer's data restored.
TEST_F(SandboxTest, DnsTcpConversationRoundTrip) {
  ASSERT_TRUE(sb().writeSettings().ok());
  ASSERT_TRUE(sb().enroll({}).ok());
  for (const Family* fp : kFamilies) {
    const Family& f = *fp;
    SCOPED_TRACE(f.tag);
    struct Step {
      Prog prog;
      Packet in;
      int verdict;
      uint32_t mark;
      Packet out;
    };
    const Step steps[] = {
        {Prog::Egress, Packet::tcp(f.pod, kApp, f.resolver, 53, SYN), TC_ACT_REDIRECT, tagMark(SLUICE_TAG_DNS_TCP),
         Packet::tcp(f.pod, kApp, f.pod, kDnsPort, SYN)},
        {Prog::LoEgress, Packet::tcp(f.pod, kDnsPort, f.pod, kApp, SYN | ACK), kNext, 0,
         Packet::tcp(f.resolver, 53, f.pod, kApp, SYN | ACK)},
        {Prog::Egress, Packet::tcp(f.pod, kApp, f.resolver, 53, ACK | PSH).payload("\x00\x03qry"sv), TC_ACT_REDIRECT,
         tagMark(SLUICE_TAG_OWNED), Packet::tcp(f.pod, kApp, f.pod, kDnsPort, ACK | PSH).payload("\x00\x03qry"sv)},
        {Prog::LoEgress, Packet::tcp(f.pod, kDnsPort, f.pod, kApp, ACK | PSH).payload("\x00\x03" "ans"sv), kNext, 0,
         Packet::tcp(f.resolver, 53, f.pod, kApp, ACK | PSH).payload("\x00\x03" "ans"sv)},
    };
    int i = 0;
    for (const Step& s : steps) {
      SCOPED_TRACE("step " + std::to_string(i++) + " " + progName(s.prog));
      auto r = sb().run(s.prog, s.in.bytes());
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(verdictName(r->verdict), verdictName(s.verdict));
      EXPECT_EQ(hex32(r->mark), hex32(s.mark));
      EXPECT_EQ(r->out, s.out.bytes()) << "got:  " << describeFrame(r->out) << "\nwant: " << s.out.describe();
    }
  }
  EXPECT_EQ(describeCounters(sb().counters().value_or(sluice_pod_stats{})), "dns_answers=4");
  EXPECT_EQ(sb().natEntries().size(), 2u);
}

// Counters accumulate per pod across runs (per-CPU values summed).
TEST_F(SandboxTest, CountersAccumulate) {
  ASSERT_TRUE(sb().writeSettings().ok());
  ASSERT_TRUE(sb().enroll({}).ok());
  for (int i = 0; i < 5; i++) {
    auto r = sb().run(Prog::Ingress, Packet::tcp(kV4.remote, kApp, kV4.pod, 80).bytes());
    ASSERT_TRUE(r.ok());
  }
  for (int i = 0; i < 3; i++) {
    auto r = sb().run(Prog::Ingress, Packet::tcp(kV6.remote, kApp, kV6.pod, 80).bytes());
    ASSERT_TRUE(r.ok());
  }
  // Packets left alone are not counted.
  auto r = sb().run(Prog::Egress, Packet::udp(kV4.pod, kApp, kV4.remote, 123).bytes());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(describeCounters(sb().counters().value_or(sluice_pod_stats{})), "dropped_pkts=8");
}

}  // namespace
}  // namespace sluice::test
