#include "userspace/cni/cni.h"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <algorithm>
#include <iterator>
#include <sstream>

#include "base/pod_types.h"
#include "userspace/api/client.h"
#include "userspace/api/logging.h"
#include "userspace/cni/install.h"

namespace sluice::cni {

using nlohmann::ordered_json;

namespace {

Error cniError(int code, const std::string& msg) { return Error{code, msg}; }

Error badConfig(const std::string& msg) { return cniError(kCniInvalidConfig, "network configuration: " + msg); }

std::string joined(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// Reads an optional key of one JSON type into @p out; a present key of
// another type is an error naming it.
Status optBool(const ordered_json& j, const char* key, bool& out) {
  if (!j.contains(key)) return {};
  if (!j[key].is_boolean()) return badConfig(std::string("'") + key + "' must be true or false");
  out = j[key].get<bool>();
  return {};
}

Status optString(const ordered_json& j, const char* key, std::string& out) {
  if (!j.contains(key)) return {};
  if (!j[key].is_string() || j[key].get<std::string>().empty())
    return badConfig(std::string("'") + key + "' must be a non-empty string");
  out = j[key].get<std::string>();
  return {};
}

Status requiredString(const ordered_json& j, const char* key, std::string& out) {
  if (!j.contains(key)) return badConfig(std::string("'") + key + "' is missing");
  return optString(j, key, out);
}

bool versionAtLeast(const std::string& v, int major, int minor) {
  int a = 0, b = 0, c = 0;
  if (std::sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c) < 2) return false;
  return a > major || (a == major && b >= minor);
}

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::string describePod(const std::string& id, const Env& env) {
  auto args = parseCniArgs(env.args);
  std::string s = "pod " + id;
  auto ns = args.find("K8S_POD_NAMESPACE");
  auto name = args.find("K8S_POD_NAME");
  if (ns != args.end() && name != args.end())
    s += " (" + ns->second + "/" + name->second + ")";
  else if (name != args.end())  // podman passes the container's name alone
    s += " (" + name->second + ")";
  return s;
}

Result<agent::Client> connectAgent(const NetConf& conf) {
  auto c = agent::Client::connect(conf.agentSocket);
  if (c.ok()) return c;
  if (agent::noAgent(c.error()))
    return cniError(kCniTryAgainLater, "the sluice agent is not running (" + c.error().message + ")");
  return cniError(kCniIoFailure, c.error().message);
}

// Unchained (Multus), there is no prevResult: no addresses are sent and
// the agent finds them in the pod's netns, where the cluster network
// already put them (Istio's plugin sends none either; cni/pkg/plugin/plugin.go).
Result<std::vector<std::string>> addressesFor(const NetConf& conf) {
  if (!conf.prevResult) return std::vector<std::string>{};
  return podAddresses(*conf.prevResult);
}

// What ADD prints: prevResult unchanged, or (unchained) a result of no
// interfaces and no addresses, as Istio's pluginResponse.
ordered_json addResult(const NetConf& conf) {
  return conf.prevResult ? *conf.prevResult : ordered_json{{"cniVersion", conf.cniVersion}};
}

Result<PodSpec> podSpecFor(const Env& env, const NetConf& conf, const std::string& id) {
  PodSpec spec;
  // The runtime's working directory is ours, not the agent's.
  spec.netnsPath = absoluteNetnsPath(env.netns);
  spec.id = id;
  spec.dnsCapture = conf.dnsCapture;
  spec.inboundCapture = conf.inboundCapture;
  spec.rerouteIfaces = conf.rerouteIfaces;
  spec.tcMode = conf.tcMode;
  spec.capture = conf.capture;
  // nodeNetnsPath stays unset: the agent looks the host-side veth up in its
  // own netns, which is the node's (hostNetwork DaemonSet).
  auto ips = addressesFor(conf);
  SLUICE_TRY(ips);
  spec.ips = *ips;
  // The pod's identity, as containerd and CRI-O pass it (unknown keys such
  // as IgnoreUnknown or K8S_POD_INFRA_CONTAINER_ID are tolerated).
  auto args = parseCniArgs(env.args);
  auto arg = [&](const char* key) {
    auto it = args.find(key);
    return it == args.end() ? std::string() : it->second;
  };
  spec.identity.uid = arg("K8S_POD_UID");
  spec.identity.name = arg("K8S_POD_NAME");
  spec.identity.ns = arg("K8S_POD_NAMESPACE");
  if (Status st = validatePodIdentity(spec.identity); !st.ok())
    return cniError(kCniInvalidEnvironment, "CNI_ARGS: " + st.error().message);
  return spec;
}

Status requireEnv(const std::string& value, const char* name, const std::string& command) {
  if (value.empty()) return cniError(kCniInvalidEnvironment, std::string(name) + " is not set (required for " + command + ")");
  return {};
}

Status requireNetns(const Env& env) {
  SLUICE_TRY(requireEnv(env.netns, "CNI_NETNS", env.command));
  if (!pathExists(env.netns))
    return cniError(kCniUnknownContainer, "network namespace " + env.netns + " does not exist");
  return {};
}

// The agent is not running: only a pod in the mesh must wait for it. The
// others (excluded namespaces without asking anyone, the rest by asking
// the Kubernetes API) pass through, as Istio's plugin lets them.
Status addWithoutAgent(const Env& env, const NetConf& conf, const std::string& id, const PodSpec& spec,
                       const std::string& agentDown, std::string& said) {
  const std::string pod = describePod(id, env);
  if (spec.identity.ns.empty() || spec.identity.name.empty())
    return cniError(kCniTryAgainLater, agentDown + "; " + pod + " not started (fail closed)");
  auto answer = judgeWithoutAgent({spec.identity.ns, spec.identity.name, spec.identity.uid}, conf.mesh);
  if (!answer.ok())
    return cniError(kCniTryAgainLater, agentDown + " and the Kubernetes API cannot tell whether " + pod +
                                           " is in the mesh (" + answer.error().message + "); not started (fail closed)");
  if (answer->inMesh)
    return cniError(kCniTryAgainLater, pod + " is in the ambient mesh (" + answer->reason + ") and " + agentDown +
                                           "; not started until the agent enrolls it (fail closed)");
  said = pod + " is not in the mesh (" + answer->reason + "); passed through without the agent (" + agentDown + ")";
  spdlog::info("{}", said);
  return {};
}

Status cmdAdd(const Env& env, const NetConf& conf, const std::string& id, std::string& said) {
  SLUICE_TRY(requireEnv(env.ifname, "CNI_IFNAME", "ADD"));
  SLUICE_TRY(requireNetns(env));
  if (!conf.prevResult && conf.chained)
    return badConfig(
        "prevResult is missing: sluice-cni is a chained plugin and must follow the main plugin in a .conflist "
        "(a standalone config for Multus says \"chained\": false)");
  auto spec = podSpecFor(env, conf, id);
  SLUICE_TRY(spec);
  auto client = connectAgent(conf);
  if (!client.ok()) {
    if (client.error().code == kCniTryAgainLater)
      return addWithoutAgent(env, conf, id, *spec, client.error().message, said);
    return cniError(client.error().code, client.error().message + "; " + describePod(id, env) + " not started (fail closed)");
  }
  auto added = client->add(*spec);
  if (!added.ok()) {
    // EAGAIN: the agent could not hand the pod to the node proxy (none
    // connected, no answer in time, or it refused the pod) and rolled the
    // enrollment back, or could not ask the Kubernetes API whether the pod
    // is in the mesh; the runtime retries the sandbox.
    int code = added.error().code == EAGAIN ? kCniTryAgainLater : kCniAgentFailed;
    return cniError(code, "sluice agent could not enroll " + describePod(id, env) + ": " + added.error().message);
  }
  if (!added->enrolled) {
    // The agent decided from Kubernetes that the pod is not in the ambient
    // mesh: nothing in the pod was touched, prevResult goes on unchanged.
    said = fmt::format("{} is not in the mesh ({}); passed through", describePod(id, env), added->reason);
    spdlog::info("{}", said);
    return {};
  }
  const PodInfo& info = added->pod;
  said = fmt::format("enrolled {} (netns {}, {}, addresses {}{}{})", describePod(id, env), env.netns,
                     info.capture == "socket" ? "captured at the socket" : "interfaces " + joined(info.interfaces, ","),
                     joined(info.ips, ","), added->reason.empty() ? "" : "; ", added->reason);
  spdlog::info("{}", said);
  return {};
}

Status cmdDel(const Env& env, const NetConf& conf, const std::string& id, std::string& said) {
  auto client = connectAgent(conf);
  if (!client.ok()) {
    // No agent to ask, whatever the reason (not running, uninstalled, a
    // socket that refuses us): failing DEL would leave the pod Terminating;
    // the agent removes pods whose netns is gone when it starts.
    spdlog::warn("{}; {} left for the agent's reconciliation", client.error().message, describePod(id, env));
    return {};
  }
  auto st = client->removePod(id);
  if (!st.ok()) {
    if (st.error().code == ENOENT) {
      // Enrolled under another id: a running pod the agent's Kubernetes
      // controller enrolled itself (its sandbox outlives an agent that
      // missed the ADD). The netns names it.
      if (!env.netns.empty() && pathExists(env.netns)) {
        auto other = client->removePodByNetns(env.netns);
        if (other.ok()) {
          said = fmt::format("removed {} (enrolled as {})", describePod(id, env), *other);
          spdlog::info("{}", said);
          return {};
        }
        if (other.error().code != ENOENT)
          return cniError(kCniAgentFailed,
                          "sluice agent could not remove " + describePod(id, env) + ": " + other.error().message);
      }
      said = fmt::format("{} was not enrolled; nothing to remove", describePod(id, env));
      spdlog::info("{}", said);
      return {};
    }
    return cniError(kCniAgentFailed, "sluice agent could not remove " + describePod(id, env) + ": " + st.error().message);
  }
  said = fmt::format("removed {}", describePod(id, env));
  spdlog::info("{}", said);
  return {};
}

// On damage, @p details gets the problems alone (the error's "details").
Status cmdCheck(const Env& env, const NetConf& conf, const std::string& id, std::string& details, std::string& said) {
  if (!versionAtLeast(conf.cniVersion, 0, 4))
    return cniError(kCniIncompatibleVersion, "CHECK needs cniVersion 0.4.0 or later, the configuration has " + conf.cniVersion);
  SLUICE_TRY(requireEnv(env.ifname, "CNI_IFNAME", "CHECK"));
  SLUICE_TRY(requireNetns(env));
  auto client = connectAgent(conf);
  SLUICE_TRY(client);
  auto report = client->check(id);
  if (!report.ok()) {
    if (report.error().code == ENOENT)
      return cniError(kCniNotEnrolled, describePod(id, env) + " is not enrolled in sluice");
    return cniError(kCniAgentFailed, "sluice agent could not check " + describePod(id, env) + ": " + report.error().message);
  }
  if (!report->intact) {
    details = joined(report->problems, "; ");
    return cniError(kCniDamaged, describePod(id, env) + " is enrolled but its redirection is damaged: " + details);
  }
  said = describePod(id, env) + " is enrolled and intact";
  return {};
}

// One line per command into the agent's log (Istio's plugin sends its log
// to its agent too: istio/istio cni/pkg/plugin/cnieventclient.go), when the
// agent can be reached; nothing is waited for otherwise.
void tellAgent(const NetConf& conf, const Env& env, const std::string& id, const std::string& outcome) {
  auto c = agent::Client::connect(conf.agentSocket);
  if (!c.ok()) return;
  std::string line = env.command + " " + describePod(id, env) + ": " + outcome;
  std::replace_if(line.begin(), line.end(), [](char ch) { return ch == '\n' || ch == '\r'; }, ' ');
  if (line.size() > agent::kMaxLogMessage) line.resize(agent::kMaxLogMessage);
  if (Status st = c->log(line); !st.ok()) spdlog::debug("the agent did not take the log line: {}", st.error().message);
}

ordered_json versionJson(const std::string& cniVersion) {
  return ordered_json{{"cniVersion", cniVersion}, {"supportedVersions", supportedVersions()}};
}

Outcome failure(const Error& e, const std::string& cniVersion, const std::string& details = "") {
  spdlog::error("{}", e.message);
  return Outcome{1, errorJson(e, cniVersion, details).dump() + "\n"};
}

bool isSupported(const std::string& v) {
  for (const auto& s : supportedVersions())
    if (s == v) return true;
  return false;
}

}  // namespace

const std::vector<std::string>& supportedVersions() {
  static const std::vector<std::string> v = {"0.3.0", "0.3.1", "0.4.0", "1.0.0"};
  return v;
}

Env Env::fromEnviron() {
  auto get = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  return Env{get("CNI_COMMAND"), get("CNI_CONTAINERID"), get("CNI_NETNS"),
             get("CNI_IFNAME"),  get("CNI_ARGS"),        get("CNI_PATH")};
}

std::map<std::string, std::string> parseCniArgs(const std::string& args) {
  std::map<std::string, std::string> out;
  std::stringstream ss(args);
  std::string pair;
  while (std::getline(ss, pair, ';')) {
    auto eq = pair.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    out[pair.substr(0, eq)] = pair.substr(eq + 1);
  }
  return out;
}

Result<NetConf> parseNetConf(const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    return cniError(kCniDecodeFailure, "no network configuration on stdin");
  ordered_json j;
  try {
    j = ordered_json::parse(text);
  } catch (const ordered_json::parse_error& e) {
    // what() starts with "[json.exception.parse_error.101] ": keep the words.
    std::string what = e.what();
    what = what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2);
    return cniError(kCniDecodeFailure, "network configuration on stdin is not valid JSON: " + what);
  }
  if (!j.is_object()) return cniError(kCniDecodeFailure, "network configuration on stdin is not a JSON object");
  NetConf c;
  SLUICE_TRY(requiredString(j, "cniVersion", c.cniVersion));
  if (!isSupported(c.cniVersion))
    return cniError(kCniIncompatibleVersion, "cniVersion " + c.cniVersion + " is not supported by sluice-cni (supported: " +
                                                 joined(supportedVersions(), ", ") + ")");
  SLUICE_TRY(requiredString(j, "name", c.name));
  SLUICE_TRY(requiredString(j, "type", c.type));
  SLUICE_TRY(optString(j, "agentSocket", c.agentSocket));
  if (c.agentSocket.front() != '/') return badConfig("'agentSocket' must be an absolute path, not '" + c.agentSocket + "'");
  SLUICE_TRY(optBool(j, "dnsCapture", c.dnsCapture));
  SLUICE_TRY(optBool(j, "inboundCapture", c.inboundCapture));
  SLUICE_TRY(optBool(j, "chained", c.chained));
  if (j.contains("rerouteIfaces")) {
    const auto& r = j["rerouteIfaces"];
    if (!r.is_array()) return badConfig("'rerouteIfaces' must be an array of interface names");
    for (const auto& i : r) {
      if (!i.is_string() || i.get<std::string>().empty())
        return badConfig("'rerouteIfaces' must be an array of interface names");
      c.rerouteIfaces.push_back(i.get<std::string>());
    }
  }
  if (j.contains("tcMode")) {
    std::string mode;
    SLUICE_TRY(optString(j, "tcMode", mode));
    auto m = parseTcMode(mode);
    if (!m.ok()) return badConfig("'tcMode' must be auto, tcx or legacy, not '" + mode + "'");
    c.tcMode = *m;
  }
  if (j.contains("capture")) {
    std::string mode;
    SLUICE_TRY(optString(j, "capture", mode));
    auto m = parseCaptureMode(mode);
    if (!m.ok()) return badConfig("'capture' must be auto, tc or socket, not '" + mode + "'");
    c.capture = *m;
  }
  SLUICE_TRY(optString(j, "logLevel", c.logLevel));
  SLUICE_TRY(optString(j, "logFormat", c.logFormat));
  if (!validateLogOptions(c.logFormat, "info").ok()) return badConfig("'logFormat' must be text or json");
  if (!validateLogOptions("text", c.logLevel).ok())
    return badConfig("'logLevel' must be trace, debug, info, warn, error or off");
  SLUICE_TRY(optString(j, "logFile", c.logFile));
  if (!c.logFile.empty() && c.logFile.front() != '/')
    return badConfig("'logFile' must be an absolute path, not '" + c.logFile + "'");
  auto mesh = parseMeshConfig(j);
  if (!mesh.ok()) return badConfig(mesh.error().message);
  c.mesh = std::move(*mesh);
  if (j.contains("prevResult")) {
    if (!j["prevResult"].is_object()) return badConfig("'prevResult' must be a JSON object");
    c.prevResult = j["prevResult"];
  }
  return c;
}

std::string podIdForContainer(const std::string& containerId) {
  if (validatePodId(containerId).ok()) return containerId;
  // FNV-1a (64 bit) of the whole id keeps two ids that share the kept
  // prefix apart.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : containerId) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  std::string prefix;
  for (char ch : containerId.substr(0, 46)) {
    bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
    prefix += ok ? ch : '_';
  }
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(h));
  return prefix + "-" + hash;
}

Result<std::vector<std::string>> podAddresses(const ordered_json& prevResult) {
  std::vector<std::string> out;
  if (!prevResult.contains("ips")) return out;
  const auto& ips = prevResult["ips"];
  if (!ips.is_array()) return badConfig("prevResult 'ips' must be an array");
  const ordered_json none = ordered_json::array();
  const auto& ifaces = prevResult.contains("interfaces") ? prevResult["interfaces"] : none;
  for (size_t i = 0; i < ips.size(); i++) {
    const auto& e = ips[i];
    std::string where = "prevResult ips[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("address") || !e["address"].is_string())
      return badConfig(where + " has no 'address'");
    if (e.contains("interface")) {
      if (!e["interface"].is_number_unsigned() || !ifaces.is_array() || e["interface"].get<size_t>() >= ifaces.size())
        return badConfig(where + " names an interface that prevResult 'interfaces' does not have");
      const auto& itf = ifaces[e["interface"].get<size_t>()];
      // Host-side interfaces (the bridge, the veth's node end) carry no
      // sandbox; their addresses are not the pod's.
      if (!itf.is_object() || !itf.contains("sandbox") || !itf["sandbox"].is_string() ||
          itf["sandbox"].get<std::string>().empty())
        continue;
    }
    std::string cidr = e["address"].get<std::string>();
    std::string addr = cidr.substr(0, cidr.find('/'));
    unsigned char buf[16];
    if (::inet_pton(AF_INET, addr.c_str(), buf) != 1 && ::inet_pton(AF_INET6, addr.c_str(), buf) != 1)
      return badConfig(where + " address '" + cidr + "' is not an IP address in CIDR form");
    out.push_back(addr);
  }
  return out;
}

ordered_json errorJson(const Error& e, const std::string& cniVersion, const std::string& details) {
  ordered_json j{{"cniVersion", cniVersion.empty() ? kSpecVersion : cniVersion}, {"code", e.code}, {"msg", e.message}};
  if (!details.empty()) j["details"] = details;
  return j;
}

Outcome run(const Env& env, const std::string& stdinText) {
  // stdout carries the result: every log line goes to stderr, from the
  // first one on.
  setupLogging(kPluginType, "text", "info");
  if (env.command.empty())
    return failure(cniError(kCniInvalidEnvironment,
                            "CNI_COMMAND is not set: sluice-cni is run by the container runtime (see sluice-cni --help)"),
                   kSpecVersion);
  if (env.command == "VERSION") {
    // The input is {"cniVersion": "..."}; answer in that version when it is
    // one of ours.
    std::string v = kSpecVersion;
    auto j = ordered_json::parse(stdinText, nullptr, false);
    if (j.is_object() && j.contains("cniVersion") && j["cniVersion"].is_string() &&
        isSupported(j["cniVersion"].get<std::string>()))
      v = j["cniVersion"].get<std::string>();
    return Outcome{0, versionJson(v).dump() + "\n"};
  }
  if (env.command != "ADD" && env.command != "DEL" && env.command != "CHECK")
    return failure(cniError(kCniInvalidEnvironment,
                            "unknown CNI_COMMAND '" + env.command + "' (expected ADD, DEL, CHECK or VERSION)"),
                   kSpecVersion);

  auto conf = parseNetConf(stdinText);
  if (!conf.ok()) {
    // Answer in the config's version when it could be read at all.
    auto j = ordered_json::parse(stdinText, nullptr, false);
    std::string v = kSpecVersion;
    if (j.is_object() && j.contains("cniVersion") && j["cniVersion"].is_string() &&
        isSupported(j["cniVersion"].get<std::string>()))
      v = j["cniVersion"].get<std::string>();
    return failure(conf.error(), v);
  }
  setupLogging(kPluginType, conf->logFormat, conf->logLevel, conf->logFile);
  if (env.containerId.empty())
    return failure(cniError(kCniInvalidEnvironment, "CNI_CONTAINERID is not set (required for " + env.command + ")"),
                   conf->cniVersion);
  const std::string id = podIdForContainer(env.containerId);
  spdlog::debug("{} {}: CNI_ARGS: {}", env.command, env.containerId, env.args);

  std::string said, details;
  Status st;
  if (env.command == "ADD")
    st = cmdAdd(env, *conf, id, said);
  else if (env.command == "DEL")
    st = cmdDel(env, *conf, id, said);
  else
    st = cmdCheck(env, *conf, id, details, said);
  if (!st.ok()) {
    tellAgent(*conf, env, id, "failed (CNI code " + std::to_string(st.error().code) + "): " + st.error().message);
    return failure(st.error(), conf->cniVersion, details);
  }
  if (!said.empty()) tellAgent(*conf, env, id, said);
  if (env.command == "ADD") return Outcome{0, addResult(*conf).dump() + "\n"};
  return Outcome{0, ""};
}

std::string usage() {
  return R"(sluice-cni: chained CNI plugin that enrolls pods into sluice through sluiced

As a CNI plugin (run by the container runtime, CNI spec 1.0.0):
  CNI_COMMAND=ADD|DEL|CHECK|VERSION, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME,
  CNI_ARGS, CNI_PATH in the environment, the network configuration on stdin.
  It follows the main plugin in a .conflist (it reads prevResult), or runs
  standalone ("chained": false, for Multus).
  Configuration keys (besides cniVersion, name, type):
    agentSocket     sluiced's socket (default /var/run/sluice/agent.sock)
    chained         true|false (default true; false: no prevResult expected,
                    the agent finds the pod's addresses in its netns)
    dnsCapture      true|false (default true)
    inboundCapture  true|false (default true)
    rerouteIfaces   ["IFNAME", ...] (default [])
    capture         auto|socket|tc (default: the agent's --capture)
    tcMode          auto|tcx|legacy (default: the agent's --tc-mode)
    logLevel        trace|debug|info|warn|error|off (default info; stderr)
    logFormat       text|json (default text)
    logFile         also append the log to this file (runtimes drop the
                    stderr of a plugin that succeeded)
  When the agent cannot be reached, ADD judges the pod itself, as the agent
  would: a pod not in the mesh passes, one in the mesh fails with code 11:
    kubeconfig      the Kubernetes credentials `install` wrote (default
                    /var/run/sluice/cni-kubeconfig)
    excludeNamespaces   ["NS", ...] passed without asking (default
                    ["kube-system"])
    enablementSelectors Istio's ambient.enablementSelectors (default
                    Istio's: pod or namespace labelled
                    istio.io/dataplane-mode=ambient)

Installing into the node's CNI configuration:
  sluice-cni install --cni-conf-dir DIR --cni-bin-dir DIR [--agent-socket PATH]
                     [--binary PATH] [--wait-timeout SECONDS] [LAYOUT]
      copies this binary (or PATH) to DIR/sluice-cni and writes sluice-cni's
      entry as LAYOUT says; idempotent, atomic (temporary file + rename).
      Waits for the primary CNI's config (a line says so) for SECONDS
      (default: as long as it takes; 0: fails at once)
    [--kubeconfig PATH [--service-account-dir DIR]]
      also writes the pod's service account (token, ca.crt,
      KUBERNETES_SERVICE_HOST/PORT) as a kubeconfig at PATH (mode 0600) and
      names it in the entry, for judging pods while the agent is away
    [--exclude-namespaces NS,...] [--ambient-enablement-selector TEXT]
      the agent's rules for the entry (default $AMBIENT_ENABLEMENT_SELECTOR)
  sluice-cni uninstall --cni-conf-dir DIR --cni-bin-dir DIR [LAYOUT]
      removes the entry from every *.conflist there, deletes sluice-cni's
      own files (its owned conflist, standalone configs), then the binary
  LAYOUT (the same flags on sluiced; Istio's names in deploy/README.md):
    (none)                  append {"type":"sluice-cni",...} to the plugins
                            of the primary (lexically first) config; a
                            single-plugin .conf/.json becomes a .conflist
    --cni-conf-name NAME    chain after NAME instead of the lexically first
                            (unchained: the standalone config's name)
    --cni-owned-conflist    leave the primary's file alone: write the
                            primary's plugins then sluice-cni to a conflist of
                            sluice's own that sorts first (default name
                            )" + std::string(kDefaultOwnedConflist) + R"()
    --cni-owned-conflist-name NAME
                            that conflist's name (implies --cni-owned-conflist)
    --cni-unchained         a standalone config with sluice-cni alone (default
                            name )" + std::string(kDefaultStandaloneConf) + R"(), for Multus (OpenShift):
                            pods name it in k8s.v1.cni.cncf.io/networks

  sluice-cni --help | --version
)";
}

int main(const std::vector<std::string>& args, std::istream& in, std::ostream& out, std::ostream& err) {
  if (args.empty()) {
    Env env = Env::fromEnviron();
    // Without CNI_COMMAND nobody feeds stdin (a person at a terminal):
    // answer at once instead of waiting for input.
    std::string input;
    if (!env.command.empty()) input.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    auto o = run(env, input);
    out << o.stdoutText << std::flush;
    return o.exitCode;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    out << usage();
    return 0;
  }
  if (args[0] == "--version") {
    out << "sluice-cni " << SLUICE_VERSION << " (CNI " << joined(supportedVersions(), ", ") << ")\n";
    return 0;
  }
  if (args[0] == "install" || args[0] == "uninstall")
    return installMain(args, out, err);
  err << "sluice-cni: unknown argument '" << args[0] << "' (see sluice-cni --help)\n";
  return 2;
}

}  // namespace sluice::cni
