// Every primary CNI's habits (issue 30 part 4), end to end: `sluice-cni
// install` (the real binary) lays the node's CNI configuration out as its
// flags say, a real sluiced watches it (--cni-conf-dir and the same
// flags), and the "runtime" (test/common/cni_runtime.h) picks the network
// from the conf dir as libcni does and runs the real bridge + host-local
// plugins and sluice-cni from it. Each test ends with the pod enrolled (or
// the install refused with nothing written).
//
//   TMP/net.d/02-sluice-cni.conflist  (owned: bridge, sluice-cni)   ◀─ runtime's pick
//   TMP/net.d/10-test.conflist        (the primary's: bridge)
//   TMP/multus.d/sluice-cni.conf      (unchained: sluice-cni alone, Multus' additional network)
//
//   node netns "sluice-cfgnode-P-N": sluiced, bridge slcN, the plugins
//   pod netns  "sluice-cfgpod-P-N":  eth0 10.232.N.2/24 (host-local)
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <iostream>
#include <filesystem>
#include <string>

#include "test/common/agent_process.h"
#include "test/common/cni_conf.h"
#include "test/common/cni_runtime.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"
#include "userspace/cni/cni.h"

namespace sluice::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::atomic<int> gCounter{0};

class CniConf : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, BPF)";
    for (const char* p : {"bridge", "host-local"})
      if (!fs::exists(std::string(kSystemCniDir) + "/" + p))
        GTEST_SKIP() << kSystemCniDir << "/" << p << " missing: install containernetworking-plugins";
    ASSERT_TRUE(fs::exists(builtBinary("sluice-cni"))) << "sluice-cni not built";
    ASSERT_TRUE(node_.ok()) << node_.error();
    ASSERT_TRUE(pod_.ok()) << pod_.error();
    ASSERT_FALSE(work_.path().empty());
    for (const char* d : {"net.d", "multus.d", "bin", "ipam"}) ASSERT_TRUE(fs::create_directory(work_.file(d)));
    const int n = gCounter++ % 250;
    net_ = {work_.file("net.d"), work_.file("bin"), "10-test.conflist",
            "sluice-cfg-" + std::to_string(::getpid()) + "-" + std::to_string(n),
            "slc" + std::to_string(::getpid() % 100000) + "-" + std::to_string(n), "10.232." + std::to_string(n) + ".",
            work_.file("ipam"), socket()};
    params_.containerId = "cfg" + std::to_string(::getpid()) + "x" + std::to_string(n);
    params_.netns = pod_.path();
    params_.args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=cfg-" + std::to_string(n);
  }

  void TearDown() override {
    if (agent_) {
      if (auto c = agent_->client(); c.ok()) (void)c->removePod(cni::podIdForContainer(params_.containerId));
      agent_.reset();
    }
  }

  std::string socket() const { return work_.file("agent.sock"); }
  std::string conf(const std::string& name) const { return net_.confDir + "/" + name; }
  std::string podIp() const { return net_.subnetPrefix + "2"; }

  /// The primary CNI writes its config (a temporary file renamed over).
  void primaryWrites(const std::string& name, const json& content) {
    ASSERT_TRUE(writeTextFile(conf("." + name + ".tmp"), content.dump(2)));
    ASSERT_EQ(::rename(conf("." + name + ".tmp").c_str(), conf(name).c_str()), 0);
  }
  /// The bridge plugin alone, as a single-plugin .conf.
  json bridgeConf() const {
    json list = bridgeConflist(net_);
    json c = list["plugins"][0];
    c["cniVersion"] = list["cniVersion"];
    c["name"] = list["name"];
    return c;
  }

  CommandResult sluiceCni(const std::string& verb, const std::string& confDir, std::vector<std::string> extra) {
    std::vector<std::string> argv = {builtBinary("sluice-cni"), verb, "--cni-conf-dir", confDir, "--cni-bin-dir",
                                     net_.binDir};
    if (verb == "install") argv.insert(argv.end(), {"--agent-socket", socket()});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return runCommand(argv);
  }

  void startAgent(const std::string& confDir, const std::vector<std::string>& layout) {
    std::vector<std::string> extra = {"--cni-conf-dir", confDir, "--cni-agent-socket", socket()};
    extra.insert(extra.end(), layout.begin(), layout.end());
    auto a = AgentProcess::start(bpffs_.root(), extra, socket(), node_.path());
    ASSERT_TRUE(a.ok()) << a.error().message;
    agent_ = std::move(*a);
    const std::string watching = "watching " + confDir + " to keep sluice-cni in the primary CNI configuration";
    ASSERT_TRUE(eventually([&] { return agent_->log().find(watching) != std::string::npos; }, 5s)) << agent_->log();
  }

  /// The runtime's pick from net.d, its file name in @p file.
  json runtimePick(std::string* file = nullptr) {
    auto list = runtimeNetwork(net_.confDir, file);
    EXPECT_TRUE(list.ok()) << list.error().message;
    return list.ok() ? *list : json();
  }

  /// ADD of the runtime's pick; the pod must come out enrolled with its
  /// address. Returns the chain's result.
  json addAndExpectEnrolled(const json& list) {
    CniRuntime rt(node_, net_.binDir, work_.path());
    auto add = rt.add(list, params_);
    EXPECT_TRUE(add.ok) << add.describe();
    EXPECT_EQ(add.runs.back().type, "sluice-cni") << list;
    expectEnrolled();
    return add.result;
  }

  void expectEnrolled() {
    auto c = agent_->client();
    ASSERT_TRUE(c.ok()) << c.error().message;
    auto pods = c->listPods();
    ASSERT_TRUE(pods.ok()) << pods.error().message;
    ASSERT_EQ(pods->size(), 1u) << agent_->log();
    EXPECT_EQ((*pods)[0].id, cni::podIdForContainer(params_.containerId));
    EXPECT_EQ((*pods)[0].netnsPath, pod_.path());
    EXPECT_EQ((*pods)[0].ips, std::vector<std::string>{podIp()});
  }

  TestBpffs bpffs_;
  TempDir work_{"cniconf"};
  TestNetns node_{"cfgnode"};
  TestNetns pod_{"cfgpod"};
  std::unique_ptr<AgentProcess> agent_;
  BridgeNetwork net_;
  CniParams params_;
};

// --cni-owned-conflist: the runtime's pick is sluice's own file (the
// primary's plugins then sluice-cni) and a pod started through it is
// enrolled; the primary rewriting its file is followed by the agent; the
// uninstall deletes the owned file and leaves the primary's byte for byte.
TEST_F(CniConf, OwnedConflistEnrollsFollowsThePrimaryAndUninstallLeavesItUntouched) {
  json primary = bridgeConflist(net_);
  primaryWrites("10-test.conflist", primary);
  auto inst = sluiceCni("install", net_.confDir, {"--cni-owned-conflist"});
  ASSERT_EQ(inst.exitCode, 0) << inst.describe();
  std::string picked;
  json list = runtimePick(&picked);
  EXPECT_EQ(picked, "02-sluice-cni.conflist");
  EXPECT_EQ(json::parse(readTextFile(conf("10-test.conflist"))), primary) << "the primary's file was written";
  startAgent(net_.confDir, {"--cni-owned-conflist"});
  auto result = addAndExpectEnrolled(list);
  EXPECT_EQ(result["ips"][0]["address"], podIp() + "/24") << result;

  // The primary rewrites its file (a larger MTU): the owned file follows.
  primary["plugins"][0]["mtu"] = 1400;
  const auto t0 = std::chrono::steady_clock::now();
  primaryWrites("10-test.conflist", primary);
  ASSERT_TRUE(eventually([&] { return runtimePick()["plugins"][0] == primary["plugins"][0]; }, 10s))
      << readTextFile(conf("02-sluice-cni.conflist")) << agent_->log();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ measure ] the owned conflist followed the primary's rewrite within " << ms << " ms\n";
  RecordProperty("owned_follow_ms", std::to_string(ms));
  list = runtimePick(&picked);
  EXPECT_EQ(picked, "02-sluice-cni.conflist");
  ASSERT_EQ(list["plugins"].size(), 2u) << list;
  EXPECT_EQ(list["plugins"][1]["type"], "sluice-cni");
  EXPECT_NE(agent_->log().find("rewrote " + conf("02-sluice-cni.conflist") + " from " + conf("10-test.conflist")),
            std::string::npos)
      << agent_->log();

  // Uninstall (the agent first, or it would write the file again).
  const std::string primaryBytes = readTextFile(conf("10-test.conflist"));
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  agent_.reset();
  auto un = sluiceCni("uninstall", net_.confDir, {});
  ASSERT_EQ(un.exitCode, 0) << un.describe();
  EXPECT_NE(un.out.find("removed " + conf("02-sluice-cni.conflist")), std::string::npos) << un.out;
  EXPECT_EQ(readTextFile(conf("10-test.conflist")), primaryBytes);
  EXPECT_FALSE(fs::exists(conf("02-sluice-cni.conflist")));
  runtimePick(&picked);
  EXPECT_EQ(picked, "10-test.conflist");
  EXPECT_FALSE(fs::exists(net_.binDir + "/sluice-cni"));
}

// A single-plugin .conf primary becomes a .conflist of that plugin then
// sluice-cni; the runtime's pick is that conflist and the pod is enrolled.
TEST_F(CniConf, SinglePluginConfIsConvertedAndEnrolls) {
  primaryWrites("10-test.conf", bridgeConf());
  auto inst = sluiceCni("install", net_.confDir, {});
  ASSERT_EQ(inst.exitCode, 0) << inst.describe();
  EXPECT_NE(inst.out.find("converted " + conf("10-test.conf") + " to " + conf("10-test.conflist")), std::string::npos)
      << inst.out;
  std::string picked;
  json list = runtimePick(&picked);
  EXPECT_EQ(picked, "10-test.conflist");
  EXPECT_EQ(list["name"], net_.name) << "the network's name (host-local's leases) is kept";
  startAgent(net_.confDir, {});
  addAndExpectEnrolled(list);
  // The primary writes its .conf again: converted again by the agent.
  primaryWrites("10-test.conf", bridgeConf());
  EXPECT_TRUE(eventually([&] { return !fs::exists(conf("10-test.conf")); }, 10s)) << agent_->log();
  list = runtimePick(&picked);
  EXPECT_EQ(picked, "10-test.conflist");
  EXPECT_EQ(list["plugins"].back()["type"], "sluice-cni") << list;
}

// --cni-conf-name: the named file is chained, not the lexically first (a
// Multus-style 00-multus.conf stays as it is); the runtime loading that
// file (Multus' delegate) enrolls the pod.
TEST_F(CniConf, ConfNameChainsIntoTheNamedFile) {
  const json multus = {{"cniVersion", "0.3.1"}, {"name", "multus-cni-network"}, {"type", "multus"}};
  primaryWrites("00-multus.conf", multus);
  primaryWrites("10-test.conflist", bridgeConflist(net_));
  auto inst = sluiceCni("install", net_.confDir, {"--cni-conf-name", "10-test.conflist"});
  ASSERT_EQ(inst.exitCode, 0) << inst.describe();
  EXPECT_EQ(json::parse(readTextFile(conf("00-multus.conf"))), multus);
  json list = json::parse(readTextFile(conf("10-test.conflist")));
  startAgent(net_.confDir, {"--cni-conf-name", "10-test.conflist"});
  EXPECT_EQ(agent_->log().find("put sluice-cni back"), std::string::npos) << agent_->log();
  addAndExpectEnrolled(list);
  EXPECT_EQ(json::parse(readTextFile(conf("00-multus.conf"))), multus);
}

// The init step waits for the primary: a line says so, the file appears,
// install completes and a pod is enrolled. With a timeout and no file:
// one line, exit 1, nothing written.
TEST_F(CniConf, InstallWaitsForThePrimaryConfig) {
  const std::string out = work_.file("install.out");
  ASSERT_TRUE(writeTextFile(work_.file(".primary"), bridgeConflist(net_).dump(2)));
  // install in the background; the primary CNI writes its file once the
  // waiting line is out.
  std::string install;
  for (const std::string& a : {builtBinary("sluice-cni"), std::string("install"), std::string("--cni-conf-dir"),
                               net_.confDir, std::string("--cni-bin-dir"), net_.binDir, std::string("--agent-socket"),
                               socket(), std::string("--wait-timeout"), std::string("60")})
    install += shellQuote(a) + " ";
  auto r = sh(install + "> " + shellQuote(out) + " 2>&1 & pid=$!; until grep -q waiting " + shellQuote(out) +
              "; do kill -0 $pid || break; sleep 0.02; done; mv " + shellQuote(work_.file(".primary")) + " " +
              shellQuote(conf("10-test.conflist")) + "; wait $pid");
  ASSERT_EQ(r.exitCode, 0) << r.describe() << readTextFile(out);
  const std::string log = readTextFile(out);
  EXPECT_NE(log.find("waiting for the primary CNI to write a CNI network configuration in " + net_.confDir +
                     " (up to 60 s)\n" + conf("10-test.conflist") + " appeared after "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("added sluice-cni to " + conf("10-test.conflist")), std::string::npos) << log;
  startAgent(net_.confDir, {});
  addAndExpectEnrolled(runtimePick());

  TempDir empty("cniconf-empty");
  TempDir bin("cniconf-bin");
  auto timedOut = runCommand({builtBinary("sluice-cni"), "install", "--cni-conf-dir", empty.path(), "--cni-bin-dir",
                              bin.path(), "--wait-timeout", "1"});
  EXPECT_EQ(timedOut.exitCode, 1) << timedOut.describe();
  EXPECT_EQ(timedOut.err, "sluice-cni install: the primary CNI did not write a CNI network configuration in " +
                              empty.path() + " within 1 s (--wait-timeout); nothing written\n");
  EXPECT_TRUE(fs::is_empty(empty.path()));
  EXPECT_TRUE(fs::is_empty(bin.path()));
}

// --cni-unchained (Multus, OpenShift): the cluster network (bridge) is the
// runtime's pick as it was; Multus then runs the additional network
// "sluice-cni" from its own dir, standalone, without prevResult: the pod
// is enrolled with the address the agent finds in its netns, the result
// has no interfaces. DEL as Multus runs it, then the cluster network's.
TEST_F(CniConf, UnchainedStandaloneConfigEnrollsWithoutPrevResult) {
  const json primary = bridgeConflist(net_);
  primaryWrites("10-test.conflist", primary);
  const std::string multusDir = work_.file("multus.d");
  auto inst = sluiceCni("install", multusDir, {"--cni-unchained"});
  ASSERT_EQ(inst.exitCode, 0) << inst.describe();
  EXPECT_EQ(json::parse(readTextFile(conf("10-test.conflist"))), primary);
  startAgent(multusDir, {"--cni-unchained"});

  CniRuntime rt(node_, net_.binDir, work_.path());
  json cluster = runtimePick();
  auto add = rt.add(cluster, params_);
  ASSERT_TRUE(add.ok) << add.describe();
  ASSERT_EQ(add.runs.size(), 1u) << "the cluster network has no sluice-cni";
  // Multus' delegate: the standalone config as it is, on another ifname.
  CniParams extra = params_;
  extra.ifname = "net1";
  const std::string standalone = readTextFile(multusDir + "/sluice-cni.conf");
  auto r = rt.invoke(rt.pluginPath("sluice-cni"), "ADD", extra, standalone);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(json::parse(r.out), json({{"cniVersion", "0.3.1"}})) << r.out;
  expectEnrolled();

  auto del = rt.invoke(rt.pluginPath("sluice-cni"), "DEL", extra, standalone);
  ASSERT_EQ(del.exitCode, 0) << del.describe();
  auto pods = agent_->client()->listPods();
  ASSERT_TRUE(pods.ok());
  EXPECT_TRUE(pods->empty());
  EXPECT_TRUE(rt.checkOrDel(cluster, params_, "DEL", add.result).ok);

  // Chained configs without prevResult are still refused (code 7).
  json chainedConf = json::parse(standalone);
  chainedConf.erase("chained");
  r = rt.invoke(rt.pluginPath("sluice-cni"), "ADD", extra, chainedConf.dump());
  EXPECT_NE(r.exitCode, 0);
  EXPECT_EQ(json::parse(r.out)["code"], cni::kCniInvalidConfig) << r.out;

  // Uninstall deletes the standalone config, leaves the cluster network.
  ASSERT_EQ(agent_->stop(SIGTERM), 0) << agent_->log();
  agent_.reset();
  auto un = sluiceCni("uninstall", multusDir, {});
  ASSERT_EQ(un.exitCode, 0) << un.describe();
  EXPECT_TRUE(fs::is_empty(multusDir));
  EXPECT_EQ(json::parse(readTextFile(conf("10-test.conflist"))), primary);
}

}  // namespace
}  // namespace sluice::test
