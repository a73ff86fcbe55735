// The node programs (bpf/host_tc.bpf.c): kubelet probe SNAT, spec rules 10
// and 11 (docs/redirection.md, "On the node").
//
// BPF_PROG_TEST_RUN tables and sequences for the translation logic.
// NOTE: a test-run skb is never socket-less. bpf_prog_test_run_skb()
// (net/bpf/test_run.c) always allocates a dummy socket
// (sk_alloc(..., &bpf_dummy_proto, ...)) and sets skb->sk to it, and ctx_in
// cannot clear it (the __sk_buff `sk` field must be zero on input). So every
// test-run of host_egress takes the "local socket" path of rule 10;
// TestRunSkbHasASocket pins that down. The socket-less path of rule 11
// (forwarded traffic), and real connections through the programs with
// checksums verified by both kernels, are tested with real traffic in
// test/netns/probe_snat_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "test/bpf/harness.h"
#include "test/common/packet.h"

namespace sluice::test {
namespace {

using namespace tcpflag;

constexpr uint16_t kProberPort = 40000;  // the prober's (kubelet's) source port
constexpr uint16_t kPodPort = 8080;      // the probed port in the pod
constexpr uint16_t kFinOut = SLUICE_SNAT_FIN_OUT;
constexpr uint16_t kFinIn = SLUICE_SNAT_FIN_IN;
// The netns cookie seeded in pod_addrs for the test-run cases (any value:
// the programs only copy it and count under it).
constexpr uint64_t kPodCookie = 0x5eed0001;

// The node's addresses next to the pod and remote addresses of harness.h.
struct HostFamily {
  const Family& f;
  const char* tag;
  const char* node;   // the node's address on the pod's host-side veth
  const char* node2;  // another node address (a second prober's)
};
const HostFamily kH4{kV4, "v4", "10.1.0.1", "10.2.0.1"};
const HostFamily kH6{kV6, "v6", "fd00:1::1", "fd00:2::1"};
const HostFamily* const kHostFamilies[] = {&kH4, &kH6};

// ------------------------------------------------------------ test-run table

struct Snat {
  sluice_snat_key k;
  sluice_snat_value v;
};

// One translated connection: prober node:port -> pod:podPort leaving as
// probe:xport; its element in snat_rev is keyed by the reply's tuple.
struct Conn {
  std::string node;
  uint16_t port;
  std::string pod;
  uint16_t podPort;
  std::string probe;
  uint16_t xport;
  uint16_t flags = 0;
  Snat entry() const { return {snatKey(pod, podPort, probe, xport), snatValue(node, port, flags, kPodCookie)}; }
};

struct HostCase {
  std::string name;  ///< [A-Za-z0-9_]
  std::string what;
  Prog prog;
  Packet in;
  std::vector<std::string> enrolled{};  ///< pod_addrs entries (cookie kPodCookie)
  std::vector<Snat> conns{};            ///< snat_rev seed
  bool zeroSettings = false;

  int verdict = kNext;
  std::optional<Packet> out{};                 ///< nullopt: unchanged
  std::optional<std::vector<Snat>> connsAfter{};  ///< nullopt: the seed
  uint64_t probeConns = 0;
  std::string bug{};  ///< "BUG: ..." -- skipped unless SLUICE_BPF_TEST_KNOWN_BUGS
};

std::string snatList(const std::vector<Snat>& entries) {
  std::vector<std::string> lines;
  for (const auto& e : entries) lines.push_back(describeSnatKey(e.k) + " => " + describeSnatValue(e.v, e.k.family));
  std::sort(lines.begin(), lines.end());
  std::string s;
  for (const auto& l : lines) s += "\n    " + l;
  return s.empty() ? " (none)" : s;
}

std::string snatList(const std::vector<std::pair<sluice_snat_key, sluice_snat_value>>& entries) {
  std::vector<Snat> v;
  for (const auto& [k, val] : entries) v.push_back({k, val});
  return snatList(v);
}

void expectSnat(Sandbox& sb, const std::vector<Snat>& conns) {
  EXPECT_EQ(snatList(sb.snatEntries()), snatList(conns)) << "snat_rev";
}

uint64_t probeConns(Sandbox& sb, uint64_t cookie = kPodCookie) {
  auto c = sb.countersOf(cookie);
  return c ? c->probe_conns : 0;
}

void runHostCase(Sandbox& sb, const HostCase& c) {
  if (!c.bug.empty() && !std::getenv("SLUICE_BPF_TEST_KNOWN_BUGS")) GTEST_SKIP() << "BUG: " << c.bug;
  const Bytes in = c.in.bytes();
  SCOPED_TRACE(std::string(progName(c.prog)) + ": " + c.what + "\n  input: " + describeFrame(in));
  ASSERT_TRUE(sb.writeSettings(c.zeroSettings).ok());
  for (const auto& a : c.enrolled) ASSERT_TRUE(sb.addPodAddr(a, kPodCookie).ok());
  if (c.enrolled.empty()) {
    ASSERT_TRUE(sb.programs().podStats.update(kPodCookie, sluice_pod_stats{}).ok());
  }
  for (const auto& e : c.conns) ASSERT_TRUE(sb.seedSnat(e.k, e.v).ok());

  auto r = sb.run(c.prog, in);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(verdictName(r->verdict), verdictName(c.verdict));
  const Bytes want = c.out ? c.out->bytes() : in;
  if (r->out != want)
    ADD_FAILURE() << "output frame " << (c.out ? "is not the expected rewrite" : "changed, expected it untouched")
                  << "\n  got:  " << describeFrame(r->out) << "\n  want: " << describeFrame(want);
  if (c.out) {
    ParsedPacket p = parsePacket(r->out);
    EXPECT_TRUE(p.checksumsOk()) << "checksums of the rewritten frame: " << p.describe();
  }
  expectSnat(sb, c.connsAfter.value_or(c.conns));
  auto counters = sb.countersOf(kPodCookie);
  ASSERT_TRUE(counters.has_value());
  EXPECT_EQ(describeCounters(*counters), describeCounters(sluice_pod_stats{.probe_conns = c.probeConns}));
}

void PrintTo(const HostCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(const HostFamily* h, std::ostream* os) { *os << h->tag; }

class HostCaseTest : public SandboxTest, public ::testing::WithParamInterface<HostCase> {};
std::string hostCaseName(const ::testing::TestParamInfo<HostCase>& info) { return info.param.name; }

TEST_P(HostCaseTest, Run) { runHostCase(sb(), GetParam()); }

std::string nm(const HostFamily& h, const std::string& s) { return std::string(h.tag) + "_" + s; }

// ----------------------------------------------------------- host_egress

std::vector<HostCase> egressCases() {
  std::vector<HostCase> cs;
  for (const HostFamily* hp : kHostFamilies) {
    const HostFamily& h = *hp;
    const Family& f = h.f;
    auto probe = [&](uint8_t flags = SYN) { return Packet::tcp(h.node, kProberPort, f.pod, kPodPort, flags); };
    const Conn conn{h.node, kProberPort, f.pod, kPodPort, f.probe, kProberPort};
    // The same prober translated to another port earlier (a collision).
    const Conn moved{h.node, kProberPort, f.pod, kPodPort, f.probe, 48943};
    auto withFlags = [](Conn c, uint16_t flags) {
      c.flags = flags;
      return c;
    };
    const std::vector<std::string> pod{f.pod};

    // Rule 10, new connections.
    cs.push_back({.name = nm(h, "syn_to_enrolled_pod_translated"),
                  .what = "rule 10: a SYN of a node socket (the test-run skb's dummy socket) to an enrolled pod "
                          "leaves from the probe address, its port kept; both entries recorded, probe counted",
                  .prog = Prog::HostEgress, .in = probe(), .enrolled = pod,
                  .out = probe().src(f.probe, kProberPort), .connsAfter = std::vector{conn.entry()}, .probeConns = 1});
    cs.push_back({.name = nm(h, "syn_ecn_translated"),
                  .what = "rule 10: an ECN set-up SYN (SYN|ECE|CWR) is a SYN",
                  .prog = Prog::HostEgress, .in = probe(SYN | ECE | CWR), .enrolled = pod,
                  .out = probe(SYN | ECE | CWR).src(f.probe, kProberPort), .connsAfter = std::vector{conn.entry()}, .probeConns = 1});
    cs.push_back({.name = nm(h, "syn_options_payload_translated"),
                  .what = "rule 10: checksum fix-up over TCP options and payload",
                  .prog = Prog::HostEgress, .in = probe().tcpOptions(3).payload("GET /healthz"),
                  .enrolled = pod, .out = probe().tcpOptions(3).payload("GET /healthz").src(f.probe, kProberPort),
                  .connsAfter = std::vector{conn.entry()}, .probeConns = 1});
    cs.push_back({.name = nm(h, "syn_two_pod_addresses_enrolled"),
                  .what = "rule 10: one of several enrolled addresses",
                  .prog = Prog::HostEgress, .in = probe(), .enrolled = {f.pod2, f.pod},
                  .out = probe().src(f.probe, kProberPort), .connsAfter = std::vector{conn.entry()}, .probeConns = 1});
    {
      const Conn other{h.node2, kProberPort, f.pod, 9090, f.probe, kProberPort};
      cs.push_back({.name = nm(h, "syn_same_port_other_pod_port_keeps_port"),
                    .what = "rule 10: the same source port to another pod port does not collide (the reply "
                            "key holds the pod port): the port is kept",
                    .prog = Prog::HostEgress, .in = Packet::tcp(h.node2, kProberPort, f.pod, 9090),
                    .enrolled = pod, .conns = {conn.entry()},
                    .out = Packet::tcp(f.probe, kProberPort, f.pod, 9090),
                    .connsAfter = std::vector{conn.entry(), other.entry()},
                    .probeConns = 1});
    }
    cs.push_back({.name = nm(h, "syn_retransmit_reuses_state"),
                  .what = "rule 10: a retransmitted SYN keeps the recorded translation (not counted again)",
                  .prog = Prog::HostEgress, .in = probe(), .enrolled = pod, .conns = {moved.entry()}, .out = probe().src(f.probe, moved.xport)});

    // Rule 10, later packets of a translated connection.
    cs.push_back({.name = nm(h, "data_with_state_translated"),
                  .what = "rule 10: data of a translated connection gets the recorded port",
                  .prog = Prog::HostEgress, .in = probe(ACK | PSH).payload("GET / HTTP/1.1\r\n\r\n"),
                  .enrolled = pod, .conns = {moved.entry()},
                  .out = probe(ACK | PSH).payload("GET / HTTP/1.1\r\n\r\n").src(f.probe, moved.xport)});
    cs.push_back({.name = nm(h, "fin_with_state_sets_fin_out"),
                  .what = "rule 10: the prober's FIN is translated and recorded (FIN_OUT)",
                  .prog = Prog::HostEgress, .in = probe(FIN | ACK), .enrolled = pod, .conns = {moved.entry()}, .out = probe(FIN | ACK).src(f.probe, moved.xport),
                  .connsAfter = std::vector{withFlags(moved, kFinOut).entry()}});
    cs.push_back({.name = nm(h, "fin_after_pod_fin_keeps_state"),
                  .what = "rule 10: the prober's FIN after the pod's: both recorded, the state stays for the last ACK",
                  .prog = Prog::HostEgress, .in = probe(FIN | ACK), .enrolled = pod,
                  .conns = {withFlags(moved, kFinIn).entry()},
                  .out = probe(FIN | ACK).src(f.probe, moved.xport),
                  .connsAfter = std::vector{withFlags(moved, kFinIn | kFinOut).entry()}});
    cs.push_back({.name = nm(h, "ack_after_own_fin_keeps_state"),
                  .what = "rule 10: an ACK after only the prober's FIN keeps the state",
                  .prog = Prog::HostEgress, .in = probe(ACK), .enrolled = pod,
                  .conns = {withFlags(moved, kFinOut).entry()},
                  .out = probe(ACK).src(f.probe, moved.xport)});
    cs.push_back({.name = nm(h, "last_ack_after_both_fins_forgets"),
                  .what = "rule 10: the prober's ACK after both FINs is translated, then both entries go",
                  .prog = Prog::HostEgress, .in = probe(ACK), .enrolled = pod,
                  .conns = {withFlags(moved, kFinOut | kFinIn).entry()},
                  .out = probe(ACK).src(f.probe, moved.xport), .connsAfter = std::vector<Snat>{}});
    cs.push_back({.name = nm(h, "rst_with_state_forgets"),
                  .what = "rule 10: the prober's RST is translated, then both entries go",
                  .prog = Prog::HostEgress, .in = probe(RST), .enrolled = pod, .conns = {moved.entry()}, .out = probe(RST).src(f.probe, moved.xport),
                  .connsAfter = std::vector<Snat>{}});
    cs.push_back({.name = nm(h, "rst_ack_with_state_forgets"),
                  .what = "rule 10: RST|ACK as well",
                  .prog = Prog::HostEgress, .in = probe(RST | ACK), .enrolled = pod, .conns = {moved.entry()}, .out = probe(RST | ACK).src(f.probe, moved.xport),
                  .connsAfter = std::vector<Snat>{}});

    // Near misses: untouched.
    cs.push_back({.name = nm(h, "syn_not_enrolled_untouched"),
                  .what = "rule 10 near-miss: the destination is not an enrolled pod address (another one is)",
                  .prog = Prog::HostEgress, .in = probe(), .enrolled = {f.pod2}});
    cs.push_back({.name = nm(h, "syn_nothing_enrolled_untouched"),
                  .what = "rule 10 near-miss: pod_addrs empty",
                  .prog = Prog::HostEgress, .in = probe()});
    cs.push_back({.name = nm(h, "syn_to_remote_untouched"),
                  .what = "rule 10 near-miss: to an address off the node",
                  .prog = Prog::HostEgress, .in = Packet::tcp(h.node, kProberPort, f.remote, kPodPort),
                  .enrolled = pod});
    for (auto [flags, fname] : {std::pair{uint8_t(ACK), "ack"}, std::pair{uint8_t(ACK | PSH), "data"},
                                std::pair{uint8_t(FIN | ACK), "fin"}, std::pair{uint8_t(RST), "rst"},
                                std::pair{uint8_t(SYN | ACK), "synack"}}) {
      cs.push_back({.name = nm(h, std::string(fname) + "_without_state_untouched"),
                    .what = "rule 10: a connection set up before the pod was enrolled stays as it is (no state, "
                            "not a SYN)",
                    .prog = Prog::HostEgress, .in = probe(flags), .enrolled = pod});
    }
    cs.push_back({.name = nm(h, "syn_from_probe_addr_untouched"),
                  .what = "rule 10: a packet already from the probe address is not translated again",
                  .prog = Prog::HostEgress, .in = Packet::tcp(f.probe, kProberPort, f.pod, kPodPort),
                  .enrolled = pod});
    cs.push_back({.name = nm(h, "udp_to_enrolled_untouched"),
                  .what = "rule 10 is TCP only (Istio: -p tcp)",
                  .prog = Prog::HostEgress, .in = Packet::udp(h.node, kProberPort, f.pod, kPodPort), .enrolled = pod});
    cs.push_back({.name = nm(h, "icmp_to_enrolled_untouched"),
                  .what = "rule 10 is TCP only: ping stays",
                  .prog = Prog::HostEgress, .in = Packet::icmp(h.node, f.pod), .enrolled = pod});
    cs.push_back({.name = nm(h, "settings_zero_untouched"),
                  .what = "all-zero settings (not configured yet): nothing is touched",
                  .prog = Prog::HostEgress, .in = probe(), .enrolled = pod, .zeroSettings = true});
    cs.push_back({.name = nm(h, "state_but_pod_removed_untouched"),
                  .what = "pod no longer enrolled: its leftover state is not applied",
                  .prog = Prog::HostEgress, .in = probe(ACK), .conns = {moved.entry()}});
  }
  return cs;
}

// ----------------------------------------------------------- host_ingress

std::vector<HostCase> ingressCases() {
  std::vector<HostCase> cs;
  for (const HostFamily* hp : kHostFamilies) {
    const HostFamily& h = *hp;
    const Family& f = h.f;
    // The second prober (node2:40000) moved to 48943 by a collision.
    const Conn conn{h.node2, kProberPort, f.pod, kPodPort, f.probe, 48943};
    auto reply = [&](uint8_t flags = SYN | ACK) { return Packet::tcp(f.pod, kPodPort, f.probe, conn.xport, flags); };
    auto restored = [&](uint8_t flags = SYN | ACK) {
      return Packet::tcp(f.pod, kPodPort, h.node2, kProberPort, flags);
    };
    auto withFlags = [](Conn c, uint16_t flags) {
      c.flags = flags;
      return c;
    };
    const std::vector<std::string> pod{f.pod};

    cs.push_back({.name = nm(h, "synack_translated_back"),
                  .what = "rule 10: the pod's SYN|ACK to probe:port goes to the prober's address and port; "
                          "state kept",
                  .prog = Prog::HostIngress, .in = reply(), .enrolled = pod, .conns = {conn.entry()}, .out = restored()});
    cs.push_back({.name = nm(h, "synack_port_kept_translated_back"),
                  .what = "rule 10: the common case, port kept",
                  .prog = Prog::HostIngress, .in = Packet::tcp(f.pod, kPodPort, f.probe, kProberPort, SYN | ACK),
                  .enrolled = pod,
                  .conns = {Conn{h.node, kProberPort, f.pod, kPodPort, f.probe, kProberPort}.entry()},
                  .out = Packet::tcp(f.pod, kPodPort, h.node, kProberPort, SYN | ACK)});
    cs.push_back({.name = nm(h, "data_translated_back"),
                  .what = "rule 10: the pod's data: checksum fix-up over options and payload",
                  .prog = Prog::HostIngress,
                  .in = reply(ACK | PSH).tcpOptions(3).payload("HTTP/1.1 200 OK\r\n\r\n"), .enrolled = pod,
                  .conns = {conn.entry()},
                  .out = restored(ACK | PSH).tcpOptions(3).payload("HTTP/1.1 200 OK\r\n\r\n")});
    cs.push_back({.name = nm(h, "reply_not_enrolled_still_translated"),
                  .what = "rule 10: replies are restored from the state alone (pod_addrs is not consulted)",
                  .prog = Prog::HostIngress, .in = reply(ACK), .conns = {conn.entry()},
                  .out = restored(ACK)});

    // Closing.
    cs.push_back({.name = nm(h, "rst_forgets_both"),
                  .what = "rule 10: the pod's RST is translated, then both entries go",
                  .prog = Prog::HostIngress, .in = reply(RST | ACK), .enrolled = pod, .conns = {conn.entry()}, .out = restored(RST | ACK), .connsAfter = std::vector<Snat>{}});
    cs.push_back({.name = nm(h, "rst_forgets_only_its_connection"),
                  .what = "rule 10: the pod's RST forgets its own connection, not another prober's",
                  .prog = Prog::HostIngress, .in = reply(RST), .enrolled = pod,
                  .conns = {conn.entry(), Conn{h.node, kProberPort, f.pod, kPodPort, f.probe, kProberPort}.entry()},
                  .out = restored(RST),
                  .connsAfter = std::vector{Conn{h.node, kProberPort, f.pod, kPodPort, f.probe, kProberPort}.entry()}});
    cs.push_back({.name = nm(h, "fin_after_fin_out_sets_fin_in"),
                  .what = "rule 10: the pod's FIN after the prober's: translated, FIN_IN recorded, state kept "
                          "for the last ACK",
                  .prog = Prog::HostIngress, .in = reply(FIN | ACK), .enrolled = pod,
                  .conns = {withFlags(conn, kFinOut).entry()}, .out = restored(FIN | ACK),
                  .connsAfter = std::vector{withFlags(conn, kFinOut | kFinIn).entry()}});
    cs.push_back({.name = nm(h, "fin_first_sets_fin_in"),
                  .what = "rule 10: the pod closes first: FIN_IN recorded",
                  .prog = Prog::HostIngress, .in = reply(FIN | ACK), .enrolled = pod, .conns = {conn.entry()}, .out = restored(FIN | ACK),
                  .connsAfter = std::vector{withFlags(conn, kFinIn).entry()}});
    cs.push_back({.name = nm(h, "ack_after_fin_out_keeps_state"),
                  .what = "rule 10: the pod's ACK of the prober's FIN alone keeps the state",
                  .prog = Prog::HostIngress, .in = reply(ACK), .enrolled = pod,
                  .conns = {withFlags(conn, kFinOut).entry()}, .out = restored(ACK)});
    cs.push_back({.name = nm(h, "last_ack_after_both_fins_forgets"),
                  .what = "rule 10: the pod's last ACK after both FINs is translated, then both entries go",
                  .prog = Prog::HostIngress, .in = reply(ACK), .enrolled = pod,
                  .conns = {withFlags(conn, kFinOut | kFinIn).entry()}, .out = restored(ACK),
                  .connsAfter = std::vector<Snat>{}});

    // Near misses: untouched.
    cs.push_back({.name = nm(h, "reply_without_state_untouched"),
                  .what = "rule 10 near-miss: no recorded translation",
                  .prog = Prog::HostIngress, .in = reply(), .enrolled = pod});
    cs.push_back({.name = nm(h, "reply_other_probe_port_untouched"),
                  .what = "rule 10 near-miss: to another probe port",
                  .prog = Prog::HostIngress,
                  .in = Packet::tcp(f.pod, kPodPort, f.probe, conn.xport + 1, SYN | ACK), .enrolled = pod,
                  .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "reply_other_pod_port_untouched"),
                  .what = "rule 10 near-miss: from another pod port",
                  .prog = Prog::HostIngress, .in = Packet::tcp(f.pod, 9090, f.probe, conn.xport, SYN | ACK),
                  .enrolled = pod, .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "reply_other_pod_addr_untouched"),
                  .what = "rule 10 near-miss: from another pod address",
                  .prog = Prog::HostIngress, .in = Packet::tcp(f.pod2, kPodPort, f.probe, conn.xport, SYN | ACK),
                  .enrolled = {f.pod, f.pod2}, .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "reply_to_node_addr_untouched"),
                  .what = "rule 10 near-miss: to another address than the probe address (an untranslated "
                          "connection to the node's own address, same ports)",
                  .prog = Prog::HostIngress, .in = Packet::tcp(f.pod, kPodPort, h.node2, conn.xport, SYN | ACK),
                  .enrolled = pod, .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "rst_to_node_addr_keeps_state"),
                  .what = "rule 10 near-miss: a RST of another connection does not forget this one",
                  .prog = Prog::HostIngress, .in = Packet::tcp(f.pod, kPodPort, h.node2, kProberPort, RST),
                  .enrolled = pod, .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "udp_reply_untouched"),
                  .what = "TCP only: a UDP datagram with the same addresses and ports",
                  .prog = Prog::HostIngress, .in = Packet::udp(f.pod, kPodPort, f.probe, conn.xport), .enrolled = pod,
                  .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "icmp_to_probe_untouched"),
                  .what = "TCP only: ICMP to the probe address",
                  .prog = Prog::HostIngress, .in = Packet::icmp(f.pod, f.probe), .enrolled = pod,
                  .conns = {conn.entry()}});
    cs.push_back({.name = nm(h, "settings_zero_untouched"),
                  .what = "all-zero settings: nothing is touched",
                  .prog = Prog::HostIngress, .in = reply(), .enrolled = pod, .conns = {conn.entry()}, .zeroSettings = true});
  }
  return cs;
}

// -------------------------------------------- malformed and unusual input

constexpr size_t kEth = 14;

struct Base {
  Prog prog;
  const char* tag;
  std::function<Packet(const HostFamily&)> tcp;
  std::function<Packet(const HostFamily&)> expected;  // the translation of tcp()
  std::function<Packet(const HostFamily&)> udp;
  bool seeded;          // seed the connection's entries
  uint64_t probeConns;  // counted when tcp() is translated
};

Conn baseConn(const HostFamily& h) { return {h.node, kProberPort, h.f.pod, kPodPort, h.f.probe, kProberPort}; }

const Base kBases[] = {
    {Prog::HostEgress, "egress",
     [](const HostFamily& h) { return Packet::tcp(h.node, kProberPort, h.f.pod, kPodPort); },
     [](const HostFamily& h) { return Packet::tcp(h.f.probe, kProberPort, h.f.pod, kPodPort); },
     [](const HostFamily& h) { return Packet::udp(h.node, kProberPort, h.f.pod, kPodPort); }, false, 1},
    {Prog::HostIngress, "ingress",
     [](const HostFamily& h) { return Packet::tcp(h.f.pod, kPodPort, h.f.probe, kProberPort, SYN | ACK); },
     [](const HostFamily& h) { return Packet::tcp(h.f.pod, kPodPort, h.node, kProberPort, SYN | ACK); },
     [](const HostFamily& h) { return Packet::udp(h.f.pod, kPodPort, h.f.probe, kProberPort); }, true, 0},
};

HostCase baseCase(const Base& b, const HostFamily& h, const std::string& name, const std::string& what,
                  Packet in) {
  HostCase c{.name = std::string(b.tag) + "_" + h.tag + "_" + name, .what = what, .prog = b.prog,
             .in = std::move(in), .enrolled = {h.f.pod}};
  if (b.seeded) c.conns = {baseConn(h).entry()};
  return c;
}

std::vector<HostCase> malformedCases() {
  std::vector<HostCase> cs;
  for (const Base& b : kBases) {
    for (const HostFamily* hp : kHostFamilies) {
      const HostFamily& h = *hp;
      const bool v4 = &h == &kH4;
      const size_t l4 = kEth + (v4 ? 20 : 40);
      auto add = [&](const std::string& name, const std::string& what, Packet in) {
        cs.push_back(baseCase(b, h, name, what, std::move(in)));
      };
      add("truncated_ip_only", "a complete IP header, no TCP header", b.tcp(h).truncate(l4));
      add("truncated_tcp_4", "4 bytes of TCP header (ports only)", b.tcp(h).truncate(l4 + 4));
      add("truncated_tcp_13", "13 bytes of TCP header (no flags byte)", b.tcp(h).truncate(l4 + 13));
      add("truncated_tcp_16", "16 bytes of TCP header (checksum field missing)", b.tcp(h).truncate(l4 + 16));
      add("truncated_tcp_18", "18 bytes of TCP header", b.tcp(h).truncate(l4 + 18));
      add("tcp_options_cut", "data offset 8, 4 of the 12 option bytes present",
          b.tcp(h).tcpOptions(3).truncate(l4 + 24));
      for (uint8_t doff = 0; doff < 5; doff++)
        add("tcp_doff_" + std::to_string(doff), "TCP data offset " + std::to_string(doff) + " (< 5)",
            b.tcp(h).tcpDataOffsetField(doff));
      add("tcp_doff_15_no_options", "data offset 15 beyond the end of the packet",
          b.tcp(h).tcpDataOffsetField(15));
      if (v4) {
        add("truncated_ipv4_options", "ihl 15 but only 10 of the 40 option bytes",
            b.tcp(h).ipv4Options(10).truncate(kEth + 30));
        for (uint8_t ihl = 0; ihl < 5; ihl++)
          add("ipv4_ihl_" + std::to_string(ihl), "IPv4 ihl " + std::to_string(ihl) + " (< 5)",
              b.tcp(h).ihlField(ihl));
        add("ipv4_version_6", "ethertype IPv4, version field 6", b.tcp(h).versionField(6));
        add("arp", "an ARP request", Packet::arp(h.node, h.f.pod));
      } else {
        add("ipv6_version_4", "ethertype IPv6, version field 4", b.tcp(h).versionField(4));
        add("truncated_ipv6_ext_header", "a hop-by-hop header cut after 1 byte",
            b.tcp(h).ext(ext6::HOPOPTS).truncate(l4 + 1));
        add("fragment_after_hopopts", "hop-by-hop then a fragment header",
            b.tcp(h).ext(ext6::HOPOPTS).fragment(true, 0));
        Packet p = b.tcp(h).ext(ext6::HOPOPTS);
        for (int i = 0; i < 6; i++) p.ext(ext6::DSTOPTS);
        add("ipv6_7_ext_headers", "7 extension headers: more than the parser walks (not TCP to it)", p);
      }
      add("fragment_first_mf", "first fragment (MF set, offset 0)", b.tcp(h).fragment(true, 0));
      add("fragment_middle", "middle fragment (MF set, offset 185)", b.tcp(h).fragment(true, 185));
      add("fragment_last", "last fragment (offset 185, MF clear)", b.tcp(h).fragment(false, 185));
      add("udp", "UDP with the same addresses and ports", b.udp(h));
      add("unknown_ethertype", "behind an unknown ethertype 0x88b5", b.tcp(h).ethertype(0x88b5));
      add("vlan_ethertype", "ethertype 802.1Q (not parsed)", b.tcp(h).ethertype(0x8100));
      add("ethertype_swapped", "an IPv4 packet labelled IPv6 or the reverse",
          b.tcp(h).ethertype(v4 ? kEthIPv6 : kEthIPv4));
    }
  }
  return cs;
}

// Legal but uncommon headers: translated at the right offsets.
std::vector<HostCase> unusualCases() {
  std::vector<HostCase> cs;
  for (const Base& b : kBases) {
    for (const HostFamily* hp : kHostFamilies) {
      const HostFamily& h = *hp;
      const bool v4 = &h == &kH4;
      auto add = [&](const std::string& name, const std::string& what, const std::function<Packet(Packet)>& shape) {
        HostCase c = baseCase(b, h, name, what, shape(b.tcp(h)));
        c.out = shape(b.expected(h));
        c.connsAfter = std::vector{baseConn(h).entry()};
        c.probeConns = b.probeConns;
        cs.push_back(std::move(c));
      };
      if (v4) {
        add("ipv4_ihl_6_translated", "IPv4 with 4 bytes of options", [](Packet p) { return p.ipv4Options(1); });
        add("ipv4_ihl_15_translated", "IPv4 with 40 bytes of options", [](Packet p) { return p.ipv4Options(10); });
        add("dont_fragment_translated", "DF set: not a fragment", [](Packet p) { return p.dontFragment(); });
      } else {
        add("hopopts_dstopts_translated", "hop-by-hop + destination options before TCP",
            [](Packet p) { return p.ext(ext6::HOPOPTS).ext(ext6::DSTOPTS, 16); });
        add("all_ext_kinds_translated", "hop-by-hop, routing, AH and destination options before TCP",
            [](Packet p) { return p.ext(ext6::HOPOPTS, 24).ext(ext6::ROUTING, 24).ext(ext6::AH, 24).ext(ext6::DSTOPTS); });
        add("6_ext_headers_translated", "6 extension headers (SLUICE_MAX_EXT_HDRS)", [](Packet p) {
          p.ext(ext6::HOPOPTS);
          for (int i = 0; i < 5; i++) p.ext(ext6::DSTOPTS);
          return p;
        });
      }
    }
  }
  return cs;
}

INSTANTIATE_TEST_SUITE_P(HostEgress, HostCaseTest, ::testing::ValuesIn(egressCases()), hostCaseName);
INSTANTIATE_TEST_SUITE_P(HostIngress, HostCaseTest, ::testing::ValuesIn(ingressCases()), hostCaseName);
INSTANTIATE_TEST_SUITE_P(HostMalformed, HostCaseTest, ::testing::ValuesIn(malformedCases()), hostCaseName);
INSTANTIATE_TEST_SUITE_P(HostUnusual, HostCaseTest, ::testing::ValuesIn(unusualCases()), hostCaseName);

// ------------------------------------------------------ test-run sequences

class HostSeq : public SandboxTest, public ::testing::WithParamInterface<const HostFamily*> {
 protected:
  void SetUp() override {
    SandboxTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(sb().writeSettings().ok());
    ASSERT_TRUE(sb().addPodAddr(h().f.pod, kPodCookie).ok());
  }
  const HostFamily& h() const { return *GetParam(); }
  const Family& f() const { return GetParam()->f; }

  // Runs prog over in and expects verdict and output (nullopt: unchanged).
  void step(const std::string& what, Prog prog, const Packet& in, const std::optional<Packet>& out,
            int verdict = kNext) {
    SCOPED_TRACE(what);
    auto r = sb().run(prog, in.bytes());
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(verdictName(r->verdict), verdictName(verdict));
    const Bytes want = out ? out->bytes() : in.bytes();
    if (r->out != want)
      ADD_FAILURE() << "output frame " << (out ? "is not the expected rewrite" : "changed, expected it untouched")
                    << "\n  got:  " << describeFrame(r->out) << "\n  want: " << describeFrame(want);
    if (out) {
      EXPECT_TRUE(parsePacket(r->out).checksumsOk()) << parsePacket(r->out).describe();
    }
  }
  // The translated source port of a SYN through host_egress (0 on failure).
  uint16_t synPort(const std::string& node, uint16_t port, uint16_t podPort = kPodPort) {
    auto r = sb().run(Prog::HostEgress, Packet::tcp(node, port, f().pod, podPort).bytes());
    if (!r.ok()) {
      ADD_FAILURE() << r.error().message;
      return 0;
    }
    if (r->verdict != kNext) {
      ADD_FAILURE() << "SYN from " << node << ":" << port << ": " << verdictName(r->verdict);
      return 0;
    }
    ParsedPacket p = parsePacket(r->out);
    EXPECT_EQ(p.src.str(), f().probe) << p.describe();
    EXPECT_EQ(p.dst.str(), f().pod) << p.describe();
    EXPECT_EQ(p.dport, podPort);
    EXPECT_TRUE(p.checksumsOk()) << p.describe();
    return p.sport.value_or(0);
  }
};
std::string familyName(const ::testing::TestParamInfo<const HostFamily*>& info) { return info.param->tag; }

// BPF_PROG_TEST_RUN's skb always has a (dummy) socket, so the rule-11
// "no socket" branch of host_egress cannot be reached by a test run: the
// very SYN that a forwarded packet would be is translated. Rule 11 is
// covered with real forwarded traffic (test/netns/probe_snat_test.cpp,
// ProbeSnat.Rule11...).
TEST_P(HostSeq, TestRunSkbHasASocket) {
  const Packet syn = Packet::tcp(h().node, kProberPort, f().pod, kPodPort);
  auto r = sb().run(Prog::HostEgress, syn.bytes());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->out != syn.bytes()) << "host_egress left a test-run SYN alone: the test-run skb has no socket any more; "
                                    "then add the rule-11 test-run cases (forwarded SYN untouched) here";
}

// Rule 10: two probers with different node addresses and the same source
// port to the same pod port must not collide on (probe addr, port).
TEST_P(HostSeq, SecondProberSamePortGetsAnotherPort) {
  uint16_t p1 = synPort(h().node, kProberPort);
  uint16_t p2 = synPort(h().node2, kProberPort);
  EXPECT_EQ(p1, kProberPort) << "the first prober keeps its port";
  EXPECT_NE(p2, p1) << "the second prober must get another port";
  EXPECT_GE(p2, 1024) << "translated ports stay out of the privileged range";
  const Conn c1{h().node, kProberPort, f().pod, kPodPort, f().probe, p1};
  const Conn c2{h().node2, kProberPort, f().pod, kPodPort, f().probe, p2};
  expectSnat(sb(), {c1.entry(), c2.entry()});
  EXPECT_EQ(probeConns(sb()), 2u);
  // Each reply finds its own prober.
  step("reply to the first", Prog::HostIngress, Packet::tcp(f().pod, kPodPort, f().probe, p1, SYN | ACK),
       Packet::tcp(f().pod, kPodPort, h().node, kProberPort, SYN | ACK));
  step("reply to the second", Prog::HostIngress, Packet::tcp(f().pod, kPodPort, f().probe, p2, SYN | ACK),
       Packet::tcp(f().pod, kPodPort, h().node2, kProberPort, SYN | ACK));
  // Later packets of the second keep its port.
  step("second's ACK", Prog::HostEgress, Packet::tcp(h().node2, kProberPort, f().pod, kPodPort, ACK),
       Packet::tcp(f().probe, p2, f().pod, kPodPort, ACK));
  // The first closes with a RST: only its entries go.
  step("first's RST", Prog::HostEgress, Packet::tcp(h().node, kProberPort, f().pod, kPodPort, RST),
       Packet::tcp(f().probe, p1, f().pod, kPodPort, RST));
  expectSnat(sb(), {c2.entry()});
}

// SLUICE_SNAT_PORT_TRIES probers with the same port to the same pod port
// all get distinct ports; one more is dropped (the prober retries later)
// and leaves no half-made state behind.
TEST_P(HostSeq, PortTriesExhaustedDropsWithoutLeaking) {
  std::set<uint16_t> ports;
  for (int i = 0; i < SLUICE_SNAT_PORT_TRIES; i++) {
    std::string node = &h() == &kH4 ? "10.1.1." + std::to_string(i + 1) : "fd00:1::1:" + std::to_string(i + 1);
    uint16_t p = synPort(node, kProberPort);
    EXPECT_TRUE(ports.insert(p).second) << "port " << p << " handed out twice";
  }
  EXPECT_EQ(ports.size(), size_t{SLUICE_SNAT_PORT_TRIES});
  const Packet syn = Packet::tcp(&h() == &kH4 ? "10.1.2.1" : "fd00:1::2:1", kProberPort, f().pod, kPodPort);
  step("one prober too many", Prog::HostEgress, syn, std::nullopt, TC_ACT_SHOT);
  EXPECT_EQ(sb().snatEntries().size(), size_t{SLUICE_SNAT_PORT_TRIES});
  EXPECT_EQ(probeConns(sb()), uint64_t{SLUICE_SNAT_PORT_TRIES});
  // Another pod port is free again.
  EXPECT_EQ(synPort(&h() == &kH4 ? "10.1.2.1" : "fd00:1::2:1", kProberPort, 9090), kProberPort);
}

// A whole probe, the prober closing first: every packet translated both
// ways, and nothing left after the last ACK.
TEST_P(HostSeq, ProberClosesFirstLeavesNothing) {
  const Packet out = Packet::tcp(h().node, kProberPort, f().pod, kPodPort);
  const Packet in = Packet::tcp(f().pod, kPodPort, f().probe, kProberPort);
  auto o = [&](uint8_t fl) { return Packet(out).tcpFlags(fl); };
  auto i = [&](uint8_t fl) { return Packet(in).tcpFlags(fl); };
  auto oX = [&](uint8_t fl) { return Packet(out).tcpFlags(fl).src(f().probe, kProberPort); };
  auto iX = [&](uint8_t fl) { return Packet(in).tcpFlags(fl).dst(h().node, kProberPort); };
  step("SYN", Prog::HostEgress, o(SYN), oX(SYN));
  step("SYN|ACK", Prog::HostIngress, i(SYN | ACK), iX(SYN | ACK));
  step("ACK", Prog::HostEgress, o(ACK), oX(ACK));
  step("request", Prog::HostEgress, o(ACK | PSH).payload("GET /"), oX(ACK | PSH).payload("GET /"));
  step("response", Prog::HostIngress, i(ACK | PSH).payload("200"), iX(ACK | PSH).payload("200"));
  step("prober FIN", Prog::HostEgress, o(FIN | ACK), oX(FIN | ACK));
  step("pod ACK", Prog::HostIngress, i(ACK), iX(ACK));
  step("pod FIN", Prog::HostIngress, i(FIN | ACK), iX(FIN | ACK));
  EXPECT_EQ(sb().snatEntries().size(), 1u) << "state kept until the last ACK";
  step("prober last ACK", Prog::HostEgress, o(ACK), oX(ACK));
  expectSnat(sb(), {});
  EXPECT_EQ(probeConns(sb()), 1u);
}

// The pod closing first (an HTTP server with Connection: close).
TEST_P(HostSeq, PodClosesFirstLeavesNothing) {
  const Packet out = Packet::tcp(h().node, kProberPort, f().pod, kPodPort);
  const Packet in = Packet::tcp(f().pod, kPodPort, f().probe, kProberPort);
  auto o = [&](uint8_t fl) { return Packet(out).tcpFlags(fl); };
  auto i = [&](uint8_t fl) { return Packet(in).tcpFlags(fl); };
  auto oX = [&](uint8_t fl) { return Packet(out).tcpFlags(fl).src(f().probe, kProberPort); };
  auto iX = [&](uint8_t fl) { return Packet(in).tcpFlags(fl).dst(h().node, kProberPort); };
  step("SYN", Prog::HostEgress, o(SYN), oX(SYN));
  step("SYN|ACK", Prog::HostIngress, i(SYN | ACK), iX(SYN | ACK));
  step("pod FIN", Prog::HostIngress, i(FIN | ACK), iX(FIN | ACK));
  step("prober ACK", Prog::HostEgress, o(ACK), oX(ACK));
  step("prober FIN", Prog::HostEgress, o(FIN | ACK), oX(FIN | ACK));
  EXPECT_EQ(sb().snatEntries().size(), 1u) << "state kept until the last ACK";
  step("pod last ACK", Prog::HostIngress, i(ACK), iX(ACK));
  expectSnat(sb(), {});
}

// The live state is forgotten at the first ACK after both FINs, but in a
// simultaneous close each side ACKs the other's FIN: the second of those
// ACKs comes after that. Closed connections move to snat_closed (the role
// of conntrack's TIME_WAIT), so it, and a FIN retransmitted after a lost
// last ACK (test below), are still translated.
TEST_P(HostSeq, SimultaneousCloseLastAckTranslated) {
  const Packet out = Packet::tcp(h().node, kProberPort, f().pod, kPodPort);
  const Packet in = Packet::tcp(f().pod, kPodPort, f().probe, kProberPort);
  auto o = [&](uint8_t fl) { return Packet(out).tcpFlags(fl); };
  auto i = [&](uint8_t fl) { return Packet(in).tcpFlags(fl); };
  auto oX = [&](uint8_t fl) { return Packet(out).tcpFlags(fl).src(f().probe, kProberPort); };
  auto iX = [&](uint8_t fl) { return Packet(in).tcpFlags(fl).dst(h().node, kProberPort); };
  step("SYN", Prog::HostEgress, o(SYN), oX(SYN));
  step("SYN|ACK", Prog::HostIngress, i(SYN | ACK), iX(SYN | ACK));
  step("prober FIN", Prog::HostEgress, o(FIN | ACK), oX(FIN | ACK));
  step("pod FIN (crossing, not acking the prober's)", Prog::HostIngress, i(FIN | ACK), iX(FIN | ACK));
  step("prober ACK of the pod's FIN", Prog::HostEgress, o(ACK), oX(ACK));
  step("pod ACK of the prober's FIN", Prog::HostIngress, i(ACK), iX(ACK));
}

TEST_P(HostSeq, RetransmittedPodFinAfterLastAckTranslated) {
  const Packet out = Packet::tcp(h().node, kProberPort, f().pod, kPodPort);
  const Packet in = Packet::tcp(f().pod, kPodPort, f().probe, kProberPort);
  auto o = [&](uint8_t fl) { return Packet(out).tcpFlags(fl); };
  auto i = [&](uint8_t fl) { return Packet(in).tcpFlags(fl); };
  auto oX = [&](uint8_t fl) { return Packet(out).tcpFlags(fl).src(f().probe, kProberPort); };
  auto iX = [&](uint8_t fl) { return Packet(in).tcpFlags(fl).dst(h().node, kProberPort); };
  step("SYN", Prog::HostEgress, o(SYN), oX(SYN));
  step("SYN|ACK", Prog::HostIngress, i(SYN | ACK), iX(SYN | ACK));
  step("prober FIN", Prog::HostEgress, o(FIN | ACK), oX(FIN | ACK));
  step("pod FIN", Prog::HostIngress, i(FIN | ACK), iX(FIN | ACK));
  step("prober last ACK (lost on the way)", Prog::HostEgress, o(ACK), oX(ACK));
  step("pod FIN retransmitted", Prog::HostIngress, i(FIN | ACK), iX(FIN | ACK));
}

INSTANTIATE_TEST_SUITE_P(Host, HostSeq, ::testing::ValuesIn(kHostFamilies), familyName);

}  // namespace
}  // namespace sluice::test
