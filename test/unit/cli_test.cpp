// sluicectl's command line and the loader's pure helpers: no privileges,
// no kernel state. Every usage error message is pinned here.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "enroll/datapath.h"
#include "loader/tc.h"
#include "userspace/sluicectl/cli.h"

namespace sluice::cli {
namespace {

Result<Command> parseArgs(std::initializer_list<std::string> args) { return parse(std::vector<std::string>(args)); }

std::string parseError(std::initializer_list<std::string> args) {
  auto r = parseArgs(args);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error().message;
}

TEST(CliParse, PodAddDefaultsAndOptions) {
  auto c = parseArgs({"pod", "add", "--netns", "/var/run/netns/web"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->verb, Verb::PodAdd);
  EXPECT_EQ(c->pod.netnsPath, "/var/run/netns/web");
  EXPECT_TRUE(c->pod.dnsCapture);
  EXPECT_TRUE(c->pod.inboundCapture);
  EXPECT_EQ(c->bpffsRoot, "/sys/fs/bpf/sluice");
  EXPECT_EQ(c->tcMode, TcMode::Auto);

  c = parseArgs({"--bpffs", "/sys/fs/bpf/x", "--tc-mode", "legacy", "--log-level", "debug", "pod", "add", "--netns",
                 "/proc/1/ns/net", "--id", "web-1", "--dns-capture", "off", "--inbound-capture", "off",
                 "--reroute-iface", "vif0", "--reroute-iface", "vif1"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->bpffsRoot, "/sys/fs/bpf/x");
  EXPECT_EQ(c->tcMode, TcMode::Legacy);
  EXPECT_EQ(c->logLevel, "debug");
  EXPECT_EQ(c->pod.id, "web-1");
  EXPECT_FALSE(c->pod.dnsCapture);
  EXPECT_FALSE(c->pod.inboundCapture);
  EXPECT_EQ(c->pod.rerouteIfaces, (std::vector<std::string>{"vif0", "vif1"}));
}

TEST(CliParse, PodIdentity) {
  auto c = parseArgs({"pod", "add", "--netns", "/var/run/netns/web", "--uid", "u-1", "--pod-name", "web",
                      "--pod-namespace", "shop", "--service-account", "web-sa"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->pod.identity, (PodIdentity{"u-1", "web", "shop", "web-sa"}));
  c = parseArgs({"pod", "add", "--netns", "/var/run/netns/web"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->pod.identity.empty());
  EXPECT_EQ(parseError({"pod", "add", "--netns", "/x", "--uid", "u-1"}),
            "a pod's identity needs --uid, --pod-name and --pod-namespace together (see sluicectl --help)");
  EXPECT_EQ(parseError({"pod", "add", "--netns", "/x", "--pod-name", "web", "--pod-namespace", "shop"}),
            "a pod's identity needs --uid, --pod-name and --pod-namespace together (see sluicectl --help)");
  EXPECT_EQ(parseError({"pod", "add", "--netns", "/x", "--uid", ""}), "--uid needs a value (see sluicectl --help)");
  EXPECT_EQ(parseError({"pod", "add", "--netns", "/x", "--uid", std::string(48, 'u'), "--pod-name", "a",
                        "--pod-namespace", "b"}),
            "uid '" + std::string(48, 'u') + "' is longer than 47 characters (see sluicectl --help)");
  EXPECT_EQ(parseError({"pod", "add", "--netns", "/x", "--uid", "u", "--pod-name", "a\tb", "--pod-namespace", "b"}),
            "pod name has a character that is not printable ASCII (or a space) (see sluicectl --help)");
  EXPECT_NE(parseError({"pod", "list", "--uid", "u"}).find("unknown option --uid"), std::string::npos);
}

// Netns paths are recorded for the agent's sweep, which runs elsewhere: a
// relative one is made absolute against sluicectl's working directory.
TEST(CliParse, RelativeNetnsPathsAreMadeAbsolute) {
  const std::string cwd = std::filesystem::current_path().string();
  auto c = parseArgs({"pod", "add", "--netns", "web", "--node-netns", "../node/./ns"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->pod.netnsPath, cwd + "/web");
  EXPECT_EQ(*c->pod.nodeNetnsPath, std::filesystem::path(cwd).parent_path().string() + "/node/ns");
  EXPECT_EQ(c->pod.id, "");  // defaultPodId of the absolute path: still "web"
  EXPECT_EQ(defaultPodId(c->pod.netnsPath), "web");
  c = parseArgs({"pod", "remove", "--netns", "web"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pod.netnsPath, cwd + "/web");
  // Absolute paths are kept as given.
  EXPECT_EQ(absoluteNetnsPath("/proc/1/ns/net"), "/proc/1/ns/net");
  EXPECT_EQ(absoluteNetnsPath("/var/run/netns/../netns/x"), "/var/run/netns/../netns/x");
  EXPECT_EQ(absoluteNetnsPath(""), "");
}

TEST(CliParse, OtherCommands) {
  auto c = parseArgs({"pod", "remove", "--id", "web"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verb, Verb::PodRemove);
  EXPECT_EQ(*c->id, "web");
  c = parseArgs({"pod", "remove", "--netns", "/var/run/netns/web"});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->id.has_value());
  c = parseArgs({"pod", "list", "--json"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verb, Verb::PodList);
  EXPECT_TRUE(c->json);
  c = parseArgs({"stats", "--id", "web", "--json"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verb, Verb::Stats);
  EXPECT_EQ(*c->id, "web");
  c = parseArgs({"--help"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->verb, Verb::Help);
}

TEST(CliParse, UsageErrorsNameTheProblem) {
  EXPECT_NE(parseError({}).find("no command given"), std::string::npos);
  EXPECT_NE(parseError({"frobnicate"}).find("unknown command 'frobnicate'"), std::string::npos);
  EXPECT_NE(parseError({"pod"}).find("pod needs a subcommand"), std::string::npos);
  EXPECT_NE(parseError({"pod", "start"}).find("unknown pod subcommand 'start'"), std::string::npos);
  EXPECT_NE(parseError({"pod", "add"}).find("pod add needs --netns PATH"), std::string::npos);
  EXPECT_NE(parseError({"pod", "add", "--netns"}).find("option --netns needs a value"), std::string::npos);
  EXPECT_NE(parseError({"pod", "add", "--netns", "/x", "--dns-capture", "maybe"}).find("invalid --dns-capture 'maybe'"),
            std::string::npos);
  EXPECT_NE(parseError({"pod", "add", "--netns", "/x", "--inbound-capture", "yes"}).find("invalid --inbound-capture"),
            std::string::npos);
  EXPECT_NE(parseError({"pod", "add", "--netns", "/x", "--id", "bad/id"}).find("characters other than"), std::string::npos);
  EXPECT_NE(parseError({"pod", "add", "--netns", "/x", "--reroute-iface", "averyveryverylongifname"})
                .find("invalid --reroute-iface"),
            std::string::npos);
  EXPECT_NE(parseError({"pod", "remove"}).find("exactly one of --netns PATH or --id NAME"), std::string::npos);
  EXPECT_NE(parseError({"pod", "remove", "--id", "a", "--netns", "/x"}).find("exactly one of"), std::string::npos);
  EXPECT_NE(parseError({"pod", "list", "--id", "a"}).find("unknown option --id"), std::string::npos);
  EXPECT_NE(parseError({"--tc-mode", "fast", "pod", "list"}).find("invalid --tc-mode 'fast'"), std::string::npos);
  EXPECT_NE(parseError({"--log-level", "loud", "pod", "list"}).find("invalid --log-level 'loud'"), std::string::npos);
  EXPECT_NE(parseError({"--bpffs", "relative", "pod", "list"}).find("absolute path"), std::string::npos);
  EXPECT_NE(parseError({"--colour", "pod", "list"}).find("unknown option --colour"), std::string::npos);
}

TEST(CliMain, UsageErrorIsOneLineAndExit2) {
  std::ostringstream out, err;
  int rc = main({"pod", "add"}, out, err);
  EXPECT_EQ(rc, 2);
  EXPECT_TRUE(out.str().empty());
  std::string e = err.str();
  EXPECT_EQ(e.rfind("sluicectl: ", 0), 0u) << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
}

TEST(CliMain, HelpPrintsTheInterface) {
  std::ostringstream out, err;
  EXPECT_EQ(main({"--help"}, out, err), 0);
  for (const char* s : {"pod add", "--netns PATH", "--dns-capture on|off", "--inbound-capture on|off",
                        "--reroute-iface IFNAME", "pod remove (--netns PATH | --id NAME)", "pod list   [--json]",
                        "stats      [--id NAME] [--json]", "--tc-mode auto|tcx|legacy"})
    EXPECT_NE(out.str().find(s), std::string::npos) << s;
}

TEST(PodId, DefaultsToTheNetnsFileName) {
  EXPECT_EQ(defaultPodId("/var/run/netns/web-7"), "web-7");
  EXPECT_EQ(defaultPodId("/run/netns/a.b/"), "a.b");
  EXPECT_EQ(defaultPodId("/proc/1234/ns/net"), "pid-1234");
  EXPECT_EQ(defaultPodId("/proc/1234/task/1240/ns/net"), "pid-1234");
  EXPECT_EQ(defaultPodId("/proc/self/ns/net"), "net");
}

TEST(PodId, Validation) {
  EXPECT_TRUE(validatePodId("web-1.default_ns").ok());
  EXPECT_NE(validatePodId("").error().message.find("empty"), std::string::npos);
  EXPECT_NE(validatePodId(std::string(64, 'a')).error().message.find("longer than 63"), std::string::npos);
  EXPECT_TRUE(validatePodId(std::string(63, 'a')).ok());
  EXPECT_NE(validatePodId("a b").error().message.find("characters other than"), std::string::npos);
}

TEST(Settings, DefaultsEncodeToTheSpecValues) {
  auto s = encodeSettings(Settings{});
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->outbound_port, 15001);
  EXPECT_EQ(s->inbound_port, 15006);
  EXPECT_EQ(s->hbone_port, 15008);
  EXPECT_EQ(s->dns_port, 15053);
  EXPECT_EQ(s->proxy_mark, 0x539u);
  EXPECT_EQ(s->return_mark, 0x111u);
  EXPECT_EQ(s->mark_mask, 0xfffu);
  const auto* v4 = reinterpret_cast<const uint8_t*>(&s->probe_v4);
  EXPECT_EQ(v4[0], 169);
  EXPECT_EQ(v4[1], 254);
  EXPECT_EQ(v4[2], 7);
  EXPECT_EQ(v4[3], 127);
  EXPECT_EQ(s->probe_v6[0], 0xfd);
  EXPECT_EQ(s->probe_v6[15], 0xff);
}

TEST(Settings, BadValuesAreRejected) {
  Settings s;
  s.probeV4 = "169.254.7";
  EXPECT_NE(encodeSettings(s).error().message.find("invalid IPv4 probe address '169.254.7'"), std::string::npos);
  s = Settings{};
  s.probeV6 = "fd16::zz";
  EXPECT_NE(encodeSettings(s).error().message.find("invalid IPv6 probe address"), std::string::npos);
  s = Settings{};
  s.returnMark = s.proxyMark;
  EXPECT_NE(encodeSettings(s).error().message.find("marks must differ"), std::string::npos);
  s = Settings{};
  s.markMask = 0xffffffff;
  EXPECT_NE(encodeSettings(s).error().message.find("tag bits"), std::string::npos);
  s = Settings{};
  s.dnsPort = 0;
  EXPECT_NE(encodeSettings(s).error().message.find("non-zero"), std::string::npos);
}

TEST(TcMode, Parse) {
  EXPECT_EQ(*parseTcMode("auto"), TcMode::Auto);
  EXPECT_EQ(*parseTcMode("tcx"), TcMode::Tcx);
  EXPECT_EQ(*parseTcMode("legacy"), TcMode::Legacy);
  EXPECT_NE(parseTcMode("xdp").error().message.find("expected auto, tcx or legacy"), std::string::npos);
}

TEST(Format, PodListTextAndJson) {
  PodInfo p;
  p.id = "web";
  p.netnsPath = "/var/run/netns/web";
  p.tcMode = "tcx";
  p.interfaces = {"eth0"};
  p.dnsCapture = false;
  std::string text = formatPodList({p}, false);
  EXPECT_NE(text.find("web"), std::string::npos);
  EXPECT_NE(text.find("off"), std::string::npos);
  EXPECT_NE(text.find("not handed off"), std::string::npos) << text;
  p.identity = {"u-1", "web-0", "shop", "web"};
  p.handoff = HandoffState::Failed;
  p.handoffError = "no ztunnel connection";
  text = formatPodList({p}, false);
  EXPECT_NE(text.find("u-1"), std::string::npos) << text;
  EXPECT_NE(text.find("shop/web-0"), std::string::npos) << text;
  EXPECT_NE(text.find("failed: no ztunnel connection"), std::string::npos) << text;
  p.handoff = HandoffState::Acked;
  EXPECT_NE(formatPodList({p}, false).find("acked"), std::string::npos);
  std::string json = formatPodList({p}, true);
  EXPECT_NE(json.find("\"id\": \"web\""), std::string::npos);
  EXPECT_NE(json.find("\"dns_capture\": false"), std::string::npos);
  EXPECT_EQ(formatPodList({}, true), "[]\n");
}

TEST(Format, StatsJsonHasEveryCounter) {
  PodCounters c;
  c.id = "web";
  c.stats.outbound_conns = 3;
  c.stats.dropped_pkts = 9;
  std::string json = formatStats({c}, true);
  for (const char* k : {"outbound_conns", "inbound_conns", "dns_tcp_conns", "dns_udp_queries", "dns_answers",
                        "owned_pkts", "dropped_pkts", "probe_conns"})
    EXPECT_NE(json.find(k), std::string::npos) << k;
  // Never counted: not a counter users see (the map keeps its slot).
  EXPECT_EQ(json.find("passed_pkts"), std::string::npos);
  EXPECT_EQ(json.find("reserved"), std::string::npos);
  EXPECT_NE(json.find("\"outbound_conns\": 3"), std::string::npos);
  EXPECT_NE(json.find("\"dropped_pkts\": 9"), std::string::npos);
}

}  // namespace
}  // namespace sluice::cli

namespace sluice {
namespace {

TEST(ErrorMessages, MissingPrivilege) {
  std::string line = cli::formatError(Error::fromErrno(EPERM, "load BPF programs"));
  EXPECT_EQ(line.rfind("sluicectl: load BPF programs: Operation not permitted", 0), 0u) << line;
  EXPECT_NE(line.find("missing privilege"), std::string::npos);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
  EXPECT_EQ(cli::formatError(Error::msg("pod 'x' is not enrolled", ENOENT)), "sluicectl: pod 'x' is not enrolled\n");
}

TEST(ErrorMessages, KernelLacksTcx) {
  Error e = tcxAttachError(EINVAL, TcHook::Ingress, 2);
  EXPECT_EQ(e.code, EOPNOTSUPP);
  EXPECT_NE(e.message.find("kernel lacks tcx"), std::string::npos);
  EXPECT_NE(e.message.find("--tc-mode legacy"), std::string::npos);
  Error other = tcxAttachError(EBUSY, TcHook::Egress, 7);
  EXPECT_NE(other.message.find("attach tcx egress on ifindex 7"), std::string::npos);
}

}  // namespace
}  // namespace sluice

#include "loader/netns.h"

namespace sluice {
namespace {

TEST(ErrorMessages, NetnsPaths) {
  auto missing = openNetns("/nonexistent/netns/web");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nonexistent/netns/web"), std::string::npos);
  EXPECT_NE(missing.error().message.find("No such file or directory"), std::string::npos);
  auto mnt = openNetns("/proc/self/ns/mnt");
  ASSERT_FALSE(mnt.ok());
  EXPECT_NE(mnt.error().message.find("not a network namespace"), std::string::npos);
  auto file = openNetns("/etc/hostname");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message.find("not a network namespace"), std::string::npos);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

TEST(ErrorMessages, PodUnknownAndOtherSettings) {
  Error unknown = notEnrolledError("web");
  EXPECT_EQ(unknown.code, ENOENT);
  EXPECT_EQ(cli::formatError(unknown), "sluicectl: pod 'web' is not enrolled\n");
  PodInfo p;
  p.id = "web";
  p.dnsCapture = false;
  p.rerouteIfaces = {"vif0"};
  Error other = otherSettingsError(p);
  EXPECT_EQ(other.code, EEXIST);
  EXPECT_EQ(other.message,
            "pod 'web' is already enrolled with other settings (dns-capture off, inbound-capture on, reroute-iface "
            "vif0); remove it first");
}

}  // namespace
}  // namespace sluice
