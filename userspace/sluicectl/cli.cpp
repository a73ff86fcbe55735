#include "userspace/sluicectl/cli.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "loader/netns.h"
#include "userspace/api/client.h"

namespace sluice::cli {

namespace {

Error usageError(const std::string& msg) { return Error::msg(msg + " (see sluicectl --help)", EINVAL); }

Result<bool> parseOnOff(const std::string& flag, const std::string& v) {
  if (v == "on") return true;
  if (v == "off") return false;
  return usageError("invalid " + flag + " '" + v + "' (expected on or off)");
}

struct Args {
  const std::vector<std::string>& v;
  size_t i = 0;
  bool done() const { return i >= v.size(); }
  const std::string& peek() const { return v[i]; }
  Result<std::string> value(const std::string& flag) {
    if (i + 1 >= v.size()) return usageError("option " + flag + " needs a value");
    i += 2;
    return v[i - 1];
  }
};

}  // namespace

std::string usage() {
  return R"(sluicectl: enroll pods into sluice's eBPF traffic redirection

usage: sluicectl [--bpffs DIR] [--socket PATH] [--capture auto|socket|tc]
                 [--tc-mode auto|tcx|legacy] [--cgroup DIR] [--log-level LEVEL] COMMAND
  pod add    --netns PATH [--id NAME] [--dns-capture on|off]
             [--inbound-capture on|off] [--reroute-iface IFNAME]...
             [--node-netns PATH] [--ip ADDR]...
             [--uid UID --pod-name NAME --pod-namespace NS [--service-account SA]]
  pod remove (--netns PATH | --id NAME)
  pod list   [--json]
  pod check  --id NAME
  stats      [--id NAME] [--json]
  status     [--json] [--cni-conf-dir DIR]
                        what this kernel supports and the paths sluice takes;
                        what Istio's node agent left on this node (its CNI
                        entry is looked for in DIR, default /etc/cni/net.d)

global options:
  --bpffs DIR       bpffs root of the pinned state (default /sys/fs/bpf/sluice)
  --socket PATH     the agent's socket (default /var/run/sluice/agent.sock):
                    when sluiced answers there for the same bpffs root, the
                    command goes through it; otherwise sluicectl acts on the
                    pinned state itself (serialized with the agent by a lock)
  --capture MODE    where pods are captured: auto (at the socket when the
                    kernel has the hooks), socket, or tc
  --tc-mode MODE    TC attach: auto (tcx when the kernel has it), tcx, or
                    legacy (clsact)
  --cgroup DIR      the cgroup v2 directory the socket mode's node hooks
                    attach at (default: the root of the cgroup v2 hierarchy)
  --log-level LVL   trace, debug, info, warn (default), error, off

PATH is a netns file (/var/run/netns/X, /proc/PID/ns/net; a relative PATH is
taken from the current directory and recorded absolute); --id defaults to
the netns file's name (pid-PID for /proc/PID/ns/net). A pod whose netns is
gone does not block its id or addresses: pod add removes it (and says so).
--node-netns names the netns of the pod's host-side interface, where probe
SNAT is attached (default: the one sluicectl runs in); --ip overrides the
pod addresses found in the pod netns.
--uid, --pod-name, --pod-namespace and --service-account give the pod's
Kubernetes identity, which an agent running with --ztunnel-socket hands to
the node proxy (it refuses a pod without a uid).
)";
}

namespace {

// One global option (before the command) and its value.
Status parseGlobalOption(Command& cmd, const std::string& flag, const std::string& v) {
  if (flag == "--bpffs") {
    if (v.empty() || v[0] != '/') return usageError("--bpffs needs an absolute path");
    cmd.bpffsRoot = v;
  } else if (flag == "--socket") {
    if (v.empty() || v[0] != '/') return usageError("--socket needs an absolute path");
    cmd.socketPath = v;
    cmd.socketGiven = true;
  } else if (flag == "--tc-mode") {
    auto m = parseTcMode(v);
    SLUICE_TRY(m);
    cmd.tcMode = *m;
  } else if (flag == "--capture") {
    auto m = parseCaptureMode(v);
    SLUICE_TRY(m);
    cmd.capture = *m;
  } else if (flag == "--cgroup") {
    if (v.empty() || v[0] != '/') return usageError("--cgroup needs an absolute path");
    cmd.cgroupPath = v;
  } else if (flag == "--log-level") {
    if (spdlog::level::from_str(v) == spdlog::level::off && v != "off")
      return usageError("invalid --log-level '" + v + "'");
    cmd.logLevel = v;
  } else {
    return usageError("unknown option " + flag);
  }
  return {};
}

}  // namespace

Result<Command> parse(const std::vector<std::string>& argv) {
  Command cmd;
  Args a{argv};
  // Global options come before the command.
  while (!a.done() && a.peek().rfind("--", 0) == 0) {
    std::string flag = a.peek();
    if (flag == "--help" || flag == "-h") {
      cmd.verb = Verb::Help;
      return cmd;
    }
    auto v = a.value(flag);
    SLUICE_TRY(v);
    SLUICE_TRY(parseGlobalOption(cmd, flag, *v));
  }
  if (a.done()) return usageError("no command given");
  std::string noun = argv[a.i++];
  std::string verb;
  if (noun == "pod") {
    if (a.done()) return usageError("pod needs a subcommand: add, remove, list or check");
    verb = argv[a.i++];
    if (verb == "add") cmd.verb = Verb::PodAdd;
    else if (verb == "remove") cmd.verb = Verb::PodRemove;
    else if (verb == "list") cmd.verb = Verb::PodList;
    else if (verb == "check") cmd.verb = Verb::PodCheck;
    else return usageError("unknown pod subcommand '" + verb + "'");
  } else if (noun == "stats") {
    cmd.verb = Verb::Stats;
  } else if (noun == "status") {
    cmd.verb = Verb::Status;
  } else if (noun == "help") {
    cmd.verb = Verb::Help;
    return cmd;
  } else {
    return usageError("unknown command '" + noun + "'");
  }

  bool haveNetns = false;
  while (!a.done()) {
    std::string flag = a.peek();
    if (flag == "--json" && (cmd.verb == Verb::PodList || cmd.verb == Verb::Stats || cmd.verb == Verb::Status)) {
      cmd.json = true;
      a.i++;
      continue;
    }
    if (flag == "--cni-conf-dir" && cmd.verb == Verb::Status) {
      auto v = a.value(flag);
      SLUICE_TRY(v);
      if (v->empty() || (*v)[0] != '/') return usageError("--cni-conf-dir needs an absolute path");
      cmd.cniConfDir = *v;
      continue;
    }
    if (flag == "--help" || flag == "-h") {
      cmd.verb = Verb::Help;
      return cmd;
    }
    bool isAdd = cmd.verb == Verb::PodAdd;
    bool known = (flag == "--netns" && (isAdd || cmd.verb == Verb::PodRemove)) ||
                 (flag == "--id" && cmd.verb != Verb::PodList && cmd.verb != Verb::Status) ||
                 (isAdd && (flag == "--dns-capture" || flag == "--inbound-capture" || flag == "--reroute-iface" ||
                            flag == "--node-netns" || flag == "--ip" || flag == "--uid" || flag == "--pod-name" ||
                            flag == "--pod-namespace" || flag == "--service-account"));
    if (!known) return usageError("unknown option " + flag + " for this command");
    auto v = a.value(flag);
    SLUICE_TRY(v);
    if (flag == "--netns") {
      if (v->empty()) return usageError("--netns needs a path");
      // Recorded for the agent's sweep, which runs elsewhere: absolute.
      cmd.pod.netnsPath = absoluteNetnsPath(*v);
      haveNetns = true;
    } else if (flag == "--id") {
      SLUICE_TRY(validatePodId(*v));
      cmd.id = *v;
      cmd.pod.id = *v;
    } else if (flag == "--dns-capture") {
      auto b = parseOnOff(flag, *v);
      SLUICE_TRY(b);
      cmd.pod.dnsCapture = *b;
    } else if (flag == "--inbound-capture") {
      auto b = parseOnOff(flag, *v);
      SLUICE_TRY(b);
      cmd.pod.inboundCapture = *b;
    } else if (flag == "--reroute-iface") {
      if (v->empty() || v->size() >= SLUICE_IFNAME_LEN) return usageError("invalid --reroute-iface '" + *v + "'");
      cmd.pod.rerouteIfaces.push_back(*v);
    } else if (flag == "--node-netns") {
      if (v->empty()) return usageError("--node-netns needs a path");
      cmd.pod.nodeNetnsPath = absoluteNetnsPath(*v);
    } else if (flag == "--ip") {
      in6_addr buf{};
      if (inet_pton(AF_INET, v->c_str(), &buf) != 1 && inet_pton(AF_INET6, v->c_str(), &buf) != 1)
        return usageError("invalid --ip '" + *v + "' (expected an IPv4 or IPv6 address)");
      cmd.pod.ips.push_back(*v);
    } else if (flag == "--uid" || flag == "--pod-name" || flag == "--pod-namespace" || flag == "--service-account") {
      if (v->empty()) return usageError(flag + " needs a value");
      auto& id = cmd.pod.identity;
      (flag == "--uid" ? id.uid : flag == "--pod-name" ? id.name : flag == "--pod-namespace" ? id.ns : id.serviceAccount) = *v;
    }
  }
  if (cmd.verb == Verb::PodAdd && !haveNetns) return usageError("pod add needs --netns PATH");
  if (cmd.verb == Verb::PodAdd) {
    const auto& id = cmd.pod.identity;
    if (!id.empty() && (id.uid.empty() || id.name.empty() || id.ns.empty()))
      return usageError("a pod's identity needs --uid, --pod-name and --pod-namespace together");
    if (Status st = validatePodIdentity(id); !st.ok()) return usageError(st.error().message);
  }
  // The node side is always on for the CLI: by default in its own netns.
  if (cmd.verb == Verb::PodAdd && !cmd.pod.nodeNetnsPath) cmd.pod.nodeNetnsPath = "";
  if (cmd.verb == Verb::PodCheck && !cmd.id) return usageError("pod check needs --id NAME");
  if (cmd.verb == Verb::PodRemove && haveNetns == cmd.id.has_value())
    return usageError("pod remove needs exactly one of --netns PATH or --id NAME");
  return cmd;
}

std::string formatCheck(const agent::CheckReport& r) {
  if (r.problems.empty()) return "pod " + r.id + ": intact\n";
  std::string s = "pod " + r.id + ": " + std::to_string(r.problems.size()) + " problem(s)\n";
  for (const auto& p : r.problems) s += "  " + p + "\n";
  return s;
}

std::string formatPodList(const std::vector<PodInfo>& pods, bool json, const NetRawByPod* netRaw,
                          const IstioRulesByPod* istioRules, const ProblemsByPod* problems) {
  auto problemsOf = [problems](const PodInfo& p) -> const std::vector<std::string>* {
    if (!problems) return nullptr;
    auto it = problems->find(p.id);
    return it == problems->end() ? nullptr : &it->second;
  };
  auto istioOf = [istioRules](const PodInfo& p) -> std::string {
    if (!istioRules) return "";
    auto it = istioRules->find(p.id);
    return it == istioRules->end() ? "?" : it->second;
  };
  auto rawOf = [netRaw](const PodInfo& p) -> const std::vector<NetRawProcess>* {
    if (!netRaw) return nullptr;
    auto it = netRaw->find(p.id);
    return it == netRaw->end() ? nullptr : &it->second;
  };
  if (json) {
    auto arr = nlohmann::json::array();
    for (const auto& p : pods) {
      auto j = agent::encodePodInfo(p);
      if (const auto* raw = rawOf(p)) {
        auto procs = nlohmann::json::array();
        for (const auto& r : *raw) procs.push_back({{"pid", r.pid}, {"comm", r.comm}});
        j["net_raw_processes"] = procs;
      }
      if (istioRules) j["istio_rules"] = istioOf(p);
      if (const auto* pr = problemsOf(p)) j["problems"] = *pr;
      arr.push_back(j);
    }
    return arr.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  // Columns as wide as their widest cell: netns paths and pod names vary.
  std::vector<std::vector<std::string>> rows = {
      {"ID", "CAPTURE", "MODE", "DNS", "INBOUND", "INTERFACES", "POD", "UID", "NETNS", "HANDOFF"}};
  if (netRaw) rows[0].push_back("NET_RAW");
  if (istioRules) rows[0].push_back("ISTIO_RULES");
  if (problems) rows[0].push_back("CHECK");
  for (const auto& p : pods) {
    std::string ifs;
    for (const auto& i : p.interfaces) ifs += (ifs.empty() ? "" : ",") + i;
    std::string handoff = handoffStateName(p.handoff);
    if (p.handoff == HandoffState::Failed) handoff += ": " + p.handoffError;
    rows.push_back({p.id, p.capture, p.capture == "socket" && p.interfaces.empty() ? "-" : p.tcMode, p.dnsCapture ? "on" : "off", p.inboundCapture ? "on" : "off", ifs,
                    p.identity.name.empty() ? "-" : p.identity.ns + "/" + p.identity.name,
                    p.identity.uid.empty() ? "-" : p.identity.uid, p.netnsPath, handoff});
    if (netRaw) {
      // Processes that could send frames past the capture without the pod
      // guard: "pid/comm,..." ("?" when /proc could not tell).
      std::string raw = "-";
      if (const auto* procs = rawOf(p)) {
        if (!procs->empty()) raw.clear();
        for (const auto& r : *procs) raw += (raw.empty() ? "" : ",") + std::to_string(r.pid) + "/" + r.comm;
      } else {
        raw = "?";
      }
      rows.back().push_back(raw);
    }
    if (istioRules) rows.back().push_back(istioOf(p));
    if (problems) {
      // "ok", or how many problems and the first (`pod check --id` lists all).
      const auto* pr = problemsOf(p);
      if (!pr) rows.back().push_back("?");
      else if (pr->empty()) rows.back().push_back("ok");
      else rows.back().push_back(std::to_string(pr->size()) + ": " + pr->front());
    }
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); c++) width[c] = std::max(width[c], r[c].size());
  std::ostringstream o;
  for (const auto& r : rows) {
    for (size_t c = 0; c + 1 < r.size(); c++) o << std::left << std::setw(static_cast<int>(width[c] + 2)) << r[c];
    o << r.back() << "\n";
  }
  return o.str();
}

std::string formatStats(const std::vector<PodCounters>& stats, bool json) {
  if (json) {
    auto arr = nlohmann::json::array();
    for (const auto& c : stats) arr.push_back(agent::encodeCounters(c));
    return arr.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  std::ostringstream o;
  o << std::left << std::setw(24) << "ID";
  const sluice_pod_stats header{};
  eachCounter(header, [&](const char* k, uint64_t) { o << std::right << std::setw(16) << k; });
  o << "\n";
  for (const auto& c : stats) {
    o << std::left << std::setw(24) << c.id;
    eachCounter(c.stats, [&](const char*, uint64_t v) { o << std::right << std::setw(16) << v; });
    o << "\n";
  }
  return o.str();
}

namespace {

struct StatusRow {
  const char* key;    // JSON key
  const char* name;   // text label
  const Feature* feature;
  const char* why;    // what sluice uses it for
};

std::vector<StatusRow> statusRows(const FeatureReport& r) {
  return {
      {"btf", "BTF", &r.btf, "CO-RE: the programs are relocated to this kernel's structs (required)"},
      {"sk_assign", "bpf_sk_assign", &r.skAssign, "hands packets to the proxy's sockets (required, Linux 5.7)"},
      {"cast_to_kern_ctx", "bpf_cast_to_kern_ctx", &r.castToKernCtx,
       "finds the pod of a packet without a helper call (Linux 6.2)"},
      {"probe_read_kernel", "bpf_probe_read_kernel", &r.probeReadKernel,
       "finds the pod where bpf_cast_to_kern_ctx is missing (needs root)"},
      {"tcx", "tcx links", &r.tcx, "pinned attachments that outlive sluicectl (Linux 6.6); else clsact + cls_bpf"},
      {"tcx_link_update", "tcx link update", &r.tcxLinkUpdate, "atomic program replacement on a tcx link"},
      {"reuseport_assign", "reuseport assignment", &r.reuseportAssign,
       "TC mode: SO_REUSEPORT proxy listeners (ztunnel's default) receive redirected traffic (Linux 6.6)"},
      {"cgroup2", "cgroup v2", &r.cgroup2, "socket mode: its node hooks attach to a cgroup v2"},
      {"socket_hooks", "socket hooks", &r.socketHooks,
       "socket mode: capture at connect() and at the socket lookup, any listener (Linux 5.17)"},
  };
}

// What --capture resolves to here, and why.
std::pair<CaptureMode, std::string> resolvedCapture(const FeatureReport& r, CaptureMode requested) {
  std::string why = socketUnavailableReason(r);
  switch (requested) {
    case CaptureMode::Auto:
      return {r.autoCapture(), why.empty() ? "auto: the kernel has the socket hooks" : "auto: " + why};
    case CaptureMode::Socket:
      return {CaptureMode::Socket, why.empty() ? "forced" : "forced, but " + why + ": pod add will fail"};
    case CaptureMode::Tc:
      return {CaptureMode::Tc, "forced"};
  }
  return {CaptureMode::Tc, ""};
}

// What --tc-mode resolves to here, and an explanation when it cannot work.
std::pair<std::string, std::string> resolvedTcMode(const FeatureReport& r, TcMode requested) {
  switch (requested) {
    case TcMode::Auto:
      return {tcModeName(r.autoTcMode()), r.tcx.present ? "auto: the kernel has tcx" : "auto: no tcx, clsact + cls_bpf"};
    case TcMode::Tcx:
      return {"tcx", r.tcx.present ? "forced" : "forced, but the kernel lacks tcx: pod add will fail"};
    case TcMode::Legacy:
      return {"legacy", "forced: clsact + cls_bpf"};
  }
  return {"?", ""};
}

}  // namespace

BpffsReport inspectBpffsForStatus(const Command& cmd, const std::optional<agent::Health>& agent) {
  BpffsReport b;
  b.root = cmd.bpffsRoot;
  b.socket = cmd.socketPath;
  b.agent = agent;
  // The root may not exist yet: its nearest existing directory tells
  // which filesystem it will be on.
  std::string at = cmd.bpffsRoot;
  while (at.size() > 1 && ::access(at.c_str(), F_OK) != 0) at = at.substr(0, std::max<size_t>(1, at.rfind('/')));
  if (!isOnBpffs(at)) {
    b.localNote = "no bpffs mounted over " + cmd.bpffsRoot + " (sluicectl and sluiced mount one at /sys/fs/bpf when they need it)";
  } else if (auto m = inspectBpffsMount(at); m.ok()) {
    b.local = *m;
  } else {
    b.localNote = m.error().message;
  }
  b.programs = inspectProgramPins(cmd.bpffsRoot);
  b.podGuard = podGuardState(cmd.bpffsRoot);
  if (auto cg = nodeHookCgroup(cmd.cgroupPath); cg.ok()) {
    b.hookCgroup = *cg;
    b.foreignAhead = foreignHooksAhead(cmd.bpffsRoot, *cg);
  }
  return b;
}

namespace {

// The neighbours line: "" when sluice's node hooks run first (or are not
// attached), else the programs ahead of them and what that means.
std::string describeNeighbours(const BpffsReport& b) {
  if (b.foreignAhead.empty()) return "";
  std::string s;
  for (const auto& f : b.foreignAhead)
    s += (s.empty() ? "" : ", ") + f.hook + ": program " + std::to_string(f.progId) +
         (f.progName.empty() ? "" : " (" + f.progName + ")");
  return s + " run(s) before sluice's at " + b.hookCgroup +
         ": an address it translates inside an enrolled pod (a service's, by a connect-time load balancer) reaches "
         "the proxy as the translated one (Cilium: socketLB.hostNamespaceOnly=true; docs/neighbours.md)";
}

}  // namespace

namespace {

std::string hexMark(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%x", v);
  return buf;
}

// "mark 0x539/0xfff alone" or "... from cgroups 12 (pid 3), ...".
std::string describeProxyIdentity(const ProxyStatus& p) {
  if (!p.pinned) return "no pinned state under this bpffs root";
  std::string s = "mark " + hexMark(p.mark) + "/" + hexMark(p.mask);
  if (!p.identity.cgroupCheck) return s + " alone (Istio's rule; no node proxy seen over ZDS)";
  if (p.identity.cgroups.empty()) return s + " from the node proxy's cgroups: none live";
  s += " only from the node proxy's cgroups:";
  for (const auto& c : p.identity.cgroups) s += " " + std::to_string(c.id) + " (pid " + std::to_string(c.pid) + ")";
  return s;
}

std::string describeZtunnel(const ProxyStatus& p) {
  if (!p.agent) return "no agent answered";
  if (p.ztunnelSocket.empty()) return "the agent hands no pod to a node proxy (no --ztunnel-socket)";
  if (!p.ztunnelWaiting.empty()) return p.ztunnelWaiting;
  return std::to_string(p.ztunnelConnections) + " connection(s) on " + p.ztunnelSocket;
}

std::string describeMount(const BpffsMount& m) {
  return "bpffs " + m.device + " at " + m.mountPoint + ", " +
         (m.outlivesNamespace ? "outlives this mount namespace" : "PRIVATE to this mount namespace") + " (" + m.why + ")";
}

std::string describeAgentBpffs(const agent::Health& h) {
  std::string s = "sluiced " + h.version + " serving " + h.bpffsRoot + ": ";
  if (h.bpffsScope == "host") return s + "its bpffs outlives its mount namespace (" + h.bpffsScopeWhy + ")";
  if (h.bpffsScope == "private")
    return s + "its bpffs is PRIVATE to its mount namespace (" + h.bpffsScopeWhy +
           "): every pod's redirection vanishes when the agent exits (it was started with --allow-private-bpffs)";
  return s + "does not report where its bpffs lives";
}

std::string describePrograms(const PinnedProgramsInfo& p) {
  if (!p.problem.empty()) return "UNREADABLE: " + p.problem;
  if (p.identity.empty()) return "none pinned (the first sluicectl or sluiced loads and pins them)";
  time_t secs = static_cast<time_t>(p.loadedAtNs / 1000000000ull);
  char when[32] = "?";
  struct tm tm {};
  if (::gmtime_r(&secs, &tm)) std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "build " + p.identity + " (" + p.cookieMethod + ", loaded " + when + "), " +
         (p.thisBuild ? "this build's: reused without loading"
                      : "another build's: this build loads and pins its own on its next pod command");
}

// What a takeover does, in its order (userspace/agent/istio_switch.h).
const char* const kTakeoverWould =
    "sluiced --istio-takeover would: wait while Istio's agent serves the ZDS socket; enroll each ambient pod it "
    "redirects with its uid (sluice's redirection first, so ztunnel keeps its proxies), then remove Istio's in-pod "
    "rules (the connmark restore once the connections opened under them closed); once Istio's agent has stopped, "
    "serve ZDS, then remove ISTIO_POSTRT and the probe sets (when every address in them is an enrolled pod's) and "
    "istio-cni from each chain that has sluice-cni";

// What Istio's node agent left on this node, and what that means here.
std::string describeIstioNode(const istio::NodeState& n) {
  if (!n.any()) {
    std::string s = "none of its node state here (no istio-cni entry, probe ipset or ISTIO_POSTRT chain)";
    if (!n.unreadable.empty() || !n.snat.unreadable.empty()) s += "; " + n.describe();
    return s;
  }
  return "ITS STATE IS HERE: " + n.describe() +
         " (Istio's agent runs this node, or ran it: pods it enrolled carry its in-pod rules; `pod list` shows "
         "them for sluice's pods). " + kTakeoverWould;
}

// "yes", "NO: a; b", or that the agent does not say (an older one).
std::string describeAgentReady(const agent::Health& h) {
  if (!h.notReady) return "not reported (an agent older than this sluicectl)";
  if (h.notReady->empty()) return "yes: sluice can enroll pods (/readyz answers 200)";
  std::string s = "NO (/readyz answers 503):";
  for (size_t i = 0; i < h.notReady->size(); i++) s += (i ? "; " : " ") + (*h.notReady)[i];
  return s;
}

std::string describeAgentKube(const agent::Health& h) {
  if (h.kubeApi.empty()) return "off: the agent enrolls every pod it is asked to";
  return h.kubeApi + (h.kubeSynced ? ", synced: the agent enrolls the pods in the ambient mesh"
                                   : ", NOT synced yet (listing pods and namespaces)");
}

}  // namespace

std::string formatStatus(const FeatureReport& r, TcMode requested, bool json, const ProxyStatus* proxy,
                         const BpffsReport* bpffs, CaptureMode capture, const istio::NodeState* istioNode) {
  Status minimum = checkMinimumFeatures(r);
  auto [mode, modeWhy] = resolvedTcMode(r, requested);
  auto [captured, captureWhy] = resolvedCapture(r, capture);
  // The socket mode hands connections to any listener; the TC mode needs
  // bpf_sk_assign of reuseport sockets.
  const bool reuseport = captured == CaptureMode::Socket || r.reuseportAssign.present;
  if (json) {
    nlohmann::json features = nlohmann::json::object();
    for (const auto& row : statusRows(r))
      features[row.key] = {{"present", row.feature->present}, {"why", row.why}, {"probe", row.feature->how}};
    nlohmann::json j = {
        {"kernel", {{"release", r.release}, {"version", r.version.str()}}},
        {"supported", minimum.ok()},
        {"error", minimum.ok() ? nlohmann::json(nullptr) : nlohmann::json(minimum.error().message)},
        {"capture",
         {{"requested", captureModeName(capture)}, {"effective", captureModeName(captured)}, {"why", captureWhy}}},
        {"tc_mode", {{"requested", tcModeName(requested)}, {"effective", mode}, {"why", modeWhy}}},
        {"pod_cookie", {{"method", podCookieMethodName(r.cookieMethod)}, {"why", r.cookieMethodHow}}},
        {"reuseport_proxies", reuseport},
        {"features", features}};
    if (proxy) {
      nlohmann::json cgroups = nlohmann::json::array();
      for (const auto& c : proxy->identity.cgroups) cgroups.push_back({{"id", c.id}, {"pid", c.pid}, {"since_ns", c.sinceNs}});
      j["node_proxy"] = {{"pinned", proxy->pinned},
                         {"mark", proxy->mark},
                         {"mark_mask", proxy->mask},
                         {"cgroup_check", proxy->identity.cgroupCheck},
                         {"cgroups", cgroups},
                         {"identity", describeProxyIdentity(*proxy)},
                         {"ztunnel", describeZtunnel(*proxy)}};
      if (proxy->agent)
        j["node_proxy"]["ztunnel_connections"] = proxy->ztunnelConnections;
    }
    if (bpffs) {
      nlohmann::json local = {{"root", bpffs->root}};
      if (bpffs->local)
        local.update({{"mount_point", bpffs->local->mountPoint},
                      {"device", bpffs->local->device},
                      {"propagation", bpffs->local->propagation},
                      {"outlives_namespace", bpffs->local->outlivesNamespace},
                      {"why", bpffs->local->why}});
      else
        local["error"] = bpffs->localNote;
      j["bpffs"] = local;
      const PinnedProgramsInfo& pp = bpffs->programs;
      j["programs"] = {{"identity", pp.identity.empty() ? nlohmann::json(nullptr) : nlohmann::json(pp.identity)},
                       {"pod_cookie", pp.cookieMethod},
                       {"loaded_at_ns", pp.loadedAtNs},
                       {"this_build", pp.thisBuild},
                       {"program_ids", pp.programIds},
                       {"problem", pp.problem.empty() ? nlohmann::json(nullptr) : nlohmann::json(pp.problem)},
                       {"describe", describePrograms(pp)}};
      nlohmann::json ahead = nlohmann::json::array();
      for (const auto& f : bpffs->foreignAhead)
        ahead.push_back({{"hook", f.hook}, {"program_id", f.progId}, {"program_name", f.progName}});
      j["neighbours"] = {{"cgroup", bpffs->hookCgroup},
                         {"ahead_of_sluice", ahead},
                         {"describe", describeNeighbours(*bpffs)}};
      j["pod_guard"] = {{"active", bpffs->podGuard.active},
                        {"why", bpffs->podGuard.why.empty() ? nlohmann::json(nullptr) : nlohmann::json(bpffs->podGuard.why)}};
      j["agent"] = nullptr;
      if (bpffs->agent)
        j["agent"] = {{"socket", bpffs->socket},
                      {"version", bpffs->agent->version},
                      {"bpffs", bpffs->agent->bpffsRoot},
                      {"bpffs_scope", bpffs->agent->bpffsScope},
                      {"bpffs_scope_why", bpffs->agent->bpffsScopeWhy},
                      {"kube_api", bpffs->agent->kubeApi},
                      {"kube_synced", bpffs->agent->kubeSynced},
                      {"istio_switch", bpffs->agent->istio},
                      {"ready", bpffs->agent->notReady ? nlohmann::json(bpffs->agent->notReady->empty())
                                                       : nlohmann::json(nullptr)},
                      {"not_ready", bpffs->agent->notReady ? nlohmann::json(*bpffs->agent->notReady)
                                                           : nlohmann::json(nullptr)}};
    }
    if (istioNode)
      j["istio_node_agent"] = {{"present", istioNode->any()},
                               {"snat", istioNode->snat.found},
                               {"probe_sets", istioNode->probeSets},
                               {"cni_entries", istioNode->cniEntries},
                               {"unreadable", istioNode->unreadable},
                               {"describe", describeIstioNode(*istioNode)}};
    return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  std::ostringstream o;
  o << "kernel             " << r.release << "\n";
  o << "supported          " << (minimum.ok() ? "yes" : "NO: " + minimum.error().message) << "\n";
  o << "capture            " << captureModeName(captured) << " (" << captureWhy << ")\n";
  o << "attach mode        " << mode << " (" << modeWhy << ")\n";
  o << "pod cookie         " << podCookieMethodName(r.cookieMethod) << " (" << r.cookieMethodHow << ")\n";
  o << "reuseport proxies  "
    << (reuseport ? "yes" : "NO: run the proxy without SO_REUSEPORT, or it receives no redirected traffic") << "\n";
  if (proxy) {
    o << "node proxy         " << describeProxyIdentity(*proxy) << "\n";
    o << "ztunnel            " << describeZtunnel(*proxy) << "\n";
  }
  if (bpffs) {
    o << "bpffs              " << bpffs->root << ": "
      << (bpffs->local ? describeMount(*bpffs->local) : bpffs->localNote) << "\n";
    o << "programs           " << describePrograms(bpffs->programs) << "\n";
    o << "pod guard          "
      << (bpffs->podGuard.active
              ? std::string("active (BPF LSM): pods' apps without CAP_NET_ADMIN get no packet or XDP socket, "
                            "and cannot bind the proxy's ports")
              : "INACTIVE: " + bpffs->podGuard.why +
                    "; apps holding CAP_NET_RAW can send frames past the proxy (README, \"Fail closed\")")
      << "\n";
    if (std::string n = describeNeighbours(*bpffs); !n.empty()) o << "neighbours         WARNING: " << n << "\n";
    o << "agent              "
      << (bpffs->agent ? describeAgentBpffs(*bpffs->agent) : "none answers at " + bpffs->socket) << "\n";
    if (bpffs->agent) o << "ready              " << describeAgentReady(*bpffs->agent) << "\n";
    if (bpffs->agent) o << "kubernetes         " << describeAgentKube(*bpffs->agent) << "\n";
    if (bpffs->agent && !bpffs->agent->istio.empty()) o << "istio switch       " << bpffs->agent->istio << "\n";
  }
  if (istioNode) o << "istio node agent   " << describeIstioNode(*istioNode) << "\n";
  o << "\nfeatures:\n";
  for (const auto& row : statusRows(r)) {
    o << "  " << std::left << std::setw(23) << row.name << std::setw(5) << (row.feature->present ? "yes" : "no")
      << row.why << "\n";
    o << "  " << std::setw(28) << "" << "probe: " << row.feature->how << "\n";
  }
  return o.str();
}

std::string formatError(const Error& e) {
  std::string msg = e.message;
  if ((e.code == EPERM || e.code == EACCES) && msg.find("missing privilege") == std::string::npos)
    msg += " (missing privilege: sluicectl must run as root with CAP_SYS_ADMIN and CAP_NET_ADMIN)";
  return "sluicectl: " + msg + "\n";
}

namespace {

// What the pod commands need, served by the agent or by the pinned state
// directly; one place turns results into output.
struct Backend {
  std::function<Result<PodInfo>(const PodSpec&)> add;
  std::function<Result<std::string>(const Command&)> remove;  ///< by --id or --netns; the id removed
  std::function<Result<std::vector<PodInfo>>()> list;
  std::function<Result<std::vector<PodCounters>>(const std::optional<std::string>&)> stats;
  std::function<Result<agent::CheckReport>(const std::string& id)> check;
};

Backend agentBackend(const Command& cmd, agent::Client& client) {
  return {
      [&cmd, &client](const PodSpec& spec) {
        PodSpec s = spec;
        if (cmd.tcMode != TcMode::Auto) s.tcMode = cmd.tcMode;
        if (cmd.capture != CaptureMode::Auto) s.capture = cmd.capture;
        return client.addPod(s);
      },
      [&client](const Command& c) -> Result<std::string> {
        if (!c.id) return client.removePodByNetns(c.pod.netnsPath);
        SLUICE_TRY(client.removePod(*c.id));
        return *c.id;
      },
      [&client] { return client.listPods(); },
      [&client](const std::optional<std::string>& id) { return client.stats(id); },
      [&client](const std::string& id) { return client.check(id); },
  };
}

Backend directBackend(Datapath& dp) {
  return {
      [&dp](const PodSpec& spec) { return dp.addPod(spec); },
      [&dp](const Command& c) -> Result<std::string> {
        std::string id;
        if (c.id) {
          id = *c.id;
        } else {
          auto found = dp.podIdForNetns(c.pod.netnsPath);
          SLUICE_TRY(found);
          id = *found;
        }
        SLUICE_TRY(dp.removePod(id));
        return id;
      },
      [&dp]() -> Result<std::vector<PodInfo>> { return dp.listPods(); },
      [&dp](const std::optional<std::string>& id) { return dp.stats(id); },
      [&dp](const std::string& id) -> Result<agent::CheckReport> {
        auto c = dp.checkPod(id);
        SLUICE_TRY(c);
        agent::CheckReport r;
        r.id = c->id;
        r.problems = c->problems;
        if (c->gone) r.problems.insert(r.problems.begin(), "its netns is gone");
        r.intact = r.problems.empty();
        return r;
      },
  };
}

int execute(const Command& cmd, const Backend& b, std::ostream& out, std::ostream& err) {
  auto fail = [&err](const Error& e) {
    err << formatError(e);
    return 1;
  };
  switch (cmd.verb) {
    case Verb::PodAdd: {
      auto info = b.add(cmd.pod);
      if (!info.ok()) return fail(info.error());
      out << "pod " << info->id << " enrolled (" << (info->capture == "socket" ? "socket" : info->tcMode) << ")\n";
      return 0;
    }
    case Verb::PodRemove: {
      auto id = b.remove(cmd);
      if (!id.ok()) return fail(id.error());
      out << "pod " << *id << " removed\n";
      return 0;
    }
    case Verb::PodList: {
      auto pods = b.list();
      if (!pods.ok()) return fail(pods.error());
      NetRawByPod netRaw;
      IstioRulesByPod istioRules;
      ProblemsByPod problems;
      for (const auto& p : *pods) {
        auto ino = netnsInodeOf(p.netnsPath);
        auto procs = ino.ok() ? netRawProcesses(*ino) : Result<std::vector<NetRawProcess>>(ino.error());
        if (procs.ok()) netRaw[p.id] = std::move(*procs);
        if (auto c = b.check(p.id); c.ok()) problems[p.id] = c->problems;
        // Istio's own redirection still in the pod: both at once.
        if (auto ns = openNetns(p.netnsPath); ns.ok()) {
          Status read = runInNetns(ns->get(), [&]() -> Status {
            auto rules = istio::readPodRules();
            istioRules[p.id] = rules.ok() ? rules->describe() : "cannot tell: " + rules.error().message;
            return {};
          });
          if (!read.ok()) istioRules[p.id] = "cannot tell: " + read.error().message;
        }
      }
      out << formatPodList(*pods, cmd.json, &netRaw, &istioRules, &problems);
      return 0;
    }
    case Verb::PodCheck: {
      auto r = b.check(*cmd.id);
      if (!r.ok()) return fail(r.error());
      out << formatCheck(*r);
      return r->problems.empty() ? 0 : 1;
    }
    case Verb::Stats: {
      auto stats = b.stats(cmd.id);
      if (!stats.ok()) return fail(stats.error());
      out << formatStats(*stats, cmd.json);
      return 0;
    }
    case Verb::Help:
    case Verb::Status:  // handled in run(): it needs neither the agent nor pinned state
      break;
  }
  return 0;
}

}  // namespace

int run(const Command& cmd, std::ostream& out, std::ostream& err) {
  if (cmd.verb == Verb::Help) {
    out << usage();
    return 0;
  }
  auto fail = [&err](const Error& e) {
    err << formatError(e);
    return 1;
  };
  // Validate what needs no kernel before touching any state.
  if (cmd.verb == Verb::PodAdd) {
    std::string id = cmd.pod.id.empty() ? defaultPodId(cmd.pod.netnsPath) : cmd.pod.id;
    if (Status st = validatePodId(id); !st.ok()) return fail(st.error());
  }
  if (cmd.verb == Verb::Status) {
    // Probing needs no pinned state: no bpffs root, no lock.
    auto features = probeKernelFeatures();
    if (!features.ok()) return fail(features.error());
    ProxyStatus proxy;
    auto pinned = readPinnedProxyIdentity(cmd.bpffsRoot, proxy.mark, proxy.mask);
    if (pinned.ok() && *pinned) {
      proxy.pinned = true;
      proxy.identity = **pinned;
    }
    std::optional<agent::Health> health;
    if (auto client = agent::Client::connect(cmd.socketPath, std::chrono::seconds(2)); client.ok())
      if (auto h = client->health(); h.ok()) health = *h;
    if (health && health->bpffsRoot == cmd.bpffsRoot) {
      proxy.agent = true;
      proxy.ztunnelSocket = health->ztunnelSocket;
      proxy.ztunnelConnections = health->ztunnelConnections;
      proxy.ztunnelWaiting = health->ztunnelWaiting;
    }
    BpffsReport bpffs = inspectBpffsForStatus(cmd, health);
    const istio::NodeState istioNode = istio::readNodeState(cmd.cniConfDir);
    out << formatStatus(*features, cmd.tcMode, cmd.json, &proxy, &bpffs, cmd.capture, &istioNode);
    Status minimum = checkMinimumFeatures(*features);
    return minimum.ok() ? 0 : fail(minimum.error());
  }
  // The agent, when one serves this bpffs root.
  auto client = agent::Client::connect(cmd.socketPath);
  if (client.ok()) {
    auto h = client->health();
    if (h.ok() && h->bpffsRoot == cmd.bpffsRoot) return execute(cmd, agentBackend(cmd, *client), out, err);
    if (!h.ok()) return fail(h.error());
    spdlog::debug("the agent at {} serves {}, not {}; working directly", cmd.socketPath, h->bpffsRoot, cmd.bpffsRoot);
  } else if (cmd.socketGiven && !agent::noAgent(client.error())) {
    return fail(client.error());
  } else {
    spdlog::debug("no agent at {} ({}); working directly", cmd.socketPath, client.error().message);
  }
  DatapathOptions opts;
  opts.bpffsRoot = cmd.bpffsRoot;
  opts.tcMode = cmd.tcMode;
  opts.capture = cmd.capture;
  opts.cgroupPath = cmd.cgroupPath;
  opts.adoptPinnedSettings = true;  // the agent's (say its probe addresses), not the defaults
  auto dp = Datapath::open(opts);
  if (!dp.ok()) return fail(dp.error());
  return execute(cmd, directBackend(**dp), out, err);
}

int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto cmd = parse(args);
  if (!cmd.ok()) {
    err << "sluicectl: " << cmd.error().message << "\n";
    return 2;
  }
  // Logs go to stderr so that stdout stays machine-readable (--json).
  auto logger = spdlog::get("sluicectl");
  if (!logger) logger = spdlog::stderr_logger_mt("sluicectl");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("sluicectl: %l: %v");
  spdlog::set_level(spdlog::level::from_str(cmd->logLevel));
  return run(*cmd, out, err);
}

}  // namespace sluice::cli
