#include "userspace/api/protocol.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace sluice::agent {

using nlohmann::json;

namespace {

Error bad(const std::string& what) { return Error::msg("malformed request: " + what, EINVAL); }

// Typed field access with errors that name the field. A missing optional
// field leaves `out` alone.
template <typename T>
Status field(const json& obj, const char* name, T& out, bool required, const char* typeName) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) {
    if (required) return bad(std::string("'") + name + "' is missing");
    return {};
  }
  bool typeOk = false;
  if constexpr (std::is_same_v<T, bool>) typeOk = it->is_boolean();
  else if constexpr (std::is_same_v<T, std::string>) typeOk = it->is_string();
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    typeOk = it->is_array();
    if (typeOk)
      for (const auto& e : *it) typeOk = typeOk && e.is_string();
  } else if constexpr (std::is_integral_v<T>) typeOk = it->is_number_unsigned() || (it->is_number_integer() && it->template get<int64_t>() >= 0);
  if (!typeOk) return bad(std::string("'") + name + "' must be " + typeName);
  out = it->template get<T>();
  return {};
}

Status str(const json& o, const char* n, std::string& out, bool req = false) { return field(o, n, out, req, "a string"); }
Status flag(const json& o, const char* n, bool& out) { return field(o, n, out, false, "true or false"); }
Status strs(const json& o, const char* n, std::vector<std::string>& out) {
  return field(o, n, out, false, "an array of strings");
}
template <typename T>
Status num(const json& o, const char* n, T& out) {
  return field(o, n, out, false, "a non-negative integer");
}

Status requireObject(const json& j, const std::string& what) {
  if (!j.is_object()) return bad(what + " must be a JSON object");
  return {};
}

const std::pair<int, const char*> kErrnoNames[] = {
    {EPERM, "EPERM"},   {ENOENT, "ENOENT"},         {ESRCH, "ESRCH"},     {EIO, "EIO"},
    {E2BIG, "E2BIG"},   {EBADF, "EBADF"},           {EAGAIN, "EAGAIN"},   {ENOMEM, "ENOMEM"},
    {EACCES, "EACCES"}, {EBUSY, "EBUSY"},           {EEXIST, "EEXIST"},   {ENODEV, "ENODEV"},
    {ENOTDIR, "ENOTDIR"}, {EINVAL, "EINVAL"},       {ENOSPC, "ENOSPC"},   {ERANGE, "ERANGE"},
    {ENOSYS, "ENOSYS"}, {EPROTO, "EPROTO"},         {EOPNOTSUPP, "EOPNOTSUPP"},
    {ETIMEDOUT, "ETIMEDOUT"}, {ECONNREFUSED, "ECONNREFUSED"}, {ESHUTDOWN, "ESHUTDOWN"},
    {EMSGSIZE, "EMSGSIZE"}, {ENOTCONN, "ENOTCONN"}, {EINTR, "EINTR"},
};

}  // namespace

const char* opName(Op op) {
  switch (op) {
    case Op::Add: return "add";
    case Op::Remove: return "remove";
    case Op::List: return "list";
    case Op::Stats: return "stats";
    case Op::Health: return "health";
    case Op::Check: return "check";
    case Op::Log: return "log";
  }
  return "?";
}

Result<Op> parseOp(const std::string& name) {
  for (Op op : {Op::Add, Op::Remove, Op::List, Op::Stats, Op::Health, Op::Check, Op::Log})
    if (name == opName(op)) return op;
  return bad("unknown op '" + name + "' (expected add, remove, list, stats, health or check)");
}

std::string errnoName(int code) {
  for (const auto& [v, n] : kErrnoNames)
    if (v == code) return n;
  return code == 0 ? "" : "EIO";
}

int errnoFromName(const std::string& name) {
  for (const auto& [v, n] : kErrnoNames)
    if (name == n) return v;
  return 0;
}

json encodePodSpec(const PodSpec& s) {
  json j = {{"netns", s.netnsPath},
            {"dnsCapture", s.dnsCapture},
            {"inboundCapture", s.inboundCapture},
            {"rerouteIfaces", s.rerouteIfaces},
            {"ips", s.ips}};
  if (!s.id.empty()) j["id"] = s.id;
  if (!s.identity.uid.empty()) j["uid"] = s.identity.uid;
  if (!s.identity.name.empty()) j["name"] = s.identity.name;
  if (!s.identity.ns.empty()) j["namespace"] = s.identity.ns;
  if (!s.identity.serviceAccount.empty()) j["serviceAccount"] = s.identity.serviceAccount;
  if (s.nodeNetnsPath) j["nodeNetns"] = *s.nodeNetnsPath;
  if (s.tcMode) j["tcMode"] = tcModeName(*s.tcMode);
  if (s.capture) j["capture"] = captureModeName(*s.capture);
  return j;
}

Result<PodSpec> decodePodSpec(const json& j) {
  SLUICE_TRY(requireObject(j, "'pod'"));
  PodSpec s;
  SLUICE_TRY(str(j, "netns", s.netnsPath, true));
  if (s.netnsPath.empty() || s.netnsPath[0] != '/') return bad("'pod.netns' must be an absolute path");
  SLUICE_TRY(str(j, "id", s.id));
  if (!s.id.empty()) SLUICE_TRY(validatePodId(s.id));
  SLUICE_TRY(flag(j, "dnsCapture", s.dnsCapture));
  SLUICE_TRY(flag(j, "inboundCapture", s.inboundCapture));
  SLUICE_TRY(strs(j, "rerouteIfaces", s.rerouteIfaces));
  SLUICE_TRY(strs(j, "ips", s.ips));
  SLUICE_TRY(str(j, "uid", s.identity.uid));
  SLUICE_TRY(str(j, "name", s.identity.name));
  SLUICE_TRY(str(j, "namespace", s.identity.ns));
  SLUICE_TRY(str(j, "serviceAccount", s.identity.serviceAccount));
  if (Status st = validatePodIdentity(s.identity); !st.ok()) return bad("'pod': " + st.error().message);
  for (const auto& ip : s.ips) {
    in6_addr buf{};
    if (inet_pton(AF_INET, ip.c_str(), &buf) != 1 && inet_pton(AF_INET6, ip.c_str(), &buf) != 1)
      return bad("invalid pod address '" + ip + "' in 'pod.ips'");
  }
  if (j.contains("nodeNetns") && !j["nodeNetns"].is_null()) {
    std::string node;
    SLUICE_TRY(str(j, "nodeNetns", node));
    if (!node.empty() && node[0] != '/') return bad("'pod.nodeNetns' must be an absolute path (or \"\": the agent's netns)");
    s.nodeNetnsPath = node;
  }
  if (j.contains("tcMode") && !j["tcMode"].is_null()) {
    std::string mode;
    SLUICE_TRY(str(j, "tcMode", mode));
    auto m = parseTcMode(mode);
    if (!m.ok()) return bad("'pod.tcMode' must be auto, tcx or legacy");
    s.tcMode = *m;
  }
  if (j.contains("capture") && !j["capture"].is_null()) {
    std::string mode;
    SLUICE_TRY(str(j, "capture", mode));
    auto m = parseCaptureMode(mode);
    if (!m.ok()) return bad("'pod.capture' must be auto, tc or socket");
    s.capture = *m;
  }
  for (const auto& k : j.items()) {
    static const char* known[] = {"netns",     "id",     "dnsCapture", "inboundCapture", "rerouteIfaces", "ips",
                                  "nodeNetns", "tcMode", "capture",    "uid",            "name",          "namespace",
                                  "serviceAccount"};
    if (std::none_of(std::begin(known), std::end(known), [&](const char* n) { return k.key() == n; }))
      return bad("unknown field 'pod." + k.key() + "'");
  }
  return s;
}

json encodeRequest(const Request& r) {
  json j = {{"version", kProtocolVersion}, {"op", opName(r.op)}};
  if (r.op == Op::Add) j["pod"] = encodePodSpec(r.pod);
  if (r.id) j["id"] = *r.id;
  if (r.netns) j["netns"] = *r.netns;
  if (r.message) j["message"] = *r.message;
  return j;
}

Result<Request> decodeRequest(const std::string& line) {
  if (line.size() > kMaxRequestBytes) return Error::msg("request larger than " + std::to_string(kMaxRequestBytes) + " bytes", EMSGSIZE);
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) return bad("not valid JSON");
  SLUICE_TRY(requireObject(j, "a request"));
  if (!j.contains("version")) return bad("'version' is missing");
  if (!j["version"].is_number_integer() || j["version"].get<int64_t>() != kProtocolVersion)
    return Error::msg("unsupported protocol version " + j["version"].dump() + " (this agent speaks version " +
                          std::to_string(kProtocolVersion) + ")",
                      EPROTO);
  std::string opText;
  SLUICE_TRY(str(j, "op", opText, true));
  Request r;
  auto op = parseOp(opText);
  SLUICE_TRY(op);
  r.op = *op;
  std::string id, netns;
  SLUICE_TRY(str(j, "id", id));
  SLUICE_TRY(str(j, "netns", netns));
  if (j.contains("id") && !j["id"].is_null()) {
    SLUICE_TRY(validatePodId(id));
    r.id = id;
  }
  if (j.contains("netns") && !j["netns"].is_null()) {
    if (netns.empty() || netns[0] != '/') return bad("'netns' must be an absolute path");
    r.netns = netns;
  }
  switch (r.op) {
    case Op::Add: {
      if (!j.contains("pod")) return bad("add needs 'pod'");
      auto spec = decodePodSpec(j["pod"]);
      SLUICE_TRY(spec);
      r.pod = *spec;
      break;
    }
    case Op::Remove:
      if (r.id.has_value() == r.netns.has_value()) return bad("remove needs exactly one of 'id' or 'netns'");
      break;
    case Op::Check:
      if (!r.id) return bad("check needs 'id'");
      break;
    case Op::Log: {
      std::string message;
      SLUICE_TRY(str(j, "message", message, true));
      if (message.empty() || message.size() > kMaxLogMessage)
        return bad("log needs a 'message' of 1 to " + std::to_string(kMaxLogMessage) + " bytes");
      if (message.find_first_of("\r\n") != std::string::npos) return bad("a log 'message' is one line");
      r.message = message;
      break;
    }
    default:
      break;
  }
  for (const auto& k : j.items()) {
    static const char* known[] = {"version", "op", "pod", "id", "netns", "message"};
    if (std::none_of(std::begin(known), std::end(known), [&](const char* n) { return k.key() == n; }))
      return bad("unknown field '" + k.key() + "'");
  }
  return r;
}

json encodePodInfo(const PodInfo& p) {
  return {{"id", p.id},
          {"netns", p.netnsPath},
          {"netns_cookie", p.netnsCookie},
          {"capture", p.capture},
          {"tc_mode", p.tcMode},
          {"dns_capture", p.dnsCapture},
          {"inbound_capture", p.inboundCapture},
          {"interfaces", p.interfaces},
          {"reroute_ifaces", p.rerouteIfaces},
          {"ipv6", p.ipv6Routes},
          {"host_iface", p.hostIface},
          {"node_netns", p.nodeNetnsPath},
          {"ips", p.ips},
          {"enrolled_at_ns", p.enrolledAtNs},
          {"uid", p.identity.uid},
          {"name", p.identity.name},
          {"namespace", p.identity.ns},
          {"service_account", p.identity.serviceAccount},
          {"handoff", handoffStateName(p.handoff)},
          {"handoff_error", p.handoffError},
          {"handoff_at_ns", p.handoffAtNs}};
}

Result<PodInfo> decodePodInfo(const json& j) {
  SLUICE_TRY(requireObject(j, "a pod"));
  PodInfo p;
  SLUICE_TRY(str(j, "id", p.id, true));
  SLUICE_TRY(str(j, "netns", p.netnsPath));
  SLUICE_TRY(num(j, "netns_cookie", p.netnsCookie));
  SLUICE_TRY(str(j, "capture", p.capture));
  SLUICE_TRY(str(j, "tc_mode", p.tcMode));
  SLUICE_TRY(flag(j, "dns_capture", p.dnsCapture));
  SLUICE_TRY(flag(j, "inbound_capture", p.inboundCapture));
  SLUICE_TRY(strs(j, "interfaces", p.interfaces));
  SLUICE_TRY(strs(j, "reroute_ifaces", p.rerouteIfaces));
  SLUICE_TRY(flag(j, "ipv6", p.ipv6Routes));
  SLUICE_TRY(str(j, "host_iface", p.hostIface));
  SLUICE_TRY(str(j, "node_netns", p.nodeNetnsPath));
  SLUICE_TRY(strs(j, "ips", p.ips));
  SLUICE_TRY(num(j, "enrolled_at_ns", p.enrolledAtNs));
  SLUICE_TRY(str(j, "uid", p.identity.uid));
  SLUICE_TRY(str(j, "name", p.identity.name));
  SLUICE_TRY(str(j, "namespace", p.identity.ns));
  SLUICE_TRY(str(j, "service_account", p.identity.serviceAccount));
  std::string handoff = handoffStateName(HandoffState::None);
  SLUICE_TRY(str(j, "handoff", handoff));
  bool known = false;
  for (HandoffState h : {HandoffState::None, HandoffState::Acked, HandoffState::Failed})
    if (handoff == handoffStateName(h)) {
      p.handoff = h;
      known = true;
    }
  if (!known) return bad("unknown hand-off state '" + handoff + "'");
  SLUICE_TRY(str(j, "handoff_error", p.handoffError));
  SLUICE_TRY(num(j, "handoff_at_ns", p.handoffAtNs));
  return p;
}

json encodeAddResult(const AddResult& r) {
  json j = r.enrolled ? encodePodInfo(r.pod) : json{{"id", r.pod.id}};
  j["enrolled"] = r.enrolled;
  if (!r.reason.empty() || !r.enrolled) j["reason"] = r.reason;
  return j;
}

Result<AddResult> decodeAddResult(const json& j) {
  SLUICE_TRY(requireObject(j, "an add result"));
  AddResult r;
  SLUICE_TRY(flag(j, "enrolled", r.enrolled));
  SLUICE_TRY(str(j, "reason", r.reason));
  auto pod = decodePodInfo(j);
  SLUICE_TRY(pod);
  r.pod = std::move(*pod);
  return r;
}

json encodeCounters(const PodCounters& c) {
  json j = {{"id", c.id}};
  eachCounter(c.stats, [&](const char* n, uint64_t v) { j[n] = v; });
  return j;
}

Result<PodCounters> decodeCounters(const json& j) {
  SLUICE_TRY(requireObject(j, "counters"));
  PodCounters c;
  SLUICE_TRY(str(j, "id", c.id, true));
  Status st;
  eachCounter(c.stats, [&](const char* n, auto& v) {
    uint64_t x = 0;
    if (st.ok()) st = num(j, n, x);
    v = x;
  });
  SLUICE_TRY(st);
  return c;
}

json encodeHealth(const Health& h) {
  return {{"version", h.version},   {"protocol", h.protocol}, {"bpffs", h.bpffsRoot},
          {"capture", h.capture},   {"tc_mode", h.tcMode},    {"pods", h.pods},         {"uptime_seconds", h.uptimeSeconds},
          {"reconciles", h.reconciles}, {"last_reconcile_error", h.lastReconcileError},
          {"ztunnel_socket", h.ztunnelSocket}, {"ztunnel_connections", h.ztunnelConnections},
          {"ztunnel_waiting", h.ztunnelWaiting},
          {"istio", h.istio},
          {"kube_api", h.kubeApi}, {"kube_synced", h.kubeSynced},
          {"bpffs_scope", h.bpffsScope}, {"bpffs_scope_why", h.bpffsScopeWhy},
          {"ready", h.notReady && h.notReady->empty()},
          {"not_ready", h.notReady ? json(*h.notReady) : json(nullptr)}};
}

Result<Health> decodeHealth(const json& j) {
  SLUICE_TRY(requireObject(j, "health"));
  Health h;
  SLUICE_TRY(str(j, "version", h.version));
  SLUICE_TRY(num(j, "protocol", h.protocol));
  SLUICE_TRY(str(j, "bpffs", h.bpffsRoot, true));
  SLUICE_TRY(str(j, "capture", h.capture));
  SLUICE_TRY(str(j, "tc_mode", h.tcMode));
  SLUICE_TRY(num(j, "pods", h.pods));
  SLUICE_TRY(num(j, "uptime_seconds", h.uptimeSeconds));
  SLUICE_TRY(num(j, "reconciles", h.reconciles));
  SLUICE_TRY(str(j, "last_reconcile_error", h.lastReconcileError));
  SLUICE_TRY(str(j, "ztunnel_socket", h.ztunnelSocket));
  SLUICE_TRY(num(j, "ztunnel_connections", h.ztunnelConnections));
  if (j.contains("ztunnel_waiting")) SLUICE_TRY(str(j, "ztunnel_waiting", h.ztunnelWaiting));  // newer agents
  if (j.contains("istio")) SLUICE_TRY(str(j, "istio", h.istio));
  SLUICE_TRY(str(j, "kube_api", h.kubeApi));
  SLUICE_TRY(flag(j, "kube_synced", h.kubeSynced));
  SLUICE_TRY(str(j, "bpffs_scope", h.bpffsScope));
  SLUICE_TRY(str(j, "bpffs_scope_why", h.bpffsScopeWhy));
  if (j.contains("not_ready") && !j["not_ready"].is_null()) {  // newer agents
    std::vector<std::string> missing;
    SLUICE_TRY(strs(j, "not_ready", missing));
    h.notReady = std::move(missing);
  }
  return h;
}

json encodeCheck(const CheckReport& c) { return {{"id", c.id}, {"intact", c.intact}, {"problems", c.problems}}; }

Result<CheckReport> decodeCheck(const json& j) {
  SLUICE_TRY(requireObject(j, "check"));
  CheckReport c;
  SLUICE_TRY(str(j, "id", c.id, true));
  SLUICE_TRY(flag(j, "intact", c.intact));
  SLUICE_TRY(strs(j, "problems", c.problems));
  return c;
}

std::string okResponse(const json& result) {
  // Text from the kernel or a client (interface names, paths) need not be
  // UTF-8; JSON must be: invalid bytes become U+FFFD instead of an exception.
  return json{{"version", kProtocolVersion}, {"ok", true}, {"result", result}}.dump(-1, ' ', false,
                                                                                   json::error_handler_t::replace) +
         "\n";
}

std::string errorResponse(const Error& e) {
  json err = {{"errno", e.code}, {"code", errnoName(e.code)}, {"message", e.message}};
  return json{{"version", kProtocolVersion}, {"ok", false}, {"error", err}}.dump(-1, ' ', false,
                                                                                 json::error_handler_t::replace) +
         "\n";
}

Result<json> decodeResponse(const std::string& line) {
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ok") || !j["ok"].is_boolean())
    return Error::msg("malformed response from the agent", EPROTO);
  if (j["ok"].get<bool>()) return j.contains("result") ? j["result"] : json();
  const json& e = j.contains("error") && j["error"].is_object() ? j["error"] : json::object();
  int code = e.contains("errno") && e["errno"].is_number_integer() ? e["errno"].get<int>() : 0;
  if (!code && e.contains("code") && e["code"].is_string()) code = errnoFromName(e["code"].get<std::string>());
  std::string msg = e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                      : "the agent reported an error without a message";
  return Error::msg(msg, code);
}

}  // namespace sluice::agent
