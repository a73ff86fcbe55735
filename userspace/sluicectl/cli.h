// sluicectl's command line: parsing (pure, unit-tested) and execution.
#pragma once

#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loader/sock_hooks.h"
#include "loader/bpffs.h"
#include "enroll/datapath.h"
#include "istio/state.h"
#include "loader/features.h"
#include "loader/pod_guard.h"
#include "base/result.h"
#include "userspace/api/protocol.h"
#include "userspace/sluicectl/net_raw.h"

namespace sluice::cli {

enum class Verb { Help, PodAdd, PodRemove, PodList, PodCheck, Stats, Status };

/// A parsed command line.
struct Command {
  Verb verb = Verb::Help;
  std::string bpffsRoot = SLUICE_DEFAULT_BPFFS_ROOT;
  TcMode tcMode = TcMode::Auto;
  CaptureMode capture = CaptureMode::Auto;
  std::string cgroupPath;  ///< --cgroup: where the socket mode's node hooks attach ("" : the cgroup v2 root)
  std::string logLevel = "warn";
  /// The agent's socket: used when an agent answers there for the same
  /// bpffs root; otherwise sluicectl works on the pinned state directly.
  std::string socketPath = "/var/run/sluice/agent.sock";
  bool socketGiven = false;  ///< --socket was on the command line
  bool json = false;
  /// status: where the node's CNI chain lives (Istio's istio-cni entry is looked for there).
  std::string cniConfDir = "/etc/cni/net.d";
  PodSpec pod;                    ///< pod add; pod remove uses netnsPath / id
  std::optional<std::string> id;  ///< pod remove, stats
};

/// Parses argv (without argv[0]). Errors are usage errors, one line each.
Result<Command> parse(const std::vector<std::string>& args);

/// The usage text printed by --help.
std::string usage();

/// Runs the command; output to out, the error line to err. Returns the
/// process exit code (0 success, 1 failure, 2 usage error).
int run(const Command& cmd, std::ostream& out, std::ostream& err);

/// parse + run; what main() calls.
int main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// The one line printed on stderr for a failure ("sluicectl: ..."); adds
/// the privilege hint for EPERM/EACCES.
std::string formatError(const Error& e);

/// Renders pods / counters (exposed for tests).
/// A pod's processes holding CAP_NET_RAW without CAP_NET_ADMIN, by pod id
/// (userspace/sluicectl/net_raw.h).
using NetRawByPod = std::map<std::string, std::vector<NetRawProcess>>;
/// With @p netRaw, a NET_RAW column (JSON: net_raw_processes): "?" for a
/// pod it has no entry for.
/// Per pod id: Istio's in-pod redirection found in its netns ("none", or
/// what is there: both redirections at once until Istio's is removed).
using IstioRulesByPod = std::map<std::string, std::string>;
/// Per pod id: what check found wrong (empty: intact), as `pod check` says it.
using ProblemsByPod = std::map<std::string, std::vector<std::string>>;
std::string formatPodList(const std::vector<PodInfo>& pods, bool json, const NetRawByPod* netRaw = nullptr,
                          const IstioRulesByPod* istioRules = nullptr, const ProblemsByPod* problems = nullptr);
/// `pod check`: "pod ID: intact", or "pod ID: N problem(s)" and one line each.
std::string formatCheck(const agent::CheckReport& r);
std::string formatStats(const std::vector<PodCounters>& stats, bool json);

/// What `sluicectl status` says about the pinned state's bpffs: whether it
/// outlives the mount namespace, as this process sees it and as the agent
/// that answers on the socket does (the agent may run in a container).
struct BpffsReport {
  std::string root;
  std::optional<BpffsMount> local;  ///< nullopt: root not on a bpffs here
  std::string localNote;            ///< why local is missing
  std::string socket;
  std::optional<agent::Health> agent;  ///< nullopt: no agent answers
  PinnedProgramsInfo programs;         ///< the programs pinned under root
  PodGuardReport podGuard;             ///< the BPF LSM guard under root (loader/pod_guard.h)
  std::string hookCgroup;              ///< where the node hooks attach (--cgroup, or the root)
  std::vector<ForeignHookAhead> foreignAhead;  ///< other programs running before them (loader/sock_hooks.h)
};

/// Fills BpffsReport for cmd's --bpffs (this process's view) and the
/// health of the agent answering on --socket (nullopt: none).
BpffsReport inspectBpffsForStatus(const Command& cmd, const std::optional<agent::Health>& agent);

/// What `sluicectl status` shows of the node proxy: how its traffic is told
/// apart (rule 5: the mark, and the proxy's cgroups once known) and its ZDS
/// connections when an agent answers.
struct ProxyStatus {
  bool pinned = false;  ///< pinned state found under the bpffs root
  uint32_t mark = 0, mask = 0;
  ProxyIdentity identity;
  bool agent = false;         ///< an agent answered for this root
  std::string ztunnelSocket;  ///< the agent's ZDS socket ("" : no hand-off)
  uint64_t ztunnelConnections = 0;
  std::string ztunnelWaiting;  ///< another node agent serves the socket: the agent waits
};

/// Renders the kernel feature report for `sluicectl status`: the kernel,
/// each feature (yes/no, why sluice needs it, how it was decided), the
/// capture and attach mode the options resolve to (@p capture is
/// --capture; shown with why), the pod-cookie method and whether SO_REUSEPORT
/// proxies can be served; with @p proxy, the node proxy's identity; with
/// @p bpffs, whether the pinned state outlives its mount namespace.
/// With @p istioNode, what Istio's node agent left on this node.
std::string formatStatus(const FeatureReport& r, TcMode requested, bool json, const ProxyStatus* proxy = nullptr,
                         const BpffsReport* bpffs = nullptr, CaptureMode capture = CaptureMode::Auto,
                         const istio::NodeState* istioNode = nullptr);

}  // namespace sluice::cli
