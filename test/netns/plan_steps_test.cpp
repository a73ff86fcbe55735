// Every step a pod's plan can contain (enroll/plan.cpp), one test each, in
// every capture mode it appears in (TC with tcx and with legacy clsact
// attachment, socket), in real namespaces with real veths and the real
// loaded programs (issue 28). Each test builds the plan Datapath::addPod
// would run for a pod of the PodTopology (Datapath::preparePod), applies
// the steps before it with the runner, then drives its step alone:
//
//  1. apply succeeds, check says InPlace, and the kernel shows it;
//  2. undo succeeds, check says Missing with one line naming it, and the
//     kernel no longer shows it;
//  3. undo again succeeds and changes nothing (a snapshot of the pod's
//     and node's netns, the pins and the maps compares equal);
//  4. apply over a half-applied step (one part removed by hand, with ip,
//     tc, a map erase or a link detached behind its pin) makes it whole:
//     InPlace again, and the steps before it are still in place.
//
// Where a step's check cannot honestly say Missing (the node hooks are the
// node's and stay; the programs' state and the host veth have nothing to
// undo in the kernel; the hand-off is the node proxy's), the test asserts
// what is meaningful and says why beside it.
//
//   node netns                          pod netns
//   +---------------------+   veth    +-------------------------------+
//   | vethpod  (host side)|<--------->| eth0 10.200.0.2, fd00:200::2  |
//   | vethpod1            |<--------->| eth1 (socket mode: reroute)   |
//   +---------------------+           +-------------------------------+
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "enroll/context.h"
#include "enroll/datapath.h"
#include "enroll/pins.h"
#include "enroll/plan.h"
#include "enroll/registry.h"
#include "enroll/runner.h"
#include "loader/netns.h"
#include "loader/sock_hooks.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

constexpr uint32_t kProxyMark = SLUICE_DEFAULT_PROXY_MARK;

// Debian bookworm's uapi headers predate tcx (Linux 6.6): the fixed ABI values.
constexpr auto kTcxIngress = static_cast<enum bpf_attach_type>(46);
constexpr auto kTcxEgress = static_cast<enum bpf_attach_type>(47);

// ---- The steps a plan can contain ------------------------------------------------

enum class Kind {
  Registry,
  NodeHooks,
  LinkDir,
  AcceptLocal,
  Rule4,
  Route4,
  Rule6,
  Route6,
  FwmarkAccept,
  SkLookup,
  ProxyListeners,
  TcPodIngress,
  TcPodEgress,
  TcLoEgress,
  ProgramState,
  PodStats,
  PodConfig,
  PodSock,
  Handoff,
  HostVeth,
  ProbeAddrs,
  ProbeHook,
  PodAddrs,
};

struct Row {
  Kind kind;
  const char* label;  ///< the test name's suffix
  std::string what;   ///< the step's what(), exactly
};

std::string routeWhat(const char* family) {
  return std::string(family) + " local default route of table " + std::to_string(SLUICE_ROUTE_TABLE);
}

// The plan of the topology's pod, step by step, as enroll/plan.cpp makes it
// (lo has IPv6, a node side, a hand-off): TC mode hooks eth0 and lo; the
// socket mode hooks only its reroute interface, eth1.
std::vector<Row> expectedPlan(bool socket) {
  std::vector<Row> p;
  p.push_back({Kind::Registry, "registry_record", std::string("record in ") + SLUICE_PIN_PODS});
  if (socket) p.push_back({Kind::NodeHooks, "node_hooks", "socket mode node hooks"});
  p.push_back({Kind::LinkDir, "link_dir", "pin directory"});
  if (!socket) p.push_back({Kind::AcceptLocal, "accept_local_eth0", "accept_local on eth0"});
  p.push_back({Kind::Rule4, "return_rule_v4", "IPv4 policy rule for the return mark"});
  p.push_back({Kind::Route4, "local_route_v4", routeWhat("IPv4")});
  p.push_back({Kind::Rule6, "return_rule_v6", "IPv6 policy rule for the return mark"});
  p.push_back({Kind::Route6, "local_route_v6", routeWhat("IPv6")});
  if (socket) {
    p.push_back({Kind::FwmarkAccept, "fwmark_accept", "net.ipv4.tcp_fwmark_accept"});
    p.push_back({Kind::SkLookup, "sk_lookup", "sk_lookup program in the pod's netns"});
    p.push_back({Kind::ProxyListeners, "proxy_listeners", std::string("the proxy's listeners in ") + SLUICE_PIN_SOCK_LISTENERS});
    p.push_back({Kind::TcPodIngress, "tc_eth1_ingress", "TC ingress hook on pod interface 0"});
  } else {
    p.push_back({Kind::TcPodIngress, "tc_eth0_ingress", "TC ingress hook on pod interface 0"});
    p.push_back({Kind::TcPodEgress, "tc_eth0_egress", "TC egress hook on pod interface 0"});
    p.push_back({Kind::TcLoEgress, "tc_lo_egress", "TC egress hook on lo"});
  }
  p.push_back({Kind::ProgramState, "program_state", "the programs' state of the pod"});
  p.push_back({Kind::PodStats, "pod_stats", std::string("entry in ") + SLUICE_PIN_POD_STATS});
  p.push_back({Kind::PodConfig, "pod_config", std::string("entry in ") + SLUICE_PIN_POD_CONFIG});
  if (socket) p.push_back({Kind::PodSock, "pod_sock", std::string("entry in ") + SLUICE_PIN_POD_SOCK});
  p.push_back({Kind::Handoff, "handoff", "hand-off to the node proxy"});
  p.push_back({Kind::HostVeth, "host_veth", "host-side veth"});
  p.push_back({Kind::ProbeAddrs, "probe_addrs", "probe addresses on the node's lo"});
  p.push_back({Kind::ProbeHook, "probe_hook", "node probe hook"});
  p.push_back({Kind::PodAddrs, "pod_addrs", std::string("addresses in ") + SLUICE_PIN_POD_ADDRS});
  return p;
}

struct StepCase {
  ModeParam mode;
  size_t index;
  Row row;
};

void PrintTo(const StepCase& c, std::ostream* os) { *os << c.mode.name << " step " << c.index << " " << c.row.label; }

std::vector<StepCase> allCases() {
  std::vector<StepCase> out;
  for (const ModeParam& m : {kTcxMode, kLegacyMode, kSocketMode}) {
    auto rows = expectedPlan(m.capture == CaptureMode::Socket);
    for (size_t i = 0; i < rows.size(); i++) out.push_back({m, i, rows[i]});
  }
  return out;
}

bool isTcHook(Kind k) {
  return k == Kind::TcPodIngress || k == Kind::TcPodEgress || k == Kind::TcLoEgress;
}

std::string stateName(StepState s) {
  switch (s) {
    case StepState::InPlace: return "InPlace";
    case StepState::Missing: return "Missing";
    case StepState::Foreign: return "Foreign";
    case StepState::Unknown: return "Unknown";
  }
  return "?";
}

std::string describe(const StepCheck& c) {
  std::string s = stateName(c.state);
  for (const auto& p : c.problems) s += "; " + p;
  return s;
}

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// Names under @p dir, sorted ("" when it is gone).
std::string listDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return "(none)";
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  std::string s;
  for (const auto& n : names) s += n + " ";
  return s;
}

// Detaches the link pinned at @p pin and leaves its pin: a hook gone
// behind sluice's back (what a removed device or a foreign bpf_link_detach
// leaves).
Status detachBehindPin(const std::string& pin) {
  Fd link(bpf_obj_get(pin.c_str()));
  if (!link.valid()) return Error::fromErrno(errno, "open " + pin);
  if (bpf_link_detach(link.get()) != 0) return Error::fromErrno(errno, "detach " + pin);
  return {};
}

// A TCP listener in @p ns on the wildcard address of @p family and @p port,
// with SO_MARK @p mark (0: none); IPv6 ones dual-stack unless @p v6only.
Result<Fd> listenIn(const TestNetns& ns, int family, uint16_t port, uint32_t mark, bool v6only = false) {
  auto fd = socketIn(ns, family, SOCK_STREAM);
  SLUICE_TRY(fd);
  const int one = 1, only = v6only ? 1 : 0;
  if (mark && ::setsockopt(fd->get(), SOL_SOCKET, SO_MARK, &mark, sizeof(mark)) != 0)
    return Error::fromErrno(errno, "SO_MARK");
  ::setsockopt(fd->get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (family == AF_INET6 && ::setsockopt(fd->get(), IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof(only)) != 0)
    return Error::fromErrno(errno, "IPV6_V6ONLY");
  const Endpoint at = Endpoint::any(family, port);
  if (::bind(fd->get(), at.raw(), at.len) != 0) return Error::fromErrno(errno, "bind :" + std::to_string(port));
  if (::listen(fd->get(), 16) != 0) return Error::fromErrno(errno, "listen");
  return fd;
}

uint64_t socketCookieOf(int fd) {
  uint64_t c = 0;
  socklen_t len = sizeof(c);
  if (::getsockopt(fd, SOL_SOCKET, SO_COOKIE, &c, &len) != 0) return 0;
  return c;
}

Status shOk(const std::string& cmd) {
  CommandResult r = sh(cmd);
  if (r.exitCode != 0) return Error::msg(cmd + ": " + r.describe());
  return {};
}

// ---- The fixture ------------------------------------------------------------------

class PlanStepTest : public ::testing::TestWithParam<StepCase> {
 protected:
  void SetUp() override {
    const StepCase& p = GetParam();
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    if (std::string why = modeUnsupported(p.mode); !why.empty()) GTEST_SKIP() << why;
    socket_ = p.mode.capture == CaptureMode::Socket;
    ASSERT_TRUE(topo_.ok()) << topo_.error();
    // The socket mode hooks only a reroute interface at TC: eth1 is one.
    if (socket_) {
      ASSERT_TRUE(topo_.addVeth("eth1", "vethpod1", 1).ok());
      // The proxy listens before anything of sluice is there (no sock_ops
      // hook sees its listen()): inbound dual-stack, outbound IPv4; beside
      // it an app's IPv6-only listener on the outbound port, without the
      // proxy's mark, which must never be registered.
      auto in = listenIn(topo_.pod(), AF_INET6, 15006, kProxyMark);
      auto out = listenIn(topo_.pod(), AF_INET, 15001, kProxyMark);
      auto app = listenIn(topo_.pod(), AF_INET6, 15001, 0, true);
      ASSERT_TRUE(in.ok() && out.ok() && app.ok())
          << (in.ok() ? out.ok() ? app.error().message : out.error().message : in.error().message);
      proxyIn_ = std::move(*in);
      proxyOut_ = std::move(*out);
      appListener_ = std::move(*app);
    }
    DatapathOptions o;
    o.bpffsRoot = bpffs_.root();
    o.tcMode = p.mode.tc;
    o.capture = p.mode.capture;
    o.podGuard = false;
    auto dp = Datapath::open(o);
    ASSERT_TRUE(dp.ok()) << dp.error().message;
    dp_ = std::move(*dp);

    handoff_.apply = [this](const PodInfo& info) -> Status {
      handedTo_.push_back(info.id);
      if (failHandoff_) return Error::msg("node proxy says no (test)", ECONNREFUSED);
      return {};
    };
    handoff_.undo = [this](const PodInfo& info) { takenBack_.push_back(info.id); };
    handoff_.failureIsFatal = false;

    PodSpec spec;
    spec.netnsPath = topo_.pod().path();
    spec.id = topo_.pod().name();
    spec.nodeNetnsPath = topo_.node().path();
    if (socket_) spec.rerouteIfaces = {"eth1"};
    id_ = spec.id;
    auto prepared = dp_->preparePod(spec, &handoff_);
    ASSERT_TRUE(prepared.ok()) << prepared.error().message;
    prepared_ = std::make_unique<PreparedPod>(std::move(*prepared));
    plan_ = planFor(ctx().rec, prepared_->what);

    // The plan is the one this test was made for: every step, in order.
    auto rows = expectedPlan(socket_);
    std::vector<std::string> whats, want;
    for (const auto& s : plan_) whats.push_back(s->what());
    for (const auto& r : rows) want.push_back(r.what);
    ASSERT_EQ(whats, want);
    ASSERT_LT(p.index, plan_.size());
    step_ = plan_[p.index].get();

    // The steps before this one, as `pod add` applies them.
    if (p.index > 0) {
      Plan before = planFor(ctx().rec, prepared_->what);
      before.resize(p.index);
      Status st = applyPlan(before, ctx());
      ASSERT_TRUE(st.ok()) << "the steps before " << p.row.what << ": " << st.error().message;
    }
    applied_ = true;
  }

  void TearDown() override {
    // Everything the plan may have made, undone as `pod remove` does (the
    // bpffs root, the namespaces and with them the rest go afterwards).
    if (applied_) {
      Status st = undoPlan(plan_, ctx());
      EXPECT_TRUE(st.ok()) << "removing the pod: " << st.error().message;
      EXPECT_FALSE(dp_->programs().pods.lookup(podKey(id_))) << "the record outlived the pod's removal";
    }
  }

  PodContext& ctx() { return prepared_->context; }
  PodPrograms& maps() { return dp_->programs(); }
  uint64_t cookie() { return ctx().rec.netns_cookie; }
  bool legacy() { return ctx().rec.tc_mode == SLUICE_TC_LEGACY; }

  // Runs @p fn where @p where says, as the runner does: in the pod's netns
  // (the context knows it is there), in the node's, or here.
  Status in(Where where, const std::function<Status()>& fn) {
    if (where == Where::Host) return fn();
    const TestNetns& ns = where == Where::Pod ? topo_.pod() : topo_.node();
    auto fd = openNetns(ns.path());
    SLUICE_TRY(fd);
    return runInNetns(fd->get(), [&]() -> Status {
      if (where != Where::Pod) return fn();
      PodContext& c = ctx();
      c.inPodNetns = true;
      c.podNetnsFd = fd->get();
      Status r = fn();
      c.inPodNetns = false;
      c.podNetnsFd = -1;
      c.podLinks.reset();
      return r;
    });
  }
  Status apply(Step& s) { return in(s.where(), [&] { return s.apply(ctx()); }); }
  Status undo(Step& s) { return in(s.where(), [&] { return s.undo(ctx()); }); }
  StepCheck check(Step& s) {
    StepCheck out = StepCheck::unknown("not run");
    Status st = in(s.where(), [&]() -> Status {
      out = s.check(ctx());
      return {};
    });
    if (!st.ok()) return StepCheck::unknown("entering its netns: " + st.error().message);
    return out;
  }

  // The steps before this one and this one, checked by the runner: none
  // has a problem (a step mended must not have broken another).
  void expectPlanUpToHereInPlace() {
    Plan upTo = planFor(ctx().rec, prepared_->what);
    upTo.resize(GetParam().index + 1);
    PodCheck c = checkPlan(upTo, ctx(), false);
    EXPECT_FALSE(c.gone);
    std::string all;
    for (const auto& p : c.problems) all += p + "\n";
    EXPECT_TRUE(c.problems.empty()) << all;
  }

  // ---- What the kernel shows, read around sluice's own checks ----

  struct Iface {
    const TestNetns* ns;
    std::string name;
    TcHook hook;
  };
  Iface ifaceOf(Kind k) {
    switch (k) {
      case Kind::TcPodIngress: return {&topo_.pod(), ifaceName(ctx().rec.ifaces[0]), TcHook::Ingress};
      case Kind::TcPodEgress: return {&topo_.pod(), ifaceName(ctx().rec.ifaces[0]), TcHook::Egress};
      case Kind::TcLoEgress: return {&topo_.pod(), "lo", TcHook::Egress};
      default: return {&topo_.pod(), "lo", TcHook::Egress};
    }
  }
  std::string pinOf(Kind k) {
    Iface f = ifaceOf(k);
    return tcxPin(ctx().linkDir, f.name, f.hook);
  }

  // Programs on one TC hook: tcx (the kernel's query) or clsact filters.
  int tcPrograms(const Iface& f) {
    if (legacy()) {
      CommandResult r = sh("tc -n " + f.ns->name() + " filter show dev " + f.name + " " + tcHookName(f.hook));
      // Two lines a filter ("... bpf chain 0" and its "... handle 0x1 <prog> ..."): count the handles.
      int n = 0;
      for (size_t at = r.out.find(" handle "); at != std::string::npos; at = r.out.find(" handle ", at + 1)) n++;
      return n;
    }
    int count = -1;
    Status st = f.ns->run([&]() -> Status {
      int ifindex = static_cast<int>(if_nametoindex(f.name.c_str()));
      if (!ifindex) return Error::fromErrno(errno, f.name);
      LIBBPF_OPTS(bpf_prog_query_opts, q);
      if (bpf_prog_query_opts(ifindex, f.hook == TcHook::Ingress ? kTcxIngress : kTcxEgress, &q) != 0)
        return Error::fromErrno(errno, "query tcx");
      count = static_cast<int>(q.prog_cnt);
      return {};
    });
    return st.ok() ? count : -1;
  }

  int skLookupPrograms() {
    auto fd = openNetns(topo_.pod().path());
    if (!fd.ok()) return -1;
    LIBBPF_OPTS(bpf_prog_query_opts, q);
    if (bpf_prog_query_opts(fd->get(), BPF_SK_LOOKUP, &q) != 0) return -1;
    return static_cast<int>(q.prog_cnt);
  }

  sluice_sock_listener_key slotKey(uint16_t port, int family, int slot) {
    sluice_sock_listener_key k{};
    k.netns_cookie = cookie();
    k.port = port;
    k.family = static_cast<uint8_t>(family);
    k.slot = static_cast<uint8_t>(slot);
    return k;
  }
  // In how many of its port's and family's slots of sock_listeners the
  // socket @p fd is.
  int registeredSlots(const Fd& fd, uint16_t port, int family) {
    const uint64_t want = socketCookieOf(fd.get());
    int n = 0;
    for (int slot = 0; slot < SLUICE_LISTENER_SLOTS; slot++)
      if (auto v = maps().sockListeners.lookup(slotKey(port, family, slot)); v && *v == want) n++;
    return n;
  }
  Status eraseSlots(uint16_t port, int family) {
    for (int slot = 0; slot < SLUICE_LISTENER_SLOTS; slot++) SLUICE_TRY(maps().sockListeners.erase(slotKey(port, family, slot)));
    return {};
  }

  std::string ipOut(const TestNetns& ns, const std::string& args) { return ns.ip(args).out; }
  bool ruleThere(const char* fam) {
    return ipOut(topo_.pod(), std::string(fam) + " rule show priority " + std::to_string(SLUICE_RULE_PRIORITY))
               .find("lookup " + std::to_string(SLUICE_ROUTE_TABLE)) != std::string::npos;
  }
  bool routeThere(const char* fam) {
    return ipOut(topo_.pod(), std::string(fam) + " route show table " + std::to_string(SLUICE_ROUTE_TABLE))
               .find("local default") != std::string::npos;
  }
  std::string sysctl(const std::string& key) {
    auto v = topo_.pod().sysctl(key);
    return v.ok() ? *v : "error: " + v.error().message;
  }
  std::string probeHookDir() { return bpffs_.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/"; }
  size_t podAddrsOwned() {
    size_t n = 0;
    for (uint32_t i = 0; i < ctx().rec.addr_count; i++)
      if (auto o = maps().podAddrs.lookup(ctx().rec.addrs[i]); o && o->netns_cookie == cookie()) n++;
    return n;
  }

  // Whether the kernel (or the map) shows step @p k made.
  bool made(Kind k) {
    switch (k) {
      case Kind::Registry: {
        auto r = maps().pods.lookup(podKey(id_));
        return r && r->netns_cookie == cookie();
      }
      case Kind::NodeHooks: {
        for (const auto& h : nodeHooks(maps()))
          if (!pathExists(bpffs_.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/" + h.name)) return false;
        return !nodeHooks(maps()).empty();
      }
      case Kind::LinkDir: return pathExists(ctx().linkDir);
      case Kind::AcceptLocal: return sysctl("net/ipv4/conf/eth0/accept_local") == "1";
      case Kind::Rule4: return ruleThere("-4");
      case Kind::Route4: return routeThere("-4");
      case Kind::Rule6: return ruleThere("-6");
      case Kind::Route6: return routeThere("-6");
      case Kind::FwmarkAccept: return sysctl("net/ipv4/tcp_fwmark_accept") == "1";
      case Kind::SkLookup: return skLookupPrograms() == 1;
      case Kind::ProxyListeners:
        return registeredSlots(proxyIn_, 15006, AF_INET6) == 1 && registeredSlots(proxyOut_, 15001, AF_INET) == 1 &&
               registeredSlots(appListener_, 15001, AF_INET6) == 0;
      case Kind::PodStats: return !maps().podStats.lookupPerCpu(cookie()).empty();
      case Kind::PodConfig: {
        auto have = maps().podConfig.lookup(cookie());
        return have && std::memcmp(&*have, &ctx().rec.config, sizeof(ctx().rec.config)) == 0;
      }
      case Kind::PodSock: return maps().podSock.lookup(cookie()).has_value();
      case Kind::Handoff: return ctx().rec.handoff.state == SLUICE_HANDOFF_ACKED;
      case Kind::HostVeth: return ifaceName(ctx().rec.host_iface) == "vethpod" && ctx().rec.host_iface.ifindex != 0;
      case Kind::PodAddrs: return ctx().rec.addr_count > 0 && podAddrsOwned() == ctx().rec.addr_count;
      case Kind::ProbeAddrs: {
        const std::string lo = ipOut(topo_.node(), "addr show dev lo");
        return lo.find("169.254.7.127/32") != std::string::npos &&
               lo.find("fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128") != std::string::npos;
      }
      case Kind::ProbeHook:
        return pathExists(probeHookDir() + "probe_connect4") && pathExists(probeHookDir() + "probe_connect6");
      case Kind::ProgramState: return true;  // nothing of its own (see its test)
      default: return tcPrograms(ifaceOf(k)) == 1;
    }
  }

  // Everything the steps touch, as text: what undo again must not change.
  std::string snapshot() {
    std::string s;
    for (const char* fam : {"-4", "-6"}) {
      s += ipOut(topo_.pod(), std::string(fam) + " rule show");
      // sluice's table only: the kernel adds link-local routes whenever DAD ends.
      s += ipOut(topo_.pod(), std::string(fam) + " route show table " + std::to_string(SLUICE_ROUTE_TABLE));
    }
    for (const TestNetns* ns : {&topo_.pod(), &topo_.node()}) {
      for (const char* dev : {"eth0", "eth1", "lo", "vethpod", "vethpod1"}) {
        s += sh("tc -n " + ns->name() + " qdisc show dev " + dev + " 2>/dev/null").out;
        for (TcHook h : {TcHook::Ingress, TcHook::Egress}) {
          s += sh("tc -n " + ns->name() + " filter show dev " + dev + " " + tcHookName(h) + " 2>/dev/null").out;
          if (!legacy()) s += std::to_string(tcPrograms({ns, dev, h})) + " ";
        }
      }
    }
    s += "accept_local " + sysctl("net/ipv4/conf/eth0/accept_local");
    s += " fwmark_accept " + sysctl("net/ipv4/tcp_fwmark_accept");
    s += " sk_lookup " + std::to_string(skLookupPrograms());
    s += "\nlinks: " + listDir(linksRoot(bpffs_.root())) + "/ " + listDir(ctx().linkDir);
    s += "\nnode_links: " + listDir(bpffs_.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR);
    auto rec = maps().pods.lookup(podKey(id_));
    s += "\nrecord " + std::to_string(rec.has_value());
    auto cfg = maps().podConfig.lookup(cookie());
    s += " config " + std::to_string(cfg.has_value());
    s += " stats " + std::to_string(!maps().podStats.lookupPerCpu(cookie()).empty());
    if (maps().socketLoaded()) s += " sock " + std::to_string(maps().podSock.lookup(cookie()).has_value());
    s += " addrs " + std::to_string(podAddrsOwned());
    s += " handed " + std::to_string(handedTo_.size()) + " back " + std::to_string(takenBack_.size());
    return s;
  }

  // The words a step's problem names it by, when it is missing.
  std::string keyword(Kind k) {
    if (isTcHook(k)) {
      Iface f = ifaceOf(k);
      return std::string("no program attached at ") + f.name + " " + tcHookName(f.hook);
    }
    switch (k) {
      case Kind::Registry: return std::string("no record in ") + SLUICE_PIN_PODS;
      case Kind::LinkDir: return "pin directory " + ctx().linkDir + " is missing";
      case Kind::AcceptLocal: return "accept_local is off on eth0";
      case Kind::Rule4: return "IPv4 policy rule for the return mark is missing";
      case Kind::Rule6: return "IPv6 policy rule for the return mark is missing";
      case Kind::Route4: return routeWhat("IPv4") + " is missing";
      case Kind::Route6: return routeWhat("IPv6") + " is missing";
      case Kind::FwmarkAccept: return "net.ipv4.tcp_fwmark_accept is missing";
      case Kind::SkLookup: return "sk_lookup program in the pod's netns is missing";
      case Kind::PodStats: return std::string("no entry in ") + SLUICE_PIN_POD_STATS;
      case Kind::PodConfig: return std::string("no entry in ") + SLUICE_PIN_POD_CONFIG;
      case Kind::PodSock: return std::string("no entry in ") + SLUICE_PIN_POD_SOCK;
      case Kind::Handoff: return "not handed to the node proxy";
      default: return "(none)";
    }
  }

  // Removes a pin and waits until the link it held is gone (the kernel
  // frees a link unpinned from bpffs asynchronously).
  Status unpinAndWait(const std::string& pin, const std::function<bool()>& gone) {
    if (::unlink(pin.c_str()) != 0) return Error::fromErrno(errno, "unlink " + pin);
    if (!eventually(gone, std::chrono::seconds(5))) return Error::msg("the link unpinned at " + pin + " stays attached");
    return {};
  }

  // The context's record, to compare before and after.
  std::string recordBytes() {
    const auto* b = reinterpret_cast<const char*>(&ctx().rec);
    return std::string(b, sizeof(ctx().rec));
  }

  bool socket_ = false;
  Fd proxyIn_, proxyOut_, appListener_;  ///< socket mode: listening before the plan runs
  TestBpffs bpffs_;
  PodTopology topo_;
  std::unique_ptr<Datapath> dp_;
  Handoff handoff_;
  bool failHandoff_ = false;
  std::vector<std::string> handedTo_, takenBack_;
  std::string id_;
  std::unique_ptr<PreparedPod> prepared_;
  Plan plan_;
  Step* step_ = nullptr;
  bool applied_ = false;
};

TEST_P(PlanStepTest, ApplyUndoUndoRepair) {
  const StepCase& p = GetParam();
  const Kind k = p.row.kind;
  Step& s = *step_;
  SCOPED_TRACE(p.row.what);

  // ---- 1. apply: in place, and the kernel shows it ----
  Status st = apply(s);
  ASSERT_TRUE(st.ok()) << st.error().message;
  StepCheck c = check(s);
  EXPECT_EQ(c.state, StepState::InPlace) << describe(c);
  EXPECT_TRUE(c.problems.empty()) << describe(c);
  EXPECT_TRUE(made(k)) << "applied, but the kernel does not show it";
  // Applying again is harmless too (the runner's repair and a retried add do).
  st = apply(s);
  ASSERT_TRUE(st.ok()) << "applied twice: " << st.error().message;
  EXPECT_EQ(check(s).state, StepState::InPlace);
  if (isTcHook(k)) {
    EXPECT_EQ(tcPrograms(ifaceOf(k)), 1) << "applied twice: one program, not two";
  }
  if (k == Kind::Handoff) {
    EXPECT_EQ(handedTo_.size(), 2u) << "each apply hands the pod over (ZDS answers a known pod)";
  }

  // ---- 2. undo: missing, one line naming it ----
  st = undo(s);
  ASSERT_TRUE(st.ok()) << st.error().message;
  c = check(s);
  switch (k) {
    case Kind::NodeHooks:
    case Kind::ProbeHook:
    case Kind::ProbeAddrs:
      // The node's, shared by every pod (socket-mode pods for NodeHooks,
      // pods with a node side for the others): a pod's undo leaves them
      // (the bpffs root's and the node netns' removal take them here).
      EXPECT_EQ(c.state, StepState::InPlace) << describe(c);
      EXPECT_TRUE(made(k)) << "a pod's undo took the node's hooks";
      break;
    case Kind::ProxyListeners:
      // The programs keep a proxy's listeners in a pod that is not enrolled
      // too (they leave when closed): undo leaves them.
      EXPECT_EQ(c.state, StepState::InPlace) << describe(c);
      EXPECT_TRUE(made(k)) << "undo took the proxy's listeners";
      break;
    case Kind::ProgramState:
      // Nothing of its own to make: the programs fill these maps as traffic
      // flows, so check has nothing to miss (what undo forgets is asserted below).
      EXPECT_EQ(c.state, StepState::InPlace) << describe(c);
      break;
    case Kind::HostVeth:
      // It only finds the host-side veth and records it; the record goes
      // with the pod, so undo leaves it and its hooks say whether it is there.
      EXPECT_EQ(c.state, StepState::InPlace) << describe(c);
      EXPECT_TRUE(made(k)) << "undo forgot the host-side veth the later steps name";
      break;
    case Kind::Handoff:
      // Not the data plane's to repair (the agent retries the hand-off):
      // Unknown, never Missing; the node proxy was told to take it back.
      EXPECT_EQ(c.state, StepState::Unknown) << describe(c);
      ASSERT_EQ(c.problems.size(), 1u) << describe(c);
      EXPECT_NE(c.problems[0].find(keyword(k)), std::string::npos) << describe(c);
      EXPECT_EQ(takenBack_.size(), 1u);
      break;
    case Kind::LinkDir:
      // A legacy (clsact) tc pod of an older build never had one, so check
      // cannot miss it there; the directory is gone all the same. A socket
      // pod always has one (its sk_lookup pin), whatever its attach mode
      // (legacy below Linux 6.6).
      if (legacy() && ctx().rec.capture != SLUICE_CAPTURE_SOCKET) {
        EXPECT_EQ(c.state, StepState::InPlace) << describe(c);
      } else {
        EXPECT_EQ(c.state, StepState::Missing) << describe(c);
        ASSERT_EQ(c.problems.size(), 1u) << describe(c);
        EXPECT_NE(c.problems[0].find(keyword(k)), std::string::npos) << describe(c);
      }
      EXPECT_FALSE(made(k)) << "undone, but the directory is still there";
      break;
    case Kind::PodAddrs:
      // One line per address (each names its address).
      EXPECT_EQ(c.state, StepState::Missing) << describe(c);
      EXPECT_EQ(c.problems.size(), ctx().rec.addr_count) << describe(c);
      for (uint32_t i = 0; i < ctx().rec.addr_count && i < c.problems.size(); i++)
        EXPECT_NE(c.problems[i].find(formatPodAddr(ctx().rec.addrs[i])), std::string::npos) << describe(c);
      EXPECT_FALSE(made(k));
      break;
    default:
      EXPECT_EQ(c.state, StepState::Missing) << describe(c);
      ASSERT_EQ(c.problems.size(), 1u) << describe(c);
      EXPECT_EQ(c.problems[0].find('\n'), std::string::npos) << describe(c);
      EXPECT_NE(c.problems[0].find(keyword(k)), std::string::npos) << describe(c);
      EXPECT_FALSE(made(k)) << "undone, but the kernel still shows it";
  }
  if (k == Kind::AcceptLocal) {
    EXPECT_EQ(sysctl("net/ipv4/conf/eth0/accept_local"), "0") << "not restored";
  }
  if (k == Kind::FwmarkAccept) {
    EXPECT_EQ(sysctl("net/ipv4/tcp_fwmark_accept"), "0") << "not restored";
  }

  // ---- 3. undo again: harmless, nothing changes ----
  const std::string before = snapshot();
  const std::string recBefore = recordBytes();
  const StepState stateBefore = c.state;
  st = undo(s);
  ASSERT_TRUE(st.ok()) << "undo again: " << st.error().message;
  EXPECT_EQ(snapshot(), before) << "undo again changed something";
  EXPECT_TRUE(recordBytes() == recBefore) << "undo again changed the pod's record";
  EXPECT_EQ(check(s).state, stateBefore);

  // ---- 4. apply over a half-applied step ----
  ASSERT_TRUE((st = apply(s)).ok()) << st.error().message;
  ASSERT_EQ(check(s).state, StepState::InPlace) << describe(check(s));
  // One part removed by hand; then the state check finds, and apply mends.
  auto damaged = [&](const std::string& how, const std::function<Status()>& damage, bool checkSeesIt = true) {
    SCOPED_TRACE(how);
    Status d = damage();
    ASSERT_TRUE(d.ok()) << d.error().message;
    if (checkSeesIt) {
      StepCheck found = check(s);
      EXPECT_NE(found.state, StepState::InPlace) << "check did not see it";
      EXPECT_FALSE(found.problems.empty()) << describe(found);
    }
    Status again = apply(s);
    ASSERT_TRUE(again.ok()) << again.error().message;
    StepCheck after = check(s);
    EXPECT_EQ(after.state, StepState::InPlace) << describe(after);
    EXPECT_TRUE(made(k)) << "apply did not mend it";
  };
  const TestNetns& pod = topo_.pod();
  switch (k) {
    case Kind::Registry: {
      damaged("the record erased", [&] { return maps().pods.erase(podKey(id_)); });
      // A record of the same netns with other content: apply writes the context's.
      // (check looks only for a record under the id; content is apply's to mend.)
      damaged("a stale record", [&]() -> Status {
        sluice_pod_record stale = ctx().rec;
        stale.enrolled_at_ns += 1;
        stale.handoff.state = SLUICE_HANDOFF_FAILED;
        return maps().pods.update(podKey(id_), stale);
      }, false);
      auto now = maps().pods.lookup(podKey(id_));
      ASSERT_TRUE(now);
      EXPECT_EQ(std::memcmp(&*now, &ctx().rec, sizeof(*now)), 0) << "apply left the stale record";
      break;
    }
    case Kind::NodeHooks: {
      auto hooks = nodeHooks(maps());
      ASSERT_GE(hooks.size(), 2u);
      const std::string dir = bpffs_.root() + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/";
      damaged("one hook unpinned", [&]() -> Status {
        if (::unlink((dir + hooks[0].name).c_str()) != 0) return Error::fromErrno(errno, "unlink");
        return {};
      });
      damaged("one hook detached behind its pin", [&] { return detachBehindPin(dir + hooks[1].name); });
      break;
    }
    case Kind::LinkDir:
      damaged("the pod's directory removed", [&]() -> Status {
        if (::rmdir(ctx().linkDir.c_str()) != 0) return Error::fromErrno(errno, "rmdir");
        return {};
      }, !legacy());
      damaged("links/ removed", [&]() -> Status {
        if (::rmdir(ctx().linkDir.c_str()) != 0 || ::rmdir(linksRoot(bpffs_.root()).c_str()) != 0)
          return Error::fromErrno(errno, "rmdir");
        return {};
      }, !legacy());
      break;
    case Kind::AcceptLocal:
      damaged("accept_local turned off", [&] { return pod.setSysctl("net/ipv4/conf/eth0/accept_local", "0"); });
      // What it was before sluice is still what undo restores.
      ASSERT_TRUE(undo(s).ok());
      EXPECT_EQ(sysctl("net/ipv4/conf/eth0/accept_local"), "0");
      ASSERT_TRUE(apply(s).ok());
      break;
    case Kind::Rule4:
      damaged("the IPv4 rule deleted", [&] {
        return shOk("ip -n " + pod.name() + " -4 rule del priority " + std::to_string(SLUICE_RULE_PRIORITY));
      });
      break;
    case Kind::Rule6:
      // Only the IPv6 rule: the IPv4 one (an earlier step) stays, and stays checked in place.
      damaged("the IPv6 rule deleted", [&] {
        return shOk("ip -n " + pod.name() + " -6 rule del priority " + std::to_string(SLUICE_RULE_PRIORITY));
      });
      EXPECT_TRUE(made(Kind::Rule4));
      break;
    case Kind::Route4:
      damaged("the IPv4 route deleted", [&] {
        return shOk("ip -n " + pod.name() + " -4 route del local default table " + std::to_string(SLUICE_ROUTE_TABLE));
      });
      EXPECT_TRUE(made(Kind::Rule4)) << "the rule went with the route";
      break;
    case Kind::Route6:
      damaged("only the IPv6 route deleted", [&] {
        return shOk("ip -n " + pod.name() + " -6 route del local default table " + std::to_string(SLUICE_ROUTE_TABLE));
      });
      EXPECT_TRUE(made(Kind::Route4) && made(Kind::Rule6));
      break;
    case Kind::FwmarkAccept:
      damaged("tcp_fwmark_accept turned off", [&] { return pod.setSysctl("net/ipv4/tcp_fwmark_accept", "0"); });
      ASSERT_TRUE(undo(s).ok());
      EXPECT_EQ(sysctl("net/ipv4/tcp_fwmark_accept"), "0") << "undo no longer restores what was there before sluice";
      ASSERT_TRUE(apply(s).ok());
      break;
    case Kind::SkLookup:
      damaged("the link detached behind its pin", [&] { return detachBehindPin(skLookupPin(ctx().linkDir)); });
      damaged("the pin removed", [&] {
        return unpinAndWait(skLookupPin(ctx().linkDir), [&] { return skLookupPrograms() == 0; });
      });
      break;
    case Kind::ProxyListeners: {
      // What a migration that re-created sock_listeners leaves: one
      // listener, then every one, unknown to pod_sk_lookup; check names
      // each, apply takes each from the process that holds it (this one)
      // into one slot, never a second, never the app's.
      damaged("the inbound listener's entry erased", [&] { return eraseSlots(15006, AF_INET6); });
      ASSERT_TRUE(eraseSlots(15006, AF_INET6).ok());
      StepCheck one = check(s);
      EXPECT_EQ(one.state, StepState::Missing) << describe(one);
      ASSERT_EQ(one.problems.size(), 1u) << describe(one);
      EXPECT_NE(one.problems[0].find("IPv6 listener on :15006"), std::string::npos) << describe(one);
      ASSERT_TRUE(apply(s).ok());
      damaged("every entry erased", [&]() -> Status {
        SLUICE_TRY(eraseSlots(15006, AF_INET6));
        return eraseSlots(15001, AF_INET);
      });
      // Applied again and again (every sweep): no second slot.
      ASSERT_TRUE(apply(s).ok());
      EXPECT_TRUE(made(k));
      // A listener that closes leaves by itself, and then nothing is missing.
      proxyOut_.reset();
      EXPECT_TRUE(eventually([&] { return check(s).state == StepState::InPlace; }, std::chrono::seconds(5)))
          << describe(check(s));
      break;
    }
    case Kind::ProgramState: {
      // Undo forgets this pod's entries in the programs' own maps, and only
      // its: another pod's stay. (Apply makes nothing: no half to mend.)
      sluice_snat_key mine{}, other{};
      mine.family = other.family = AF_INET;
      mine.sport = 1;
      other.sport = 2;
      sluice_snat_value mv{}, ov{};
      mv.netns_cookie = cookie();
      ov.netns_cookie = cookie() + 1;
      sluice_dns_nat_key dmine{}, dother{};
      dmine.netns_cookie = cookie();
      dother.netns_cookie = cookie() + 1;
      ASSERT_TRUE(maps().snatRev.update(mine, mv).ok());
      ASSERT_TRUE(maps().snatRev.update(other, ov).ok());
      ASSERT_TRUE(maps().snatClosed.update(mine, mv).ok());
      ASSERT_TRUE(maps().dnsNat.update(dmine, sluice_dns_nat_value{}).ok());
      ASSERT_TRUE(maps().dnsNat.update(dother, sluice_dns_nat_value{}).ok());
      ASSERT_TRUE(undo(s).ok());
      EXPECT_FALSE(maps().snatRev.lookup(mine));
      EXPECT_FALSE(maps().snatClosed.lookup(mine));
      EXPECT_FALSE(maps().dnsNat.lookup(dmine));
      EXPECT_TRUE(maps().snatRev.lookup(other)) << "undo forgot another pod's probe SNAT state";
      EXPECT_TRUE(maps().dnsNat.lookup(dother)) << "undo forgot another pod's DNS translation";
      ASSERT_TRUE(undo(s).ok());
      EXPECT_TRUE(maps().snatRev.lookup(other));
      (void)maps().snatRev.erase(other);
      (void)maps().dnsNat.erase(dother);
      ASSERT_TRUE(apply(s).ok());
      break;
    }
    case Kind::PodStats:
      damaged("the entry erased", [&] { return maps().podStats.erase(cookie()); });
      break;
    case Kind::PodConfig:
      damaged("the entry erased", [&] { return maps().podConfig.erase(cookie()); });
      damaged("another config written", [&]() -> Status {
        sluice_pod_config wrong = ctx().rec.config;
        wrong.flags ^= SLUICE_POD_DNS_CAPTURE;
        return maps().podConfig.update(cookie(), wrong);
      });
      break;
    case Kind::PodSock:
      damaged("the entry erased", [&] { return maps().podSock.erase(cookie()); });
      damaged("other capture flags written", [&]() -> Status {
        auto have = maps().podSock.lookup(cookie());
        if (!have) return Error::msg("no pod_sock entry");
        have->flags ^= SLUICE_POD_INBOUND_CAPTURE;
        return maps().podSock.update(cookie(), *have);
      });
      EXPECT_EQ(maps().podSock.lookup(cookie())->flags, ctx().rec.config.flags);
      break;
    case Kind::Handoff: {
      // Half done: the node proxy refused it (not fatal here): recorded as
      // failed, which check reports; the retry succeeds.
      ASSERT_TRUE(undo(s).ok());
      failHandoff_ = true;
      ASSERT_TRUE(apply(s).ok()) << "a refused hand-off that is not fatal is no error";
      StepCheck failed = check(s);
      EXPECT_EQ(failed.state, StepState::Unknown) << describe(failed);
      ASSERT_EQ(failed.problems.size(), 1u) << describe(failed);
      EXPECT_NE(failed.problems[0].find("node proxy says no"), std::string::npos) << describe(failed);
      failHandoff_ = false;
      damaged("refused once, then retried", [] { return Status(); }, false);
      break;
    }
    case Kind::HostVeth: {
      damaged("the record's host-side interface forgotten", [&]() -> Status {
        ctx().rec.host_iface = {};
        return {};
      }, false);
      // The wrong peer: in a named node netns that is an error, not a guess.
      const int peer = ctx().peerIfindex;
      ctx().rec.host_iface = {};
      ctx().peerIfindex = peer + 1000;
      Status wrong = apply(s);
      EXPECT_FALSE(wrong.ok());
      if (!wrong.ok()) {
        EXPECT_EQ(wrong.error().code, ENODEV) << wrong.error().message;
      }
      ctx().peerIfindex = peer;
      ASSERT_TRUE(apply(s).ok());
      EXPECT_TRUE(made(k));
      break;
    }
    case Kind::ProbeHook:
      damaged("one link unpinned", [&]() -> Status {
        if (::unlink((probeHookDir() + "probe_connect4").c_str()) != 0) return Error::fromErrno(errno, "unlink");
        return {};
      });
      damaged("one link detached behind its pin", [&] { return detachBehindPin(probeHookDir() + "probe_connect6"); });
      break;
    case Kind::ProbeAddrs:
      damaged("the IPv4 address deleted", [&] { return shOk("ip -n " + topo_.node().name() + " addr del 169.254.7.127/32 dev lo"); });
      damaged("the IPv6 address deleted", [&] {
        return shOk("ip -n " + topo_.node().name() + " addr del fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128 dev lo");
      });
      break;
    case Kind::PodAddrs: {
      ASSERT_GE(ctx().rec.addr_count, 2u) << "the pod has an IPv4 and an IPv6 address";
      damaged("one address erased", [&] { return maps().podAddrs.erase(ctx().rec.addrs[1]); });
      // Another pod's entry for an address is no damage of this pod's.
      break;
    }
    default: {  // the TC hooks
      ASSERT_TRUE(isTcHook(k));
      const Iface f = ifaceOf(k);
      if (legacy()) {
        // Only this hook's filter: the interface's other hook (if applied) stays.
        damaged("the filter deleted", [&] {
          return shOk("tc -n " + f.ns->name() + " filter del dev " + f.name + " " + tcHookName(f.hook));
        });
        // The interface's first hook (the one that made the clsact qdisc):
        // the qdisc gone with it (a later hook's would take the earlier's filter).
        if (k == Kind::TcPodIngress || k == Kind::TcLoEgress)
          damaged("the clsact qdisc deleted", [&] {
            return shOk("tc -n " + f.ns->name() + " qdisc del dev " + f.name + " clsact");
          });
      } else {
        damaged("the link detached behind its pin", [&] { return detachBehindPin(pinOf(k)); });
        damaged("the pin removed", [&] { return unpinAndWait(pinOf(k), [&] { return tcPrograms(f) == 0; }); });
      }
      EXPECT_EQ(tcPrograms(f), 1) << "mended, with one program";
    }
  }
  if (HasFatalFailure()) return;

  // ---- The steps before it are untouched, and it is in place ----
  expectPlanUpToHereInPlace();
}

INSTANTIATE_TEST_SUITE_P(Steps, PlanStepTest, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<StepCase>& info) {
                           char idx[8];
                           std::snprintf(idx, sizeof(idx), "%02zu", info.param.index);
                           return std::string(info.param.mode.name) + "_" + idx + "_" + info.param.row.label;
                         });

}  // namespace
}  // namespace sluice::test
