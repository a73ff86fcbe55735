// `sluice-cni install` / `uninstall` on temporary directories: where the
// entry goes, idempotence, atomic writes, refusals, and that the result is
// a conflist a runtime would load.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <filesystem>
#include <sstream>

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

TEST_F(CniInstall, RefusesASinglePluginConfAndChangesNothing) {
  const std::string single = R"({"cniVersion":"1.0.0","name":"n","type":"bridge"})";
  ASSERT_TRUE(writeTextFile(conf_.file("10-bridge.conf"), single));
  ASSERT_TRUE(writeTextFile(conf_.file("20-later.conflist"), kBridgeConflist));
  auto r = install(opts_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_NE(r.error().message.find(conf_.file("10-bridge.conf") + " is a single-plugin file"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(readTextFile(conf_.file("10-bridge.conf")), single);
  EXPECT_EQ(conflist("20-later.conflist")["plugins"].size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(bin_.file("sluice-cni")));
}

TEST_F(CniInstall, ReadableErrors) {
  // No config yet.
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

TEST(CniInstallPure, WithoutSluiceLeavesOthersAlone) {
  bool removed = true;
  auto j = withoutSluice(json::parse(kBridgeConflist), removed);
  EXPECT_FALSE(removed);
  EXPECT_EQ(j, json::parse(kBridgeConflist));
}

}  // namespace
}  // namespace sluice::cni
