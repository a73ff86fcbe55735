// sluice-cni: a chained CNI plugin (CNI spec 1.0.0) that enrolls each new
// pod into sluice through the node agent (sluiced). The container runtime
// runs it after the main plugin of the node's conflist chain; it never
// touches the network itself, the agent does.
//
// Everything but main() lives here so the unit tests can drive a whole
// invocation (environment + stdin in, stdout + exit status out).
//
// In this module an Error's `code` is a CNI error code (kCni* below), not
// an errno: it is what ends up in the error JSON the runtime reads.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/tc_mode.h"
#include "userspace/cni/mesh_check.h"
#include "userspace/cni/plugin.h"

namespace sluice::cni {

/// cniVersions accepted in network configs. 0.3.x / 0.4.0 results carry the
/// same `ips` / `interfaces` that sluice-cni reads; CHECK needs 0.4.0+.
const std::vector<std::string>& supportedVersions();

/// Error codes of the CNI spec ("Error codes", 1-99 reserved) and this
/// plugin's own (100+).
enum CniCode : int {
  kCniIncompatibleVersion = 1,
  kCniUnsupportedField = 2,
  kCniUnknownContainer = 3,
  kCniInvalidEnvironment = 4,
  kCniIoFailure = 5,
  kCniDecodeFailure = 6,
  kCniInvalidConfig = 7,
  kCniTryAgainLater = 11,
  /// The agent answered, but refused or failed the request (its message).
  kCniAgentFailed = 100,
  /// CHECK: the pod is not enrolled in sluice.
  kCniNotEnrolled = 101,
  /// CHECK: the pod is enrolled but its redirection is damaged (details
  /// lists what is missing).
  kCniDamaged = 102,
};

/// The CNI_* environment of one invocation.
struct Env {
  std::string command;      ///< CNI_COMMAND
  std::string containerId;  ///< CNI_CONTAINERID
  std::string netns;        ///< CNI_NETNS
  std::string ifname;       ///< CNI_IFNAME
  std::string args;         ///< CNI_ARGS ("K=V;K=V")
  std::string path;         ///< CNI_PATH

  /// Reads the process environment.
  static Env fromEnviron();
};

/// "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=x" -> {K8S_POD_NAMESPACE: ns, ...};
/// malformed pairs (no '=') are skipped.
std::map<std::string, std::string> parseCniArgs(const std::string& args);

/// The network configuration sluice-cni gets on stdin: the standard keys,
/// sluice's own (documented in deploy/README.md), and prevResult.
struct NetConf {
  std::string cniVersion;
  std::string name;
  std::string type;
  /// The agent's unix socket.
  std::string agentSocket = "/var/run/sluice/agent.sock";
  /// PodSpec options for every pod of this network.
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> rerouteIfaces;
  std::optional<TcMode> tcMode;  ///< nullopt: the agent's --tc-mode
  std::optional<CaptureMode> capture;  ///< nullopt: the agent's --capture
  /// spdlog level of the plugin's stderr log, and its format.
  std::string logLevel = "info";
  std::string logFormat = "text";
  /// Also append the log to this file (absolute path); "" = stderr only.
  std::string logFile;
  /// false: a standalone network config (`sluice-cni install
  /// --cni-unchained`, run by Multus as an additional network): ADD gets no
  /// prevResult, the agent finds the pod's addresses in its netns.
  bool chained = true;
  /// How to judge a pod when the agent cannot be reached (kubeconfig,
  /// excludeNamespaces, enablementSelectors).
  MeshConfig mesh;
  /// The previous plugin's result, kept with its key order so ADD can
  /// return it unchanged.
  std::optional<nlohmann::ordered_json> prevResult;
};

/// Parses and validates stdin. Errors: kCniDecodeFailure (not JSON / not an
/// object), kCniInvalidConfig (a key missing or of the wrong type or value),
/// kCniIncompatibleVersion (cniVersion not supported).
Result<NetConf> parseNetConf(const std::string& text);

/// The pod id sluice-cni enrolls a container under: CNI_CONTAINERID itself
/// when it is a valid pod id (1-63 of [A-Za-z0-9._-]); otherwise (runtimes
/// use 64 hex digits) its first characters, '-', and 16 hex digits of a
/// hash of the whole id, 63 characters in all. Deterministic, so DEL finds
/// what ADD enrolled.
std::string podIdForContainer(const std::string& containerId);

/// The pod's addresses from prevResult: `ips[].address` without the
/// prefix length, only those on an interface inside the sandbox (the
/// `interfaces[]` entry has `sandbox`) when the entry names its interface.
/// Errors (kCniInvalidConfig) name a malformed entry.
Result<std::vector<std::string>> podAddresses(const nlohmann::ordered_json& prevResult);

/// The CNI error object: {"cniVersion", "code", "msg", "details"?}.
nlohmann::ordered_json errorJson(const Error& e, const std::string& cniVersion, const std::string& details = "");

/// What one invocation prints and returns.
struct Outcome {
  int exitCode = 0;
  std::string stdoutText;  ///< the result, version info or error JSON
};

/// Runs one CNI command (ADD, DEL, CHECK, VERSION) as the spec describes:
/// configuration from @p stdinText, parameters from @p env. Talks to the
/// agent named by the config's agentSocket.
Outcome run(const Env& env, const std::string& stdinText);

/// `sluice-cni --help`.
std::string usage();

/// The whole binary: `install` / `uninstall` subcommands, `--help`,
/// `--version`, or (no arguments) one CNI invocation from the environment
/// and stdin. Returns the exit status.
int main(const std::vector<std::string>& args, std::istream& in, std::ostream& out, std::ostream& err);

}  // namespace sluice::cni
