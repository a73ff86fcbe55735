// `sluice-cni install` / `uninstall` on temporary directories: where the
// entry goes, idempotence, atomic writes, refusals, and that the result is
// a conflist a runtime would load.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <sstream>
#include <thread>

#include "test/common/tempdir.h"
#include "userspace/cni/install.h"

namespace sluice::cni {
namespace {

using nlohmann::json;
using test::readTextFile;
using test::TempDir;
using test::writeTextFile;

// What a bridge-based node (kind, containerd's example config) ships.
const char* kBridgeConflist = R"({
  "cniVersion": "1.0.0",
  "name": "containerd-net",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
})";

class CniInstall : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(conf_.path().empty());
    ASSERT_FALSE(bin_.path().empty());
    ASSERT_TRUE(writeTextFile(src_.file("sluice-cni-build"), "#!binary bytes\n"));
    opts_.confDir = conf_.path();
    opts_.binDir = bin_.path();
    opts_.binary = src_.file("sluice-cni-build");
    opts_.agentSocket = "/var/run/sluice/agent.sock";
  }
  json conflist(const std::string& name) const { return json::parse(readTextFile(conf_.file(name))); }
  std::vector<std::string> confDirEntries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(conf_.path())) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir conf_{"cni-conf"};
  TempDir bin_{"cni-bin"};
  TempDir src_{"cni-src"};
  InstallOptions opts_;
};

TEST_F(CniInstall, AppendsToThePrimaryConflistAndCopiesTheBinary) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-containerd-net.conflist"), kBridgeConflist));
  auto r = install(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->size(), 2u);

  // What a runtime loads: same version and name, the original plugins in
  // order with their settings, sluice-cni last.
  auto j = conflist("10-containerd-net.conflist");
  EXPECT_EQ(j["cniVersion"], "1.0.0");
  EXPECT_EQ(j["name"], "containerd-net");
  ASSERT_EQ(j["plugins"].size(), 3u) << j;
  EXPECT_EQ(j["plugins"][0], json::parse(kBridgeConflist)["plugins"][0]);
  EXPECT_EQ(j["plugins"][1]["type"], "portmap");
  EXPECT_EQ(j["plugins"][2], json({{"type", "sluice-cni"}, {"agentSocket", "/var/run/sluice/agent.sock"}}));
  for (const auto& p : j["plugins"]) EXPECT_TRUE(p["type"].is_string()) << p;
  // Key order of the operator's file is kept.
  EXPECT_EQ(readTextFile(conf_.file("10-containerd-net.conflist")).find("\"cniVersion\""), 4u);

  EXPECT_EQ(readTextFile(bin_.file("sluice-cni")), "#!binary bytes\n");
  struct stat st {};
  ASSERT_EQ(::stat(bin_.file("sluice-cni").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  // No temporary file left beside the config.
  EXPECT_EQ(confDirEntries(), std::vector<std::string>{"10-containerd-net.conflist"});
}

TEST_F(CniInstall, IsIdempotentAndUpdatesTheSocket) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), kBridgeConflist));
  ASSERT_TRUE(install(opts_).ok());
  const std::string once = readTextFile(conf_.file("10-net.conflist"));
  auto again = install(opts_);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(readTextFile(conf_.file("10-net.conflist")), once);
  EXPECT_NE(again->back().find("already last"), std::string::npos) << again->back();

  opts_.agentSocket = "/run/other/agent.sock";
  ASSERT_TRUE(install(opts_).ok());
  auto j = conflist("10-net.conflist");
  ASSERT_EQ(j["plugins"].size(), 3u) << j;
  EXPECT_EQ(j["plugins"][2]["agentSocket"], "/run/other/agent.sock");
}

TEST_F(CniInstall, MovesAnEarlierEntryToTheEnd) {
  auto j = json::parse(kBridgeConflist);
  j["plugins"].insert(j["plugins"].begin() + 1, json{{"type", "sluice-cni"}});
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), j.dump()));
  ASSERT_TRUE(install(opts_).ok());
  auto after = conflist("10-net.conflist");
  ASSERT_EQ(after["plugins"].size(), 3u) << after;
  EXPECT_EQ(after["plugins"][0]["type"], "bridge");
  EXPECT_EQ(after["plugins"][1]["type"], "portmap");
  EXPECT_EQ(after["plugins"][2]["type"], "sluice-cni");
}

TEST_F(CniInstall, OnlyTheLexicallyFirstConfigIsTouched) {
  ASSERT_TRUE(writeTextFile(conf_.file("05-cilium.conflist"), kBridgeConflist));
  ASSERT_TRUE(writeTextFile(conf_.file("10-other.conflist"), kBridgeConflist));
  ASSERT_TRUE(writeTextFile(conf_.file("README"), "not a config"));
  ASSERT_TRUE(install(opts_).ok());
  EXPECT_EQ(conflist("05-cilium.conflist")["plugins"].size(), 3u);
  EXPECT_EQ(conflist("10-other.conflist")["plugins"].size(), 2u);
}

// Istio's insertCNIConfig: a single-plugin .conf becomes a .conflist of
// that plugin then sluice-cni, in its place (its own version and name kept).
TEST_F(CniInstall, ConvertsASinglePluginConfIntoAConflist) {
  const std::string single =
      R"({"cniVersion":"0.4.0","name":"mynet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}})";
  ASSERT_TRUE(writeTextFile(conf_.file("10-bridge.conf"), single));
  ASSERT_TRUE(writeTextFile(conf_.file("20-later.conflist"), kBridgeConflist));
  auto r = install(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->back(), "converted " + conf_.file("10-bridge.conf") + " to " + conf_.file("10-bridge.conflist") +
                           " with sluice-cni added");
  EXPECT_EQ(confDirEntries(), (std::vector<std::string>{"10-bridge.conflist", "20-later.conflist"}));
  auto j = conflist("10-bridge.conflist");
  EXPECT_EQ(j["cniVersion"], "0.4.0");
  EXPECT_EQ(j["name"], "mynet");
  ASSERT_EQ(j["plugins"].size(), 2u) << j;
  EXPECT_EQ(j["plugins"][0], json::parse(R"({"type":"bridge","bridge":"cni0","ipam":{"type":"host-local"}})"));
  EXPECT_EQ(j["plugins"][1]["type"], "sluice-cni");
  EXPECT_EQ(conflist("20-later.conflist")["plugins"].size(), 2u);
  // Again: nothing changes.
  const std::string once = readTextFile(conf_.file("10-bridge.conflist"));
  ASSERT_TRUE(install(opts_).ok());
  EXPECT_EQ(readTextFile(conf_.file("10-bridge.conflist")), once);
  // The primary writes its .conf again: converted again, over our .conflist.
  ASSERT_TRUE(writeTextFile(conf_.file("10-bridge.conf"), single));
  ASSERT_TRUE(install(opts_).ok());
  EXPECT_EQ(confDirEntries(), (std::vector<std::string>{"10-bridge.conflist", "20-later.conflist"}));
  EXPECT_EQ(readTextFile(conf_.file("10-bridge.conflist")), once);
  // Uninstall leaves a one-plugin conflist: the network a runtime loads
  // from the .conf.
  ASSERT_TRUE(uninstall(opts_).ok());
  j = conflist("10-bridge.conflist");
  ASSERT_EQ(j["plugins"].size(), 1u) << j;
  EXPECT_EQ(j["plugins"][0]["type"], "bridge");
}

// Converting must not hand the runtime another network, nor overwrite a
// .conflist that is not sluice-cni's: refused, nothing written.
TEST_F(CniInstall, RefusesAConversionThatWouldChangeTheNetwork) {
  const std::string single = R"({"cniVersion":"1.0.0","name":"n","type":"bridge"})";
  ASSERT_TRUE(writeTextFile(conf_.file("10-bridge.conf"), single));
  ASSERT_TRUE(writeTextFile(conf_.file("10-bridge.conflist"), kBridgeConflist));
  auto r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "converting " + conf_.file("10-bridge.conf") + " would overwrite " +
                                   conf_.file("10-bridge.conflist") +
                                   ", which is not sluice-cni's (it has no sluice-cni entry)");
  EXPECT_EQ(readTextFile(conf_.file("10-bridge.conf")), single);
  EXPECT_EQ(readTextFile(conf_.file("10-bridge.conflist")), kBridgeConflist);
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));

  std::filesystem::remove(conf_.file("10-bridge.conflist"));
  ASSERT_TRUE(writeTextFile(conf_.file("10-bridge.conf-b.conf"), single));  // sorts between .conf and .conflist
  r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("would let 10-bridge.conf-b.conf sort first"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(confDirEntries(), (std::vector<std::string>{"10-bridge.conf", "10-bridge.conf-b.conf"}));
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));
}

// --cni-conf-name (Istio's CNI_CONF_NAME): that file, not the first.
TEST_F(CniInstall, ConfNameChainsIntoTheNamedFile) {
  ASSERT_TRUE(writeTextFile(conf_.file("00-multus.conf"), R"({"cniVersion":"0.3.1","name":"multus","type":"multus"})"));
  ASSERT_TRUE(writeTextFile(conf_.file("10-calico.conflist"), kBridgeConflist));
  opts_.mode.confName = "10-calico.conflist";
  ASSERT_TRUE(install(opts_).ok());
  EXPECT_EQ(conflist("10-calico.conflist")["plugins"].size(), 3u);
  EXPECT_EQ(readTextFile(conf_.file("00-multus.conf")), R"({"cniVersion":"0.3.1","name":"multus","type":"multus"})");
  // Named .conf, written as .conflist: its twin is used (as Istio does).
  opts_.mode.confName = "10-calico.conf";
  auto r = install(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->back(), "sluice-cni already last in " + conf_.file("10-calico.conflist"));
  // Not there, no waiting: one line naming it.
  opts_.mode.confName = "20-absent.conflist";
  opts_.waitTimeout = std::chrono::seconds(0);
  r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_EQ(r.error().message, "the primary CNI configuration " + conf_.file("20-absent.conflist") +
                                   " (--cni-conf-name) is not there yet");
}

// --cni-owned-conflist (Istio's istioOwnedCNIConfig): sluice's own file,
// first in order, the primary's plugins then sluice-cni; the primary's
// file never written; uninstall deletes the owned file alone.
TEST_F(CniInstall, OwnedConflistLeavesThePrimaryUntouched) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-calico.conflist"), kBridgeConflist));
  ::chmod(conf_.file("10-calico.conflist").c_str(), 0600);
  opts_.mode.owned = true;
  auto r = install(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->back(), "wrote " + conf_.file("02-sluice-cni.conflist") + ": the plugins of " +
                           conf_.file("10-calico.conflist") + " then sluice-cni (" + conf_.file("10-calico.conflist") +
                           " untouched)");
  EXPECT_EQ(readTextFile(conf_.file("10-calico.conflist")), kBridgeConflist);
  auto j = conflist("02-sluice-cni.conflist");
  auto primary = json::parse(kBridgeConflist);
  EXPECT_EQ(j["cniVersion"], primary["cniVersion"]);
  EXPECT_EQ(j["name"], primary["name"]);
  ASSERT_EQ(j["plugins"].size(), 3u) << j;
  EXPECT_EQ(j["plugins"][0], primary["plugins"][0]);
  EXPECT_EQ(j["plugins"][1], primary["plugins"][1]);
  EXPECT_EQ(j["plugins"][2]["type"], "sluice-cni");
  struct stat st {};
  ASSERT_EQ(::stat(conf_.file("02-sluice-cni.conflist").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the primary's mode";
  // Idempotent.
  r = install(opts_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->back(), conf_.file("02-sluice-cni.conflist") + " already as it should be");
  // The primary changes: a new install follows it.
  primary["plugins"].push_back({{"type", "tuning"}});
  ASSERT_TRUE(writeTextFile(conf_.file("10-calico.conflist"), primary.dump()));
  ASSERT_TRUE(install(opts_).ok());
  j = conflist("02-sluice-cni.conflist");
  ASSERT_EQ(j["plugins"].size(), 4u) << j;
  EXPECT_EQ(j["plugins"][2]["type"], "tuning");

  // Uninstall: the owned file goes, the primary stays byte for byte.
  const std::string before = readTextFile(conf_.file("10-calico.conflist"));
  r = uninstall(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->front(), "removed " + conf_.file("02-sluice-cni.conflist"));
  EXPECT_EQ(confDirEntries(), std::vector<std::string>{"10-calico.conflist"});
  EXPECT_EQ(readTextFile(conf_.file("10-calico.conflist")), before);
}

TEST_F(CniInstall, OwnedConflistFromAConfAndItsOrder) {
  const std::string single = R"({"cniVersion":"1.0.0","name":"flannel","type":"flannel","delegate":{"isDefaultGateway":true}})";
  ASSERT_TRUE(writeTextFile(conf_.file("10-flannel.conf"), single));
  opts_.mode.owned = true;
  opts_.mode.ownedName = "01-mine.conflist";
  ASSERT_TRUE(install(opts_).ok());
  EXPECT_EQ(readTextFile(conf_.file("10-flannel.conf")), single);
  auto j = conflist("01-mine.conflist");
  ASSERT_EQ(j["plugins"].size(), 2u) << j;
  EXPECT_EQ(j["name"], "flannel");
  EXPECT_EQ(j["plugins"][0]["type"], "flannel");
  ASSERT_TRUE(uninstall(opts_).ok());
  EXPECT_EQ(confDirEntries(), std::vector<std::string>{"10-flannel.conf"});

  // Something sorts before the owned file: the runtime would skip
  // sluice-cni. Refused, nothing written.
  ASSERT_TRUE(writeTextFile(conf_.file("00-multus.conf"), R"({"cniVersion":"0.3.1","name":"multus","type":"multus"})"));
  auto r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, conf_.file("00-multus.conf") +
                                   " sorts before the owned conflist 01-mine.conflist: the runtime would use it and start "
                                   "pods without sluice-cni (choose a --cni-owned-conflist-name that sorts first)");
  EXPECT_EQ(confDirEntries(), (std::vector<std::string>{"00-multus.conf", "10-flannel.conf"}));
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));
}

// --cni-unchained (Istio's chained: false): a standalone config, nothing
// else touched; uninstall deletes it (found by its type).
TEST_F(CniInstall, UnchainedWritesAStandaloneConfig) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), kBridgeConflist));
  opts_.mode.chained = false;
  auto r = install(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->back(), "wrote the standalone network config " + conf_.file("sluice-cni.conf") +
                           " (sluice-cni alone, unchained)");
  EXPECT_EQ(readTextFile(conf_.file("10-net.conflist")), kBridgeConflist);
  EXPECT_EQ(conflist("sluice-cni.conf"), json::parse(R"({"cniVersion":"0.3.1","name":"sluice-cni","type":"sluice-cni",
                                                         "agentSocket":"/var/run/sluice/agent.sock","chained":false})"));
  opts_.mode.confName = "istio-like.conf";
  ASSERT_TRUE(install(opts_).ok());
  EXPECT_TRUE(std::filesystem::exists(conf_.file("istio-like.conf")));
  InstallOptions plain = opts_;
  plain.mode = ConfMode{};
  r = uninstall(plain);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(confDirEntries(), std::vector<std::string>{"10-net.conflist"});
  EXPECT_EQ(readTextFile(conf_.file("10-net.conflist")), kBridgeConflist);
}

// The init step waits for the primary (Istio's getCNIConfigFilepath):
// a line says so; the file appears and install completes; with a timeout
// and no file, one line and nothing written.
TEST_F(CniInstall, WaitsForThePrimaryConfig) {
  std::vector<std::string> lines;
  opts_.progress = [&](const std::string& l) { lines.push_back(l); };
  std::thread primaryCni([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    writeTextFile(conf_.file(".10-net.conflist.tmp"), kBridgeConflist);
    std::filesystem::rename(conf_.file(".10-net.conflist.tmp"), conf_.file("10-net.conflist"));
  });
  auto r = install(opts_);
  primaryCni.join();
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "waiting for the primary CNI to write a CNI network configuration in " + conf_.path());
  EXPECT_EQ(lines[1].rfind(conf_.file("10-net.conflist") + " appeared after ", 0), 0u) << lines[1];
  EXPECT_EQ(conflist("10-net.conflist")["plugins"].size(), 3u);

  TempDir empty("cni-empty");
  opts_.confDir = empty.path();
  std::filesystem::remove(bin_.file("sluice-cni"));
  opts_.waitTimeout = std::chrono::seconds(1);
  lines.clear();
  r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ETIMEDOUT);
  EXPECT_EQ(r.error().message, "the primary CNI did not write a CNI network configuration in " + empty.path() +
                                   " within 1 s (--wait-timeout); nothing written");
  EXPECT_EQ(lines, std::vector<std::string>{"waiting for the primary CNI to write a CNI network configuration in " +
                                            empty.path() + " (up to 1 s)"});
  EXPECT_TRUE(std::filesystem::is_empty(empty.path()));
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));
}

TEST_F(CniInstall, ReadableErrors) {
  // No config yet (and no waiting).
  opts_.waitTimeout = std::chrono::seconds(0);
  auto r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_NE(r.error().message.find("no CNI network configuration in " + conf_.path()), std::string::npos)
      << r.error().message;
  // Broken JSON, no plugins, a plugin without type, nothing to chain after.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"cniVersion\":", "is not valid JSON"},
      {R"({"cniVersion":"1.0.0","name":"n"})", "has no \"plugins\" array"},
      {R"({"cniVersion":"1.0.0","name":"n","plugins":[{"bridge":"x"}]})", "plugin without \"type\""},
      {R"({"cniVersion":"1.0.0","plugins":[{"type":"bridge"}]})", "has no \"name\""},
      {R"({"cniVersion":"1.0.0","name":"n","plugins":[]})", "no plugins before sluice-cni"},
  };
  for (const auto& [text, msg] : bad) {
    ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), text));
    auto e = install(opts_);
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_NE(e.error().message.find(msg), std::string::npos) << text << ": " << e.error().message;
    EXPECT_EQ(readTextFile(conf_.file("10-net.conflist")), text);
  }
  // Directories that are not there.
  opts_.binDir = bin_.file("missing");
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), kBridgeConflist));
  r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "--cni-bin-dir " + bin_.file("missing") + " is not a directory");
}

TEST_F(CniInstall, UninstallRestoresTheChainAndIsIdempotent) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), kBridgeConflist));
  ASSERT_TRUE(install(opts_).ok());
  auto r = uninstall(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(conflist("10-net.conflist"), json::parse(kBridgeConflist));
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));
  r = uninstall(opts_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_NE(r->front().find("was not installed"), std::string::npos) << r->front();
  EXPECT_EQ(confDirEntries(), std::vector<std::string>{"10-net.conflist"});
}

TEST_F(CniInstall, CommandLine) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), kBridgeConflist));
  std::ostringstream out, err;
  EXPECT_EQ(installMain({"install", "--cni-conf-dir", conf_.path(), "--cni-bin-dir", bin_.path(), "--agent-socket",
                         "/run/s.sock", "--binary", opts_.binary},
                        out, err),
            0)
      << err.str();
  EXPECT_NE(out.str().find("added sluice-cni to " + conf_.file("10-net.conflist")), std::string::npos) << out.str();
  EXPECT_EQ(conflist("10-net.conflist")["plugins"][2]["agentSocket"], "/run/s.sock");

  err.str("");
  EXPECT_EQ(installMain({"install", "--cni-conf-dir", conf_.path()}, out, err), 2);
  EXPECT_NE(err.str().find("--cni-bin-dir is required"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(installMain({"uninstall", "--cni-conf-dir", conf_.path(), "--cni-bin-dir", bin_.path(), "--agent-socket",
                         "/x"},
                        out, err),
            2);
  EXPECT_NE(err.str().find("unknown argument '--agent-socket'"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(installMain({"install", "--cni-conf-dir", conf_.path(), "--cni-bin-dir", bin_.path(), "--agent-socket",
                         "relative.sock"},
                        out, err),
            2);
  EXPECT_NE(err.str().find("absolute path"), std::string::npos) << err.str();

  out.str("");
  EXPECT_EQ(installMain({"uninstall", "--cni-conf-dir", conf_.path(), "--cni-bin-dir", bin_.path()}, out, err), 0);
  EXPECT_NE(out.str().find("removed sluice-cni from"), std::string::npos) << out.str();
}

// Every bad argument: exit 2, one line naming it, nothing written.
TEST_F(CniInstall, ArgumentErrorsWriteNothing) {
  ASSERT_TRUE(writeTextFile(conf_.file("10-net.conflist"), kBridgeConflist));
  const std::vector<std::string> base = {"--cni-conf-dir", conf_.path(), "--cni-bin-dir", bin_.path(), "--binary",
                                         opts_.binary};
  struct Case {
    std::vector<std::string> extra;
    std::string error;
  } cases[] = {
      {{"--cni-conf-name", "../10-net.conflist"}, "--cni-conf-name must be a file name in the CNI conf dir, not '../10-net.conflist'"},
      {{"--cni-conf-name", "net.yaml"}, "--cni-conf-name 'net.yaml' must end in .conf, .conflist or .json"},
      {{"--cni-conf-name"}, "--cni-conf-name needs a value"},
      {{"--cni-owned-conflist-name", "02-sluice.conf"}, "--cni-owned-conflist-name '02-sluice.conf' must end in .conflist"},
      {{"--cni-owned-conflist-name", ".hidden.conflist"},
       "--cni-owned-conflist-name must be a file name in the CNI conf dir, not '.hidden.conflist'"},
      {{"--cni-unchained", "--cni-owned-conflist"},
       "--cni-unchained and --cni-owned-conflist contradict each other (a standalone config has no primary plugins to copy)"},
      {{"--cni-unchained", "--cni-conf-name", "x.conflist"},
       "--cni-unchained writes a single-plugin config: --cni-conf-name must end in .conf or .json, not 'x.conflist'"},
      {{"--cni-owned-conflist", "--cni-conf-name", "02-sluice-cni.conflist"},
       "--cni-conf-name names the primary's file: it cannot be the owned conflist '02-sluice-cni.conflist'"},
      {{"--wait-timeout", "5s"}, "invalid --wait-timeout '5s' (expected whole seconds; 0: do not wait)"},
      {{"--cni-unchained", "--wait-timeout", "5"},
       "--wait-timeout: --cni-unchained waits for nothing (it writes its own config)"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"install"};
    args.insert(args.end(), base.begin(), base.end());
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    std::ostringstream out, err;
    EXPECT_EQ(installMain(args, out, err), 2) << c.error;
    EXPECT_EQ(err.str(), "sluice-cni install: " + c.error + " (see sluice-cni --help)\n");
    EXPECT_EQ(out.str(), "");
  }
  std::ostringstream out, err;
  EXPECT_EQ(installMain({"uninstall", "--cni-conf-dir", conf_.path(), "--cni-bin-dir", bin_.path(), "--wait-timeout", "3"},
                        out, err),
            2);
  EXPECT_EQ(err.str(), "sluice-cni uninstall: unknown argument '--wait-timeout' (see sluice-cni --help)\n");
  EXPECT_EQ(confDirEntries(), std::vector<std::string>{"10-net.conflist"});
  EXPECT_EQ(readTextFile(conf_.file("10-net.conflist")), kBridgeConflist);
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));
}

TEST(CniInstallPure, AsConflist) {
  auto list = json::parse(kBridgeConflist);
  auto same = asConflist(list, "f");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, list);
  // The plugin's keys in their order.
  auto conv = asConflist(nlohmann::ordered_json::parse(R"({"cniVersion":"0.3.1","name":"n","type":"ptp","mtu":1400})"), "f");
  ASSERT_TRUE(conv.ok()) << conv.error().message;
  EXPECT_EQ(conv->dump(), R"({"cniVersion":"0.3.1","name":"n","plugins":[{"type":"ptp","mtu":1400}]})");
  auto bad = asConflist(json::parse(R"({"cniVersion":"0.3.1","name":"n"})"), "/d/f.conf");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "/d/f.conf has neither \"plugins\" nor \"type\": not a CNI network configuration");
  bad = asConflist(json::parse(R"({"cniVersion":"0.3.1","type":"ptp"})"), "/d/f.conf");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "/d/f.conf has no \"name\": not a valid CNI network configuration");
}

TEST(CniInstallPure, WithoutSluiceLeavesOthersAlone) {
  bool removed = true;
  auto j = withoutSluice(json::parse(kBridgeConflist), removed);
  EXPECT_FALSE(removed);
  EXPECT_EQ(j, json::parse(kBridgeConflist));
}

}  // namespace
}  // namespace sluice::cni
