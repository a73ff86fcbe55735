#include "test/bench/micro.h"

#include <bpf/bpf.h>
#include <linux/pkt_cls.h>
#include <net/if.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loader/netns.h"
#include "maps/sluice_maps.h"
#include "test/bench/bpfstats.h"
#include "test/bench/util.h"
#include "test/common/packet.h"

namespace sluice::bench {

namespace {

using sluice::test::Packet;
namespace tcpflag = sluice::test::tcpflag;

std::string verdictName(int v) {
  switch (v) {
    case -1: return "NEXT";
    case TC_ACT_OK: return "TC_ACT_OK";
    case TC_ACT_SHOT: return "TC_ACT_SHOT";
    case TC_ACT_REDIRECT: return "TC_ACT_REDIRECT";
    default: return std::to_string(v);
  }
}

struct Kind {
  const char* program;
  const char* packet;
  int progFd;
  sluice::test::Bytes frame;
  uint32_t mark;
  uint32_t ifindex;
};

}  // namespace

std::vector<MicroSample> runMicro(CaseEnv& env, int runs) {
  std::vector<MicroSample> out;
  Datapath* dp = env.datapath();
  if (!dp) return out;
  PodPrograms& p = dp->programs();

  // A real outbound connection through the redirect, kept open: its packets
  // take the "owned" paths (a proxy socket owns the flow).
  auto conn = sluice::test::tcpConnect(env.topo().pod(), sluice::test::Endpoint::of("10.96.0.7", 80));
  uint16_t appPort = 0;
  if (conn.ok()) {
    auto echo = sluice::test::echoRoundTrip(conn->get(), std::string(1, '\x07'));
    if (echo.ok()) appPort = sluice::test::localOf(conn->get()).port();
  }
  uint32_t eth0 = 0;
  (void)runInNetns(env.podFd(), [&]() -> Status {
    eth0 = if_nametoindex("eth0");
    return {};
  });
  // The fixed cost of a run as this machine times it: an empty program.
  Fd emptyProg = loadEmptyTcProgram("sluice_bench_nop");
  const uint32_t tag = SLUICE_TAG_MAGIC;
  std::vector<Kind> kinds = {
      {"baseline", "empty program (timer and call overhead)", emptyProg.get(),
       Packet::tcp("10.200.0.2", 40001, "10.96.0.7", 80, tcpflag::SYN).bytes(), 0, eth0},
      {"pod_egress", "outbound SYN (capture)", p.egressFd(),
       Packet::tcp("10.200.0.2", 40001, "10.96.0.7", 80, tcpflag::SYN).bytes(), 0, eth0},
      {"pod_egress", "outbound ACK, proxy-owned flow", p.egressFd(),
       Packet::tcp("10.200.0.2", appPort, "10.96.0.7", 80, tcpflag::ACK).bytes(), 0, eth0},
      {"pod_egress", "reply of an inbound flow (pass)", p.egressFd(),
       Packet::tcp("10.201.0.9", 8080, "10.200.0.1", 40002, tcpflag::ACK).bytes(), 0, eth0},
      {"pod_egress", "proxy-marked packet (pass)", p.egressFd(),
       Packet::tcp("10.200.0.2", 40003, "10.96.0.7", 80, tcpflag::ACK).bytes(), 0x539, eth0},
      {"pod_egress", "DNS query over UDP (capture)", p.egressFd(),
       Packet::udp("10.200.0.2", 40004, "10.96.0.10", 53).payload("0123456789abcdef0123456789").bytes(), 0, eth0},
      {"pod_ingress", "looped outbound SYN (listener)", p.ingressFd(),
       Packet::tcp("10.200.0.2", 40001, "10.96.0.7", 80, tcpflag::SYN).bytes(), tag | SLUICE_TAG_OUTBOUND, eth0},
      {"pod_ingress", "looped ACK, proxy-owned flow", p.ingressFd(),
       Packet::tcp("10.200.0.2", appPort, "10.96.0.7", 80, tcpflag::ACK).bytes(), tag | SLUICE_TAG_OWNED, eth0},
      {"pod_ingress", "inbound SYN (capture)", p.ingressFd(),
       Packet::tcp("10.200.0.1", 40005, "10.201.0.9", 8080, tcpflag::SYN).bytes(), 0, eth0},
      {"pod_ingress", "inbound ACK (pass)", p.ingressFd(),
       Packet::tcp("10.200.0.1", 40005, "10.201.0.9", 8080, tcpflag::ACK).bytes(), 0, eth0},
      {"pod_lo_egress", "TCP on lo (pass)", p.loEgressFd(),
       Packet::tcp("10.96.0.7", 80, "10.200.0.2", appPort, tcpflag::ACK).bytes(), 0, 1},
      {"pod_lo_egress", "DNS answer (source restored)", p.loEgressFd(),
       Packet::udp("127.0.0.1", 15053, "10.200.0.2", 40004).payload("0123456789abcdef0123456789").bytes(), 0, 1},
  };
  for (const auto& k : kinds) {
    MicroSample s;
    s.program = k.program;
    s.packet = k.packet;
    if (k.progFd < 0) {
      s.error = "cannot load the empty program";
      out.push_back(s);
      continue;
    }
    if (appPort == 0 && std::string(k.packet).find("owned") != std::string::npos) {
      s.error = "no redirected connection to take the owned path";
      out.push_back(s);
      continue;
    }
    std::vector<double> ns;
    int verdict = -1;
    Status st = runInNetns(env.podFd(), [&]() -> Status {
      sluice::test::Bytes buf(k.frame.size() + 256);
      for (int i = 0; i < runs && !gStop; i++) {
        sluice::test::Bytes in = k.frame;
        struct __sk_buff ctx {};
        ctx.mark = k.mark;
        ctx.ifindex = k.ifindex;
        LIBBPF_OPTS(bpf_test_run_opts, o);
        o.data_in = in.data();
        o.data_size_in = static_cast<__u32>(in.size());
        o.data_out = buf.data();
        o.data_size_out = static_cast<__u32>(buf.size());
        o.ctx_in = &ctx;
        o.ctx_size_in = sizeof(ctx);
        o.repeat = 1;
        if (bpf_prog_test_run_opts(k.progFd, &o) != 0) return Error::fromErrno(errno, "BPF_PROG_TEST_RUN");
        verdict = static_cast<int>(o.retval);
        ns.push_back(static_cast<double>(o.duration));
      }
      return {};
    });
    if (!st.ok()) s.error = st.error().message;
    s.verdict = verdictName(verdict);
    s.runs = static_cast<int>(ns.size());
    s.nsMedian = median(ns);
    s.nsMean = ns.empty() ? NAN : std::accumulate(ns.begin(), ns.end(), 0.0) / static_cast<double>(ns.size());
    out.push_back(s);
  }
  return out;
}

}  // namespace sluice::bench
