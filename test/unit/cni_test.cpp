// sluice-cni without privileges: configuration parsing, pod ids, the pod's
// addresses from prevResult, and every error an invocation can answer
// before it needs a live agent (the netns tests cover the rest).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <sstream>

#include "enroll/datapath.h"
#include "test/common/tempdir.h"
#include "userspace/cni/cni.h"

namespace sluice::cni {
namespace {

using nlohmann::json;

// The result the bridge plugin (with host-local) prints: bridge, host veth,
// then the pod's eth0, which alone carries "sandbox".
const char* kBridgeResult = R"({
  "cniVersion": "1.0.0",
  "interfaces": [
    {"name": "cni-br0", "mac": "aa:bb:cc:00:00:01"},
    {"name": "veth1234", "mac": "aa:bb:cc:00:00:02"},
    {"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/pod"}
  ],
  "ips": [
    {"interface": 2, "address": "10.22.0.5/24", "gateway": "10.22.0.1"},
    {"interface": 2, "address": "fd00:22::5/64"},
    {"interface": 0, "address": "10.22.0.1/24"}
  ],
  "routes": [{"dst": "0.0.0.0/0"}],
  "dns": {}
})";

std::string conf(const std::string& extra = "", const std::string& version = "1.0.0") {
  return R"({"cniVersion":")" + version + R"(","name":"k8s-pod-network","type":"sluice-cni")" + extra + "}";
}

std::string withPrev(const std::string& extra = "") { return conf(",\"prevResult\":" + std::string(kBridgeResult) + extra); }

Env env(const std::string& command) {
  Env e;
  e.command = command;
  e.containerId = "c0ffee";
  e.netns = "/proc/self/ns/net";
  e.ifname = "eth0";
  e.path = "/usr/lib/cni";
  return e;
}

/// An agent socket path under a fresh empty directory: nobody listens there.
class NoAgent : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(tmp_.path().empty()); }
  std::string socketKey() const { return ",\"agentSocket\":\"" + tmp_.file("agent.sock") + "\""; }
  test::TempDir tmp_{"cni-unit"};
  const std::string& dir_ = tmp_.path();
};

json errorOf(const Outcome& o) {
  EXPECT_NE(o.exitCode, 0) << o.stdoutText;
  auto j = json::parse(o.stdoutText, nullptr, false);
  EXPECT_TRUE(j.is_object()) << o.stdoutText;
  EXPECT_TRUE(j["code"].is_number_integer()) << o.stdoutText;
  EXPECT_TRUE(j["msg"].is_string()) << o.stdoutText;
  EXPECT_TRUE(j["cniVersion"].is_string()) << o.stdoutText;
  return j;
}

// ---- configuration ---------------------------------------------------------------

TEST(CniConf, DefaultsAndEveryKey) {
  auto c = parseNetConf(conf());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->agentSocket, "/var/run/sluice/agent.sock");
  EXPECT_TRUE(c->dnsCapture);
  EXPECT_TRUE(c->inboundCapture);
  EXPECT_TRUE(c->rerouteIfaces.empty());
  EXPECT_FALSE(c->tcMode.has_value());
  EXPECT_FALSE(c->prevResult.has_value());

  c = parseNetConf(withPrev(R"(,"agentSocket":"/run/x.sock","dnsCapture":false,"inboundCapture":false,)"
                            R"("rerouteIfaces":["tun0","wg0"],"tcMode":"legacy","logLevel":"debug","logFormat":"json",)"
                            R"("runtimeConfig":{},"someOtherPluginsKey":1)"));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->agentSocket, "/run/x.sock");
  EXPECT_FALSE(c->dnsCapture);
  EXPECT_FALSE(c->inboundCapture);
  EXPECT_EQ(c->rerouteIfaces, (std::vector<std::string>{"tun0", "wg0"}));
  ASSERT_TRUE(c->tcMode.has_value());
  EXPECT_EQ(*c->tcMode, TcMode::Legacy);
  EXPECT_EQ(c->logFormat, "json");
  ASSERT_TRUE(c->prevResult.has_value());
}

TEST(CniConf, EveryOlderSupportedVersion) {
  for (const char* v : {"0.3.0", "0.3.1", "0.4.0", "1.0.0"}) EXPECT_TRUE(parseNetConf(conf("", v)).ok()) << v;
}

struct BadConf {
  const char* description;
  std::string text;
  int code;
  const char* msgPart;
};

TEST(CniConf, EachBadConfigHasItsCodeAndNamesTheProblem) {
  const std::vector<BadConf> cases = {
      {"empty stdin", "", kCniDecodeFailure, "no network configuration"},
      {"not JSON", "{\"cniVersion\": ", kCniDecodeFailure, "not valid JSON"},
      {"not an object", "[1,2]", kCniDecodeFailure, "not a JSON object"},
      {"no cniVersion", R"({"name":"n","type":"sluice-cni"})", kCniInvalidConfig, "'cniVersion' is missing"},
      {"no name", R"({"cniVersion":"1.0.0","type":"sluice-cni"})", kCniInvalidConfig, "'name' is missing"},
      {"name not a string", R"({"cniVersion":"1.0.0","name":5,"type":"sluice-cni"})", kCniInvalidConfig, "'name'"},
      {"unsupported version", conf("", "2.0.0"), kCniIncompatibleVersion, "cniVersion 2.0.0 is not supported"},
      {"ancient version", conf("", "0.2.0"), kCniIncompatibleVersion, "supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0"},
      {"dnsCapture a string", conf(",\"dnsCapture\":\"no\""), kCniInvalidConfig, "'dnsCapture' must be true or false"},
      {"inboundCapture a number", conf(",\"inboundCapture\":0"), kCniInvalidConfig, "'inboundCapture'"},
      {"rerouteIfaces a string", conf(",\"rerouteIfaces\":\"tun0\""), kCniInvalidConfig, "'rerouteIfaces'"},
      {"rerouteIfaces with a number", conf(",\"rerouteIfaces\":[1]"), kCniInvalidConfig, "'rerouteIfaces'"},
      {"tcMode unknown", conf(",\"tcMode\":\"xdp\""), kCniInvalidConfig, "'tcMode' must be auto, tcx or legacy"},
      {"relative agentSocket", conf(",\"agentSocket\":\"agent.sock\""), kCniInvalidConfig, "absolute path"},
      {"empty agentSocket", conf(",\"agentSocket\":\"\""), kCniInvalidConfig, "'agentSocket'"},
      {"bad logLevel", conf(",\"logLevel\":\"loud\""), kCniInvalidConfig, "'logLevel' must be"},
      {"bad logFormat", conf(",\"logFormat\":\"xml\""), kCniInvalidConfig, "'logFormat' must be text or json"},
      {"relative logFile", conf(",\"logFile\":\"cni.log\""), kCniInvalidConfig,
       "'logFile' must be an absolute path, not 'cni.log'"},
      {"prevResult an array", conf(",\"prevResult\":[]"), kCniInvalidConfig, "'prevResult' must be a JSON object"},
  };
  for (const auto& c : cases) {
    auto r = parseNetConf(c.text);
    ASSERT_FALSE(r.ok()) << c.description;
    EXPECT_EQ(r.error().code, c.code) << c.description << ": " << r.error().message;
    EXPECT_NE(r.error().message.find(c.msgPart), std::string::npos) << c.description << ": " << r.error().message;
  }
}

TEST(CniConf, CniArgs) {
  auto a = parseCniArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;junk;=x");
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a["K8S_POD_NAMESPACE"], "default");
  EXPECT_EQ(a["K8S_POD_NAME"], "web-0");
}

// ---- pod ids and addresses -------------------------------------------------------

TEST(CniPodId, ShortIdsAreKeptLongOnesHashedDeterministically) {
  EXPECT_EQ(podIdForContainer("c0ffee"), "c0ffee");
  const std::string hex64(64, 'a');
  auto id = podIdForContainer(hex64);
  EXPECT_EQ(id.size(), 63u) << id;
  EXPECT_TRUE(validatePodId(id).ok()) << id;
  EXPECT_EQ(id, podIdForContainer(hex64)) << "DEL must find what ADD enrolled";
  EXPECT_EQ(id.substr(0, 46), hex64.substr(0, 46));
  // Same 46-character prefix, different tails: different pods.
  EXPECT_NE(podIdForContainer(hex64), podIdForContainer(std::string(63, 'a') + "b"));
  // Characters a pod id can't hold.
  auto odd = podIdForContainer("pod/with spaces:and:colons");
  EXPECT_TRUE(validatePodId(odd).ok()) << odd;
  EXPECT_NE(odd, podIdForContainer("pod_with_spaces_and_colons"));
}

TEST(CniPodAddresses, OnlyTheSandboxInterfacesAddresses) {
  auto prev = nlohmann::ordered_json::parse(kBridgeResult);
  auto ips = podAddresses(prev);
  ASSERT_TRUE(ips.ok()) << ips.error().message;
  EXPECT_EQ(*ips, (std::vector<std::string>{"10.22.0.5", "fd00:22::5"}));

  // Without interface indexes every address is the pod's; no ips: none
  // (the agent then finds them in the pod netns).
  ips = podAddresses(nlohmann::ordered_json::parse(R"({"ips":[{"address":"10.1.0.7/32"}]})"));
  ASSERT_TRUE(ips.ok());
  EXPECT_EQ(*ips, std::vector<std::string>{"10.1.0.7"});
  ips = podAddresses(nlohmann::ordered_json::parse(R"({"cniVersion":"1.0.0"})"));
  ASSERT_TRUE(ips.ok());
  EXPECT_TRUE(ips->empty());
}

TEST(CniPodAddresses, MalformedEntriesAreNamed) {
  for (const char* bad : {R"({"ips":{}})", R"({"ips":[{"gateway":"10.0.0.1"}]})",
                          R"({"ips":[{"address":"not-an-ip/24"}]})",
                          R"({"interfaces":[],"ips":[{"interface":3,"address":"10.0.0.2/24"}]})"}) {
    auto r = podAddresses(nlohmann::ordered_json::parse(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, kCniInvalidConfig) << bad;
    EXPECT_NE(r.error().message.find("prevResult"), std::string::npos) << r.error().message;
  }
}

// ---- invocations -----------------------------------------------------------------

TEST(CniRun, VersionListsTheSupportedVersions) {
  auto o = run(env("VERSION"), R"({"cniVersion":"0.4.0"})");
  ASSERT_EQ(o.exitCode, 0);
  auto j = json::parse(o.stdoutText);
  EXPECT_EQ(j["cniVersion"], "0.4.0");
  EXPECT_EQ(j["supportedVersions"], json({"0.3.0", "0.3.1", "0.4.0", "1.0.0"}));
  o = run(env("VERSION"), "");
  ASSERT_EQ(o.exitCode, 0);
  EXPECT_EQ(json::parse(o.stdoutText)["cniVersion"], "1.0.0");
}

TEST(CniRun, EnvironmentErrorsAreCode4) {
  auto j = errorOf(run(env(""), conf()));
  EXPECT_EQ(j["code"], kCniInvalidEnvironment);
  EXPECT_NE(j["msg"].get<std::string>().find("CNI_COMMAND is not set"), std::string::npos);

  j = errorOf(run(env("GC"), conf()));
  EXPECT_EQ(j["code"], kCniInvalidEnvironment);
  EXPECT_NE(j["msg"].get<std::string>().find("unknown CNI_COMMAND 'GC'"), std::string::npos);

  auto e = env("ADD");
  e.netns.clear();
  j = errorOf(run(e, withPrev()));
  EXPECT_EQ(j["code"], kCniInvalidEnvironment);
  EXPECT_EQ(j["msg"], "CNI_NETNS is not set (required for ADD)");

  e = env("ADD");
  e.containerId.clear();
  j = errorOf(run(e, withPrev()));
  EXPECT_EQ(j["code"], kCniInvalidEnvironment);
  EXPECT_EQ(j["msg"], "CNI_CONTAINERID is not set (required for ADD)");

  e = env("ADD");
  e.ifname.clear();
  j = errorOf(run(e, withPrev()));
  EXPECT_EQ(j["msg"], "CNI_IFNAME is not set (required for ADD)");

  // The pod's identity comes from CNI_ARGS; a value that cannot be one is
  // refused before the agent is asked.
  e = env("ADD");
  e.args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=" + std::string(60, 'u');
  j = errorOf(run(e, withPrev()));
  EXPECT_EQ(j["code"], kCniInvalidEnvironment);
  EXPECT_EQ(j["msg"], "CNI_ARGS: uid '" + std::string(60, 'u') + "' is longer than 47 characters");
  e.args = "K8S_POD_NAMESPACE=sh op;K8S_POD_NAME=web-0;K8S_POD_UID=u1";
  j = errorOf(run(e, withPrev()));
  EXPECT_EQ(j["code"], kCniInvalidEnvironment);
  EXPECT_EQ(j["msg"], "CNI_ARGS: pod namespace has a character that is not printable ASCII (or a space)");
}

TEST(CniRun, ConfigErrorsAnswerInTheConfigsVersion) {
  auto j = errorOf(run(env("ADD"), conf(",\"tcMode\":\"xdp\"", "0.4.0")));
  EXPECT_EQ(j["code"], kCniInvalidConfig);
  EXPECT_EQ(j["cniVersion"], "0.4.0");
  j = errorOf(run(env("ADD"), "{oops"));
  EXPECT_EQ(j["code"], kCniDecodeFailure);
  EXPECT_EQ(j["cniVersion"], "1.0.0");
}

TEST(CniRun, AddNeedsPrevResultAndAnExistingNetns) {
  auto j = errorOf(run(env("ADD"), conf()));
  EXPECT_EQ(j["code"], kCniInvalidConfig);
  EXPECT_NE(j["msg"].get<std::string>().find("prevResult is missing"), std::string::npos) << j;

  auto e = env("ADD");
  e.netns = "/run/netns/sluice-no-such-netns-" + std::to_string(::getpid());
  j = errorOf(run(e, withPrev()));
  EXPECT_EQ(j["code"], kCniUnknownContainer);
  EXPECT_EQ(j["msg"], "network namespace " + e.netns + " does not exist");
}

// "chained": false (install --cni-unchained, Multus): the key is read,
// must be a boolean, and lets ADD go on without prevResult (to the agent,
// which is not running here: not code 7 as a chained config would be).
TEST_F(NoAgent, UnchainedAddNeedsNoPrevResult) {
  auto c = parseNetConf(conf(",\"chained\":false"));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FALSE(c->chained);
  EXPECT_TRUE(parseNetConf(conf()).value().chained);
  auto bad = parseNetConf(conf(",\"chained\":\"no\""));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "network configuration: 'chained' must be true or false");
  auto j = errorOf(run(env("ADD"), conf(",\"chained\":false" + socketKey())));
  EXPECT_NE(j["code"], kCniInvalidConfig) << j;
  EXPECT_EQ(j["msg"].get<std::string>().find("prevResult"), std::string::npos) << j;
  EXPECT_EQ(errorOf(run(env("ADD"), conf(socketKey())))["code"], kCniInvalidConfig);
}

TEST_F(NoAgent, AddFailsClosedWithTryAgainLater) {
  auto j = errorOf(run(env("ADD"), withPrev(socketKey())));
  EXPECT_EQ(j["code"], kCniTryAgainLater);
  const std::string msg = j["msg"];
  EXPECT_NE(msg.find("the sluice agent is not running"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir_ + "/agent.sock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pod c0ffee not started (fail closed)"), std::string::npos) << msg;
}

// logFile: the lines a runtime would drop with the plugin's stderr are
// appended there too (CNI_ARGS at debug level); a file that cannot be
// opened does not fail the command.
TEST_F(NoAgent, LogFileKeepsTheLinesAndCniArgs) {
  auto e = env("ADD");
  e.args = "IgnoreUnknown=1;K8S_POD_NAME=web";
  std::string logKey = ",\"logLevel\":\"debug\",\"logFile\":\"" + tmp_.file("cni.log") + "\"";
  auto j = errorOf(run(e, withPrev(socketKey() + logKey)));
  EXPECT_EQ(j["code"], kCniTryAgainLater);
  std::string log = test::readTextFile(tmp_.file("cni.log"));
  EXPECT_NE(log.find(" debug sluice-cni: ADD c0ffee: CNI_ARGS: IgnoreUnknown=1;K8S_POD_NAME=web\n"), std::string::npos)
      << log;
  EXPECT_NE(log.find(" error sluice-cni: " + j["msg"].get<std::string>() + "\n"), std::string::npos) << log;
  // A name alone (podman's CNI_ARGS) names the pod.
  EXPECT_NE(log.find("pod c0ffee (web) not started (fail closed)"), std::string::npos) << log;
  // Appended, not truncated, by the next invocation.
  (void)run(env("DEL"), withPrev(socketKey() + logKey));
  std::string more = test::readTextFile(tmp_.file("cni.log"));
  EXPECT_EQ(more.rfind(log, 0), 0u);
  EXPECT_NE(more.find(" debug sluice-cni: DEL c0ffee: CNI_ARGS: \n"), std::string::npos) << more;

  std::string unwritable = ",\"logFile\":\"" + tmp_.file("no/such/dir/cni.log") + "\"";
  j = errorOf(run(env("ADD"), withPrev(socketKey() + unwritable)));
  EXPECT_EQ(j["code"], kCniTryAgainLater) << "a log file that cannot be opened is no reason to fail";
}

TEST_F(NoAgent, DelSucceedsWithoutAnAgent) {
  auto o = run(env("DEL"), conf(socketKey()));
  EXPECT_EQ(o.exitCode, 0) << o.stdoutText;
  EXPECT_EQ(o.stdoutText, "");
  // DEL needs neither a netns nor prevResult.
  auto e = env("DEL");
  e.netns.clear();
  o = run(e, conf(socketKey()));
  EXPECT_EQ(o.exitCode, 0) << o.stdoutText;
}

TEST_F(NoAgent, CheckWithoutAnAgentFails) {
  auto j = errorOf(run(env("CHECK"), withPrev(socketKey())));
  EXPECT_EQ(j["code"], kCniTryAgainLater);
}

TEST(CniRun, CheckNeedsVersion040) {
  auto j = errorOf(run(env("CHECK"), conf("", "0.3.1")));
  EXPECT_EQ(j["code"], kCniIncompatibleVersion);
  EXPECT_NE(j["msg"].get<std::string>().find("CHECK needs cniVersion 0.4.0"), std::string::npos) << j;
}

TEST(CniRun, ErrorJsonShape) {
  auto j = errorJson(Error{kCniDamaged, "broken"}, "0.4.0", "no tcx link");
  EXPECT_EQ(j.dump(), R"({"cniVersion":"0.4.0","code":102,"msg":"broken","details":"no tcx link"})");
  EXPECT_EQ(errorJson(Error{4, "x"}, "").dump(), R"({"cniVersion":"1.0.0","code":4,"msg":"x"})");
}

TEST(CniMain, HelpAndUnknownArguments) {
  std::istringstream in;
  std::ostringstream out, err;
  EXPECT_EQ(main({"--help"}, in, out, err), 0);
  EXPECT_NE(out.str().find("sluice-cni install --cni-conf-dir DIR --cni-bin-dir DIR"), std::string::npos);
  EXPECT_NE(out.str().find("agentSocket"), std::string::npos);
  out.str("");
  EXPECT_EQ(main({"--bogus"}, in, out, err), 2);
  EXPECT_NE(err.str().find("unknown argument '--bogus'"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace sluice::cni
