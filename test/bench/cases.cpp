#include "test/bench/cases.h"

#include <arpa/inet.h>
#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "loader/netns.h"
#include "loader/tc.h"
#include "minimal_tc.skel.h"
#include "xdp_pass.skel.h"
#include "test/bench/bpfstats.h"

namespace sluice::bench {

namespace {

constexpr uint32_t kServiceNet = 0x0a600000;  // 10.96.0.0/24: outbound destinations
constexpr uint32_t kAnyIpNet = 0x0ac90000;    // 10.201.0.0/24: local to the pod (any-IP route)
constexpr const char* kResolver = "10.96.0.10";
// The IPv6 twins (the last byte is K).
constexpr const char* kServiceNet6 = "fd00:96::";
constexpr const char* kAnyIpNet6 = "fd00:201::";

/// "10.0.0.1" of "10.0.0.1:80", "fd00::1" of "[fd00::1]:80".
std::string ipOf(const std::string& addrPort) {
  std::string ip = addrPort.substr(0, addrPort.rfind(':'));
  return ip.size() > 2 && ip.front() == '[' ? ip.substr(1, ip.size() - 2) : ip;
}

/// The port of "a:port" / "[a]:port" (0 when there is none).
int portOf(const std::string& addrPort) {
  auto colon = addrPort.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(addrPort.c_str() + colon + 1);
}

/// "TSO on, GSO on, GRO off" for @p dev in the calling thread's namespace
/// (the legacy ethtool ioctls): what attaching XDP changed on a veth end.
std::string offloads(const char* dev) {
  Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  std::string out;
  for (auto [cmd, name] : {std::pair{ETHTOOL_GTSO, "TSO"}, std::pair{ETHTOOL_GGSO, "GSO"}, std::pair{ETHTOOL_GGRO, "GRO"}}) {
    ethtool_value v{};
    v.cmd = cmd;
    ifreq ifr{};
    std::snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", dev);
    ifr.ifr_data = reinterpret_cast<char*>(&v);
    out += std::string(out.empty() ? "" : ", ") + name + " " +
           (!s.valid() || ::ioctl(s.get(), SIOCETHTOOL, &ifr) != 0 ? "?" : v.data ? "on" : "off");
  }
  return out;
}

}  // namespace

const char* caseName(CaseKind k) {
  switch (k) {
    case CaseKind::Floor: return "floor";
    case CaseKind::Iptables: return "iptables";
    case CaseKind::IptablesLegacy: return "iptables-legacy";
    case CaseKind::SluiceTcx: return "sluice-tcx";
    case CaseKind::SluiceLegacy: return "sluice-legacy";
    case CaseKind::TcMinimal: return "tc-minimal";
    case CaseKind::SluiceSocket: return "sluice-socket";
    case CaseKind::FloorXdp: return "floor+xdp";
    case CaseKind::FloorXdpFrags: return "floor+xdp-frags";
    case CaseKind::SluiceTcxXdp: return "sluice-tcx+xdp";
    case CaseKind::SluiceTcxXdpFrags: return "sluice-tcx+xdp-frags";
    case CaseKind::SluiceSocketXdp: return "sluice-socket+xdp";
    case CaseKind::SluiceSocketXdpFrags: return "sluice-socket+xdp-frags";
  }
  return "?";
}

XdpVariant xdpVariant(CaseKind k) {
  switch (k) {
    case CaseKind::FloorXdp:
    case CaseKind::SluiceTcxXdp:
    case CaseKind::SluiceSocketXdp: return XdpVariant::Pass;
    case CaseKind::FloorXdpFrags:
    case CaseKind::SluiceTcxXdpFrags:
    case CaseKind::SluiceSocketXdpFrags: return XdpVariant::PassFrags;
    default: return XdpVariant::None;
  }
}

CaseKind baseCase(CaseKind k) {
  switch (k) {
    case CaseKind::FloorXdp:
    case CaseKind::FloorXdpFrags: return CaseKind::Floor;
    case CaseKind::SluiceTcxXdp:
    case CaseKind::SluiceTcxXdpFrags: return CaseKind::SluiceTcx;
    case CaseKind::SluiceSocketXdp:
    case CaseKind::SluiceSocketXdpFrags: return CaseKind::SluiceSocket;
    default: return k;
  }
}

namespace {
std::string gSocketHookCgroup;
}  // namespace

void setSocketHookCgroup(const std::string& path) { gSocketHookCgroup = path; }
const std::string& socketHookCgroup() { return gSocketHookCgroup; }

bool caseRuns(CaseKind k, const std::string& workload) {
  return k != CaseKind::TcMinimal || (workload != "dns" && !isIpv6Workload(workload));
}

std::optional<CaseKind> parseCase(const std::string& s) {
  for (CaseKind k : kAllCases)
    if (s == caseName(k)) return k;
  for (CaseKind k : kXdpCases)
    if (s == caseName(k)) return k;
  return std::nullopt;
}

Result<std::unique_ptr<CaseEnv>> CaseEnv::create(CaseKind kind, const IstioRules* rules, int sinkCpu) {
  std::unique_ptr<CaseEnv> env(new CaseEnv(kind));
  const std::string what = std::string(caseName(kind)) + ": ";
  const CaseKind base = baseCase(kind);
  env->topo_ = std::make_unique<sluice::test::PodTopology>();
  if (!env->topo_->ok()) return Error::msg(what + env->topo_->error());
  auto& topo = *env->topo_;
  const std::string pod = "ip -n " + topo.pod().name(), node = "ip -n " + topo.node().name();
  auto r = sluice::test::sh("set -e\n" + pod + " route add local 10.201.0.0/24 dev lo\n" + node +
                            " route add 10.201.0.0/24 via 10.200.0.2 dev vethpod\n" + pod + " -6 route add local " +
                            kAnyIpNet6 + "/64 dev lo\n" + node + " -6 route add " + kAnyIpNet6 +
                            "/64 via fd00:200::2 dev vethpod\n");
  if (r.exitCode != 0) return Error::msg(what + "any-IP routes: " + r.describe());
  auto pfd = openNetns(topo.pod().path());
  SLUICE_TRY(pfd);
  auto nfd = openNetns(topo.node().path());
  SLUICE_TRY(nfd);
  env->podFd_ = std::move(*pfd);
  env->nodeFd_ = std::move(*nfd);

  SinkConfig sc;
  sc.netnsFd = env->podFd_.get();
  sc.cpu = sinkCpu;
  sc.dnsAnswer = kDnsAnswer;
  sc.method = isIptables(kind)                  ? OrigDstMethod::SoOriginalDst
              : base == CaseKind::SluiceSocket ? OrigDstMethod::Ztunnel
                                               : OrigDstMethod::GetSockName;
  if (base == CaseKind::Floor) {
    sc.outbound = {kAnyIpNet, 15001, parseV6(kAnyIpNet6)};
    sc.inbound = {kAnyIpNet, 15006, parseV6(kAnyIpNet6)};
  } else {
    sc.outbound = {kServiceNet, 80, parseV6(kServiceNet6)};
    sc.inbound = {kAnyIpNet, 8080, parseV6(kAnyIpNet6)};
  }

  if (isIptables(kind)) {
    if (!rules) return Error::msg(what + "no rule files");
    auto t = applyIstioRules(env->podFd_.get(), kind == CaseKind::Iptables ? IptFlavor::Nft : IptFlavor::Legacy, *rules);
    if (!t.ok()) return Error::msg(what + t.error().message);
  } else if (isTproxyStyle(kind) || base == CaseKind::SluiceSocket) {
    env->bpffs_ = std::make_unique<sluice::test::TestBpffs>();
    DatapathOptions o;
    o.bpffsRoot = env->bpffs_->root();
    o.tcMode = base == CaseKind::SluiceLegacy ? TcMode::Legacy : TcMode::Tcx;
    o.capture = base == CaseKind::SluiceSocket ? CaptureMode::Socket : CaptureMode::Tc;
    o.cgroupPath = socketHookCgroup();
    auto dp = Datapath::open(o);
    if (!dp.ok()) return Error::msg(what + "Datapath::open: " + dp.error().message);
    env->dp_ = std::move(*dp);
    PodSpec spec;
    spec.netnsPath = topo.pod().path();
    spec.id = topo.pod().name();
    auto info = env->dp_->addPod(spec);
    if (!info.ok()) return Error::msg(what + "addPod: " + info.error().message);
    env->podId_ = spec.id;
    env->enrolled_ = true;
  }
  auto sink = Sink::start(sc);
  if (!sink.ok()) return Error::msg(what + sink.error().message);
  env->sink_ = std::move(*sink);
  if (kind == CaseKind::TcMinimal) {
    Status st = env->swapInMinimal();
    if (!st.ok()) return Error::msg(what + st.error().message);
  }
  if (xdpVariant(kind) != XdpVariant::None) {
    Status st = env->attachXdp();
    if (!st.ok()) return Error::msg(what + st.error().message);
  }
  return env;
}

/// Loads xdp_pass.bpf.c and attaches the case's variant to both ends of the
/// pod's veth: eth0 (what the node sends the pod) and vethpod (what the pod
/// sends the node). Native (driver) mode is demanded, so the attach fails
/// rather than falling back to generic XDP, and bpf_xdp_query confirms it.
/// BPF links, not netlink attachments: closing them (the destructor, or the
/// process's exit on a crash) detaches the programs.
Status CaseEnv::attachXdp() {
  xdp_pass* skel = xdp_pass__open();
  if (!skel) return Error::fromErrno(errno, "XDP: open the BPF object");
  xdp_.reset(skel, xdp_pass__destroy);
  const bool frags = xdpVariant(kind_) == XdpVariant::PassFrags;
  bpf_program* prog = frags ? skel->progs.xdp_pass_frags : skel->progs.xdp_pass;
  bpf_program__set_autoload(frags ? skel->progs.xdp_pass : skel->progs.xdp_pass_frags, false);
  if (int err = xdp_pass__load(skel); err != 0) return Error::fromErrno(-err, "XDP: load the BPF object");
  xdpProgFd_ = bpf_program__fd(prog);
  struct End {
    int netnsFd;
    const char* dev;
  };
  xdpNote_ = std::string("XDP ") + bpf_program__name(prog) + ":";
  for (End e : {End{podFd_.get(), "eth0"}, End{nodeFd_.get(), "vethpod"}}) {
    // The ifindex is resolved in the calling thread's namespace.
    Status st = runInNetns(e.netnsFd, [&]() -> Status {
      unsigned ifindex = if_nametoindex(e.dev);
      if (ifindex == 0) return Error::fromErrno(errno, std::string("XDP: ") + e.dev);
      LIBBPF_OPTS(bpf_link_create_opts, lo);
      lo.flags = XDP_FLAGS_DRV_MODE;
      Fd link(bpf_link_create(bpf_program__fd(prog), static_cast<int>(ifindex), BPF_XDP, &lo));
      if (!link.valid()) return Error::fromErrno(errno, std::string("XDP: attach in driver mode to ") + e.dev);
      LIBBPF_OPTS(bpf_xdp_query_opts, q);
      if (bpf_xdp_query(static_cast<int>(ifindex), 0, &q) != 0)
        return Error::fromErrno(errno, std::string("XDP: query ") + e.dev);
      if (q.attach_mode != XDP_ATTACHED_DRV)
        return Error::msg(std::string("XDP: ") + e.dev + " is not in driver mode (attach_mode " +
                          std::to_string(q.attach_mode) + ")");
      xdpLinks_.push_back(std::move(link));
      xdpNote_ += std::string(" ") + e.dev + " native;";
      return {};
    });
    SLUICE_TRY(st);
  }
  // After both attachments: each end's program changes its peer's features.
  xdpNote_ += " then";
  for (End e : {End{podFd_.get(), "eth0"}, End{nodeFd_.get(), "vethpod"}})
    SLUICE_TRY(runInNetns(e.netnsFd, [&]() -> Status {
      xdpNote_ += std::string(" ") + e.dev + " (" + offloads(e.dev) + ")";
      return {};
    }));
  return {};
}

/// Loads minimal_tc.bpf.c, hands it the sink's listeners and swaps it into
/// the links sluice made for the pod's eth0 (bpf_link_update: the same
/// attachments, policy route and sysctls as sluice-tcx). tc-minimal does no
/// DNS: lo's link gets an empty program, whose run time in traffic is what
/// a run costs here with nothing in it.
Status CaseEnv::swapInMinimal() {
  minimal_tc* skel = minimal_tc__open();
  if (!skel) return Error::fromErrno(errno, "tc-minimal: open the BPF object");
  minimal_.reset(skel, minimal_tc__destroy);
  skel->rodata->out_net = htonl(kServiceNet);
  skel->rodata->out_port = htons(80);
  skel->rodata->in_net = htonl(kAnyIpNet);
  skel->rodata->in_port = htons(8080);
  skel->rodata->return_mark = dp_->options().settings.returnMark;
  if (int err = minimal_tc__load(skel); err != 0) return Error::fromErrno(-err, "tc-minimal: load the BPF object");
  int mapFd = bpf_map__fd(skel->maps.listeners);
  const uint32_t keys[2] = {0, 1};
  const uint64_t socks[2] = {static_cast<uint64_t>(sink_->outboundListenerFd()),
                             static_cast<uint64_t>(sink_->inboundListenerFd())};
  for (int i = 0; i < 2; i++)
    if (bpf_map_update_elem(mapFd, &keys[i], &socks[i], BPF_ANY) != 0)
      return Error::fromErrno(errno, "tc-minimal: put the sink's listener in the SOCKMAP");
  const std::string dir = bpffs_->linkDir(podId_);
  SLUICE_TRY(updateTcx(dir + "/eth0_egress", bpf_program__fd(skel->progs.minimal_egress)));
  SLUICE_TRY(updateTcx(dir + "/eth0_ingress", bpf_program__fd(skel->progs.minimal_ingress)));
  empty_ = loadEmptyTcProgram("minimal_empty");
  if (!empty_.valid()) return Error::fromErrno(errno, "tc-minimal: load the empty program");
  return updateTcx(dir + "/lo_egress", empty_.get());
}

CaseEnv::~CaseEnv() {
  sink_.reset();
  if (dp_ && enrolled_) (void)dp_->removePod(podId_);
  dp_.reset();
  xdpLinks_.clear();
  podFd_.reset();
  nodeFd_.reset();
  topo_.reset();
  bpffs_.reset();
}

DstFn CaseEnv::outboundDst(int family) const {
  const bool floor = baseCase(kind_) == CaseKind::Floor;
  const uint16_t port = floor ? 15001 : 80;
  if (family == AF_INET6) {
    in6_addr net = parseV6(floor ? kAnyIpNet6 : kServiceNet6);
    return [net, port](int k) { return v6(net, k, port); };
  }
  const uint32_t net = floor ? kAnyIpNet : kServiceNet;
  return [net, port](int k) { return addrOf(v4(net | static_cast<uint32_t>(k), port)); };
}

DstFn CaseEnv::inboundDst(int family) const {
  const uint16_t port = baseCase(kind_) == CaseKind::Floor ? 15006 : 8080;
  if (family == AF_INET6) {
    in6_addr net = parseV6(kAnyIpNet6);
    return [net, port](int k) { return v6(net, k, port); };
  }
  return [port](int k) { return addrOf(v4(kAnyIpNet | static_cast<uint32_t>(k), port)); };
}

sockaddr_in CaseEnv::resolver() const {
  return baseCase(kind_) == CaseKind::Floor ? v4("127.0.0.1", 15053) : v4(kResolver, 53);
}

std::vector<CaseProgram> CaseEnv::programs() {
  if (minimal_)
    return {{"minimal_egress", bpf_program__fd(minimal_->progs.minimal_egress)},
            {"minimal_ingress", bpf_program__fd(minimal_->progs.minimal_ingress)},
            {kEmptyProgramName, empty_.get()}};
  if (!dp_) return {};
  PodPrograms& p = dp_->programs();
  if (baseCase(kind_) == CaseKind::SluiceSocket) {
    const SocketPrograms& s = p.socketPrograms();
    // The pod's own sk_lookup program: its run time includes the shared
    // program it tail-calls.
    if (!lookup_.valid()) {
      Fd link(bpf_obj_get((bpffs_->linkDir(podId_) + "/sk_lookup").c_str()));
      bpf_link_info info{};
      __u32 len = sizeof(info);
      if (link.valid() && bpf_obj_get_info_by_fd(link.get(), &info, &len) == 0)
        lookup_ = Fd(bpf_prog_get_fd_by_id(info.prog_id));
    }
    return {{"connect4", s.connect4},       {"sockops", s.sockops},        {"getsockopt", s.getsockopt},
            {"getpeername4", s.getpeername4}, {"sendmsg4", s.sendmsg4},    {"recvmsg4", s.recvmsg4},
            {"skb_ingress", s.skbIngress},  {"skb_egress", s.skbEgress},   {"sk_lookup (pod)", lookup_.get()}};
  }
  return {{"pod_egress", p.egressFd()}, {"pod_ingress", p.ingressFd()}, {"pod_lo_egress", p.loEgressFd()}};
}

sluice_pod_stats CaseEnv::podStats() {
  if (!dp_ || !enrolled_ || minimal_) return {};
  auto s = dp_->stats(podId_);
  if (!s.ok() || s->empty()) return {};
  return s->front().stats;
}

std::vector<std::string> CaseEnv::probe(std::vector<std::string>& notes) {
  using sluice::test::Endpoint;
  std::vector<std::string> fails;
  const bool floor = baseCase(kind_) == CaseKind::Floor;
  if (!xdpNote_.empty()) notes.push_back(xdpNote_);
  sluice_pod_stats before = podStats();
  sink_->setRecording(true);
  sink_->setMode(SinkMode::Echo);

  struct Conn {
    const char* listener;
    sluice::test::TestNetns* from;
    Addr dst;
    std::string peerIp;  // "" = not checked
    std::string redirectedTo;  // iptables: the address REDIRECT gives
  };
  // +xdp: the program must really run on the packets that cross the veth
  // (the inbound connection's, both directions). Run-time statistics are on
  // for the probe only, so the measurements do not pay for them.
  std::optional<BpfStatsOn> xdpStats;
  ProgRun xdpBefore;
  if (xdpProgFd_ >= 0) {
    xdpStats.emplace();
    if (!xdpStats->ok()) fails.push_back("XDP run count: " + xdpStats->error());
    xdpBefore = progRun(xdpProgFd_);
  }
  std::vector<Conn> conns = {
      {"outbound", &topo_->pod(), outboundDst()(7), floor ? "" : "10.200.0.2", "127.0.0.1:15001"},
      {"inbound", &topo_->node(), inboundDst()(9), "10.200.0.1", "10.200.0.2:15006"},
  };
  if (caseRuns(kind_, "conn_out6")) {
    conns.push_back({"outbound", &topo_->pod(), outboundDst(AF_INET6)(7), floor ? "" : "fd00:200::2", "[::1]:15001"});
    conns.push_back({"inbound", &topo_->node(), inboundDst(AF_INET6)(9), "fd00:200::1", "[fd00:200::2]:15006"});
  }
  for (const auto& c : conns) {
    const bool ipv6 = c.dst.family() == AF_INET6;
    std::string want = c.dst.text();
    Endpoint ep = Endpoint::fromSockaddr(c.dst.sa(), c.dst.len);
    auto fd = sluice::test::tcpConnect(*c.from, ep);
    if (!fd.ok()) {
      fails.push_back(std::string(c.listener) + " probe to " + want + ": " + fd.error().message);
      continue;
    }
    std::string k(1, static_cast<char>(c.dst.index()));
    auto echo = sluice::test::echoRoundTrip(fd->get(), k);
    if (!echo.ok() || *echo != k) {
      fails.push_back(std::string(c.listener) + " probe to " + want + ": no answer from the sink");
      continue;
    }
    const ConnInfo* seen = nullptr;
    auto rec = sink_->recorded();
    for (const auto& ci : rec)
      if (ci.listener == c.listener) seen = &ci;
    if (!seen) {
      fails.push_back(std::string(c.listener) + " probe to " + want + ": the sink recorded no connection");
      continue;
    }
    std::string how = std::string(c.listener) + " to " + want + ": sink local " + seen->local + ", SO_ORIGINAL_DST " +
                      (seen->soOriginalDst.empty() ? std::string("fails (") + std::strerror(seen->soOriginalDstErrno) + ")"
                                                   : seen->soOriginalDst) +
                      ", peer " + seen->peer;
    notes.push_back(how);
    if (seen->origDst != want) fails.push_back(how + ": original destination is not " + want);
    if (!c.peerIp.empty() && ipOf(seen->peer) != c.peerIp) fails.push_back(how + ": peer is not " + c.peerIp);
    if (isIptables(kind_) && (seen->soOriginalDst != want || seen->local != c.redirectedTo))
      fails.push_back(how + ": expected REDIRECT to " + c.redirectedTo + " with SO_ORIGINAL_DST " + want);
    if (isTproxyStyle(kind_) && (seen->local != want || !seen->soOriginalDst.empty()))
      fails.push_back(how + ": expected TPROXY-style delivery (local address " + want + ", no conntrack NAT)");
    if (baseCase(kind_) == CaseKind::SluiceSocket) {
      // Outbound: connect() was sent to the proxy on loopback (IPv4: an
      // address of 127.1.0.0/16 chosen by the destination, port 15001;
      // IPv6: [::1] at a port of 16384-32767 chosen by the destination),
      // from the pod's address, and SO_ORIGINAL_DST answers; inbound: the
      // socket lookup handed the connection over with its addresses (no
      // NAT, no SO_ORIGINAL_DST).
      bool out = std::string(c.listener) == "outbound";
      const int port = portOf(seen->local);
      const bool toLoopback = ipv6 ? ipOf(seen->local) == "::1" && port >= 16384 && port <= 32767
                                   : seen->local.rfind("127.1.", 0) == 0 && port == 15001;
      if (out && (!toLoopback || seen->soOriginalDst != want))
        fails.push_back(how + ": expected connect() sent to " + (ipv6 ? "[::1]:16384-32767" : "127.1.x.y:15001") +
                        " with SO_ORIGINAL_DST " + want);
      if (!out && (seen->local != want || !seen->soOriginalDst.empty()))
        fails.push_back(how + ": expected the socket lookup's hand-over (local address " + want + ")");
    }
    if (floor && seen->local != want) fails.push_back(how + ": floor connection did not reach the proxy port directly");
  }
  sink_->setRecording(false);
  if (xdpStats && xdpStats->ok()) {
    uint64_t runs = (progRun(xdpProgFd_) - xdpBefore).cnt;
    notes.push_back("XDP program runs during the connection probes: " + std::to_string(runs));
    if (runs == 0) fails.push_back("XDP: the program did not run on the inbound probe's packets");
    xdpStats.reset();
  }

  // DNS through the UDP capture, from a connected socket.
  if (!caseRuns(kind_, "dns")) return fails;
  sockaddr_in res = resolver();
  std::string resText = sockaddrText(reinterpret_cast<sockaddr*>(&res));
  uint64_t dnsBefore = sink_->counters().dnsQueries;
  auto reply = sluice::test::udpExchange(topo_->pod(), Endpoint::fromSockaddr(reinterpret_cast<sockaddr*>(&res), sizeof(res)),
                                         sluice::test::dnsQuery(0x5a5a, "probe.sluice.example", 1), true);
  if (!reply.ok()) {
    fails.push_back("DNS probe to " + resText + ": " + reply.error().message);
  } else {
    auto ans = sluice::test::parseDnsAnswer(reply->payload);
    std::string how = "DNS to " + resText + ": answer from " + reply->from.str();
    notes.push_back(how);
    if (reply->from.str() != resText) fails.push_back(how + ": not from the resolver queried");
    if (!ans || ans->id != 0x5a5a || ans->addresses.empty() || ans->addresses[0] != kDnsAnswer)
      fails.push_back(how + ": not the sink's answer");
    if (sink_->counters().dnsQueries <= dnsBefore) fails.push_back(how + ": the sink saw no query");
  }

  if (isSluice(kind_)) {
    sluice_pod_stats after = podStats();
    std::string counters = "sluice counters: outbound_conns +" + std::to_string(after.outbound_conns - before.outbound_conns) +
                           ", inbound_conns +" + std::to_string(after.inbound_conns - before.inbound_conns) +
                           ", dns_udp_queries +" + std::to_string(after.dns_udp_queries - before.dns_udp_queries) +
                           ", dns_answers +" + std::to_string(after.dns_answers - before.dns_answers);
    notes.push_back(counters);
    if (after.outbound_conns <= before.outbound_conns || after.inbound_conns <= before.inbound_conns ||
        after.dns_udp_queries <= before.dns_udp_queries || after.dns_answers <= before.dns_answers)
      fails.push_back(counters + ": the BPF programs did not handle every probe");
  }

  if (floor) {
    // Controls: without redirection the redirected destinations are dead,
    // so nothing but a working redirect can make the other cases succeed.
    sluice::test::ConnectOptions co;
    co.timeout = 1s;
    std::string seen;
    bool anyAnswered = false;
    auto control = [&](sluice::test::TestNetns& from, const Addr& dst) {
      auto c = sluice::test::tcpConnect(from, Endpoint::fromSockaddr(dst.sa(), dst.len), co);
      seen += dst.text() + " " + (c.ok() ? "connected" : c.error().message) + "; ";
      anyAnswered |= c.ok();
    };
    control(topo_->pod(), addrOf(v4("10.96.0.7", 80)));
    control(topo_->node(), addrOf(v4("10.201.0.9", 8080)));
    control(topo_->pod(), v6(parseV6(kServiceNet6), 7, 80));
    control(topo_->node(), v6(parseV6(kAnyIpNet6), 9, 8080));
    auto dns = sluice::test::udpExchange(topo_->pod(), Endpoint::of(kResolver, 53),
                                         sluice::test::dnsQuery(1, "control.example", 1), true, 500ms);
    notes.push_back("controls without redirection: " + seen + "DNS to 10.96.0.10:53 " +
                    (dns.ok() ? "answered" : dns.error().message));
    if (anyAnswered || dns.ok())
      fails.push_back("floor: a redirected destination answers without redirection; the checks would prove nothing");
  }
  return fails;
}

}  // namespace sluice::bench
