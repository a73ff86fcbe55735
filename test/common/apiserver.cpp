#include "test/common/apiserver.h"

#include <curl/curl.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "test/common/agent_process.h"

namespace sluice::test {

using nlohmann::json;

namespace {

const std::string kServerScript = std::string(SLUICE_SOURCE_DIR) + "/test/apiserver/apiserver.py";

size_t collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

json podObject(const TestPod& p) {
  json meta = {{"name", p.name}, {"namespace", p.namespaceName}};
  if (!p.uid.empty()) meta["uid"] = p.uid;
  if (!p.labels.empty()) meta["labels"] = p.labels;
  if (!p.annotations.empty()) meta["annotations"] = p.annotations;
  json spec = {{"nodeName", p.node}, {"serviceAccountName", p.serviceAccount},
               {"containers", json::array({{{"name", "app"}, {"image", "app:1"}}})}};
  if (p.hostNetwork) spec["hostNetwork"] = true;
  json status = {{"phase", p.phase}};
  if (!p.ips.empty()) {
    status["podIP"] = p.ips.front();
    json ips = json::array();
    for (const auto& ip : p.ips) ips.push_back({{"ip", ip}});
    status["podIPs"] = ips;
  }
  return {{"metadata", meta}, {"spec", spec}, {"status", status}};
}

json namespaceObject(const std::string& name, const std::map<std::string, std::string>& labels) {
  json meta = {{"name", name}};
  if (!labels.empty()) meta["labels"] = labels;
  return {{"metadata", meta}, {"status", {{"phase", "Active"}}}};
}

void ApiServerTest::SetUp() {
  auto s = TestApiServer::start();
  ASSERT_TRUE(s.ok()) << s.error().message;
  server_ = std::move(*s);
  auto c = kube::Client::create(server_->clientConfig());
  ASSERT_TRUE(c.ok()) << c.error().message;
  client_ = std::move(*c);
  ASSERT_TRUE(server_->createNamespace("shop").ok());
}

TestPod ApiServerTest::shopPod(const std::string& name, const std::string& node) {
  TestPod p;
  p.namespaceName = "shop";
  p.name = name;
  p.node = node;
  p.ips = {"10.1.0.1"};
  return p;
}

Result<std::unique_ptr<TestApiServer>> TestApiServer::start(int window) {
  std::unique_ptr<TestApiServer> s(new TestApiServer());
  if (s->dir_.path().empty()) return Error::msg("test API server: no temporary directory", EIO);
  auto pid = spawnWithLog({"/usr/bin/python3", kServerScript, "--dir", s->dir_.path(), "--window", std::to_string(window)},
                          s->dir_.file("server.log"));
  SLUICE_TRY(pid);
  s->pid_ = *pid;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    std::string ready = readTextFile(s->dir_.file("ready.json"));
    if (!ready.empty()) {
      json j = json::parse(ready, nullptr, false);
      if (!j.is_discarded()) {
        s->apiPort_ = j.value("api_port", 0);
        s->adminPort_ = j.value("admin_port", 0);
        return s;
      }
    }
    if (waitExit(s->pid_, std::chrono::milliseconds(0)) >= 0) {
      s->pid_ = -1;
      return Error::msg("test API server exited during start-up: " + s->log(), ECHILD);
    }
    if (std::chrono::steady_clock::now() > deadline)
      return Error::msg("test API server not ready within 20 s: " + s->log(), ETIMEDOUT);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TestApiServer::~TestApiServer() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    waitExit(pid_, std::chrono::seconds(10));
  }
}

std::string TestApiServer::url() const { return "https://127.0.0.1:" + std::to_string(apiPort_); }

kube::ClientConfig TestApiServer::clientConfig() const {
  kube::ClientConfig c;
  c.apiUrl = url();
  c.tokenFile = tokenFile();
  c.caFile = caFile();
  c.connectTimeout = std::chrono::milliseconds(2000);
  c.requestTimeout = std::chrono::milliseconds(10000);
  c.userAgent = "sluice-tests";
  return c;
}

Status TestApiServer::rotateToken(const std::string& token) {
  // Like kubelet: the new file appears by rename, never half-written.
  std::string tmp = dir_.file("token.new");
  if (!writeTextFile(tmp, token + "\n")) return Error::msg("write " + tmp, EIO);
  SLUICE_TRY(fault({{"tokens", json::array({token})}}));
  if (::rename(tmp.c_str(), tokenFile().c_str()) != 0) return Error::fromErrno(errno, "rename " + tmp);
  return {};
}

Result<json> TestApiServer::admin(const std::string& method, const std::string& path, const json& body) {
  std::unique_ptr<CURL, void (*)(CURL*)> e(curl_easy_init(), curl_easy_cleanup);
  if (!e) return Error::msg("curl_easy_init", ENOMEM);
  std::string url = "http://127.0.0.1:" + std::to_string(adminPort_) + path, out, payload;
  curl_easy_setopt(e.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(e.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e.get(), CURLOPT_TIMEOUT_MS, 20000L);
  curl_easy_setopt(e.get(), CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(e.get(), CURLOPT_WRITEDATA, &out);
  if (method == "POST") {
    payload = body.is_null() ? "{}" : body.dump();
    curl_easy_setopt(e.get(), CURLOPT_POSTFIELDS, payload.c_str());
    curl_easy_setopt(e.get(), CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
  }
  CURLcode rc = curl_easy_perform(e.get());
  if (rc != CURLE_OK) return Error::msg("admin " + path + ": " + curl_easy_strerror(rc), EIO);
  long status = 0;
  curl_easy_getinfo(e.get(), CURLINFO_RESPONSE_CODE, &status);
  json j = json::parse(out, nullptr, false);
  if (status != 200) return Error::msg("admin " + path + ": HTTP " + std::to_string(status) + ": " + out, static_cast<int>(status));
  if (j.is_discarded()) return Error::msg("admin " + path + ": not JSON: " + out, EPROTO);
  return j;
}

Result<json> TestApiServer::apply(const json& ops) { return admin("POST", "/admin/apply", {{"ops", ops}}); }

Result<json> TestApiServer::createNamespace(const std::string& name, const std::map<std::string, std::string>& labels) {
  auto r = apply(json::array({{{"op", "create"}, {"kind", "namespaces"}, {"object", namespaceObject(name, labels)}}}));
  if (!r) return r.error();
  return (*r)["results"][0];
}

Status TestApiServer::setNamespaceLabels(const std::string& name, const std::map<std::string, std::string>& labels) {
  auto current = object("namespaces", "", name);
  SLUICE_TRY(current);
  if (!*current) return Error::msg("namespace " + name + " does not exist", ENOENT);
  json patchLabels = json::object();
  const json old = (**current)["metadata"].value("labels", json::object());
  for (const auto& [k, v] : old.items()) patchLabels[k] = nullptr;
  for (const auto& [k, v] : labels) patchLabels[k] = v;
  SLUICE_TRY(apply(json::array({{{"op", "patch"}, {"kind", "namespaces"}, {"name", name},
                                 {"patch", {{"metadata", {{"labels", patchLabels}}}}}}})));
  return {};
}

Status TestApiServer::deleteNamespace(const std::string& name) {
  SLUICE_TRY(apply(json::array({{{"op", "delete"}, {"kind", "namespaces"}, {"name", name}}})));
  return {};
}

Result<json> TestApiServer::createPod(const TestPod& p) {
  auto r = apply(json::array({{{"op", "create"}, {"kind", "pods"}, {"object", podObject(p)}}}));
  if (!r) return r.error();
  return (*r)["results"][0];
}

Status TestApiServer::createNodeAgentPod() {
  SLUICE_TRY(createNamespace("sluice-system"));
  TestPod agent;
  agent.namespaceName = "sluice-system";
  agent.name = "sluice-node-x";
  agent.hostNetwork = true;
  agent.ips = {"192.0.2.10"};
  SLUICE_TRY(createPod(agent));
  return {};
}

Status TestApiServer::patchPod(const std::string& ns, const std::string& name, const json& mergePatch) {
  SLUICE_TRY(apply(json::array({{{"op", "patch"}, {"kind", "pods"}, {"namespace", ns}, {"name", name}, {"patch", mergePatch}}})));
  return {};
}

Status TestApiServer::deletePod(const std::string& ns, const std::string& name) {
  SLUICE_TRY(apply(json::array({{{"op", "delete"}, {"kind", "pods"}, {"namespace", ns}, {"name", name}}})));
  return {};
}

std::optional<std::string> TestApiServer::podAnnotation(const std::string& ns, const std::string& name,
                                                        const std::string& key) {
  auto o = object("pods", ns, name);
  if (!o.ok() || !o->has_value()) return std::nullopt;
  const json a = (**o)["metadata"].value("annotations", json::object());
  if (!a.contains(key)) return std::nullopt;
  return a[key].get<std::string>();
}

Result<std::optional<json>> TestApiServer::object(const std::string& kind, const std::string& ns, const std::string& name) {
  std::string path = "/admin/objects/" + kind + "/" + (ns.empty() ? "" : ns + "/") + name;
  auto r = admin("GET", path);
  if (!r) {
    if (r.error().code == 404) return std::optional<json>();
    return r.error();
  }
  return std::optional<json>(*r);
}

Status TestApiServer::fault(const json& body) {
  SLUICE_TRY(admin("POST", "/admin/fault", body));
  return {};
}

Result<json> TestApiServer::patches() { return admin("GET", "/admin/patches"); }
Result<json> TestApiServer::requests() { return admin("GET", "/admin/requests"); }
Result<json> TestApiServer::state() { return admin("GET", "/admin/state"); }

Result<int> TestApiServer::countRequests(const std::string& kind, const std::string& pathPart) {
  auto r = requests();
  if (!r) return r.error();
  int n = 0;
  for (const auto& q : *r)
    if (q["kind"] == kind && q["path"].get<std::string>().find(pathPart) != std::string::npos) ++n;
  return n;
}

std::string TestApiServer::log() const { return readTextFile(dir_.file("server.log")); }

}  // namespace sluice::test
