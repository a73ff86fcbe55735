// sluiced keeps sluice-cni in the node's CNI chain (--cni-conf-dir): the real
// agent binary, a conflist written by `sluice-cni install`, then rewritten
// by "the primary CNI" without it. The agent puts it back, logs it and
// counts it in /metrics; a conflist it cannot read is counted as an error
// and left as it is.
//
//   TMP/net.d/10-calico.conflist  ◀──inotify── sluiced --cni-conf-dir TMP/net.d
//       (rewritten by the test)                  --metrics-address 127.0.0.1:P
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>

#include "test/common/agent_process.h"
#include "test/common/tempdir.h"
#include "test/common/topology.h"

namespace sluice::test {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const json kCalico = {{"cniVersion", "0.3.1"},
                      {"name", "k8s-pod-network"},
                      {"plugins",
                       {{{"type", "calico"}, {"datastore_type", "kubernetes"}, {"ipam", {{"type", "calico-ipam"}}}},
                        {{"type", "portmap"}, {"capabilities", {{"portMappings", true}}}}}}};

bool sluiceIsLast(const std::string& text, const std::string& socket) {
  auto j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("plugins") || !j["plugins"].is_array() || j["plugins"].empty()) return false;
  const auto& last = j["plugins"].back();
  return last.value("type", "") == "sluice-cni" && last.value("agentSocket", "") == socket;
}

// The number after "NAME " on its own line of a metrics page; -1 if absent.
long metricValue(const std::string& page, const std::string& name) {
  auto at = page.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stol(page.substr(at + name.size() + 2));
}

TEST(AgentCniWatch, RewrittenConflistGetsSluiceBackWithLogAndMetric) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (the agent loads BPF programs)";
  TempDir work("cniwatch");
  ASSERT_FALSE(work.path().empty());
  for (const char* d : {"net.d", "bin"}) ASSERT_TRUE(std::filesystem::create_directory(work.file(d)));
  const std::string conflist = work.file("net.d/10-calico.conflist");
  const std::string socket = work.file("agent.sock");
  const std::string hostSocket = "/var/run/sluice/agent.sock";  // as the host's runtime sees it
  ASSERT_TRUE(writeTextFile(conflist, kCalico.dump(2)));
  auto inst = runCommand({builtBinary("sluice-cni"), "install", "--cni-conf-dir", work.file("net.d"), "--cni-bin-dir",
                          work.file("bin"), "--agent-socket", hostSocket});
  ASSERT_EQ(inst.exitCode, 0) << inst.describe();
  ASSERT_TRUE(sluiceIsLast(readTextFile(conflist), hostSocket));

  TestBpffs bpffs;
  uint16_t port = freeLoopbackPort();
  ASSERT_NE(port, 0);
  auto agent = AgentProcess::start(bpffs.root(),
                                   {"--cni-conf-dir", work.file("net.d"), "--cni-agent-socket", hostSocket,
                                    "--metrics-address", "127.0.0.1:" + std::to_string(port)},
                                   socket);
  ASSERT_TRUE(agent.ok()) << agent.error().message;
  auto& a = **agent;
  // The watch may start just after the API socket answers (start()'s cue).
  const std::string watching = "watching " + work.file("net.d") + " to keep sluice-cni in the primary CNI configuration";
  EXPECT_TRUE(eventually([&] { return a.log().find(watching) != std::string::npos; }, 5s)) << a.log();
  EXPECT_EQ(metricValue(httpGetLoopback(port, "/metrics"), "sluice_cni_conflist_restored_total"), 0);

  // Calico rewrites its conflist (temporary file + rename), without sluice-cni.
  std::string tmp = conflist + ".calico-tmp";
  ASSERT_TRUE(writeTextFile(tmp, kCalico.dump(2)));
  auto t0 = Clock::now();
  ASSERT_EQ(::rename(tmp.c_str(), conflist.c_str()), 0);
  std::optional<double> ms;
  while (!ms && Clock::now() - t0 < std::chrono::seconds(10)) {
    if (sluiceIsLast(readTextFile(conflist), hostSocket))
      ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(ms) << "sluice-cni not back within 10 s: " << readTextFile(conflist) << "\n" << a.log();
  std::cout << "[ measure ] sluiced put sluice-cni back " << *ms << " ms after the rewrite\n";
  RecordProperty("restore_delay_ms", std::to_string(*ms));
  json j = json::parse(readTextFile(conflist));
  ASSERT_EQ(j["plugins"].size(), 3u) << j;
  EXPECT_EQ(j["plugins"][0], kCalico["plugins"][0]);
  EXPECT_EQ(j["plugins"][1], kCalico["plugins"][1]);
  // The log line comes right after the rename; the metric with it.
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (a.log().find("put sluice-cni back") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(a.log().find("warning sluiced: put sluice-cni back at the end of the plugin chain in " + conflist +
                         " (it was rewritten without it; "),
            std::string::npos)
      << a.log();
  std::string page = httpGetLoopback(port, "/metrics");
  EXPECT_NE(page.find("# TYPE sluice_cni_conflist_restored_total counter"), std::string::npos) << page;
  EXPECT_EQ(metricValue(page, "sluice_cni_conflist_restored_total"), 1) << page;
  EXPECT_EQ(metricValue(page, "sluice_agent_errors_total{source=\"cni_conf\"}"), 0) << page;

  // A conflist that is not JSON: an error line and metric, the file as is.
  const std::string broken = "{\"cniVersion\": \"0.3.1\", \"name\": \"k8s-pod-network\", \"plugins\": [{\"type\":";
  ASSERT_TRUE(writeTextFile(conflist, broken));
  deadline = Clock::now() + std::chrono::seconds(10);
  while (metricValue(httpGetLoopback(port, "/metrics"), "sluice_agent_errors_total{source=\"cni_conf\"}") < 1 &&
         Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  page = httpGetLoopback(port, "/metrics");
  EXPECT_EQ(metricValue(page, "sluice_agent_errors_total{source=\"cni_conf\"}"), 1) << page;
  EXPECT_EQ(metricValue(page, "sluice_cni_conflist_restored_total"), 1) << page;
  EXPECT_NE(a.log().find("error sluiced: CNI configuration: " + conflist + " is not valid JSON: "), std::string::npos)
      << a.log();
  EXPECT_EQ(readTextFile(conflist), broken);
  // The agent still serves.
  auto c = a.client();
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->health().ok());
  EXPECT_EQ(a.stop(SIGTERM), 0) << a.log();
}

}  // namespace
}  // namespace sluice::test
