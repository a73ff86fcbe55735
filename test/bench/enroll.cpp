#include "test/bench/enroll.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <thread>

#include "loader/netns.h"
#include "loader/sock_hooks.h"
#include "loader/sysctl.h"
#include "loader/tc.h"
#include "test/common/agent_process.h"
#include "test/standin/node_proxy.h"

namespace sluice::bench {

namespace {

Status ifUp(int s, const char* name) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) return Error::fromErrno(errno, std::string("SIOCGIFFLAGS ") + name);
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) return Error::fromErrno(errno, std::string("SIOCSIFFLAGS ") + name);
  return {};
}

Status ifAddr(int s, const char* name, uint32_t addr, uint32_t mask) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  auto* sin = reinterpret_cast<sockaddr_in*>(&ifr.ifr_addr);
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = htonl(addr);
  if (::ioctl(s, SIOCSIFADDR, &ifr) != 0) return Error::fromErrno(errno, "SIOCSIFADDR");
  sin->sin_addr.s_addr = htonl(mask);
  if (::ioctl(s, SIOCSIFNETMASK, &ifr) != 0) return Error::fromErrno(errno, "SIOCSIFNETMASK");
  return {};
}

template <typename F>
double timeMs(F&& f) {
  auto t0 = Clock::now();
  f();
  return toMs(Clock::now() - t0);
}

std::string sluicectl() { return sluice::test::builtBinary("sluicectl"); }

// An agent has been running before its first pod arrives: its pool of
// sk_lookup programs is full (a few ms after Datapath::open).
void waitForStubs(Datapath& dp) {
  if (const SkLookupStubPool* pool = dp.programs().skLookupStubPool()) pool->waitReady(kSkLookupStubsAhead, 5000);
}

// How the socket-mode enrollments got their sk_lookup programs.
std::string stubCounts(Datapath& dp) {
  const SkLookupStubPool* pool = dp.programs().skLookupStubPool();
  if (!pool) return "sk_lookup programs: no pool";
  auto c = pool->counts();
  return "sk_lookup programs: " + std::to_string(c.ahead) + " loaded ahead, " + std::to_string(c.inline_) +
         " at enrollment (pool of " + std::to_string(kSkLookupStubsAhead) + ")";
}

// Pods of @p list whose node side was set up (their host-side veth found in
// the node netns): what `pod list` shows whatever the node side attaches.
size_t withHostVeth(const std::vector<PodInfo>& list) {
  return static_cast<size_t>(
      std::count_if(list.begin(), list.end(), [](const PodInfo& pi) { return !pi.hostIface.empty(); }));
}

std::string hostVethCheck(size_t with, size_t of) {
  return std::to_string(with) + " of " + std::to_string(of) + " with the node side (host-side veth found)";
}

// Istio's pods carry their uid as the ipset element's comment.
std::string istioUid(int i) { return "bench-uid-" + std::to_string(i); }

}  // namespace

// ---- PodFarm ---------------------------------------------------------------------

Result<std::unique_ptr<PodFarm>> PodFarm::create(int pods) {
  std::unique_ptr<PodFarm> f(new PodFarm());
  f->node_ = uniqueNetnsName();
  for (int i = 0; i < pods; i++) f->pods_.push_back(uniqueNetnsName());
  TempDir tmp;
  std::string add = "netns add " + f->node_ + "\n";
  for (const auto& p : f->pods_) add += "netns add " + p + "\n";
  auto addFile = tmp.write("add.batch", add);
  SLUICE_TRY(addFile);
  auto r = spawnWait({"ip", "-batch", *addFile}, {}, 600s);
  if (r.exitCode != 0) return Error::msg(r.describe("ip -batch (netns add)"));
  // Veths created from inside the node netns: nothing appears in the
  // machine's own namespace.
  std::string links;
  for (int i = 0; i < pods; i++) {
    std::string v = "p" + std::to_string(i);
    links += "link add " + v + " type veth peer name eth0 netns " + f->pods_[static_cast<size_t>(i)] + "\n";
    links += "link set " + v + " up\n";
  }
  auto linkFile = tmp.write("links.batch", links);
  SLUICE_TRY(linkFile);
  r = spawnWait({"ip", "-n", f->node_, "-batch", *linkFile}, {}, 600s);
  if (r.exitCode != 0) return Error::msg(r.describe("ip -n " + f->node_ + " -batch (veths)"));
  // lo and eth0 up, an address on eth0: one thread visiting every pod.
  Status st;
  std::thread t([&] {
    for (int i = 0; i < pods && st.ok(); i++) {
      std::string path = f->path(i);
      int nsfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (nsfd < 0 || ::setns(nsfd, CLONE_NEWNET) != 0) {
        st = Error::fromErrno(errno, "enter " + path);
        if (nsfd >= 0) ::close(nsfd);
        return;
      }
      ::close(nsfd);
      int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      Status s1 = ifUp(s, "lo");
      in_addr a{};
      inet_pton(AF_INET, address(i).c_str(), &a);
      if (s1.ok()) s1 = ifAddr(s, "eth0", ntohl(a.s_addr), 0xffff0000u);
      if (s1.ok()) s1 = ifUp(s, "eth0");
      ::close(s);
      if (!s1.ok()) st = Error::msg(path + ": " + s1.error().message);
    }
  });
  t.join();
  SLUICE_TRY(st);
  return f;
}

Status PodFarm::cniChainBefore(int i) const {
  if (bare) return {};
  Status st = [&]() -> Status {
    auto ns = openNetns(path(i));
    SLUICE_TRY(ns);
    return runInNetns(ns->get(), [] { return writeSysctl("net/ipv4/conf/eth0/arp_notify", "1"); });
  }();
  if (!st.ok())
    return Error::msg("the CNI chain before pod " + std::to_string(i) + ": " + st.error().message, st.error().code);
  return {};
}

std::string PodFarm::address(int i) { return "10.222." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1); }

PodFarm::~PodFarm() {
  std::string del = "netns del " + node_ + "\n";
  for (const auto& p : pods_) del += "netns del " + p + "\n";
  TempDir tmp;
  auto f = tmp.write("del.batch", del);
  if (f.ok()) (void)spawnWait({"ip", "-force", "-batch", *f}, {}, 600s);
}

// ---- Enroll / remove ---------------------------------------------------------------

EnrollResult runEnrollBench(int pods, const std::vector<CaseKind>& kinds, const IstioRules* rules) {
  EnrollResult res;
  res.pods = pods;
  struct PathState {
    PathTimes times;
    std::unique_ptr<PodFarm> farm;
    std::unique_ptr<sluice::test::TestBpffs> bpffs;
    std::unique_ptr<Datapath> dp;
    Fd nodeNs;  ///< Istio: the farm's node netns, where its probe ipset lives
    std::vector<bool> added;
  };
  auto flavor = [](CaseKind k) { return k == CaseKind::Iptables ? IptFlavor::Nft : IptFlavor::Legacy; };
  // sluice twice per kind: the whole (node side) and its in-pod part alone.
  std::vector<std::pair<CaseKind, bool>> plan;
  for (CaseKind k : kinds) {
    if (isIptables(k)) plan.emplace_back(k, true);
    if (isSluice(k)) plan.insert(plan.end(), {{k, true}, {k, false}});
  }
  std::vector<std::unique_ptr<PathState>> paths;
  for (auto [k, nodeSide] : plan) {
    auto p = std::make_unique<PathState>();
    p->times.kind = k;
    p->times.nodeSide = nodeSide;
    p->added.assign(static_cast<size_t>(pods), false);
    auto farm = PodFarm::create(pods);
    if (!farm.ok()) {
      p->times.fail(farm.error().message);
      paths.push_back(std::move(p));
      continue;
    }
    p->farm = std::move(*farm);
    if (isIptables(k) && rules) {
      // Istio's agent creates its sets and SNAT rule once per node.
      Status st = [&]() -> Status {
        auto ns = openNetns(p->farm->nodePath());
        SLUICE_TRY(ns);
        p->nodeNs = std::move(*ns);
        return installIstioNode(p->nodeNs.get(), flavor(k), *rules);
      }();
      if (!st.ok()) {
        p->times.fail("Istio's node side: " + st.error().message);
        p->farm.reset();
      }
    }
    if (isSluice(k)) {
      p->bpffs = std::make_unique<sluice::test::TestBpffs>();
      DatapathOptions o;
      o.bpffsRoot = p->bpffs->root();
      o.tcMode = k == CaseKind::SluiceLegacy ? TcMode::Legacy : TcMode::Tcx;
      o.capture = k == CaseKind::SluiceSocket ? CaptureMode::Socket : CaptureMode::Tc;
      o.cgroupPath = socketHookCgroup();
      o.skLookupStubsAhead = kSkLookupStubsAhead;  // in process as the agent runs it
      auto dp = Datapath::open(o);
      if (!dp.ok()) {
        p->times.fail("Datapath::open: " + dp.error().message);
        p->farm.reset();
      } else {
        p->dp = std::move(*dp);
        waitForStubs(*p->dp);
      }
    } else if (!rules) {
      p->times.fail("no rule files");
      p->farm.reset();
    }
    paths.push_back(std::move(p));
  }

  // Enroll: pod 0 of every path, pod 1 of every path, ...
  for (int i = 0; i < pods && !gStop; i++) {
    for (auto& p : paths) {
      if (!p->farm) continue;
      PathTimes& t = p->times;
      if (Status before = p->farm->cniChainBefore(i); !before.ok()) {
        t.fail(before.error().message);
        continue;
      }
      if (isSluice(t.kind)) {
        PodSpec spec;
        spec.netnsPath = p->farm->path(i);
        spec.id = p->farm->name(i);
        if (t.nodeSide) spec.nodeNetnsPath = p->farm->nodePath();
        Result<PodInfo> info = Error::msg("not run");
        double ms = timeMs([&] { info = p->dp->addPod(spec); });
        if (!info.ok()) {
          t.fail("addPod " + spec.id + ": " + info.error().message);
          continue;
        }
        t.addMs.push_back(ms);
      } else {
        auto ns = openNetns(p->farm->path(i));
        if (!ns.ok()) {
          t.fail(ns.error().message);
          continue;
        }
        auto r = applyIstioRules(ns->get(), flavor(t.kind), *rules);
        if (!r.ok()) {
          t.fail(r.error().message);
          continue;
        }
        // The node part: the pod's address in the probe set, as the agent adds it.
        auto node = istioIpsetNetlink(p->nodeNs.get(), true, PodFarm::address(i), istioUid(i));
        if (!node.ok()) {
          t.fail(node.error().message);
          (void)removeIstioRules(ns->get(), flavor(t.kind), *rules);
          continue;
        }
        t.addMs.push_back((r->total() + *node) * 1000);
        t.inPodMs.push_back(r->total() * 1000);
        t.nodeMs.push_back(*node * 1000);
        t.v4Ms.push_back(r->v4 * 1000);
        t.v6Ms.push_back(r->v6 * 1000);
        t.routeMs.push_back(r->route * 1000);
      }
      p->added[static_cast<size_t>(i)] = true;
    }
  }

  // Checks that the work was really done (not timed).
  for (auto& p : paths) {
    if (!p->farm || p->times.addMs.empty()) continue;
    PathTimes& t = p->times;
    if (t.kind == CaseKind::SluiceSocket) {
      auto list = p->dp->listPods();
      size_t socket = std::count_if(list.begin(), list.end(), [](const PodInfo& pi) { return pi.capture == "socket"; });
      t.checks.push_back(std::to_string(list.size()) + " pods in the registry, " + std::to_string(socket) +
                         " captured at the socket");
      std::string pin = p->bpffs->linkDir(p->farm->name(0)) + "/sk_lookup";
      bool attached = podSkLookupAttached(pin);
      t.checks.push_back("pod 0: sk_lookup link " + pin + (attached ? " attached" : " NOT attached"));
      t.checks.push_back(stubCounts(*p->dp));
      t.verified = socket == t.addMs.size() && attached;
    } else if (isSluice(t.kind)) {
      auto list = p->dp->listPods();
      size_t withEth0 = 0;
      for (const auto& pi : list)
        if (!pi.interfaces.empty() && pi.interfaces[0] == "eth0" &&
            pi.tcMode == (t.kind == CaseKind::SluiceTcx ? std::string("tcx") : std::string("legacy")))
          withEth0++;
      t.checks.push_back(std::to_string(list.size()) + " pods in the registry, " + std::to_string(withEth0) +
                         " attached at eth0 in " + (t.kind == CaseKind::SluiceTcx ? "tcx" : "legacy") + " mode");
      t.verified = withEth0 == t.addMs.size();
      if (t.kind == CaseKind::SluiceTcx && !list.empty()) {
        std::string pin = p->bpffs->linkDir(p->farm->name(0)) + "/eth0_ingress";
        bool attached = tcxAttached(pin);
        t.checks.push_back("pod 0: tcx link " + pin + (attached ? " attached" : " NOT attached"));
        t.verified = t.verified && attached;
      }
    } else {
      auto ns = openNetns(p->farm->path(0));
      auto saved = ns.ok() ? iptablesSave(ns->get(), flavor(t.kind)) : Result<std::string>(ns.error());
      bool ok = saved.ok() && saved->find("-A ISTIO_OUTPUT") != std::string::npos &&
                saved->find("REDIRECT --to-ports 15001") != std::string::npos &&
                saved->find("lookup 100") != std::string::npos;
      t.checks.push_back(std::string("pod 0: ") + (saved.ok() ? (ok ? "ISTIO_* chains, REDIRECT to 15001 and the fwmark rule present"
                                                                      : "rules or policy route missing")
                                                               : saved.error().message));
      bool inSet = istioIpsetHas(p->nodeNs.get(), PodFarm::address(0));
      t.checks.push_back(std::string("pod 0's address ") + (inSet ? "in " : "NOT in ") + kIstioProbeSetV4 + " on the node");
      t.verified = ok && inSet;
    }
    if (isSluice(t.kind)) {
      // The node side where asked for, none where not.
      size_t host = withHostVeth(p->dp->listPods());
      t.checks.push_back(hostVethCheck(host, t.addMs.size()));
      t.verified = t.verified && host == (t.nodeSide ? t.addMs.size() : 0);
    }
  }

  // Remove, same interleaving.
  for (int i = 0; i < pods && !gStop; i++) {
    for (auto& p : paths) {
      if (!p->farm || !p->added[static_cast<size_t>(i)]) continue;
      PathTimes& t = p->times;
      if (isSluice(t.kind)) {
        Status st;
        std::string id = p->farm->name(i);
        double ms = timeMs([&] { st = p->dp->removePod(id); });
        if (!st.ok()) {
          t.fail("removePod " + id + ": " + st.error().message);
          continue;
        }
        t.removeMs.push_back(ms);
      } else {
        auto ns = openNetns(p->farm->path(i));
        if (!ns.ok()) {
          t.fail(ns.error().message);
          continue;
        }
        auto r = removeIstioRules(ns->get(), flavor(t.kind), *rules);
        if (!r.ok()) {
          t.fail(r.error().message);
          continue;
        }
        auto node = istioIpsetNetlink(p->nodeNs.get(), false, PodFarm::address(i), "");
        if (!node.ok()) {
          t.fail(node.error().message);
          continue;
        }
        t.removeMs.push_back((r->total() + *node) * 1000);
      }
      p->added[static_cast<size_t>(i)] = false;
    }
  }
  for (auto& p : paths) {
    PathTimes& t = p->times;
    if (!p->farm || t.removeMs.empty()) continue;
    if (isSluice(t.kind)) {
      size_t left = p->dp->listPods().size();
      t.checks.push_back("after removal: " + std::to_string(left) + " pods in the registry");
      t.verified = t.verified && left == 0;
    } else {
      auto ns = openNetns(p->farm->path(0));
      auto saved = ns.ok() ? iptablesSave(ns->get(), flavor(t.kind)) : Result<std::string>(ns.error());
      bool gone = saved.ok() && saved->find("ISTIO_") == std::string::npos && saved->find("lookup 100") == std::string::npos &&
                  !istioIpsetHas(p->nodeNs.get(), PodFarm::address(0));
      t.checks.push_back(std::string("after removal, pod 0: ") +
                         (gone ? "no ISTIO_* chain, no fwmark rule, not in the probe set" : "leftovers"));
      t.verified = t.verified && gone;
    }
  }
  for (auto& p : paths) {
    // Whatever is still enrolled goes before the namespaces (destructors).
    if (p->dp)
      for (int i = 0; i < pods; i++)
        if (p->added[static_cast<size_t>(i)]) (void)p->dp->removePod(p->farm->name(i));
    res.paths.push_back(p->times);
  }
  return res;
}

// ---- sluicectl -------------------------------------------------------------------

CliResult runCliBench(int pods, const IstioRules* rules) {
  CliResult res;
  auto farm = PodFarm::create(pods);
  if (!farm.ok()) {
    res.fail(farm.error().message);
    return res;
  }
  // Istio's pods, and its node side set up once (as its agent does).
  std::unique_ptr<PodFarm> istio;
  Fd istioNode;
  if (rules) {
    Status st = [&]() -> Status {
      auto f = PodFarm::create(pods);
      SLUICE_TRY(f);
      istio = std::move(*f);
      auto ns = openNetns(istio->nodePath());
      SLUICE_TRY(ns);
      istioNode = std::move(*ns);
      return installIstioNode(istioNode.get(), IptFlavor::Nft, *rules);
    }();
    if (!st.ok()) {
      res.fail("Istio's processes: " + st.error().message);
      istio.reset();
    }
  }
  sluice::test::TestBpffs bpffs;
  std::vector<bool> added(static_cast<size_t>(pods), false), istioAdded(static_cast<size_t>(pods), false);
  for (int i = 0; i < pods && !gStop; i++) {
    if (Status before = (*farm)->cniChainBefore(i); !before.ok()) {
      res.fail(before.error().message);
      continue;
    }
    // The node side as in a cluster: the host-side veth lives in the node netns.
    std::vector<std::string> argv = {sluicectl(), "--bpffs", bpffs.root()};
    if (!socketHookCgroup().empty()) argv.insert(argv.end(), {"--cgroup", socketHookCgroup()});
    argv.insert(argv.end(), {"pod", "add", "--netns", (*farm)->path(i), "--node-netns", (*farm)->nodePath()});
    auto r = spawnWait(argv);
    if (r.exitCode != 0) {
      res.fail(r.describe("sluicectl pod add"));
    } else {
      added[static_cast<size_t>(i)] = true;
      // The first loads and pins the programs (a fresh root); the rest reuse them.
      if (i == 0)
        res.firstAddMs = r.seconds * 1000;
      else
        res.addMs.push_back(r.seconds * 1000);
      res.addMaxRssKb = std::max(res.addMaxRssKb, r.maxRssKb);
    }
    if (!istio) continue;
    if (Status before = istio->cniChainBefore(i); !before.ok()) {
      res.fail(before.error().message);
      continue;
    }
    auto ns = openNetns(istio->path(i));
    auto in = ns.ok() ? applyIstioRules(ns->get(), IptFlavor::Nft, *rules) : Result<IptTiming>(ns.error());
    if (!in.ok()) {
      res.fail("Istio's processes: " + in.error().message);
      continue;
    }
    auto node = istioIpsetProcess(istioNode.get(), true, PodFarm::address(i), istioUid(i));
    if (!node.ok()) {
      res.fail("Istio's processes: " + node.error().message);
      (void)removeIstioRules(ns->get(), IptFlavor::Nft, *rules);
      continue;
    }
    istioAdded[static_cast<size_t>(i)] = true;
    if (i == 0) continue;  // as for sluicectl: the first pod is no steady state
    res.istioInPodMs.push_back(in->total() * 1000);
    res.istioNodeMs.push_back(*node * 1000);
    res.istioAddMs.push_back((in->total() + *node) * 1000);
  }
  // The node side of every pod (whatever it attaches), as `pod list` shows it.
  auto list = spawnWait({sluicectl(), "--bpffs", bpffs.root(), "pod", "list", "--json"});
  size_t host = 0, listed = 0;
  if (list.exitCode == 0) {
    auto j = nlohmann::json::parse(list.output, nullptr, false);
    if (j.is_array())
      for (const auto& p : j) {
        listed++;
        host += p.contains("host_iface") && p["host_iface"].is_string() && !p["host_iface"].get<std::string>().empty();
      }
  }
  size_t want = static_cast<size_t>(std::count(added.begin(), added.end(), true));
  res.checks.push_back(std::to_string(listed) + " pods listed, " + hostVethCheck(host, want));
  if (host != want || listed != want) res.fail("sluicectl pod add --node-netns: " + res.checks.back());
  if (istio) {
    bool inSet = istioIpsetHas(istioNode.get(), PodFarm::address(0));
    res.checks.push_back(std::string("Istio's pod 0 ") + (inSet ? "in " : "NOT in ") + kIstioProbeSetV4);
    if (!inSet && istioAdded[0]) res.fail("ipset add: " + res.checks.back());
  }
  for (int i = 0; i < pods; i++) {
    if (added[static_cast<size_t>(i)]) {
      auto r = spawnWait({sluicectl(), "--bpffs", bpffs.root(), "pod", "remove", "--id", (*farm)->name(i)});
      if (r.exitCode != 0) {
        res.fail(r.describe("sluicectl pod remove"));
      } else {
        res.removeMs.push_back(r.seconds * 1000);
        res.removeMaxRssKb = std::max(res.removeMaxRssKb, r.maxRssKb);
      }
    }
    if (!istio || !istioAdded[static_cast<size_t>(i)]) continue;
    auto ns = openNetns(istio->path(i));
    auto out = ns.ok() ? removeIstioRules(ns->get(), IptFlavor::Nft, *rules) : Result<IptTiming>(ns.error());
    auto node = out.ok() ? istioIpsetProcess(istioNode.get(), false, PodFarm::address(i), "") : Result<double>(out.error());
    if (!node.ok()) {
      res.fail("Istio's processes, removal: " + node.error().message);
      continue;
    }
    res.istioRemoveMs.push_back((out->total() + *node) * 1000);
  }
  return res;
}

// ---- sluice-cni -> sluiced -> ZDS ack ---------------------------------------------

std::vector<HandOffResult> runHandOffBench(int pods, const std::vector<std::string>& modes) {
  using nlohmann::json;
  std::vector<HandOffResult> out;
  for (const auto& mode : modes) {
    if (gStop) break;
    HandOffResult res;
    res.mode = mode;
    auto farm = PodFarm::create(pods);
    if (!farm.ok()) {
      res.fail(farm.error().message);
      out.push_back(res);
      continue;
    }
    sluice::test::TestBpffs bpffs;
    TempDir tmp;
    std::string zds = tmp.path() + "/zds.sock", sock = tmp.path() + "/agent.sock";
    // The agent in the node netns (hostNetwork), as the DaemonSet runs it.
    std::vector<std::string> agentArgs = {"--ztunnel-socket", zds, "--log-level", "warn"};
    if (!socketHookCgroup().empty()) agentArgs.insert(agentArgs.end(), {"--cgroup", socketHookCgroup()});
    auto agent = sluice::test::AgentProcess::start(bpffs.root(), agentArgs, sock, (*farm)->nodePath());
    if (!agent.ok()) {
      res.fail(agent.error().message);
      out.push_back(res);
      continue;
    }
    NodeProxyConfig npc = sluice::test::testNodeProxyConfig(zds);
    auto proxy = NodeProxyStandIn::start(npc);
    if (!proxy.ok() || !(*proxy)->waitForEvent("snapshot", "", 10s)) {
      res.fail(proxy.ok() ? "the node proxy stand-in got no snapshot" : proxy.error().message);
      out.push_back(res);
      continue;
    }
    auto conf = [&](int i) {
      json prev = {{"cniVersion", "1.0.0"},
                   {"interfaces", {{{"name", "eth0"}, {"sandbox", (*farm)->path(i)}}}},
                   {"ips", {{{"interface", 0}, {"address", PodFarm::address(i) + "/16"}}}}};
      json c{{"cniVersion", "1.0.0"}, {"name", "bench"}, {"type", "sluice-cni"}, {"agentSocket", sock},
             {"logLevel", "warn"},     {"prevResult", prev}};
      if (mode == "socket")
        c["capture"] = "socket";
      else
        c["capture"] = "tc", c["tcMode"] = mode;
      return c.dump();
    };
    auto env = [&](const char* cmd, int i) {
      return std::vector<std::string>{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", std::string("CNI_COMMAND=") + cmd,
                                      "CNI_CONTAINERID=bench" + std::to_string(i), "CNI_NETNS=" + (*farm)->path(i),
                                      "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin",
                                      "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-" +
                                          std::to_string(i) + ";K8S_POD_UID=bench-uid-" + std::to_string(i)};
    };
    const std::string cniBin = sluice::test::builtBinary("sluice-cni");
    std::vector<bool> added(static_cast<size_t>(pods), false);
    for (int i = 0; i < pods && !gStop; i++) {
      auto in = tmp.write("conf.json", conf(i));
      if (!in.ok()) {
        res.fail(in.error().message);
        continue;
      }
      if (Status before = (*farm)->cniChainBefore(i); !before.ok()) {
        res.fail(before.error().message);
        continue;
      }
      auto r = spawnWaitEnv({cniBin}, env("ADD", i), *in);
      if (r.exitCode != 0) {
        res.fail(r.describe("sluice-cni ADD"));
        continue;
      }
      added[static_cast<size_t>(i)] = true;
      res.addMs.push_back(r.seconds * 1000);
      res.addMaxRssKb = std::max(res.addMaxRssKb, r.maxRssKb);
    }
    // What the adds did: every pod enrolled, acked and served by the proxy.
    size_t acked = 0;
    if (auto c = (*agent)->client(); c.ok())
      if (auto l = c->listPods(); l.ok())
        for (const auto& p : *l) acked += p.handoff == HandoffState::Acked;
    size_t running = (*proxy)->runningPods().size();
    res.checks.push_back(std::to_string(acked) + " pods enrolled with the hand-off acked, " + std::to_string(running) +
                         " proxied by the stand-in");
    // The agent runs in the node netns: every pod gets its node side there.
    size_t host = 0;
    if (auto c = (*agent)->client(); c.ok())
      if (auto l = c->listPods(); l.ok()) host = withHostVeth(*l);
    res.checks.push_back(hostVethCheck(host, res.addMs.size()));
    bool addsOk = acked == res.addMs.size() && running == res.addMs.size() && host == res.addMs.size();
    for (int i = 0; i < pods; i++) {
      if (!added[static_cast<size_t>(i)]) continue;
      auto in = tmp.write("conf.json", conf(i));
      auto r = spawnWaitEnv({cniBin}, env("DEL", i), in.ok() ? *in : "");
      if (r.exitCode != 0) {
        res.fail(r.describe("sluice-cni DEL"));
        continue;
      }
      res.removeMs.push_back(r.seconds * 1000);
    }
    bool drained = false;
    for (int t = 0; t < 200 && !drained; t++) {
      drained = (*proxy)->runningPods().empty();
      if (!drained) std::this_thread::sleep_for(10ms);
    }
    res.checks.push_back(std::string("after DEL: ") + (drained ? "no pod proxied" : "pods still proxied"));
    res.verified = addsOk && drained && !res.addMs.empty();
    (*proxy)->stop();
    out.push_back(res);
  }
  return out;
}

// ---- Scale -----------------------------------------------------------------------

uint64_t fdinfoMemlock(int fd) {
  std::ifstream f("/proc/self/fdinfo/" + std::to_string(fd));
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("memlock:", 0) == 0) return std::strtoull(line.c_str() + 8, nullptr, 10);
  return 0;
}

std::vector<MapMem> mapMemory(const std::string& root) {
  std::vector<MapMem> out;
  DIR* d = ::opendir(root.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string path = root + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
    int fd = bpf_obj_get(path.c_str());
    if (fd < 0) continue;
    bpf_map_info info{};
    __u32 len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0) {
      MapMem m;
      m.name = name;
      const char* t = libbpf_bpf_map_type_str(static_cast<bpf_map_type>(info.type));
      m.type = t ? t : std::to_string(info.type);
      m.maxEntries = info.max_entries;
      m.memlock = fdinfoMemlock(fd);
      out.push_back(m);
    }
    ::close(fd);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const MapMem& a, const MapMem& b) { return a.name < b.name; });
  return out;
}

ScaleResult runScaleBench(int pods, CaptureMode capture) {
  ScaleResult res;
  res.pods = pods;
  res.mode = capture == CaptureMode::Socket ? "socket" : "tcx";
  // One more pod than enrolled in process: sluicectl adds it at scale.
  auto farm = PodFarm::create(pods + 1);
  if (!farm.ok()) {
    res.fail(farm.error().message);
    return res;
  }
  sluice::test::TestBpffs bpffs;
  res.rssBeforeKb = vmRssKb();
  DatapathOptions o;
  o.bpffsRoot = bpffs.root();
  o.tcMode = TcMode::Tcx;
  o.capture = capture;
  o.cgroupPath = socketHookCgroup();
  o.skLookupStubsAhead = kSkLookupStubsAhead;
  auto dp = Datapath::open(o);
  if (!dp.ok()) {
    res.fail("Datapath::open: " + dp.error().message);
    return res;
  }
  waitForStubs(**dp);
  res.rssAfterOpenKb = vmRssKb();
  res.mapsBefore = mapMemory(bpffs.root());
  auto& prog = (*dp)->programs();
  for (int fd : {prog.egressFd(), prog.ingressFd(), prog.loEgressFd(), prog.hostEgressFd(), prog.hostIngressFd()})
    res.progMemlock += fdinfoMemlock(fd);

  std::vector<bool> added(static_cast<size_t>(pods), false);
  for (int i = 0; i < pods && !gStop; i++) {
    PodSpec spec;
    spec.netnsPath = (*farm)->path(i);
    spec.id = (*farm)->name(i);
    spec.nodeNetnsPath = (*farm)->nodePath();
    if (Status before = (*farm)->cniChainBefore(i); !before.ok()) {
      res.fail(before.error().message);
      continue;
    }
    Result<PodInfo> info = Error::msg("not run");
    double ms = timeMs([&] { info = (*dp)->addPod(spec); });
    if (!info.ok()) {
      res.fail("addPod " + spec.id + ": " + info.error().message);
      continue;
    }
    added[static_cast<size_t>(i)] = true;
    res.addMs.push_back(ms);
  }
  res.rssAfterPodsKb = vmRssKb();
  res.mapsAfter = mapMemory(bpffs.root());
  auto enrolled = (*dp)->listPods();
  size_t host = withHostVeth(enrolled);
  res.nodeSide = hostVethCheck(host, res.addMs.size());
  res.verified = enrolled.size() == res.addMs.size() && host == res.addMs.size() && res.failures == 0;
  if (capture == CaptureMode::Socket) res.stubs = stubCounts(**dp);

  // The CLI with every pod enrolled: what an operator's `sluicectl` costs.
  if (!gStop) {
    std::vector<std::string> argv = {sluicectl(), "--bpffs", bpffs.root(), "--capture", capture == CaptureMode::Socket ? "socket" : "tc"};
    if (!socketHookCgroup().empty()) argv.insert(argv.end(), {"--cgroup", socketHookCgroup()});
    argv.insert(argv.end(), {"pod", "add", "--netns", (*farm)->path(pods), "--node-netns", (*farm)->nodePath()});
    auto r = spawnWait(argv);
    if (r.exitCode != 0) res.fail(r.describe("sluicectl pod add"));
    res.cliAddMs = r.seconds * 1000;
    res.cliAddRssKb = r.maxRssKb;
    // `pod list` checks every pod (its node side too): minutes at 1000 pods.
    r = spawnWait({sluicectl(), "--bpffs", bpffs.root(), "pod", "list"}, {}, 900s);
    if (r.exitCode != 0) res.fail(r.describe("sluicectl pod list"));
    res.cliListMs = r.seconds * 1000;
    res.cliListRssKb = r.maxRssKb;
    r = spawnWait({sluicectl(), "--bpffs", bpffs.root(), "pod", "remove", "--id", (*farm)->name(pods)});
    if (r.exitCode != 0) res.fail(r.describe("sluicectl pod remove"));
    res.cliRemoveMs = r.seconds * 1000;
    res.cliRemoveRssKb = r.maxRssKb;
  }

  for (int i = 0; i < pods; i++) {
    if (!added[static_cast<size_t>(i)]) continue;
    std::string id = (*farm)->name(i);
    Status st;
    double ms = timeMs([&] { st = (*dp)->removePod(id); });
    if (!st.ok()) {
      res.fail("removePod " + id + ": " + st.error().message);
      continue;
    }
    res.removeMs.push_back(ms);
  }
  res.verified = res.verified && (*dp)->listPods().empty();
  return res;
}

}  // namespace sluice::bench
