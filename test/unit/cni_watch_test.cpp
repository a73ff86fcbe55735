// Keeping sluice-cni in the chain (userspace/cni/watch.h): one check
// (ensureInChain) and the inotify watcher, on a throw-away config dir. No
// privileges. The agent's use of it (log line, metric) is tested with the
// real binary in test/netns/cni_watch_test.cpp.
//
//   TMP/net.d/10-primary.conflist   {"plugins": [bridge, (sluice-cni)]}
//     the "primary CNI" rewrites it  ──inotify──▶  watcher: sluice-cni back last
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "test/common/tempdir.h"
#include "userspace/agent/options.h"
#include "userspace/cni/watch.h"

namespace sluice::cni {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using test::readTextFile;
using test::TempDir;
using test::writeTextFile;

const json kPrimary = {{"cniVersion", "1.0.0"},
                       {"name", "k8s-pod-network"},
                       {"plugins", {{{"type", "bridge"}, {"bridge", "cni0"}}, {{"type", "portmap"}}}}};

bool sluiceIsLast(const std::string& text, const std::string& socket = "/run/sluice/agent.sock") {
  auto j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("plugins") || !j["plugins"].is_array() || j["plugins"].empty()) return false;
  const auto& last = j["plugins"].back();
  return last.value("type", "") == "sluice-cni" && last.value("agentSocket", "") == socket;
}

/// Writes @p content the way most CNIs do: a temporary file renamed over.
void writeAtomically(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp-writer";
  ASSERT_TRUE(writeTextFile(tmp, content));
  ASSERT_EQ(::rename(tmp.c_str(), path.c_str()), 0);
}

ino_t inodeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) n++;
  return n;
}

class CniWatch : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.file("net.d");
    ASSERT_TRUE(std::filesystem::create_directory(dir_));
    file_ = dir_ + "/10-primary.conflist";
  }
  void TearDown() override {
    if (watcher_) watcher_->stop();
  }

  void startWatcher(const ConfMode& mode = {}) {
    auto w = ConfWatcher::start({dir_, socket_, mode}, [this](const WatchEvent& e) {
      std::lock_guard<std::mutex> g(mu_);
      events_.push_back(e);
      cv_.notify_all();
    });
    ASSERT_TRUE(w.ok()) << w.error().message;
    watcher_ = std::move(*w);
  }

  /// Waits until @p n events arrived (generous bound: timing is measured,
  /// never asserted tightly).
  bool waitEvents(size_t n, std::chrono::seconds bound = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, bound, [&] { return events_.size() >= n; });
  }
  std::vector<WatchEvent> events() {
    std::lock_guard<std::mutex> g(mu_);
    return events_;
  }

  /// Polls the file until sluice-cni is last again; the time it took.
  std::optional<std::chrono::microseconds> waitRestored(Clock::time_point since) {
    while (Clock::now() - since < std::chrono::seconds(10)) {
      if (sluiceIsLast(readTextFile(file_), socket_))
        return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - since);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return std::nullopt;
  }

  TempDir tmp_{"cniwatch"};
  std::string dir_, file_;
  std::string socket_ = "/run/sluice/agent.sock";
  std::unique_ptr<ConfWatcher> watcher_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WatchEvent> events_;
};

TEST_F(CniWatch, EnsureInChainAppendsOnceAndOnlyWhenMissing) {
  // No config yet: nothing to join, nothing written.
  auto r = ensureInChain(dir_, socket_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(*r);
  EXPECT_EQ(entries(dir_), 0u);

  ASSERT_TRUE(writeTextFile(file_, kPrimary.dump(2)));
  r = ensureInChain(dir_, socket_);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(*r);
  EXPECT_EQ((*r)->file, file_);
  EXPECT_EQ((*r)->what, "put sluice-cni back at the end of the plugin chain in " + file_);
  json j = json::parse(readTextFile(file_));
  ASSERT_EQ(j["plugins"].size(), 3u) << j;
  EXPECT_EQ(j["plugins"][0]["type"], "bridge");
  EXPECT_EQ(j["plugins"][1]["type"], "portmap");
  EXPECT_TRUE(sluiceIsLast(j.dump(), socket_)) << j;

  // Already last: the file is not touched (same inode).
  ino_t before = inodeOf(file_);
  r = ensureInChain(dir_, socket_);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(inodeOf(file_), before);

  // Not last any more (a plugin appended after it), or another socket: fixed.
  j["plugins"].push_back({{"type", "tuning"}});
  ASSERT_TRUE(writeTextFile(file_, j.dump()));
  r = ensureInChain(dir_, socket_);
  ASSERT_TRUE(r.ok() && *r);
  j = json::parse(readTextFile(file_));
  ASSERT_EQ(j["plugins"].size(), 4u) << j;
  EXPECT_EQ(j["plugins"][2]["type"], "tuning");
  EXPECT_TRUE(sluiceIsLast(j.dump(), socket_)) << j;
  r = ensureInChain(dir_, "/other.sock");
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_TRUE(sluiceIsLast(readTextFile(file_), "/other.sock"));
  EXPECT_EQ(entries(dir_), 1u) << "no temporary file left";
}

// What cannot be judged is refused in one line naming the file, and the
// file is left exactly as it was.
TEST_F(CniWatch, EnsureInChainRefusesWhatItCannotReadAndWritesNothing) {
  struct Case {
    std::string name, content, error;
  } cases[] = {
      {"10-primary.conflist", "{\"cniVersion\": \"1.0.0\", \"name\": \"x\", \"plugins\": [",
       " is not valid JSON: "},
      {"10-primary.conflist", R"({"cniVersion":"1.0.0","name":"x"})", " has no \"plugins\" array: not a CNI conflist"},
      {"10-primary.conflist", R"({"cniVersion":"1.0.0","name":"x","plugins":[]})",
       " has no plugins before sluice-cni to chain after"},
      {"10-primary.conflist", R"({"cniVersion":"1.0.0","name":"x","plugins":[{"type":"sluice-cni"}]})",
       " has no plugins before sluice-cni to chain after"},
      {"05-single.conf", R"({"cniVersion":"1.0.0","name":"x"})",
       " has neither \"plugins\" nor \"type\": not a CNI network configuration"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.content);
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(std::filesystem::create_directory(dir_));
    std::string path = dir_ + "/" + c.name;
    ASSERT_TRUE(writeTextFile(path, c.content));
    auto r = ensureInChain(dir_, socket_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, EINVAL);
    EXPECT_NE(r.error().message.find(path + c.error), std::string::npos) << r.error().message;
    EXPECT_EQ(readTextFile(path), c.content);
    EXPECT_EQ(entries(dir_), 1u);
  }
}

// The watch: the primary CNI rewrites its conflist (atomically, then in
// place) and sluice-cni is back; a file it cannot read is reported once and
// left alone; once fixed, it is chained again. Prints the delays measured.
TEST_F(CniWatch, RewrittenConflistGetsSluiceBackAndBadOnesAreLeftAlone) {
  ASSERT_TRUE(writeTextFile(file_, kPrimary.dump(2)));
  startWatcher();
  // The first pass at start already chained it.
  ASSERT_TRUE(waitEvents(1));
  EXPECT_TRUE(events()[0].restored);
  EXPECT_EQ(events()[0].file, file_);
  EXPECT_EQ(events()[0].delay.count(), 0);
  EXPECT_TRUE(sluiceIsLast(readTextFile(file_), socket_));

  std::vector<double> ms;
  for (int round = 0; round < 6; round++) {
    auto t0 = Clock::now();
    if (round % 2 == 0) {
      writeAtomically(file_, kPrimary.dump(2));
    } else {
      ASSERT_TRUE(writeTextFile(file_, kPrimary.dump()));  // truncate + write in place
    }
    auto took = waitRestored(t0);
    ASSERT_TRUE(took) << "sluice-cni not back within 10 s (round " << round << "): " << readTextFile(file_);
    ms.push_back(took->count() / 1000.0);
    ASSERT_TRUE(waitEvents(2 + static_cast<size_t>(round)));
    WatchEvent e = events().back();
    EXPECT_TRUE(e.restored);
    EXPECT_EQ(e.file, file_);
    EXPECT_NE(e.message.find("put sluice-cni back at the end of the plugin chain in " + file_ +
                             " (it was rewritten without it; "),
              std::string::npos)
        << e.message;
    json j = json::parse(readTextFile(file_));
    ASSERT_EQ(j["plugins"].size(), 3u) << j;
    EXPECT_EQ(j["plugins"][0], kPrimary["plugins"][0]);
    EXPECT_EQ(j["plugins"][1], kPrimary["plugins"][1]);
  }
  std::sort(ms.begin(), ms.end());
  std::cout << "[ measure ] conflist restore delay over " << ms.size() << " rewrites: min " << ms.front()
            << " ms, median " << ms[ms.size() / 2] << " ms, max " << ms.back() << " ms\n";
  RecordProperty("restore_delay_median_ms", std::to_string(ms[ms.size() / 2]));

  // Not JSON: one error event, the file untouched.
  size_t before = events().size();
  const std::string broken = "{\"cniVersion\": \"1.0.0\", \"plugins\": [";
  writeAtomically(file_, broken);
  ASSERT_TRUE(waitEvents(before + 1));
  WatchEvent e = events().back();
  EXPECT_FALSE(e.restored);
  EXPECT_NE(e.message.find(file_ + " is not valid JSON: "), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("; nothing written"), std::string::npos) << e.message;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(readTextFile(file_), broken);

  // No plugins: the same.
  before = events().size();
  const std::string empty = R"({"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[]})";
  writeAtomically(file_, empty);
  ASSERT_TRUE(waitEvents(before + 1));
  e = events().back();
  EXPECT_FALSE(e.restored);
  EXPECT_NE(e.message.find(file_ + " has no plugins before sluice-cni to chain after; nothing written"),
            std::string::npos)
      << e.message;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(readTextFile(file_), empty);

  // Fixed by its owner: chained again.
  auto t0 = Clock::now();
  writeAtomically(file_, kPrimary.dump());
  EXPECT_TRUE(waitRestored(t0)) << readTextFile(file_);
  EXPECT_EQ(entries(dir_), 1u) << "no temporary file left";
}

// A new, lexically earlier conflist becomes the primary: sluice-cni joins it.
TEST_F(CniWatch, ANewPrimaryConflistIsJoined) {
  ASSERT_TRUE(writeTextFile(file_, kPrimary.dump()));
  startWatcher();
  ASSERT_TRUE(waitEvents(1));
  std::string earlier = dir_ + "/05-cilium.conflist";
  json cilium = kPrimary;
  cilium["plugins"] = json::array({{{"type", "cilium-cni"}}});
  writeAtomically(earlier, cilium.dump());
  file_ = earlier;
  EXPECT_TRUE(waitRestored(Clock::now())) << readTextFile(earlier);
}

// --cni-owned-conflist: the owned file follows its primary (rewritten,
// replaced by a .conf), goes when the primary goes, comes back with it;
// the primary's file is never written.
TEST_F(CniWatch, OwnedConflistFollowsItsPrimary) {
  ConfMode mode;
  mode.owned = true;
  const std::string owned = dir_ + "/02-sluice-cni.conflist";
  ASSERT_TRUE(writeTextFile(file_, kPrimary.dump(2)));
  startWatcher(mode);
  ASSERT_TRUE(waitEvents(1));
  EXPECT_EQ(events()[0].message, "rewrote " + owned + " from " + file_ + " (its plugins then sluice-cni) (at start)");
  EXPECT_EQ(readTextFile(file_), kPrimary.dump(2));
  auto ownedIs = [&](const json& primaryPlugins) {
    auto j = json::parse(readTextFile(owned), nullptr, false);
    if (!j.is_object() || !j["plugins"].is_array() || j["plugins"].size() != primaryPlugins.size() + 1) return false;
    for (size_t i = 0; i < primaryPlugins.size(); i++)
      if (j["plugins"][i] != primaryPlugins[i]) return false;
    return sluiceIsLast(j.dump(), socket_);
  };
  EXPECT_TRUE(ownedIs(kPrimary["plugins"]));

  // The primary rewrites its file with another plugin list.
  json changed = kPrimary;
  changed["plugins"].push_back({{"type", "bandwidth"}});
  writeAtomically(file_, changed.dump());
  ASSERT_TRUE(waitEvents(2));
  EXPECT_TRUE(events()[1].restored);
  EXPECT_TRUE(ownedIs(changed["plugins"])) << readTextFile(owned);
  EXPECT_EQ(readTextFile(file_), changed.dump());

  // Gone: the owned copy goes too; back: so is the owned file.
  ASSERT_EQ(::unlink(file_.c_str()), 0);
  ASSERT_TRUE(waitEvents(3));
  EXPECT_EQ(events()[2].message.rfind("removed " + owned + ": its primary CNI configuration is gone (", 0), 0u)
      << events()[2].message;
  EXPECT_FALSE(std::filesystem::exists(owned));
  writeAtomically(file_, kPrimary.dump());
  ASSERT_TRUE(waitEvents(4));
  EXPECT_TRUE(ownedIs(kPrimary["plugins"])) << readTextFile(owned);
  EXPECT_EQ(entries(dir_), 2u) << "no temporary file left";
}

// --cni-unchained: the standalone config is put back as written.
TEST_F(CniWatch, UnchainedStandaloneConfigIsKept) {
  ConfMode mode;
  mode.chained = false;
  const std::string standalone = dir_ + "/sluice-cni.conf";
  startWatcher(mode);
  ASSERT_TRUE(waitEvents(1));
  EXPECT_EQ(json::parse(readTextFile(standalone)), standaloneConf(socket_));
  ASSERT_EQ(::unlink(standalone.c_str()), 0);
  ASSERT_TRUE(waitEvents(2));
  EXPECT_EQ(events()[1].message.rfind("wrote the standalone network config " + standalone + " back (", 0), 0u)
      << events()[1].message;
  EXPECT_EQ(json::parse(readTextFile(standalone)), standaloneConf(socket_));
}

TEST_F(CniWatch, StartRefusesAMissingDirectoryAndStopIsPrompt) {
  auto w = ConfWatcher::start({tmp_.file("absent"), socket_}, [](const WatchEvent&) {});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().message, "--cni-conf-dir " + tmp_.file("absent") + " is not a directory");
  startWatcher();
  auto t0 = Clock::now();
  watcher_->stop();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
}

TEST(CniWatchOptions, AgentFlags) {
  auto d = agent::parseDaemonArgs({"--cni-conf-dir", "/etc/cni/net.d", "--cni-agent-socket", "/run/s.sock"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->agent.cniConfDir, "/etc/cni/net.d");
  EXPECT_EQ(d->agent.cniAgentSocket, "/run/s.sock");
  EXPECT_EQ(agent::parseDaemonArgs({}).value().agent.cniConfDir, "");
  struct {
    std::vector<std::string> args;
    std::string error;
  } bad[] = {
      {{"--cni-conf-dir", "net.d"}, "--cni-conf-dir needs an absolute path (see sluiced --help)"},
      {{"--cni-conf-dir", "/x", "--cni-agent-socket", "s"}, "--cni-agent-socket needs an absolute path (see sluiced --help)"},
      {{"--cni-agent-socket", "/s"}, "--cni-agent-socket needs --cni-conf-dir (see sluiced --help)"},
  };
  for (const auto& b : bad) {
    auto r = agent::parseDaemonArgs(b.args);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, b.error);
  }
}

// The layout flags the init container takes, on the agent too.
TEST(CniWatchOptions, AgentLayoutFlags) {
  auto d = agent::parseDaemonArgs({"--cni-conf-dir", "/etc/cni/net.d", "--cni-owned-conflist-name", "01-s.conflist",
                                   "--cni-conf-name", "10-calico.conflist"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_TRUE(d->agent.cniMode.owned);
  EXPECT_EQ(d->agent.cniMode.ownedName, "01-s.conflist");
  EXPECT_EQ(d->agent.cniMode.confName, "10-calico.conflist");
  EXPECT_TRUE(d->agent.cniMode.chained);
  d = agent::parseDaemonArgs({"--cni-conf-dir", "/etc/cni/multus/net.d", "--cni-unchained"});
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_FALSE(d->agent.cniMode.chained);
  EXPECT_FALSE(agent::parseDaemonArgs({}).value().agent.cniMode.owned);
  struct {
    std::vector<std::string> args;
    std::string error;
  } bad[] = {
      {{"--cni-unchained"},
       "--cni-conf-name, --cni-owned-conflist[-name] and --cni-unchained need --cni-conf-dir (see sluiced --help)"},
      {{"--cni-conf-dir", "/x", "--cni-conf-name"}, "option --cni-conf-name needs a value (see sluiced --help)"},
      {{"--cni-conf-dir", "/x", "--cni-conf-name", "a/b.conf"},
       "--cni-conf-name must be a file name in the CNI conf dir, not 'a/b.conf' (see sluiced --help)"},
      {{"--cni-conf-dir", "/x", "--cni-owned-conflist", "--cni-unchained"},
       "--cni-unchained and --cni-owned-conflist contradict each other (a standalone config has no primary plugins to "
       "copy) (see sluiced --help)"},
  };
  for (const auto& b : bad) {
    auto r = agent::parseDaemonArgs(b.args);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, b.error);
  }
}

// The switch with Istio's node agent: takeover needs the API (it names the
// pods and their uids) and ZDS, and waits for Istio's agent's socket.
TEST(IstioSwitchOptions, AgentFlags) {
  auto env = [](const char*) -> std::optional<std::string> { return std::nullopt; };
  const std::vector<std::string> kube = {"--kube-api", "https://127.0.0.1:6443", "--kube-token-file", "/t",
                                         "--kube-ca-file", "/c", "--node-name", "n"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = kube;
    a.insert(a.end(), extra.begin(), extra.end());
    return agent::parseDaemonArgs(a, env);
  };
  auto t = with({"--ztunnel-socket", "/z.sock", "--istio-takeover"});
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->agent.istioSwitch, agent::IstioSwitchMode::Takeover);
  EXPECT_TRUE(t->agent.ztunnelTakeover);
  auto h = agent::parseDaemonArgs({"--istio-hand-back"}, env);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->agent.istioSwitch, agent::IstioSwitchMode::HandBack);
  EXPECT_EQ(agent::parseDaemonArgs({}, env).value().agent.istioSwitch, agent::IstioSwitchMode::Off);

  auto noKube = agent::parseDaemonArgs({"--ztunnel-socket", "/z.sock", "--istio-takeover"}, env);
  ASSERT_FALSE(noKube.ok());
  EXPECT_EQ(noKube.error().message.rfind("--istio-takeover needs Kubernetes (in a pod, or --kube-api)", 0), 0u)
      << noKube.error().message;
  auto noZds = with({"--istio-takeover"});
  ASSERT_FALSE(noZds.ok());
  EXPECT_EQ(noZds.error().message, "--istio-takeover needs --ztunnel-socket (see sluiced --help)");
  auto both = with({"--ztunnel-socket", "/z.sock", "--istio-takeover", "--istio-hand-back"});
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.error().message, "--istio-takeover and --istio-hand-back contradict each other (see sluiced --help)");
}

}  // namespace
}  // namespace sluice::cni
