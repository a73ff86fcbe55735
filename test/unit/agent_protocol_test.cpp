// The agent's wire format, command line and metrics rendering: pure code,
// no privileges.
#include <gtest/gtest.h>

#include "userspace/agent/logging.h"
#include "userspace/agent/metrics.h"
#include "userspace/agent/options.h"
#include "userspace/agent/protocol.h"
#include "userspace/sluicectl/cli.h"

namespace sluice::agent {
namespace {

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
