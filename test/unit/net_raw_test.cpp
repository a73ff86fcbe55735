// sluicectl's report of a pod's processes that could send frames past the
// capture without the pod guard (userspace/sluicectl/net_raw.h), over a
// /proc laid out by hand: namespace links, CapEff, comm.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "test/common/tempdir.h"
#include "userspace/sluicectl/cli.h"
#include "userspace/sluicectl/net_raw.h"

namespace sluice {
namespace {

// CapEff of a default container (CAP_NET_RAW among them) and of one with
// CAP_NET_ADMIN added.
constexpr const char* kDefaultCaps = "00000000a80425fb";
constexpr const char* kWithNetAdmin = "00000000a80435fb";
constexpr const char* kNoNetRaw = "00000000a80405fb";

void fakeProcess(const std::string& proc, const std::string& pid, uint64_t netns, const std::string& capEff,
                 const std::string& comm) {
  const std::string dir = proc + "/" + pid;
  ::mkdir(dir.c_str(), 0755);
  ::mkdir((dir + "/ns").c_str(), 0755);
  ASSERT_EQ(::symlink(("net:[" + std::to_string(netns) + "]").c_str(), (dir + "/ns/net").c_str()), 0);
  std::ofstream(dir + "/status") << "Name:\t" << comm << "\nCapInh:\t0000000000000000\nCapPrm:\t" << capEff
                                 << "\nCapEff:\t" << capEff << "\n";
  std::ofstream(dir + "/comm") << comm << "\n";
}

TEST(NetRaw, ThePodsProcessesHoldingNetRawWithoutNetAdmin) {
  test::TempDir tmp("netraw");
  ASSERT_FALSE(tmp.path().empty());
  const std::string proc = tmp.path();
  fakeProcess(proc, "100", 42, kDefaultCaps, "nginx");
  fakeProcess(proc, "101", 42, kWithNetAdmin, "ztunnel");
  fakeProcess(proc, "102", 42, kDefaultCaps, "pause");
  fakeProcess(proc, "103", 43, kDefaultCaps, "other-pod");
  fakeProcess(proc, "104", 42, kNoNetRaw, "restricted");
  fakeProcess(proc, "105", 42, kDefaultCaps, "worker");
  ::mkdir((proc + "/self").c_str(), 0755);  // not a pid
  auto got = netRawProcesses(42, proc);
  ASSERT_TRUE(got.ok()) << got.error().message;
  std::vector<std::string> names;
  for (const auto& p : *got) names.push_back(std::to_string(p.pid) + "/" + p.comm);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"100/nginx", "105/worker"}));
  EXPECT_TRUE(netRawProcesses(44, proc)->empty());
  EXPECT_FALSE(netRawProcesses(42, proc + "/missing").ok());
}

TEST(NetRaw, PodListShowsThemAsAColumnAndInJson) {
  PodInfo p;
  p.id = "web";
  p.netnsPath = "/proc/1/ns/net";
  cli::NetRawByPod raw{{"web", {{100, "nginx"}, {105, "worker"}}}};
  std::string text = cli::formatPodList({p}, false, &raw);
  EXPECT_NE(text.find("NET_RAW"), std::string::npos) << text;
  EXPECT_NE(text.find("100/nginx,105/worker"), std::string::npos) << text;
  std::string json = cli::formatPodList({p}, true, &raw);
  EXPECT_NE(json.find("\"net_raw_processes\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"comm\": \"worker\""), std::string::npos) << json;
  cli::NetRawByPod none;
  EXPECT_NE(cli::formatPodList({p}, false, &none).find("?"), std::string::npos);
  raw["web"].clear();
  EXPECT_EQ(cli::formatPodList({p}, false, &raw).find("nginx"), std::string::npos);
}

}  // namespace
}  // namespace sluice
