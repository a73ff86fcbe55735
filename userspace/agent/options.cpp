#include "userspace/agent/options.h"

#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "enroll/settings.h"
#include "userspace/api/logging.h"

namespace sluice::agent {

std::string daemonUsage() {
  return std::string(R"(sluiced: sluice's node agent (eBPF traffic redirection for ambient pods)

usage: sluiced [--bpffs DIR] [--socket PATH] [--metrics-address HOST:PORT]
               [--log-format text|json] [--log-level LEVEL]
               [--capture auto|socket|tc] [--tc-mode auto|tcx|legacy]
               [--cgroup DIR] [--pod-guard on|off] [--reconcile-interval SECONDS]
               [--ztunnel-socket PATH [--ztunnel-socket-takeover]] [--ztunnel-timeout-ms MS]
               [--istio-takeover | --istio-hand-back]
               [--allow-private-bpffs] [--cni-conf-dir DIR [--cni-agent-socket PATH]
                 [--cni-conf-name NAME] [--cni-owned-conflist] [--cni-owned-conflist-name NAME]
                 [--cni-unchained]]
               [--max-connections N] [--request-deadline-ms MS] [--wedged-after-ms MS]
               [--remove-node-taint [--node-taint-key KEY]]
               [--daemonset NAME [--daemonset-namespace NS] --cni-bin-dir DIR]
               [--host-probe-snat-ip IPV4] [--host-probe-snat-ipv6 IPV6]
               [Kubernetes flags, below]

  --bpffs DIR              bpffs root of the pinned state (default /sys/fs/bpf/sluice)
  --socket PATH            API socket, root only (default /var/run/sluice/agent.sock)
  --metrics-address A:P    Prometheus /metrics (default 127.0.0.1:9464; "off": none)
  --log-format FMT         text (default) or json, on stderr
  --log-level LVL          trace, debug, info (default), warn, error, off
  --capture MODE           where new pods are captured: auto (at the socket
                           when the kernel has the hooks), socket, or tc
  --tc-mode MODE           TC attach mode for new pods: auto (tcx when the
                           kernel has it), tcx, or legacy (clsact + cls_bpf)
  --cgroup DIR             the cgroup v2 directory the socket mode's node hooks
                           attach at (default: the cgroup v2 root: every process)
  --pod-guard on|off       the pod guard (BPF LSM: an enrolled pod's apps without
                           CAP_NET_ADMIN get no packet or XDP socket and cannot
                           bind the proxy's ports; default on where the kernel
                           runs it, see `sluicectl status`)
  --reconcile-interval S   seconds between sweeps (default 30; 0: start-up only)
  --ztunnel-socket PATH    hand every enrolled pod to the node proxy (ztunnel)
                           over ZDS on this unix socket (ztunnel's INPOD_UDS,
                           e.g. /var/run/ztunnel/ztunnel.sock); pods then need
                           a uid, and an enrollment fails (retryably) while no
                           ztunnel is connected. Default: no hand-off
  --ztunnel-socket-takeover
                           when another node agent (Istio's, or another
                           sluiced) serves that socket, wait until it stops
                           and then serve it (ztunnel reconnects by itself);
                           without it the agent refuses to start then
  --istio-takeover         take this node over from Istio's node agent, live
                           (needs Kubernetes and --ztunnel-socket; implies
                           --ztunnel-socket-takeover): enroll the pods it
                           redirects, then remove its in-pod rules, then its
                           node state (deploy/README.md)
  --istio-hand-back        give this node back to Istio's node agent once it
                           runs again: each pod carrying its rules loses
                           sluice's redirection (not its return path); no ZDS,
                           no Kubernetes enrollment, sluice-cni leaves the chain
  --ztunnel-timeout-ms MS  ZDS deadlines: hello, request write, ack read, idle
                           check interval (default 5000)
  --allow-private-bpffs    start even when the bpffs is private to the agent's
                           mount namespace (every pin, and every pod's
                           redirection, then goes with it); refused otherwise
  --cni-conf-dir DIR       watch this CNI config dir (inotify) and put sluice-cni
                           back into the primary conflist whenever the primary
                           CNI rewrites it without it (default: no watch)
  --cni-agent-socket PATH  the agentSocket written into that entry: this
                           socket as the host's runtime sees it (default: --socket)
  --cni-conf-name NAME, --cni-owned-conflist, --cni-owned-conflist-name NAME,
  --cni-unchained          where that entry lives, as `sluice-cni install` was
                           told (see sluice-cni --help): the agent keeps the
                           owned conflist in step with its primary (and removes
                           it when the primary is gone), the standalone config
                           as written
  --max-connections N      connections served at once per listener (API,
                           metrics; default 32); more are refused at once
  --request-deadline-ms MS a whole request must arrive within this (default
                           10000); also how long an idle connection is kept
  --wedged-after-ms MS     /healthz fails when the datapath lock is held this
                           long or a sweep is this late (default 10000)
  --remove-node-taint      once ready (/readyz), remove the taint --node-taint-key
                           from this node (a JSON patch on the Node; needs
                           Kubernetes and RBAC get/patch on nodes), for clusters
                           without istiod's untaint controller (default: off)
  --node-taint-key KEY     the taint --remove-node-taint removes (default
                           cni.istio.io/not-ready, Istio's)
  --daemonset NAME         this agent's DaemonSet: on SIGTERM the agent asks the
                           API whether it still exists; gone (404) or being
                           deleted: sluice-cni leaves the chain of --cni-conf-dir
                           and the binary --cni-bin-dir/sluice-cni goes (and the
                           pinned state when no pod is enrolled); still there (an
                           update) or the API unreachable: nothing changes.
                           Needs Kubernetes, --cni-conf-dir and --cni-bin-dir
  --daemonset-namespace NS its namespace (default $POD_NAMESPACE)
  --cni-bin-dir DIR        the CNI bin dir sluice-cni was copied to (--daemonset)
  --host-probe-snat-ip A   the source of the node's probes to its pods, which
                           the pods let past the proxy (default 169.254.7.127;
                           $HOST_PROBE_SNAT_IP, Istio's name, when not given).
                           Pods enrolled under another address must be removed
                           first: the agent refuses to start otherwise
  --host-probe-snat-ipv6 A the same for IPv6 (default fd16:9254:7127:1337:ffff:
                           ffff:ffff:ffff; $HOST_PROBE_SNAT_IPV6)
  --version                print the version

)") + kubeUsage() + R"(
On start the agent loads its programs, switches every enrolled pod's hooks
to them in place, removes pods whose netns is gone and repairs damaged ones.
SIGTERM/SIGINT stop it; the data plane stays in place while it is down
(with --daemonset, unless its DaemonSet is gone: then it uninstalls).
The API is documented in docs/agent-api.md.
)";
}

Result<DaemonArgs> parseDaemonArgs(const std::vector<std::string>& args, const EnvLookup& env) {
  DaemonArgs d;
  bool cniModeSet = false;
  bool nodeTaintKeyGiven = false;
  std::optional<std::string> probeV4, probeV6;  // --host-probe-snat-ip[v6]
  auto usageError = [](const std::string& m) { return Error::msg(m + " (see sluiced --help)", EINVAL); };
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& flag = args[i];
    if (flag == "--help" || flag == "-h") {
      d.help = true;
      return d;
    }
    if (flag == "--version") {
      d.version = true;
      return d;
    }
    if (isKubeFlag(flag)) {
      if (i + 1 >= args.size()) return usageError("option " + flag + " needs a value");
      if (Status st = applyKubeFlag(d.agent.kube, flag, args[++i]); !st.ok()) return usageError(st.error().message);
      continue;
    }
    if (flag == "--allow-private-bpffs") {
      d.agent.allowPrivateBpffs = true;
      continue;
    }
    if (bool takesValue = false; cni::isConfModeFlag(flag, takesValue)) {
      if (takesValue && i + 1 >= args.size()) return usageError("option " + flag + " needs a value");
      std::string v = takesValue ? args[++i] : "";
      if (Status st = cni::applyConfModeFlag(d.agent.cniMode, flag, v); !st.ok()) return usageError(st.error().message);
      cniModeSet = true;
      continue;
    }
    if (flag == "--remove-node-taint") {
      d.agent.removeNodeTaint = true;
      continue;
    }
    if (flag == "--ztunnel-socket-takeover") {
      d.agent.ztunnelTakeover = true;
      continue;
    }
    if (flag == "--istio-takeover" || flag == "--istio-hand-back") {
      auto mode = flag == "--istio-takeover" ? IstioSwitchMode::Takeover : IstioSwitchMode::HandBack;
      if (d.agent.istioSwitch != IstioSwitchMode::Off && d.agent.istioSwitch != mode)
        return usageError("--istio-takeover and --istio-hand-back contradict each other");
      d.agent.istioSwitch = mode;
      continue;
    }
    static const char* withValue[] = {"--bpffs", "--socket", "--metrics-address", "--log-format", "--log-level",
                                      "--tc-mode", "--capture", "--cgroup", "--pod-guard", "--reconcile-interval",
                                      "--ztunnel-socket", "--ztunnel-timeout-ms", "--cni-conf-dir",
                                      "--cni-agent-socket", "--max-connections", "--request-deadline-ms",
                                      "--wedged-after-ms", "--node-taint-key", "--daemonset",
                                      "--daemonset-namespace", "--cni-bin-dir", "--host-probe-snat-ip",
                                      "--host-probe-snat-ipv6"};
    if (std::none_of(std::begin(withValue), std::end(withValue), [&](const char* f) { return flag == f; }))
      return usageError("unknown option '" + flag + "'");
    if (i + 1 >= args.size()) return usageError("option " + flag + " needs a value");
    const std::string& v = args[++i];
    if (flag == "--bpffs") {
      if (v.empty() || v[0] != '/') return usageError("--bpffs needs an absolute path");
      d.agent.datapath.bpffsRoot = v;
    } else if (flag == "--socket") {
      if (v.empty() || v[0] != '/') return usageError("--socket needs an absolute path");
      d.agent.socketPath = v;
    } else if (flag == "--metrics-address") {
      if (v == "off") {
        d.agent.metricsAddress.clear();
      } else {
        auto hp = parseHostPort(v);
        if (!hp.ok()) return usageError("--metrics-address: " + hp.error().message);
        d.agent.metricsAddress = v;
      }
    } else if (flag == "--log-format") {
      if (Status st = validateLogOptions(v, "info"); !st.ok()) return usageError(st.error().message);
      d.logFormat = v;
    } else if (flag == "--log-level") {
      if (Status st = validateLogOptions("text", v); !st.ok()) return usageError(st.error().message);
      d.logLevel = v;
    } else if (flag == "--tc-mode") {
      auto m = parseTcMode(v);
      if (!m.ok()) return usageError(m.error().message);
      d.agent.datapath.tcMode = *m;
    } else if (flag == "--capture") {
      auto m = parseCaptureMode(v);
      if (!m.ok()) return usageError(m.error().message);
      d.agent.datapath.capture = *m;
    } else if (flag == "--cgroup") {
      if (v.empty() || v[0] != '/') return usageError("--cgroup needs an absolute path");
      d.agent.datapath.cgroupPath = v;
    } else if (flag == "--pod-guard") {
      if (v != "on" && v != "off") return usageError("--pod-guard takes on or off, not '" + v + "'");
      d.agent.datapath.podGuard = v == "on";
    } else if (flag == "--cni-conf-dir") {
      if (v.empty() || v[0] != '/') return usageError("--cni-conf-dir needs an absolute path");
      d.agent.cniConfDir = v;
    } else if (flag == "--node-taint-key") {
      // A label key: an optional DNS-subdomain prefix and '/', a name.
      const bool valid = !v.empty() && v.size() <= 317 && v.front() != '/' && v.back() != '/' &&
                         std::count(v.begin(), v.end(), '/') <= 1 &&
                         std::all_of(v.begin(), v.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '/'; });
      if (!valid) return usageError("invalid --node-taint-key '" + v + "' (expected a taint key such as cni.istio.io/not-ready)");
      d.agent.nodeTaintKey = v;
      nodeTaintKeyGiven = true;
    } else if (flag == "--daemonset" || flag == "--daemonset-namespace") {
      const bool valid = !v.empty() && v.size() <= 253 &&
                         std::all_of(v.begin(), v.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'; });
      if (!valid) return usageError("invalid " + flag + " '" + v + "' (expected a Kubernetes object name)");
      (flag == "--daemonset" ? d.agent.daemonSet : d.agent.daemonSetNamespace) = v;
    } else if (flag == "--host-probe-snat-ip" || flag == "--host-probe-snat-ipv6") {
      const bool v6 = flag == "--host-probe-snat-ipv6";
      if (Status st = validateProbeAddr(v6 ? AF_INET6 : AF_INET, v, flag); !st.ok()) return usageError(st.error().message);
      (v6 ? probeV6 : probeV4) = v;
    } else if (flag == "--cni-bin-dir") {
      if (v.empty() || v[0] != '/') return usageError("--cni-bin-dir needs an absolute path");
      d.agent.cniBinDir = v;
    } else if (flag == "--cni-agent-socket") {
      if (v.empty() || v[0] != '/') return usageError("--cni-agent-socket needs an absolute path");
      d.agent.cniAgentSocket = v;
    } else if (flag == "--reconcile-interval") {
      if (v.empty() || v.size() > 6 || !std::all_of(v.begin(), v.end(), ::isdigit))
        return usageError("invalid --reconcile-interval '" + v + "' (expected whole seconds)");
      d.agent.reconcileInterval = std::chrono::seconds(std::stoul(v));
    } else if (flag == "--ztunnel-socket") {
      if (v.empty() || v[0] != '/') return usageError("--ztunnel-socket needs an absolute path");
      if (v.size() >= 108) return usageError("--ztunnel-socket path is longer than 107 bytes");
      d.agent.ztunnelSocket = v;
    } else if (flag == "--ztunnel-timeout-ms") {
      if (v.empty() || v.size() > 6 || !std::all_of(v.begin(), v.end(), ::isdigit) || std::stoul(v) == 0)
        return usageError("invalid --ztunnel-timeout-ms '" + v + "' (expected whole milliseconds > 0)");
      d.agent.ztunnelTimeout = std::chrono::milliseconds(std::stoul(v));
    } else if (flag == "--max-connections") {
      if (v.empty() || v.size() > 5 || !std::all_of(v.begin(), v.end(), ::isdigit) || std::stoul(v) == 0)
        return usageError("invalid --max-connections '" + v + "' (expected a whole number > 0)");
      d.agent.maxConnections = std::stoul(v);
    } else if (flag == "--request-deadline-ms" || flag == "--wedged-after-ms") {
      if (v.empty() || v.size() > 7 || !std::all_of(v.begin(), v.end(), ::isdigit) || std::stoul(v) == 0)
        return usageError("invalid " + flag + " '" + v + "' (expected whole milliseconds > 0)");
      (flag == "--wedged-after-ms" ? d.agent.wedgedAfter : d.agent.requestDeadline) = std::chrono::milliseconds(std::stoul(v));
    }
  }
  if (Status st = resolveKubeOptions(d.agent.kube, env); !st.ok()) return usageError(st.error().message);
  // Istio's node agent reads the probe source from these (its chart's
  // env), so a DaemonSet taken over from it keeps its choice.
  for (auto [given, name, family, into] :
       {std::tuple{&probeV4, "HOST_PROBE_SNAT_IP", AF_INET, &d.agent.datapath.settings.probeV4},
        std::tuple{&probeV6, "HOST_PROBE_SNAT_IPV6", AF_INET6, &d.agent.datapath.settings.probeV6}}) {
    if (!*given) {
      if (auto e = env(name); e && !e->empty()) {
        if (Status st = validateProbeAddr(family, *e, std::string("$") + name); !st.ok())
          return usageError(st.error().message);
        *given = *e;
      }
    }
    if (*given) *into = **given;
  }
  if (!d.agent.cniAgentSocket.empty() && d.agent.cniConfDir.empty())
    return usageError("--cni-agent-socket needs --cni-conf-dir");
  if (cniModeSet && d.agent.cniConfDir.empty()) return usageError("--cni-conf-name, --cni-owned-conflist[-name] and "
                                                                  "--cni-unchained need --cni-conf-dir");
  if (Status st = cni::validateConfMode(d.agent.cniMode); !st.ok()) return usageError(st.error().message);
  if (nodeTaintKeyGiven && !d.agent.removeNodeTaint) return usageError("--node-taint-key needs --remove-node-taint");
  if (d.agent.removeNodeTaint && !d.agent.kube.enabled())
    return usageError("--remove-node-taint needs Kubernetes (in a pod, or --kube-api)");
  if (!d.agent.daemonSet.empty()) {
    if (!d.agent.kube.enabled()) return usageError("--daemonset needs Kubernetes (in a pod, or --kube-api)");
    if (d.agent.cniConfDir.empty() || d.agent.cniBinDir.empty())
      return usageError("--daemonset needs --cni-conf-dir and --cni-bin-dir (what an uninstall takes sluice-cni out of)");
    if (d.agent.daemonSetNamespace.empty()) d.agent.daemonSetNamespace = env("POD_NAMESPACE").value_or("");
    if (d.agent.daemonSetNamespace.empty())
      return usageError("--daemonset needs --daemonset-namespace or $POD_NAMESPACE (the downward API's metadata.namespace)");
  } else if (!d.agent.daemonSetNamespace.empty()) {
    return usageError("--daemonset-namespace needs --daemonset");
  }
  if (!d.agent.cniBinDir.empty() && d.agent.daemonSet.empty()) return usageError("--cni-bin-dir needs --daemonset");
  if (d.agent.ztunnelTakeover && d.agent.ztunnelSocket.empty())
    return usageError("--ztunnel-socket-takeover needs --ztunnel-socket");
  if (d.agent.istioSwitch == IstioSwitchMode::Takeover) {
    if (!d.agent.kube.enabled())
      return usageError("--istio-takeover needs Kubernetes (in a pod, or --kube-api): only the API names the pods "
                        "Istio enrolled and their uids");
    if (d.agent.ztunnelSocket.empty()) return usageError("--istio-takeover needs --ztunnel-socket");
    d.agent.ztunnelTakeover = true;  // Istio's agent serves the socket until it stops
  }
  return d;
}

}  // namespace sluice::agent
