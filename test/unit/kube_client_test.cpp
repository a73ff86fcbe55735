// The Kubernetes client (userspace/agent/kube/client.h) against the test API
// server (test/apiserver): TLS with a per-run CA, bearer tokens and their
// rotation, chunked lists, watch streams and their failure modes, merge
// patches, and the one-line errors of each.
#include <gtest/gtest.h>

#include <atomic>
#include <stdlib.h>

#include <thread>

#include "test/common/apiserver.h"
#include "test/common/tempdir.h"
#include "userspace/agent/kube/client.h"

namespace sluice::kube {
namespace {

using nlohmann::json;
using test::TestApiServer;
using test::TestPod;
using namespace std::chrono_literals;

class KubeClient : public test::ApiServerTest {
 protected:
  static TestPod pod(const std::string& name, const std::string& node = "node-a") { return shopPod(name, node); }
};

TEST_F(KubeClient, GetsAnObjectOverTlsWithTheToken) {
  auto ns = client_->get(namespacePath("shop"));
  ASSERT_TRUE(ns.ok()) << ns.error().message;
  EXPECT_EQ((*ns)["metadata"]["name"], "shop");
  auto reqs = server_->requests();
  ASSERT_TRUE(reqs.ok());
  auto tok = client_->token();
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(test::readTextFile(server_->tokenFile()), *tok + "\n");
  EXPECT_EQ(reqs->back()["token"], *tok);
  EXPECT_EQ(reqs->back()["status"], 200);
}

TEST_F(KubeClient, ConnectionsAreReused) {
  auto before = server_->state();
  ASSERT_TRUE(before.ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(client_->get(namespacePath("shop")).ok());
  ASSERT_TRUE(server_->createPod(pod("p")).ok());
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(client_->mergePatch(podStatusPath("shop", "p"), {{"metadata", {{"labels", {{"n", std::to_string(i)}}}}}}).ok());
  auto after = server_->state();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["connections"].get<int>() - (*before)["connections"].get<int>(), 1)
      << "15 sequential requests over one connection";
}

TEST_F(KubeClient, ErrorsAreOneLineWithStatusAndReason) {
  auto missing = client_->get(podPath("shop", "nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(isNotFound(missing.error()));
  EXPECT_EQ(missing.error().message, "GET /api/v1/namespaces/shop/pods/nope: HTTP 404 NotFound: pods \"nope\" not found");

  ASSERT_TRUE(server_->fault({{"fail", {{"count", 1}, {"status", 500}}}}).ok());
  auto failed = client_->get(namespacePath("shop"));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code, 500);
  EXPECT_EQ(failed.error().message,
            "GET /api/v1/namespaces/shop: HTTP 500 InternalError: Internal error occurred: injected fault");
  EXPECT_TRUE(client_->get(namespacePath("shop")).ok()) << "only one request was to fail";

  auto badSelector = client_->list(podsPath(), ListOptions{.fieldSelector = "spec.colour=red"});
  ASSERT_FALSE(badSelector.ok());
  EXPECT_EQ(badSelector.error().code, 400);
  EXPECT_NE(badSelector.error().message.find("GET /api/v1/pods?fieldSelector=spec.colour%3Dred: HTTP 400 BadRequest: "),
            std::string::npos)
      << badSelector.error().message;
}

TEST_F(KubeClient, WrongTokenIsUnauthorized) {
  test::TempDir dir("kube-token");
  ASSERT_TRUE(test::writeTextFile(dir.file("token"), "not-the-token\n"));
  auto cfg = server_->clientConfig();
  cfg.tokenFile = dir.file("token");
  auto c = Client::create(cfg);
  ASSERT_TRUE(c.ok());
  auto r = (*c)->get(namespacePath("shop"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, 401);
  EXPECT_EQ(r.error().message, "GET /api/v1/namespaces/shop: HTTP 401 Unauthorized");
}

TEST_F(KubeClient, TokenFileErrors) {
  test::TempDir dir("kube-token");
  auto cfg = server_->clientConfig();
  cfg.tokenFile = dir.file("token");
  ASSERT_TRUE(test::writeTextFile(cfg.tokenFile, "\n"));
  auto empty = Client::create(cfg);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message, "Kubernetes token file " + cfg.tokenFile + " is empty");
  ASSERT_TRUE(test::writeTextFile(cfg.tokenFile, "a\nb\n"));
  EXPECT_EQ(Client::create(cfg).error().message, "Kubernetes token file " + cfg.tokenFile + " holds more than one line");
  cfg.tokenFile = dir.file("absent");
  EXPECT_EQ(Client::create(cfg).error().message,
            "Kubernetes token file " + cfg.tokenFile + ": No such file or directory");
}

TEST_F(KubeClient, RotatedTokenIsPickedUp) {
  ASSERT_TRUE(client_->get(namespacePath("shop")).ok());
  ASSERT_TRUE(server_->rotateToken("rotated-token-1").ok());
  auto r = client_->get(namespacePath("shop"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  auto reqs = server_->requests();
  ASSERT_TRUE(reqs.ok());
  EXPECT_EQ(reqs->back()["token"], "rotated-token-1");
  EXPECT_EQ(reqs->back()["status"], 200);
  auto tok = client_->token();
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(*tok, "rotated-token-1");
}

TEST_F(KubeClient, ServerCertificateMustChainToTheConfiguredCa) {
  auto cfg = server_->clientConfig();
  cfg.caFile = server_->otherCaFile();
  auto c = Client::create(cfg);
  ASSERT_TRUE(c.ok());
  auto r = (*c)->get(namespacePath("shop"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EPROTO);
  EXPECT_EQ(r.error().message.rfind("GET /api/v1/namespaces/shop: SSL certificate problem", 0), 0u) << r.error().message;
}

TEST_F(KubeClient, ServerDownIsConnectionRefused) {
  ASSERT_TRUE(server_->fault({{"down", true}}).ok());
  auto r = client_->get(namespacePath("shop"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ECONNREFUSED);
  EXPECT_EQ(r.error().message.rfind("GET /api/v1/namespaces/shop: Failed to connect to 127.0.0.1 port " +
                                        std::to_string(server_->port()),
                                    0),
            0u)
      << r.error().message;
  ASSERT_TRUE(server_->fault({{"up", true}}).ok());
  EXPECT_TRUE(client_->get(namespacePath("shop")).ok()) << "same port after coming back";
}

TEST_F(KubeClient, ChunkedListIsOneConsistentSnapshot) {
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(server_->createPod(pod("a" + std::to_string(i))).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(server_->createPod(pod("b" + std::to_string(i), "node-b")).ok());
  ListOptions o{.fieldSelector = "spec.nodeName=node-a", .limit = 3};
  auto first = client_->list(podsPath(), o);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->items.size(), 3u);
  ASSERT_FALSE(first->continueToken.empty());
  // Changes after the first page are not in the later pages.
  ASSERT_TRUE(server_->createPod(pod("a99")).ok());
  ASSERT_TRUE(server_->deletePod("shop", "a6").ok());
  std::vector<std::string> names;
  for (const auto& i : first->items) names.push_back(i["metadata"]["name"]);
  std::string token = first->continueToken;
  while (!token.empty()) {
    o.continueToken = token;
    auto page = client_->list(podsPath(), o);
    ASSERT_TRUE(page.ok()) << page.error().message;
    EXPECT_EQ(page->resourceVersion, first->resourceVersion);
    for (const auto& i : page->items) names.push_back(i["metadata"]["name"]);
    token = page->continueToken;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a0", "a1", "a2", "a3", "a4", "a5", "a6"}));
}

TEST_F(KubeClient, ExpiredContinueTokenIsGone) {
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(server_->createPod(pod("a" + std::to_string(i))).ok());
  auto first = client_->list(podsPath(), ListOptions{.limit = 2});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(server_->createPod(pod("late")).ok());
  ASSERT_TRUE(server_->fault({{"compact", "now"}}).ok());
  auto next = client_->list(podsPath(), ListOptions{.limit = 2, .continueToken = first->continueToken});
  ASSERT_FALSE(next.ok());
  EXPECT_TRUE(isGone(next.error()));
  EXPECT_NE(next.error().message.find(": HTTP 410 Expired: The provided continue parameter is too old"), std::string::npos)
      << next.error().message;
}

TEST_F(KubeClient, WatchStreamsEventsInOrderWithBookmarks) {
  auto created = server_->createPod(pod("w1"));
  ASSERT_TRUE(created.ok());
  auto list = client_->list(podsPath(), ListOptions{.fieldSelector = "spec.nodeName=node-a"});
  ASSERT_TRUE(list.ok());
  std::vector<std::string> seen;
  std::atomic<bool> opened{false}, bookmarked{false};
  std::thread changer([&] {
    // The bookmark fault reaches only watches the server holds: wait for
    // this one to be open (a fixed sleep lost the race on a loaded machine).
    for (int i = 0; i < 500 && !opened; i++) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(opened) << "the watch never opened";
    EXPECT_TRUE(server_->patchPod("shop", "w1", {{"metadata", {{"labels", {{"x", "1"}}}}}}).ok());
    EXPECT_TRUE(server_->createPod(pod("other", "node-b")).ok());  // filtered out
    EXPECT_TRUE(server_->fault({{"bookmark", true}}).ok());
    // The server sends what changed before the bookmark it was asked for:
    // a deletion that lands before the bookmark went out would come first.
    for (int i = 0; i < 500 && !bookmarked; i++) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(bookmarked) << "no bookmark arrived";
    EXPECT_TRUE(server_->deletePod("shop", "w1").ok());
  });
  WatchOptions o{.fieldSelector = "spec.nodeName=node-a", .resourceVersion = list->resourceVersion, .stallTimeout = 5s};
  o.onOpen = [&] {
    seen.push_back("open");
    opened = true;
  };
  auto end = client_->watch(podsPath(), o, [&](WatchEvent&& ev) {
    std::string what = toString(ev.type);
    if (ev.type != WatchEventType::Bookmark) what += " " + ev.object["metadata"]["name"].get<std::string>();
    seen.push_back(what);
    if (ev.type == WatchEventType::Bookmark) bookmarked = true;
    return ev.type != WatchEventType::Deleted;
  });
  changer.join();
  ASSERT_TRUE(end.ok()) << end.error().message;
  EXPECT_EQ(*end, WatchEnd::Stopped);
  EXPECT_EQ(seen, (std::vector<std::string>{"open", "MODIFIED w1", "BOOKMARK", "DELETED w1"}));
}

TEST_F(KubeClient, WatchTimeoutEndsTheStreamCleanly) {
  auto list = client_->list(podsPath(), {});
  ASSERT_TRUE(list.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto end = client_->watch(podsPath(), WatchOptions{.resourceVersion = list->resourceVersion, .timeout = 1s},
                            [](WatchEvent&&) { return true; });
  ASSERT_TRUE(end.ok()) << end.error().message;
  EXPECT_EQ(*end, WatchEnd::Closed);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 900ms);
}

TEST_F(KubeClient, TooOldVersionIsGoneAsEventOrStatus) {
  auto list = client_->list(podsPath(), {});
  ASSERT_TRUE(list.ok());
  ASSERT_TRUE(server_->createPod(pod("x")).ok());
  ASSERT_TRUE(server_->fault({{"compact", "now"}}).ok());
  std::optional<Error> gone;
  auto end = client_->watch(podsPath(), WatchOptions{.resourceVersion = list->resourceVersion}, [&](WatchEvent&& ev) {
    if (ev.type == WatchEventType::Error) gone = statusError(ev.object, "watch");
    return true;
  });
  ASSERT_TRUE(end.ok()) << end.error().message;
  ASSERT_TRUE(gone.has_value());
  EXPECT_TRUE(isGone(*gone));
  EXPECT_EQ(gone->message.rfind("watch: HTTP 410 Expired: too old resource version: " + list->resourceVersion, 0), 0u)
      << gone->message;

  ASSERT_TRUE(server_->fault({{"gone_mode", "http"}}).ok());
  bool opened = false;
  WatchOptions wo{.resourceVersion = list->resourceVersion};
  wo.onOpen = [&] { opened = true; };
  auto http = client_->watch(podsPath(), wo, [](WatchEvent&&) { return true; });
  EXPECT_FALSE(opened) << "a refused watch is not open";
  ASSERT_FALSE(http.ok());
  EXPECT_TRUE(isGone(http.error()));
  EXPECT_NE(http.error().message.find("&resourceVersion=" + list->resourceVersion + "&allowWatchBookmarks=true: HTTP 410 Expired: too old resource version"),
            std::string::npos)
      << http.error().message;
}

TEST_F(KubeClient, StalledStreamTimesOut) {
  auto list = client_->list(podsPath(), {});
  ASSERT_TRUE(list.ok());
  int events = 0;
  std::thread staller([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(server_->fault({{"stall", "open"}}).ok());
    EXPECT_TRUE(server_->createPod(pod("half")).ok());  // half of this event goes out
  });
  auto t0 = std::chrono::steady_clock::now();
  auto end = client_->watch(podsPath(), WatchOptions{.resourceVersion = list->resourceVersion, .stallTimeout = 800ms},
                            [&](WatchEvent&&) { return ++events, true; });
  staller.join();
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ETIMEDOUT);
  EXPECT_NE(end.error().message.find(": no data for 800 ms (stalled stream)"), std::string::npos) << end.error().message;
  EXPECT_EQ(events, 0) << "half an event is no event";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_F(KubeClient, DroppedStreamIsConnectionLost) {
  auto list = client_->list(podsPath(), {});
  ASSERT_TRUE(list.ok());
  std::thread dropper([&] {
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(server_->fault({{"drop", true}}).ok());
  });
  auto end = client_->watch(podsPath(), WatchOptions{.resourceVersion = list->resourceVersion, .stallTimeout = 10s},
                            [](WatchEvent&&) { return true; });
  dropper.join();
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ECONNRESET) << end.error().message;
  EXPECT_NE(end.error().message.find(": connection lost ("), std::string::npos) << end.error().message;
}

TEST_F(KubeClient, SlowStreamStillDeliversWholeEvents) {
  auto list = client_->list(podsPath(), {});
  ASSERT_TRUE(list.ok());
  ASSERT_TRUE(server_->fault({{"slow", 0.001}}).ok());  // one byte per millisecond
  ASSERT_TRUE(server_->createPod(pod("slow1")).ok());
  ASSERT_TRUE(server_->createPod(pod("slow2")).ok());
  std::vector<std::string> names;
  auto end = client_->watch(podsPath(), WatchOptions{.resourceVersion = list->resourceVersion, .stallTimeout = 500ms},
                            [&](WatchEvent&& ev) {
                              names.push_back(ev.object["metadata"]["name"]);
                              return names.size() < 2;
                            });
  ASSERT_TRUE(end.ok()) << end.error().message;
  EXPECT_EQ(names, (std::vector<std::string>{"slow1", "slow2"}));
}

TEST_F(KubeClient, StopTokenCancelsAWatch) {
  auto list = client_->list(podsPath(), {});
  ASSERT_TRUE(list.ok());
  std::stop_source stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(300ms);
    stop.request_stop();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto end = client_->watch(podsPath(), WatchOptions{.resourceVersion = list->resourceVersion},
                            [](WatchEvent&&) { return true; }, stop.get_token());
  stopper.join();
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ECANCELED);
  EXPECT_NE(end.error().message.find(": cancelled"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST_F(KubeClient, MergePatchOnPodStatus) {
  ASSERT_TRUE(server_->createPod(pod("p1")).ok());
  auto r = client_->mergePatch(podStatusPath("shop", "p1"),
                               {{"metadata", {{"annotations", {{"ambient.istio.io/redirection", "enabled"}}}}},
                                {"spec", {{"nodeName", "elsewhere"}}}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["metadata"]["annotations"]["ambient.istio.io/redirection"], "enabled");
  EXPECT_EQ((*r)["spec"]["nodeName"], "node-a") << "the status subresource keeps the spec";
  auto removed = client_->mergePatch(podStatusPath("shop", "p1"),
                                     {{"metadata", {{"annotations", {{"ambient.istio.io/redirection", nullptr}}}}}});
  ASSERT_TRUE(removed.ok());
  EXPECT_FALSE((*removed)["metadata"].value("annotations", json::object()).contains("ambient.istio.io/redirection"));
  auto patches = server_->patches();
  ASSERT_TRUE(patches.ok());
  ASSERT_EQ(patches->size(), 2u);
  EXPECT_EQ((*patches)[0]["subresource"], "status");
  EXPECT_EQ((*patches)[0]["contentType"], "application/merge-patch+json");

  auto missing = client_->mergePatch(podStatusPath("shop", "gone"), {{"metadata", json::object()}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "PATCH /api/v1/namespaces/shop/pods/gone/status: HTTP 404 NotFound: pods \"gone\" not found");
}

class KubeConfig : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("KUBERNETES_SERVICE_HOST");
    ::unsetenv("KUBERNETES_SERVICE_PORT");
  }
};

TEST_F(KubeConfig, InClusterFromEnvironmentAndServiceAccountFiles) {
  test::TempDir sa("kube-sa");
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(inClusterConfig(sa.path()).error().message,
            "in-cluster configuration: KUBERNETES_SERVICE_HOST is not set (not in a pod?)");
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  EXPECT_EQ(inClusterConfig(sa.path()).error().message,
            "in-cluster configuration: KUBERNETES_SERVICE_PORT is not set (not in a pod?)");
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  EXPECT_EQ(inClusterConfig(sa.path()).error().message,
            "in-cluster configuration: service account token " + sa.file("token") + ": No such file or directory");
  ASSERT_TRUE(test::writeTextFile(sa.file("token"), "t\n"));
  EXPECT_EQ(inClusterConfig(sa.path()).error().message,
            "in-cluster configuration: service account CA " + sa.file("ca.crt") + ": No such file or directory");
  ASSERT_TRUE(test::writeTextFile(sa.file("ca.crt"), "x"));
  auto c = inClusterConfig(sa.path());
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->apiUrl, "https://10.96.0.1:443");
  EXPECT_EQ(c->tokenFile, sa.file("token"));
  EXPECT_EQ(c->caFile, sa.file("ca.crt"));
  ::setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
  EXPECT_EQ(inClusterConfig(sa.path())->apiUrl, "https://[fd00:10:96::1]:443");
}

TEST_F(KubeConfig, ExplicitConfiguration) {
  test::TempDir d("kube-cfg");
  EXPECT_EQ(explicitConfig("ftp://x", "", "").error().message,
            "Kubernetes API URL \"ftp://x\" is not an http:// or https:// URL");
  EXPECT_EQ(explicitConfig("https://x", d.file("t"), "").error().message,
            "Kubernetes token file " + d.file("t") + ": No such file or directory");
  EXPECT_EQ(explicitConfig("https://x", "", d.file("ca")).error().message,
            "Kubernetes CA file " + d.file("ca") + ": No such file or directory");
  auto c = explicitConfig("https://127.0.0.1:6443/", "", "");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->apiUrl, "https://127.0.0.1:6443");
}

}  // namespace
}  // namespace sluice::kube
