// The agent's wire format, command line and metrics rendering: pure code,
// no privileges.
#include <gtest/gtest.h>

#include "userspace/api/logging.h"
#include "userspace/agent/metrics.h"
#include "userspace/agent/options.h"
#include "userspace/api/protocol.h"
#include "userspace/sluicectl/cli.h"

namespace sluice::agent {
namespace {

using nlohmann::json;

TEST(AgentProtocol, AddRequestRoundTrips) {
  Request r;
  r.op = Op::Add;
  r.pod.netnsPath = "/var/run/netns/web-1";
  r.pod.id = "web-1";
  r.pod.dnsCapture = false;
  r.pod.rerouteIfaces = {"eth1"};
  r.pod.ips = {"10.0.0.5", "fd00::5"};
  r.pod.nodeNetnsPath = "";
  r.pod.tcMode = TcMode::Legacy;
  auto back = decodeRequest(encodeRequest(r).dump());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->op, Op::Add);
  EXPECT_EQ(back->pod.netnsPath, r.pod.netnsPath);
  EXPECT_EQ(back->pod.id, "web-1");
  EXPECT_FALSE(back->pod.dnsCapture);
  EXPECT_TRUE(back->pod.inboundCapture);
  EXPECT_EQ(back->pod.rerouteIfaces, r.pod.rerouteIfaces);
  EXPECT_EQ(back->pod.ips, r.pod.ips);
  EXPECT_EQ(back->pod.nodeNetnsPath, std::optional<std::string>(""));
  EXPECT_EQ(back->pod.tcMode, std::optional<TcMode>(TcMode::Legacy));
}

TEST(AgentProtocol, PodIdentityRoundTrips) {
  Request r;
  r.op = Op::Add;
  r.pod.netnsPath = "/var/run/netns/web-1";
  r.pod.identity = {"8b5c0d0e-4f0a-4b7e-9a51-0d5a5f1c2e3d", "web-1", "shop", "web"};
  std::string line = encodeRequest(r).dump();
  EXPECT_NE(line.find(R"("uid":"8b5c0d0e-4f0a-4b7e-9a51-0d5a5f1c2e3d")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("namespace":"shop")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("serviceAccount":"web")"), std::string::npos) << line;
  auto back = decodeRequest(line);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->pod.identity, r.pod.identity);
  // Without one, no identity fields travel (an older agent refuses unknown
  // fields).
  r.pod.identity = {};
  EXPECT_EQ(encodeRequest(r).dump().find("uid"), std::string::npos);

  PodInfo p;
  p.id = "web-1";
  p.identity = {"u1", "web-1", "shop", "web"};
  p.handoff = HandoffState::Failed;
  p.handoffError = "failure to start proxy: address in use";
  p.handoffAtNs = 42;
  auto info = decodePodInfo(encodePodInfo(p));
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->identity, p.identity);
  EXPECT_EQ(info->handoff, HandoffState::Failed);
  EXPECT_EQ(info->handoffError, p.handoffError);
  EXPECT_EQ(info->handoffAtNs, 42u);
  EXPECT_EQ(encodePodInfo(PodInfo{})["handoff"], "not handed off");
  auto bad = decodePodInfo({{"id", "a"}, {"handoff", "maybe"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "malformed request: unknown hand-off state 'maybe'");
}

TEST(AgentProtocol, OptionalFieldsStayUnset) {
  auto r = decodeRequest(R"({"version":1,"op":"add","pod":{"netns":"/proc/42/ns/net"}})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->pod.id.empty());
  EXPECT_FALSE(r->pod.nodeNetnsPath.has_value());
  EXPECT_FALSE(r->pod.tcMode.has_value());
  EXPECT_TRUE(r->pod.dnsCapture);
}

TEST(AgentProtocol, BadRequestsNameTheProblem) {
  struct Case {
    const char* line;
    int code;
    const char* msg;
  } cases[] = {
      {"", EINVAL, "malformed request: not valid JSON"},
      {"{", EINVAL, "malformed request: not valid JSON"},
      {"42", EINVAL, "malformed request: a request must be a JSON object"},
      {R"({"version":"1","op":"list"})", EPROTO, "unsupported protocol version \"1\" (this agent speaks version 1)"},
      {R"({"version":1,"op":3})", EINVAL, "malformed request: 'op' must be a string"},
      {R"({"version":1,"op":"remove","id":"a","netns":"/b"})", EINVAL,
       "malformed request: remove needs exactly one of 'id' or 'netns'"},
      {R"({"version":1,"op":"add","pod":[]})", EINVAL, "malformed request: 'pod' must be a JSON object"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","bogus":1}})", EINVAL, "malformed request: unknown field 'pod.bogus'"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","rerouteIfaces":"eth1"}})", EINVAL,
       "malformed request: 'rerouteIfaces' must be an array of strings"},
      {R"({"version":1,"op":"stats","id":""})", EINVAL, "pod id is empty"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","uid":7}})", EINVAL, "malformed request: 'uid' must be a string"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","uid":"a b"}})", EINVAL,
       "malformed request: 'pod': uid has a character that is not printable ASCII (or a space)"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","namespace":"0123456789012345678901234567890123456789012345678901234567890123"}})",
       EINVAL,
       "malformed request: 'pod': pod namespace '0123456789012345678901234567890123456789012345678901234567890123' is "
       "longer than 63 characters"},
      // Relative paths mean nothing in the agent's working directory.
      {R"({"version":1,"op":"add","pod":{"netns":"run/netns/x"}})", EINVAL,
       "malformed request: 'pod.netns' must be an absolute path"},
      {R"({"version":1,"op":"add","pod":{"netns":"/x","nodeNetns":"node"}})", EINVAL,
       "malformed request: 'pod.nodeNetns' must be an absolute path (or \"\": the agent's netns)"},
      {R"({"version":1,"op":"remove","netns":"x"})", EINVAL, "malformed request: 'netns' must be an absolute path"},
  };
  for (const auto& c : cases) {
    auto r = decodeRequest(c.line);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.error().code, c.code) << c.line;
    EXPECT_EQ(r.error().message, c.msg) << c.line;
  }
  auto big = decodeRequest(std::string(kMaxRequestBytes + 1, ' '));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, EMSGSIZE);
}

TEST(AgentProtocol, ResponsesCarryErrnoAndMessage) {
  auto ok = decodeResponse(okResponse({{"id", "x"}}));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["id"], "x");
  auto err = decodeResponse(errorResponse(Error::msg("pod 'x' is not enrolled", ENOENT)));
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.error().code, ENOENT);
  EXPECT_EQ(err.error().message, "pod 'x' is not enrolled");
  EXPECT_NE(errorResponse(Error::msg("m", EEXIST)).find(R"("code":"EEXIST")"), std::string::npos);
  auto garbage = decodeResponse("<html>");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.error().message, "malformed response from the agent");
  EXPECT_EQ(errnoFromName(errnoName(EPROTO)), EPROTO);
}

TEST(AgentProtocol, PodInfoAndCountersRoundTrip) {
  PodInfo p;
  p.id = "a";
  p.netnsPath = "/var/run/netns/a";
  p.netnsCookie = 1ull << 40;
  p.tcMode = "tcx";
  p.interfaces = {"eth0"};
  p.ips = {"10.0.0.1"};
  auto back = decodePodInfo(encodePodInfo(p));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->netnsCookie, p.netnsCookie);
  EXPECT_EQ(back->interfaces, p.interfaces);
  PodCounters c;
  c.id = "a";
  c.stats.outbound_conns = 7;
  c.stats.probe_conns = 3;
  auto cb = decodeCounters(encodeCounters(c));
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(cb->stats.outbound_conns, 7u);
  EXPECT_EQ(cb->stats.probe_conns, 3u);
  EXPECT_FALSE(decodeCounters({{"id", "a"}, {"outbound_conns", -1}}).ok());
}

TEST(AgentOptions, DefaultsAndFlags) {
  auto d = parseDaemonArgs({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->agent.socketPath, "/var/run/sluice/agent.sock");
  EXPECT_EQ(d->agent.metricsAddress, "127.0.0.1:9464");
  EXPECT_EQ(d->agent.datapath.bpffsRoot, "/sys/fs/bpf/sluice");
  auto f = parseDaemonArgs({"--bpffs", "/sys/fs/bpf/x", "--socket", "/run/s.sock", "--metrics-address", "[::1]:9000",
                            "--log-format", "json", "--log-level", "debug", "--tc-mode", "legacy",
                            "--reconcile-interval", "5"});
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->agent.metricsAddress, "[::1]:9000");
  EXPECT_EQ(f->logFormat, "json");
  EXPECT_EQ(f->agent.datapath.tcMode, TcMode::Legacy);
  EXPECT_EQ(f->agent.reconcileInterval, std::chrono::seconds(5));
  EXPECT_TRUE(f->agent.ztunnelSocket.empty()) << "no hand-off unless asked for";
  auto z = parseDaemonArgs({"--ztunnel-socket", "/var/run/ztunnel/ztunnel.sock", "--ztunnel-timeout-ms", "250"});
  ASSERT_TRUE(z.ok()) << z.error().message;
  EXPECT_EQ(z->agent.ztunnelSocket, "/var/run/ztunnel/ztunnel.sock");
  EXPECT_EQ(z->agent.ztunnelTimeout, std::chrono::milliseconds(250));
  auto off = parseDaemonArgs({"--metrics-address", "off"});
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->agent.metricsAddress.empty());
}

TEST(AgentOptions, BadFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* msg;
  } cases[] = {
      {{"--frobnicate"}, "unknown option '--frobnicate' (see sluiced --help)"},
      {{"--socket"}, "option --socket needs a value (see sluiced --help)"},
      {{"--socket", "rel.sock"}, "--socket needs an absolute path (see sluiced --help)"},
      {{"--log-format", "xml"}, "invalid --log-format 'xml' (expected text or json) (see sluiced --help)"},
      {{"--log-level", "loud"},
       "invalid --log-level 'loud' (expected trace, debug, info, warn, error or off) (see sluiced --help)"},
      {{"--metrics-address", "127.0.0.1:99999"}, "--metrics-address: invalid port in '127.0.0.1:99999' (see sluiced --help)"},
      {{"--reconcile-interval", "-1"}, "invalid --reconcile-interval '-1' (expected whole seconds) (see sluiced --help)"},
      {{"--tc-mode", "x"}, "invalid --tc-mode 'x' (expected auto, tcx or legacy) (see sluiced --help)"},
      {{"--ztunnel-socket", "ztunnel.sock"}, "--ztunnel-socket needs an absolute path (see sluiced --help)"},
      {{"--ztunnel-socket", "/" + std::string(120, 'z')},
       "--ztunnel-socket path is longer than 107 bytes (see sluiced --help)"},
      {{"--ztunnel-timeout-ms", "0"}, "invalid --ztunnel-timeout-ms '0' (expected whole milliseconds > 0) (see sluiced --help)"},
  };
  for (const auto& c : cases) {
    auto r = parseDaemonArgs(c.args);
    ASSERT_FALSE(r.ok()) << c.args[0];
    EXPECT_EQ(r.error().message, c.msg);
  }
}

// The probe source: Istio's default, the flags, or Istio's env names
// (HOST_PROBE_SNAT_IP[V6]) when no flag is given; a flag beats the env;
// nothing that cannot be a source is taken.
TEST(AgentOptions, HostProbeSnatAddresses) {
  auto none = [](const char*) -> std::optional<std::string> { return std::nullopt; };
  auto d = parseDaemonArgs({}, none);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->agent.datapath.settings.probeV4, "169.254.7.127");
  EXPECT_EQ(d->agent.datapath.settings.probeV6, "fd16:9254:7127:1337:ffff:ffff:ffff:ffff");
  auto f = parseDaemonArgs({"--host-probe-snat-ip", "169.254.9.1", "--host-probe-snat-ipv6", "fd16::9"}, none);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->agent.datapath.settings.probeV4, "169.254.9.1");
  EXPECT_EQ(f->agent.datapath.settings.probeV6, "fd16::9");
  auto istioEnv = [](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "HOST_PROBE_SNAT_IP") return "169.254.8.8";
    if (std::string(n) == "HOST_PROBE_SNAT_IPV6") return "fd16::8";
    return std::nullopt;
  };
  auto e = parseDaemonArgs({}, istioEnv);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->agent.datapath.settings.probeV4, "169.254.8.8");
  EXPECT_EQ(e->agent.datapath.settings.probeV6, "fd16::8");
  auto both = parseDaemonArgs({"--host-probe-snat-ip", "169.254.9.1"}, istioEnv);
  ASSERT_TRUE(both.ok()) << both.error().message;
  EXPECT_EQ(both->agent.datapath.settings.probeV4, "169.254.9.1") << "the flag beats the env";
  EXPECT_EQ(both->agent.datapath.settings.probeV6, "fd16::8");

  struct Case {
    std::vector<std::string> args;
    const char* msg;
  } cases[] = {
      {{"--host-probe-snat-ip", "fd16::1"},
       "--host-probe-snat-ip: 'fd16::1' is not an IPv4 address (see sluiced --help)"},
      {{"--host-probe-snat-ipv6", "169.254.7.127"},
       "--host-probe-snat-ipv6: '169.254.7.127' is not an IPv6 address (see sluiced --help)"},
      {{"--host-probe-snat-ip", "127.0.0.1"},
       "--host-probe-snat-ip: '127.0.0.1' cannot be a probe source (unspecified, loopback or multicast) (see sluiced "
       "--help)"},
      {{"--host-probe-snat-ipv6", "::"},
       "--host-probe-snat-ipv6: '::' cannot be a probe source (unspecified, loopback or multicast) (see sluiced "
       "--help)"},
      {{"--host-probe-snat-ip", "224.0.0.1"},
       "--host-probe-snat-ip: '224.0.0.1' cannot be a probe source (unspecified, loopback or multicast) (see "
       "sluiced --help)"},
  };
  for (const auto& c : cases) {
    auto r = parseDaemonArgs(c.args, none);
    ASSERT_FALSE(r.ok()) << c.args[1];
    EXPECT_EQ(r.error().message, c.msg);
  }
  auto badEnv = parseDaemonArgs({}, [](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "HOST_PROBE_SNAT_IP") return "node-ip";
    return std::nullopt;
  });
  ASSERT_FALSE(badEnv.ok());
  EXPECT_EQ(badEnv.error().message, "$HOST_PROBE_SNAT_IP: 'node-ip' is not an IPv4 address (see sluiced --help)");
}

// The environment of a process outside Kubernetes (nothing set), and of a
// DaemonSet pod (the service's host and the downward API's NODE_NAME).
std::optional<std::string> noEnv(const char*) { return std::nullopt; }
std::optional<std::string> podEnv(const char* name) {
  if (std::string(name) == "KUBERNETES_SERVICE_HOST") return "10.96.0.1";
  if (std::string(name) == "NODE_NAME") return "node-a";
  return std::nullopt;
}

TEST(AgentOptions, KubernetesDefaultsAndFlags) {
  auto d = parseDaemonArgs({}, noEnv);
  ASSERT_TRUE(d.ok()) << d.error().message;
  const KubeOptions& k = d->agent.kube;
  EXPECT_FALSE(k.enabled()) << "outside a pod and without --kube-api the agent works as without Kubernetes";
  EXPECT_EQ(describeKube(k), "off (not in a pod, no --kube-api)");
  EXPECT_EQ(k.ztunnelNamespace, "istio-system");
  EXPECT_EQ(k.ztunnelLabelKey + "=" + k.ztunnelLabelValue, "app=ztunnel");
  EXPECT_EQ(k.excludeNamespaces, std::set<std::string>{"kube-system"});
  EXPECT_TRUE(k.dnsCaptureDefault);

  auto inPod = parseDaemonArgs({}, podEnv);
  ASSERT_TRUE(inPod.ok()) << inPod.error().message;
  EXPECT_TRUE(inPod->agent.kube.inCluster);
  EXPECT_TRUE(inPod->agent.kube.enabled());
  EXPECT_EQ(inPod->agent.kube.nodeName, "node-a");
  EXPECT_EQ(describeKube(inPod->agent.kube),
            "in cluster, node node-a, ztunnel istio-system/app=ztunnel, excluded [kube-system], DNS capture by default on, "
            "enablement selectors Istio's default");
  EXPECT_TRUE(inPod->agent.kube.selectors.isDefault());
  // Istio's AMBIENT_ENABLEMENT_SELECTOR, and the flag over it.
  auto envSel = [&](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "AMBIENT_ENABLEMENT_SELECTOR") return "- podSelector: {matchLabels: {app: x}}";
    return podEnv(n);
  };
  auto sel = parseDaemonArgs({}, envSel);
  ASSERT_TRUE(sel.ok()) << sel.error().message;
  EXPECT_EQ(sel->agent.kube.selectors.match({{"app", "x"}}, {}), 0u);
  EXPECT_NE(describeKube(sel->agent.kube).find(R"(enablement selectors [{"podSelector":{"matchLabels":{"app":"x"}}}])"),
            std::string::npos)
      << describeKube(sel->agent.kube);
  auto flagSel = parseDaemonArgs({"--ambient-enablement-selector", "[{\"namespaceSelector\": {\"matchLabels\": {\"t\": \"y\"}}}]"}, envSel);
  ASSERT_TRUE(flagSel.ok()) << flagSel.error().message;
  EXPECT_EQ(flagSel->agent.kube.selectors.match({}, {{"t", "y"}}), 0u);
  auto badEnv = parseDaemonArgs({}, [&](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "AMBIENT_ENABLEMENT_SELECTOR") return "- podSelector: {matchLabels: {app: x}";
    return podEnv(n);
  });
  ASSERT_FALSE(badEnv.ok());
  EXPECT_EQ(badEnv.error().message.rfind("invalid AMBIENT_ENABLEMENT_SELECTOR: enablement selectors: not YAML: ", 0), 0u)
      << badEnv.error().message;
  auto off = parseDaemonArgs({"--kube", "off"}, podEnv);
  ASSERT_TRUE(off.ok()) << off.error().message;
  EXPECT_FALSE(off->agent.kube.enabled());
  EXPECT_EQ(describeKube(off->agent.kube), "off (--kube off)");

  auto x = parseDaemonArgs({"--kube-api", "https://127.0.0.1:6443/", "--kube-token-file", "/run/t/token",
                            "--kube-ca-file", "/run/t/ca.crt", "--node-name", "worker-1.example", "--ztunnel-namespace",
                            "mesh", "--ztunnel-label", "app.kubernetes.io/name=ztunnel", "--exclude-namespaces",
                            "kube-system,monitoring", "--dns-capture", "F"},
                           podEnv);
  ASSERT_TRUE(x.ok()) << x.error().message;
  const KubeOptions& e = x->agent.kube;
  EXPECT_TRUE(e.enabled());
  EXPECT_FALSE(e.inCluster) << "--kube-api wins over the in-cluster configuration";
  EXPECT_EQ(e.apiUrl, "https://127.0.0.1:6443");
  EXPECT_EQ(e.tokenFile, "/run/t/token");
  EXPECT_EQ(e.caFile, "/run/t/ca.crt");
  EXPECT_EQ(e.nodeName, "worker-1.example") << "--node-name wins over NODE_NAME";
  EXPECT_EQ(e.ztunnelNamespace, "mesh");
  EXPECT_EQ(e.ztunnelLabelKey, "app.kubernetes.io/name");
  EXPECT_EQ(e.ztunnelLabelValue, "ztunnel");
  EXPECT_EQ(e.excludeNamespaces, (std::set<std::string>{"kube-system", "monitoring"}));
  EXPECT_FALSE(e.dnsCaptureDefault);
  auto none = parseDaemonArgs({"--exclude-namespaces", "", "--kube-api", "http://10.0.0.1:8080", "--node-name", "n"},
                              noEnv);
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->agent.kube.excludeNamespaces.empty());
  EXPECT_EQ(none->agent.kube.apiUrl, "http://10.0.0.1:8080");
}

TEST(AgentOptions, BadKubernetesFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* msg;
  } cases[] = {
      {{"--kube", "on"}, "invalid --kube 'on' (expected auto or off) (see sluiced --help)"},
      {{"--kube-api"}, "option --kube-api needs a value (see sluiced --help)"},
      {{"--kube-api", "127.0.0.1:6443"},
       "invalid --kube-api '127.0.0.1:6443' (expected https://HOST:PORT or http://HOST:PORT) (see sluiced --help)"},
      {{"--kube-api", "https://"},
       "invalid --kube-api 'https://' (expected https://HOST:PORT or http://HOST:PORT) (see sluiced --help)"},
      {{"--kube-api", "https://h:1/api"},
       "invalid --kube-api 'https://h:1/api' (expected https://HOST:PORT, without a path) (see sluiced --help)"},
      {{"--kube-token-file", "token"}, "--kube-token-file needs an absolute path (see sluiced --help)"},
      {{"--kube-ca-file", ""}, "--kube-ca-file needs an absolute path (see sluiced --help)"},
      {{"--node-name", "Node_A"},
       "invalid --node-name 'Node_A' (expected a node name: lower-case letters, digits, '-' and '.') (see sluiced --help)"},
      {{"--ztunnel-namespace", "istio.system"},
       "invalid --ztunnel-namespace 'istio.system' (expected a namespace name: lower-case letters, digits and '-') "
       "(see sluiced --help)"},
      {{"--ztunnel-label", "app"}, "invalid --ztunnel-label 'app' (expected KEY=VALUE, e.g. app=ztunnel) (see sluiced --help)"},
      {{"--ztunnel-label", "=ztunnel"},
       "invalid --ztunnel-label '=ztunnel' (expected KEY=VALUE, e.g. app=ztunnel) (see sluiced --help)"},
      {{"--exclude-namespaces", "kube-system,,x"},
       "invalid --exclude-namespaces 'kube-system,,x': '' is not a namespace name (expected NS[,NS...], or \"\" for "
       "none) (see sluiced --help)"},
      {{"--dns-capture", "yes"}, "invalid --dns-capture 'yes' (expected true or false) (see sluiced --help)"},
      {{"--kube", "off", "--kube-api", "https://h:1"}, "--kube off contradicts --kube-api (see sluiced --help)"},
      {{"--kube-token-file", "/t"},
       "--kube-token-file needs --kube-api (in a pod the service account's token is read) (see sluiced --help)"},
      {{"--kube-ca-file", "/c"},
       "--kube-ca-file needs --kube-api (in a pod the service account's CA is read) (see sluiced --help)"},
      {{"--kube-api", "https://h:1"},
       "Kubernetes is configured (--kube-api) but the node name is unknown: pass --node-name or set NODE_NAME (the "
       "downward API's spec.nodeName); --kube off turns Kubernetes off (see sluiced --help)"},
  };
  for (const auto& c : cases) {
    auto r = parseDaemonArgs(c.args, noEnv);
    ASSERT_FALSE(r.ok()) << c.args[0];
    EXPECT_EQ(r.error().message, c.msg);
  }
  // In a pod without NODE_NAME (the downward API missing from the manifest).
  auto noNode = parseDaemonArgs({}, [](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "KUBERNETES_SERVICE_HOST") return "10.96.0.1";
    return std::nullopt;
  });
  ASSERT_FALSE(noNode.ok());
  EXPECT_EQ(noNode.error().message,
            "Kubernetes is configured (in cluster) but the node name is unknown: pass --node-name or set NODE_NAME (the "
            "downward API's spec.nodeName); --kube off turns Kubernetes off (see sluiced --help)");
  auto badNode = parseDaemonArgs({}, [](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "KUBERNETES_SERVICE_HOST") return "10.96.0.1";
    if (std::string(n) == "NODE_NAME") return "bad node";
    return std::nullopt;
  });
  ASSERT_FALSE(badNode.ok());
  EXPECT_EQ(badNode.error().message, "invalid NODE_NAME 'bad node' (expected a node name) (see sluiced --help)");
  EXPECT_NE(daemonUsage().find("--kube-api URL"), std::string::npos);
}

// The node's readiness taint and the uninstall on SIGTERM: off unless
// asked for; each needs what it acts through.
TEST(AgentOptions, NodeTaintAndDaemonSetFlags) {
  auto d = parseDaemonArgs({}, podEnv);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_FALSE(d->agent.removeNodeTaint);
  EXPECT_EQ(d->agent.nodeTaintKey, "cni.istio.io/not-ready") << "Istio's taint";
  EXPECT_EQ(d->agent.daemonSet, "") << "never uninstalls unless told its DaemonSet";

  auto t = parseDaemonArgs({"--remove-node-taint", "--node-taint-key", "example.com/mesh-not-ready"}, podEnv);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->agent.removeNodeTaint);
  EXPECT_EQ(t->agent.nodeTaintKey, "example.com/mesh-not-ready");

  auto withNs = [](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "POD_NAMESPACE") return "sluice-system";
    return podEnv(n);
  };
  auto u = parseDaemonArgs({"--daemonset", "sluice-node", "--cni-conf-dir", "/host/etc/cni/net.d", "--cni-bin-dir",
                            "/host/opt/cni/bin"},
                           withNs);
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_EQ(u->agent.daemonSet, "sluice-node");
  EXPECT_EQ(u->agent.daemonSetNamespace, "sluice-system") << "from POD_NAMESPACE";
  EXPECT_EQ(u->agent.cniBinDir, "/host/opt/cni/bin");
  u = parseDaemonArgs({"--daemonset", "sluice-node", "--daemonset-namespace", "mesh", "--cni-conf-dir", "/c",
                       "--cni-bin-dir", "/b"},
                      withNs);
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_EQ(u->agent.daemonSetNamespace, "mesh") << "the flag wins";

  struct Case {
    std::vector<std::string> args;
    const char* msg;
  } cases[] = {
      {{"--remove-node-taint"}, "--remove-node-taint needs Kubernetes (in a pod, or --kube-api) (see sluiced --help)"},
      {{"--node-taint-key", "x"}, "--node-taint-key needs --remove-node-taint (see sluiced --help)"},
      {{"--remove-node-taint", "--node-taint-key", "a b"},
       "invalid --node-taint-key 'a b' (expected a taint key such as cni.istio.io/not-ready) (see sluiced --help)"},
      {{"--daemonset", "sluice-node"}, "--daemonset needs Kubernetes (in a pod, or --kube-api) (see sluiced --help)"},
      {{"--daemonset", "Sluice"}, "invalid --daemonset 'Sluice' (expected a Kubernetes object name) (see sluiced --help)"},
      {{"--cni-bin-dir", "/b"}, "--cni-bin-dir needs --daemonset (see sluiced --help)"},
      {{"--daemonset-namespace", "x"}, "--daemonset-namespace needs --daemonset (see sluiced --help)"},
  };
  for (const auto& c : cases) {
    auto r = parseDaemonArgs(c.args, noEnv);
    ASSERT_FALSE(r.ok()) << c.args[0];
    EXPECT_EQ(r.error().message, c.msg);
  }
  auto noDirs = parseDaemonArgs({"--daemonset", "sluice-node"}, withNs);
  ASSERT_FALSE(noDirs.ok());
  EXPECT_EQ(noDirs.error().message,
            "--daemonset needs --cni-conf-dir and --cni-bin-dir (what an uninstall takes sluice-cni out of) (see sluiced "
            "--help)");
  auto noNs = parseDaemonArgs({"--daemonset", "sluice-node", "--cni-conf-dir", "/c", "--cni-bin-dir", "/b"}, podEnv);
  ASSERT_FALSE(noNs.ok());
  EXPECT_EQ(noNs.error().message,
            "--daemonset needs --daemonset-namespace or $POD_NAMESPACE (the downward API's metadata.namespace) (see "
            "sluiced --help)");
}

// Readiness in health: the list of what is missing; an older agent's answer
// (no "not_ready") reports nothing, which is not "ready".
TEST(AgentProtocol, HealthCarriesWhatIsNotReady) {
  Health h;
  h.notReady = std::vector<std::string>{"kubernetes: not synced", "cni: not in the chain"};
  auto j = encodeHealth(h);
  EXPECT_EQ(j["ready"], false);
  auto back = decodeHealth(j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_TRUE(back->notReady.has_value());
  EXPECT_EQ(*back->notReady, *h.notReady);
  h.notReady = std::vector<std::string>{};
  j = encodeHealth(h);
  EXPECT_EQ(j["ready"], true);
  back = decodeHealth(j);
  ASSERT_TRUE(back.ok() && back->notReady.has_value());
  EXPECT_TRUE(back->notReady->empty());
  j.erase("ready");
  j.erase("not_ready");
  back = decodeHealth(j);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_FALSE(back->notReady.has_value());
  j["not_ready"] = "x";
  EXPECT_FALSE(decodeHealth(j).ok()) << "not_ready must be an array";
}

// The add's answer: an agent that decides from Kubernetes may leave a pod
// alone. A client of this build reads both answers; an older client reads
// "not enrolled" as a pod with nothing attached (and passes it through), an
// older agent's answer (no "enrolled") is an enrolled pod.
TEST(AgentProtocol, AddResultIsCompatibleBothWays) {
  AddResult no;
  no.enrolled = false;
  no.reason = "not in the ambient mesh: namespace shop is not labelled";
  no.pod.id = "c0ffee";
  json wire = encodeAddResult(no);
  EXPECT_EQ(wire, (json{{"id", "c0ffee"}, {"enrolled", false}, {"reason", no.reason}}));
  auto back = decodeAddResult(wire);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_FALSE(back->enrolled);
  EXPECT_EQ(back->reason, no.reason);
  EXPECT_EQ(back->pod.id, "c0ffee");
  auto asOld = decodePodInfo(wire);
  ASSERT_TRUE(asOld.ok()) << "an older client could not read it: " << asOld.error().message;
  EXPECT_EQ(asOld->id, "c0ffee");
  EXPECT_TRUE(asOld->interfaces.empty());

  PodInfo p;
  p.id = "web-1";
  p.interfaces = {"eth0"};
  p.identity = {"u1", "web-1", "shop", "web"};
  auto fromOldAgent = decodeAddResult(encodePodInfo(p));
  ASSERT_TRUE(fromOldAgent.ok());
  EXPECT_TRUE(fromOldAgent->enrolled);
  EXPECT_EQ(fromOldAgent->pod.identity, p.identity);
  AddResult yes{true, "in the ambient mesh: namespace labelled istio.io/dataplane-mode=ambient", p};
  auto y = decodeAddResult(encodeAddResult(yes));
  ASSERT_TRUE(y.ok());
  EXPECT_TRUE(y->enrolled);
  EXPECT_EQ(y->reason, yes.reason);
  EXPECT_EQ(y->pod.interfaces, p.interfaces);
  auto bad = decodeAddResult({{"id", "x"}, {"enrolled", "no"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "malformed request: 'enrolled' must be true or false");

  Health h;
  h.bpffsRoot = "/sys/fs/bpf/sluice";
  h.kubeApi = "in cluster";
  h.kubeSynced = true;
  auto hb = decodeHealth(encodeHealth(h));
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->kubeApi, "in cluster");
  EXPECT_TRUE(hb->kubeSynced);
}

TEST(AgentMetrics, HistogramIsCumulative) {
  Histogram h({0.001, 0.01});
  h.observe(0.0005);
  h.observe(0.005);
  h.observe(5);
  std::string out;
  h.render(out, "x_seconds");
  EXPECT_EQ(out,
            "x_seconds_bucket{le=\"0.001\"} 1\n"
            "x_seconds_bucket{le=\"0.01\"} 2\n"
            "x_seconds_bucket{le=\"+Inf\"} 3\n"
            "x_seconds_sum 5.0055\n"
            "x_seconds_count 3\n");
  EXPECT_EQ(labelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Metrics m;
  m.request("add", true);
  m.request("add", false);
  std::string page = m.render();
  EXPECT_NE(page.find("sluice_agent_requests_total{op=\"add\",result=\"ok\"} 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("sluice_agent_errors_total{source=\"api\"} 1\n"), std::string::npos) << page;
}

TEST(SluicectlSocket, SocketOptionIsParsed) {
  auto c = cli::parse({"--socket", "/run/a.sock", "pod", "list"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->socketPath, "/run/a.sock");
  EXPECT_TRUE(c->socketGiven);
  auto d = cli::parse({"pod", "list"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->socketPath, kDefaultSocket);
  EXPECT_FALSE(d->socketGiven);
  auto bad = cli::parse({"--socket", "x", "pod", "list"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "--socket needs an absolute path (see sluicectl --help)");
}

}  // namespace
}  // namespace sluice::agent
