// sluice-cni's own way to the Kubernetes API (when the agent cannot be
// reached): HTTP responses as the API server sends them, the server
// address (an IP, never a name), the kubeconfig install writes and the
// plugin reads, the plugin's mesh keys, and install's part of it.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include "test/common/apiserver.h"
#include "test/common/tempdir.h"
#include "userspace/cni/cni.h"
#include "userspace/cni/install.h"
#include "userspace/cni/kube_get.h"
#include "userspace/cni/kubeconfig.h"
#include "userspace/cni/mesh_check.h"
#include "userspace/cni/mesh_install.h"

namespace sluice::cni {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

TEST(CniHttp, ContentLengthChunkedAndToTheEnd) {
  auto r = parseHttpResponse("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}trailing");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"a\":1}");

  r = parseHttpResponse("HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body, "{\"a\":1}");

  r = parseHttpResponse("HTTP/1.0 401 Unauthorized\r\n\r\nno length");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->body, "no length");
}

TEST(CniHttp, BrokenResponsesAreProtocolErrors) {
  for (const char* raw : {"", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n", "SSH-2.0-OpenSSH\r\n\r\n",
                          "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                          "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "HTTP/1.1 20 OK\r\n\r\n"}) {
    auto r = parseHttpResponse(raw);
    EXPECT_FALSE(r.ok()) << raw;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, EPROTO) << raw;
    }
  }
}

TEST(CniHttp, ServerIsAnIpAndAPort) {
  auto a = parseServer("https://10.96.0.1:443");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.96.0.1");
  EXPECT_EQ(a->port, 443);
  a = parseServer("https://[fd00::1]:6443/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "fd00::1");
  EXPECT_EQ(a->port, 6443);
  a = parseServer("https://127.0.0.1");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->port, 443);
  for (const char* bad : {"http://10.0.0.1:80", "https://kubernetes.default.svc:443", "https://10.0.0.1:0",
                          "https://10.0.0.1:99999", "https://[fd00::1", "https://10.0.0.1:x"}) {
    auto r = parseServer(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code, EINVAL) << bad;
    }
  }
  EXPECT_NE(parseServer("https://kubernetes.default.svc:443").error().message.find("resolves no names"), std::string::npos);
}

TEST(CniKubeconfig, WrittenFromTheServiceAccountAndReadBack) {
  test::TempDir tmp("cni-kubeconfig");
  ASSERT_TRUE(test::writeTextFile(tmp.file("ca.crt"), "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"));
  ASSERT_TRUE(test::writeTextFile(tmp.file("token"), "secret-token\n"));
  auto env = [](const char* n) -> std::optional<std::string> {
    if (std::string(n) == "KUBERNETES_SERVICE_HOST") return "10.96.0.1";
    if (std::string(n) == "KUBERNETES_SERVICE_PORT") return "443";
    return std::nullopt;
  };
  auto c = serviceAccountCredentials(tmp.path(), env);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->token, "secret-token");
  ASSERT_TRUE(writeFileAtomic(tmp.file("kubeconfig"), kubeconfigText(*c), 0600).ok());
  struct stat st {};
  ASSERT_EQ(::stat(tmp.file("kubeconfig").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = loadKubeconfig(tmp.file("kubeconfig"));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->server, c->server);
  EXPECT_EQ(back->caPem, c->caPem);
  EXPECT_EQ(back->token, c->token);
  // kubectl's shape: current-context naming a cluster and a user.
  auto j = json::parse(test::readTextFile(tmp.file("kubeconfig")));
  EXPECT_EQ(j["current-context"], "sluice-cni-context");
  EXPECT_EQ(j["clusters"][0]["cluster"]["server"], "https://10.96.0.1:443");

  // An IPv6 service address is bracketed; a name is refused (nothing to
  // resolve it in a static binary).
  auto v6 = serviceAccountCredentials(tmp.path(), [](const char* n) -> std::optional<std::string> {
    return std::string(n) == "KUBERNETES_SERVICE_HOST" ? "fd00::1" : "6443";
  });
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->server, "https://[fd00::1]:6443");
  auto named = serviceAccountCredentials(tmp.path(), [](const char* n) -> std::optional<std::string> {
    return std::string(n) == "KUBERNETES_SERVICE_HOST" ? "kubernetes" : "443";
  });
  EXPECT_FALSE(named.ok());
  auto outside = serviceAccountCredentials(tmp.path(), [](const char*) { return std::optional<std::string>(); });
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.error().message.find("KUBERNETES_SERVICE_HOST is not set"), std::string::npos);
}

TEST(CniKubeconfig, WhatIsMissingIsNamed) {
  const ordered_json good = kubeconfigJson({"https://10.0.0.1:443", "PEM", "t"});
  struct Case {
    std::function<void(ordered_json&)> change;
    const char* message;
  };
  const Case cases[] = {
      {[](ordered_json& j) { j["current-context"] = "other"; }, "no context \"other\""},
      {[](ordered_json& j) { j["clusters"] = ordered_json::array(); }, "the current context's cluster is missing"},
      {[](ordered_json& j) { j["users"][0]["name"] = "x"; }, "the current context's user is missing"},
      {[](ordered_json& j) { j["clusters"][0]["cluster"]["server"] = "http://10.0.0.1"; }, "is not https://IP:PORT"},
      {[](ordered_json& j) { j["clusters"][0]["cluster"].erase("certificate-authority-data"); },
       "no certificate-authority-data or certificate-authority"},
      {[](ordered_json& j) { j["clusters"][0]["cluster"]["certificate-authority-data"] = "%%%"; }, "is not base64"},
      {[](ordered_json& j) { j["users"][0]["user"].erase("token"); }, "the user has no token or tokenFile"},
  };
  for (const auto& c : cases) {
    ordered_json j = good;
    c.change(j);
    auto r = parseKubeconfig(j.dump(), "/k");
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.error().message.rfind("/k: ", 0), 0u) << r.error().message;
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << r.error().message;
  }
  EXPECT_FALSE(parseKubeconfig("server: yaml", "/k").ok());
  auto ok = parseKubeconfig(good.dump(), "/k");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->caPem, "PEM");
}

TEST(CniMeshConfig, KeysDefaultsAndErrors) {
  auto d = parseMeshConfig(ordered_json::object());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kubeconfig, "");
  EXPECT_EQ(d->excludeNamespaces, std::set<std::string>{"kube-system"});
  EXPECT_TRUE(d->selectors.isDefault());

  auto c = parseMeshConfig(ordered_json::parse(R"({"kubeconfig": "/etc/k", "excludeNamespaces": ["a", "b"],
      "enablementSelectors": [{"podSelector": {"matchLabels": {"app": "x"}}}]})"));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->kubeconfig, "/etc/k");
  EXPECT_EQ(c->excludeNamespaces, (std::set<std::string>{"a", "b"}));
  EXPECT_EQ(c->selectors.match({{"app", "x"}}, {}), 0u);

  for (const char* bad : {R"({"kubeconfig": "rel"})", R"({"excludeNamespaces": "kube-system"})",
                          R"({"excludeNamespaces": ["Bad"]})", R"({"enablementSelectors": []})",
                          R"({"enablementSelectors": [{"podselector": {}}]})"}) {
    auto r = parseMeshConfig(ordered_json::parse(bad));
    EXPECT_FALSE(r.ok()) << bad;
  }
  // Through the whole plugin: a bad key is an invalid configuration (7).
  Env env{"ADD", "c0ffee", "/proc/self/ns/net", "eth0", "", ""};
  auto o = run(env, R"({"cniVersion":"1.0.0","name":"n","type":"sluice-cni","enablementSelectors":[{"podSelector":{"matchLabels":{"a":"b c"}}}]})");
  EXPECT_NE(o.exitCode, 0);
  auto j = json::parse(o.stdoutText);
  EXPECT_EQ(j["code"], kCniInvalidConfig);
  EXPECT_NE(j["msg"].get<std::string>().find("'enablementSelectors': enablement selector [0].podSelector.matchLabels.a"),
            std::string::npos)
      << j;
}

TEST(CniMeshConfig, ExcludedNamespacesPassWithoutAskingAnyone) {
  MeshConfig c;
  c.kubeconfig = "/nonexistent/kubeconfig";
  auto a = judgeWithoutAgent({"kube-system", "coredns-1", ""}, c);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_FALSE(a->inMesh);
  EXPECT_EQ(a->reason, "namespace kube-system is excluded");
  // Anyone else needs the API: without credentials that is an error, not
  // a guess.
  auto b = judgeWithoutAgent({"shop", "web", ""}, c);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("no credentials for the Kubernetes API"), std::string::npos) << b.error().message;
}

// The rules install writes beside the credentials apply where the entry
// sets none (an entry the agent put back), never over the entry's own.
TEST(CniMeshConfig, KubeconfigRulesFillWhatTheEntryLeavesOut) {
  KubeCredentials c{"https://10.0.0.1:443", "PEM", "t", ordered_json::parse(R"({"excludeNamespaces": ["infra"],
      "enablementSelectors": [{"podSelector": {"matchLabels": {"app": "x"}}}]})")};
  auto back = parseKubeconfig(kubeconfigText(c), "/k");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->meshRules, c.meshRules);
  auto bare = parseMeshConfig(ordered_json::object());
  ASSERT_TRUE(bare.ok());
  auto merged = withKubeconfigRules(*bare, back->meshRules);
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  EXPECT_EQ(merged->excludeNamespaces, std::set<std::string>{"infra"});
  EXPECT_EQ(merged->selectors.match({{"app", "x"}}, {}), 0u);
  auto own = parseMeshConfig(ordered_json::parse(R"({"excludeNamespaces": ["kube-system"]})"));
  ASSERT_TRUE(own.ok());
  merged = withKubeconfigRules(*own, back->meshRules);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->excludeNamespaces, std::set<std::string>{"kube-system"}) << "the entry's own key wins";
  EXPECT_EQ(merged->selectors.match({{"app", "x"}}, {}), 0u);
  auto bad = withKubeconfigRules(*bare, ordered_json::parse(R"({"enablementSelectors": []})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("sluice-cni.mesh extension: 'enablementSelectors'"), std::string::npos)
      << bad.error().message;
}

TEST(CniMeshInstall, FlagsAndTheEntrysKeys) {
  MeshInstallOptions o;
  std::vector<std::string> args = {"--exclude-namespaces", "kube-system,infra", "--ambient-enablement-selector",
                                   "- podSelector: {matchLabels: {app: x}}", "--other"};
  size_t i = 0;
  ASSERT_TRUE(*parseMeshInstallFlag(o, args, i));
  ASSERT_TRUE(*parseMeshInstallFlag(o, args, ++i));
  EXPECT_FALSE(*parseMeshInstallFlag(o, args, ++i));
  auto noEnv = [](const char*) { return std::optional<std::string>(); };
  auto plan = planMeshInstall(o, noEnv);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->keys["excludeNamespaces"], ordered_json::parse(R"(["kube-system","infra"])"));
  EXPECT_EQ(plan->keys["enablementSelectors"], ordered_json::parse(R"([{"podSelector":{"matchLabels":{"app":"x"}}}])"));
  EXPECT_FALSE(plan->keys.contains("kubeconfig"));
  EXPECT_EQ(plan->kubeconfigPath, "");
  // The defaults add no key; a bad selector from the environment is named.
  auto none = planMeshInstall(MeshInstallOptions{}, noEnv);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->keys.empty());
  auto bad = planMeshInstall(MeshInstallOptions{}, [](const char*) { return std::optional<std::string>("- {}"); });
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("invalid AMBIENT_ENABLEMENT_SELECTOR: enablement selector [0]", 0), 0u)
      << bad.error().message;
  std::vector<std::string> missing = {"--kubeconfig"};
  i = 0;
  EXPECT_FALSE(parseMeshInstallFlag(o, missing, i).ok());
}

// The plugin's GET against the test API server (TLS, token): an object, a
// missing one, refused credentials, a CA that signed nothing it presents,
// and the server away — each with its code and a one-line message.
class CniKubeGet : public test::ApiServerTest {
 protected:
  KubeCredentials creds(const std::string& token = "") const {
    KubeCredentials c;
    c.server = server_->url();
    c.caPem = test::readTextFile(server_->caFile());
    c.token = token.empty() ? test::readTextFile(server_->tokenFile()) : token;
    while (!c.token.empty() && c.token.back() == '\n') c.token.pop_back();
    return c;
  }
  static constexpr std::chrono::milliseconds kTimeout{5000};
};

TEST_F(CniKubeGet, ObjectsMissingAndRefused) {
  auto ns = kubeGetObject(creds(), "/api/v1/namespaces/shop", kTimeout);
  ASSERT_TRUE(ns.ok()) << ns.error().message;
  EXPECT_EQ((*ns)["metadata"]["name"], "shop");
  auto missing = kubeGetObject(creds(), "/api/v1/namespaces/shop/pods/nope", kTimeout);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ENOENT);
  EXPECT_EQ(missing.error().message.rfind("GET /api/v1/namespaces/shop/pods/nope: 404", 0), 0u) << missing.error().message;
  auto refused = kubeGetObject(creds("not-the-token"), "/api/v1/namespaces/shop", kTimeout);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, EACCES);
  EXPECT_EQ(refused.error().message, "GET /api/v1/namespaces/shop: 401 Unauthorized");
}

TEST_F(CniKubeGet, AnotherCaIsRefusedAndAnAbsentServerNamed) {
  KubeCredentials other = creds();
  other.caPem = test::readTextFile(server_->otherCaFile());
  auto r = httpsGet(other, "/api/v1/namespaces/shop", kTimeout);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EPROTO);
  EXPECT_NE(r.error().message.find("the server's certificate: "), std::string::npos) << r.error().message;
  KubeCredentials noCa = creds();
  noCa.caPem = "not PEM";
  EXPECT_FALSE(httpsGet(noCa, "/", kTimeout).ok());

  ASSERT_TRUE(server_->fault({{"down", true}}).ok());
  auto down = httpsGet(creds(), "/api/v1/namespaces/shop", kTimeout);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().message.find('\n'), std::string::npos) << down.error().message;
  EXPECT_NE(down.error().message.find("127.0.0.1:" + std::to_string(server_->port())), std::string::npos)
      << down.error().message;
}

}  // namespace
}  // namespace sluice::cni
