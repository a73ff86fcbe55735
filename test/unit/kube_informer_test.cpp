// Informers (userspace/agent/kube/informer.h) against the test API server:
// list-then-watch of one node's pods and of namespaces, chunked lists,
// bookmarks, 410 → a new list whose differences are reported, dropped and
// stalled streams, 500s with back-off, the API server away for a while
// (nothing reported deleted by mistake), token rotation.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "test/common/apiserver.h"
#include "userspace/mesh/decisions.h"
#include "userspace/agent/kube/informer.h"

namespace sluice::kube {
namespace {

using nlohmann::json;
using test::eventually;
using test::TestApiServer;
using test::TestPod;
using namespace std::chrono_literals;

// Records the callbacks as "added shop/a", "updated shop/a", "deleted shop/a", "synced".
class Recorder {
 public:
  InformerHandlers<Pod> podHandlers() {
    return {[this](const Pod& p) { add("added " + p.fullName()); },
            [this](const Pod&, const Pod& p) { add("updated " + p.fullName()); },
            [this](const Pod& p) { add("deleted " + p.fullName()); }, [this] { add("synced"); }};
  }
  void add(std::string s) {
    std::lock_guard lock(mu_);
    calls_.push_back(std::move(s));
  }
  std::vector<std::string> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  void clear() {
    std::lock_guard lock(mu_);
    calls_.clear();
  }
  size_t count(const std::string& prefix) const {
    std::lock_guard lock(mu_);
    return std::count_if(calls_.begin(), calls_.end(), [&](const std::string& c) { return c.rfind(prefix, 0) == 0; });
  }
  bool has(const std::string& c) const {
    std::lock_guard lock(mu_);
    return std::find(calls_.begin(), calls_.end(), c) != calls_.end();
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> calls_;
};

class KubeInformer : public test::ApiServerTest {
 protected:
  Status addPod(const std::string& name, const std::string& node = "node-a") {
    auto r = server_->createPod(shopPod(name, node));
    if (!r) return r.error();
    return {};
  }

  InformerOptions podOptions() {
    InformerOptions o;
    o.path = podsPath();
    o.fieldSelector = "spec.nodeName=node-a";
    o.name = "pods on node-a";
    o.watchTimeout = 30s;
    o.stallTimeout = 10s;
    o.backoff = {100ms, 1000ms, 2.0, 0.5};
    return o;
  }

  std::unique_ptr<Informer<Pod>> startPods(InformerOptions o) {
    auto inf = std::make_unique<Informer<Pod>>(*client_, std::move(o), rec_.podHandlers());
    inf->start();
    EXPECT_TRUE(inf->waitSynced(10s)) << inf->stats().lastError;
    return inf;
  }

  std::vector<std::string> cachedNames(const Informer<Pod>& inf) {
    std::vector<std::string> names;
    for (const auto& p : inf.list()) names.push_back(p.name);
    std::sort(names.begin(), names.end());
    return names;
  }

  std::vector<std::string> serverNames(const std::string& node) {
    auto page = client_->list(podsPath(), ListOptions{.fieldSelector = "spec.nodeName=" + node});
    EXPECT_TRUE(page.ok());
    std::vector<std::string> names;
    if (page.ok())
      for (const auto& i : page->items) names.push_back(i["metadata"]["name"]);
    std::sort(names.begin(), names.end());
    return names;
  }

  Recorder rec_;
};

TEST_F(KubeInformer, ListsThenWatchesTheNodesPods) {
  ASSERT_TRUE(addPod("a").ok());
  ASSERT_TRUE(addPod("elsewhere", "node-b").ok());
  auto inf = startPods(podOptions());
  EXPECT_EQ(rec_.calls(), (std::vector<std::string>{"added shop/a", "synced"}));
  EXPECT_EQ(cachedNames(*inf), std::vector<std::string>{"a"});

  ASSERT_TRUE(addPod("b").ok());
  ASSERT_TRUE(server_->patchPod("shop", "a", {{"metadata", {{"labels", {{"istio.io/dataplane-mode", "ambient"}}}}}}).ok());
  ASSERT_TRUE(addPod("elsewhere2", "node-b").ok());
  ASSERT_TRUE(server_->deletePod("shop", "b").ok());
  ASSERT_TRUE(eventually([&] { return rec_.has("deleted shop/b"); }));
  EXPECT_EQ(rec_.calls(),
            (std::vector<std::string>{"added shop/a", "synced", "added shop/b", "updated shop/a", "deleted shop/b"}));
  auto a = inf->get(inf->list()[0].uid);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->labels.at("istio.io/dataplane-mode"), "ambient");
  auto st = server_->state();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(inf->resourceVersion(), std::to_string((*st)["rv"].get<int>())) << "the last event was the delete";
  EXPECT_EQ(inf->stats().lists, 1u);
  EXPECT_EQ(inf->stats().errors, 0u);
}

TEST_F(KubeInformer, ListsInPages) {
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(addPod("p" + std::to_string(i)).ok());
  auto o = podOptions();
  o.pageSize = 2;
  auto inf = startPods(o);
  EXPECT_EQ(inf->list().size(), 7u);
  auto lists = server_->countRequests("list", "limit=2");
  ASSERT_TRUE(lists.ok());
  EXPECT_EQ(*lists, 4);
  EXPECT_EQ(rec_.count("added "), 7u);
}

TEST_F(KubeInformer, BookmarksMoveTheResourceVersionPastOtherNodesChanges) {
  ASSERT_TRUE(addPod("a").ok());
  auto inf = startPods(podOptions());
  std::string before = inf->resourceVersion();
  // Other nodes' pods change; this node's watch sees none of it...
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(addPod("b" + std::to_string(i), "node-b").ok());
  ASSERT_TRUE(eventually([&] { return server_->state()->value("watchers", 0) == 1; }));
  // ...until a bookmark says how far the stream has got.
  ASSERT_TRUE(server_->fault({{"bookmark", true}}).ok());
  auto rv = std::to_string((*server_->state())["rv"].get<int>());
  ASSERT_TRUE(eventually([&] { return inf->resourceVersion() == rv; })) << inf->resourceVersion() << " vs " << rv;
  EXPECT_NE(before, rv);
  // Compacting everything up to now no longer costs a new list.
  ASSERT_TRUE(server_->fault({{"compact", "now"}}).ok());
  ASSERT_TRUE(server_->fault({{"drop", true}}).ok());
  ASSERT_TRUE(addPod("c").ok());
  ASSERT_TRUE(eventually([&] { return rec_.has("added shop/c"); })) << inf->stats().lastError;
  EXPECT_EQ(inf->stats().lists, 1u);
  EXPECT_EQ(inf->stats().gone, 0u);
}

TEST_F(KubeInformer, WithoutABookmarkACompactedVersionMeansANewList) {
  ASSERT_TRUE(addPod("a").ok());
  auto inf = startPods(podOptions());
  ASSERT_TRUE(addPod("b0", "node-b").ok());
  ASSERT_TRUE(server_->fault({{"compact", "now"}}).ok());
  ASSERT_TRUE(server_->fault({{"drop", true}}).ok());
  ASSERT_TRUE(eventually([&] { return inf->stats().lists == 2; })) << inf->stats().lastError;
  EXPECT_EQ(inf->stats().gone, 1u);
  EXPECT_EQ(rec_.calls(), (std::vector<std::string>{"added shop/a", "synced"})) << "nothing changed on this node";
}

// Events lost while the API server compacted them: the new list's
// differences are reported, and the cache ends equal to the server's view.
void goneConverges(KubeInformer* t, TestApiServer& server, Recorder& rec, const std::string& goneMode,
                   const std::function<Status(const std::string&)>& addPod,
                   const std::function<std::unique_ptr<Informer<Pod>>()>& start,
                   const std::function<std::vector<std::string>(const Informer<Pod>&)>& cached,
                   const std::function<std::vector<std::string>()>& truth) {
  (void)t;
  ASSERT_TRUE(server.fault({{"gone_mode", goneMode}}).ok());
  for (const char* n : {"keep", "change", "remove"}) ASSERT_TRUE(addPod(n).ok());
  auto inf = start();
  rec.clear();
  ASSERT_TRUE(server.fault({{"down", true}}).ok());
  ASSERT_TRUE(eventually([&] { return inf->stats().errors > 0; }));
  ASSERT_TRUE(addPod("new").ok());
  ASSERT_TRUE(server.patchPod("shop", "change", {{"metadata", {{"labels", {{"v", "2"}}}}}}).ok());
  ASSERT_TRUE(server.deletePod("shop", "remove").ok());
  ASSERT_TRUE(server.fault({{"compact", "now"}}).ok());
  ASSERT_TRUE(server.fault({{"up", true}}).ok());
  ASSERT_TRUE(eventually([&] { return inf->stats().lists == 2; })) << inf->stats().lastError;
  EXPECT_EQ(inf->stats().gone, 1u);
  // The list is counted when its result is in the cache, just before the
  // handlers hear of the differences.
  EXPECT_TRUE(eventually([&] { return rec.calls().size() >= 3; }));
  auto calls = rec.calls();
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<std::string>{"added shop/new", "deleted shop/remove", "updated shop/change"}));
  EXPECT_EQ(cached(*inf), truth());
  // And it keeps watching afterwards.
  ASSERT_TRUE(addPod("after").ok());
  EXPECT_TRUE(eventually([&] { return rec.has("added shop/after"); }));
}

TEST_F(KubeInformer, GoneAsWatchErrorEventRelistsAndConverges) {
  goneConverges(
      this, *server_, rec_, "event", [&](const std::string& n) { return addPod(n); },
      [&] { return startPods(podOptions()); }, [&](const Informer<Pod>& i) { return cachedNames(i); },
      [&] { return serverNames("node-a"); });
}

TEST_F(KubeInformer, GoneAsHttpStatusRelistsAndConverges) {
  goneConverges(
      this, *server_, rec_, "http", [&](const std::string& n) { return addPod(n); },
      [&] { return startPods(podOptions()); }, [&](const Informer<Pod>& i) { return cachedNames(i); },
      [&] { return serverNames("node-a"); });
}

TEST_F(KubeInformer, DroppedStreamReconnectsWithoutLosingEvents) {
  auto inf = startPods(podOptions());
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(eventually([&] { return inf->stats().connected && server_->state()->value("watchers", 0) == 1; }));
    ASSERT_TRUE(server_->fault({{"drop", true}}).ok());
    // Made between the drop and the reconnection: replayed from the resourceVersion.
    ASSERT_TRUE(addPod("r" + std::to_string(round)).ok());
    ASSERT_TRUE(eventually([&] { return rec_.has("added shop/r" + std::to_string(round)); })) << inf->stats().lastError;
  }
  auto s = inf->stats();
  EXPECT_EQ(s.lists, 1u);
  EXPECT_GE(s.watches, 4u);
  EXPECT_NE(s.lastError.find("connection lost"), std::string::npos) << s.lastError;
}

TEST_F(KubeInformer, StalledStreamIsGivenUpAndRemade) {
  auto o = podOptions();
  o.stallTimeout = 700ms;
  auto inf = startPods(o);
  ASSERT_TRUE(eventually([&] { return server_->state()->value("watchers", 0) == 1; }));
  ASSERT_TRUE(server_->fault({{"stall", "open"}}).ok());
  ASSERT_TRUE(addPod("during-stall").ok());
  ASSERT_TRUE(eventually([&] { return rec_.has("added shop/during-stall"); })) << inf->stats().lastError;
  EXPECT_NE(inf->stats().lastError.find("no data for 700 ms (stalled stream)"), std::string::npos);
  EXPECT_EQ(inf->stats().lists, 1u);
  ASSERT_TRUE(server_->fault({{"drop", true}}).ok());  // releases the stalled handler
}

TEST_F(KubeInformer, ServerErrorsBackOffWithJitterThenRecover) {
  ASSERT_TRUE(addPod("a").ok());
  ASSERT_TRUE(server_->fault({{"fail", {{"count", 4}, {"status", 500}, {"kind", "list"}}}}).ok());
  auto o = podOptions();
  o.backoff = {100ms, 2000ms, 2.0, 0.5};
  auto inf = startPods(o);
  EXPECT_EQ(cachedNames(*inf), std::vector<std::string>{"a"});
  auto s = inf->stats();
  EXPECT_EQ(s.errors, 4u);
  EXPECT_EQ(s.lastError,
            "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=500: HTTP 500 InternalError: Internal error "
            "occurred: injected fault");
  // The gaps between attempts follow the back-off: at least d(n)*(1-jitter)
  // = 50, 100, 200, 400 ms, growing.
  auto reqs = server_->requests();
  ASSERT_TRUE(reqs.ok());
  std::vector<double> times;
  for (const auto& r : *reqs)
    if (r["kind"] == "list") times.push_back(r["time"]);
  ASSERT_EQ(times.size(), 5u);
  Backoff bounds(o.backoff);
  for (uint32_t n = 0; n < 4; ++n) {
    double gapMs = (times[n + 1] - times[n]) * 1000;
    EXPECT_GE(gapMs, bounds.lowerBound(n).count() - 5) << "attempt " << n;
  }
}

TEST_F(KubeInformer, ApiServerAwayKeepsTheCacheAndCatchesUp) {
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(addPod(n).ok());
  auto inf = startPods(podOptions());
  rec_.clear();
  ASSERT_TRUE(server_->fault({{"down", true}}).ok());
  std::this_thread::sleep_for(1500ms);
  auto s = inf->stats();
  EXPECT_GE(s.errors, 2u);
  EXPECT_FALSE(s.connected);
  EXPECT_NE(s.lastError.find("Failed to connect to 127.0.0.1"), std::string::npos) << s.lastError;
  EXPECT_TRUE(rec_.calls().empty()) << "nothing is reported while the server is away";
  EXPECT_EQ(cachedNames(*inf), (std::vector<std::string>{"a", "b", "c"}));
  // Changes while it was away are caught up from the resourceVersion.
  ASSERT_TRUE(server_->deletePod("shop", "b").ok());
  ASSERT_TRUE(addPod("d").ok());
  ASSERT_TRUE(server_->fault({{"up", true}}).ok());
  ASSERT_TRUE(eventually([&] { return rec_.has("added shop/d"); })) << inf->stats().lastError;
  EXPECT_EQ(rec_.calls(), (std::vector<std::string>{"deleted shop/b", "added shop/d"}));
  EXPECT_EQ(cachedNames(*inf), (std::vector<std::string>{"a", "c", "d"}));
  EXPECT_EQ(inf->stats().lists, 1u) << "no list needed: the events were still there";
}

TEST_F(KubeInformer, RotatedTokenIsUsedForTheNextWatch) {
  auto inf = startPods(podOptions());
  ASSERT_TRUE(eventually([&] { return server_->state()->value("watchers", 0) == 1; }));
  ASSERT_TRUE(server_->rotateToken("rotated-during-watch").ok());
  ASSERT_TRUE(server_->fault({{"drop", true}}).ok());
  ASSERT_TRUE(addPod("after-rotation").ok());
  ASSERT_TRUE(eventually([&] { return rec_.has("added shop/after-rotation"); })) << inf->stats().lastError;
  auto reqs = server_->requests();
  ASSERT_TRUE(reqs.ok());
  EXPECT_EQ(reqs->back()["kind"], "watch");
  EXPECT_EQ(reqs->back()["token"], "rotated-during-watch");
  for (const auto& r : *reqs) EXPECT_NE(r["status"], 401) << r;
  EXPECT_EQ(inf->stats().lists, 1u);
}

TEST_F(KubeInformer, NamespacesWithTheirLabels) {
  std::mutex mu;
  std::vector<std::string> calls;
  InformerHandlers<Namespace> h{
      [&](const Namespace& n) { std::lock_guard l(mu); calls.push_back("added " + n.name); },
      [&](const Namespace& o, const Namespace& n) {
        std::lock_guard l(mu);
        calls.push_back("updated " + n.name + " " + (namespaceSelected(o.labels) ? "in" : "out") + "->" +
                        (namespaceSelected(n.labels) ? "in" : "out"));
      },
      [&](const Namespace& n) { std::lock_guard l(mu); calls.push_back("deleted " + n.name); }, nullptr};
  InformerOptions o;
  o.path = namespacesPath();
  o.name = "namespaces";
  o.watchTimeout = 30s;
  Informer<Namespace> inf(*client_, o, h);
  inf.start();
  ASSERT_TRUE(inf.waitSynced(10s));
  ASSERT_TRUE(server_->setNamespaceLabels("shop", {{"istio.io/dataplane-mode", "ambient"}}).ok());
  ASSERT_TRUE(server_->createNamespace("other").ok());
  ASSERT_TRUE(server_->deleteNamespace("other").ok());
  ASSERT_TRUE(eventually([&] { std::lock_guard l(mu); return calls.size() == 4; }));
  std::lock_guard l(mu);
  EXPECT_EQ(calls, (std::vector<std::string>{"added shop", "updated shop out->in", "added other", "deleted other"}));
  EXPECT_TRUE(namespaceSelected(inf.get("shop")->labels));
}

TEST_F(KubeInformer, StopEndsAnOpenWatchPromptly) {
  auto inf = startPods(podOptions());
  ASSERT_TRUE(eventually([&] { return inf->stats().connected; }));
  auto t0 = std::chrono::steady_clock::now();
  inf->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  ASSERT_TRUE(addPod("after-stop").ok());
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(rec_.has("added shop/after-stop"));
}

}  // namespace
}  // namespace sluice::kube
