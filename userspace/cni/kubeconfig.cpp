#include "userspace/cni/kubeconfig.h"

#include <arpa/inet.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>


namespace sluice::cni {

using nlohmann::ordered_json;

namespace {

Result<std::string> slurp(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error::fromErrno(errno ? errno : ENOENT, "read " + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

Result<std::string> unbase64(std::string in) {
  std::erase_if(in, [](char c) { return c == '\n' || c == '\r' || c == ' '; });
  if (in.size() % 4 != 0) return Error::msg("not base64", EINVAL);
  std::string out(in.size() / 4 * 3 + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  if (n < 0) return Error::msg("not base64", EINVAL);
  size_t pad = in.empty() ? 0 : (in.back() == '=') + (in.size() > 1 && in[in.size() - 2] == '=');
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

// The entry of a kubeconfig list ("clusters", "users") named @p name.
const ordered_json* named(const ordered_json& j, const char* list, const std::string& name, const char* field) {
  if (!j.contains(list) || !j[list].is_array()) return nullptr;
  for (const auto& e : j[list])
    if (e.is_object() && e.value("name", "") == name && e.contains(field) && e[field].is_object()) return &e[field];
  return nullptr;
}

bool isIpLiteral(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

Result<KubeCredentials> parseKubeconfig(const std::string& text, const std::string& file) {
  auto bad = [&](const std::string& what) { return Error::msg(file + ": " + what, EINVAL); };
  ordered_json j = ordered_json::parse(text, nullptr, false);
  if (!j.is_object()) return bad("not a kubeconfig in JSON");
  std::string context = j.value("current-context", "");
  const ordered_json* ctx = named(j, "contexts", context, "context");
  if (!ctx) return bad("no context \"" + context + "\" (current-context)");
  const ordered_json* cluster = named(j, "clusters", ctx->value("cluster", ""), "cluster");
  const ordered_json* user = named(j, "users", ctx->value("user", ""), "user");
  if (!cluster) return bad("the current context's cluster is missing");
  if (!user) return bad("the current context's user is missing");
  KubeCredentials c;
  c.server = cluster->value("server", "");
  if (c.server.rfind("https://", 0) != 0) return bad("cluster server \"" + c.server + "\" is not https://IP:PORT");
  if (std::string ca = cluster->value("certificate-authority-data", ""); !ca.empty()) {
    auto pem = unbase64(ca);
    if (!pem.ok()) return bad("certificate-authority-data is not base64");
    c.caPem = *pem;
  } else if (std::string caFile = cluster->value("certificate-authority", ""); !caFile.empty()) {
    auto pem = slurp(caFile, "certificate-authority");
    SLUICE_TRY(pem);
    c.caPem = *pem;
  } else {
    return bad("the cluster has no certificate-authority-data or certificate-authority");
  }
  c.token = user->value("token", "");
  if (c.token.empty())
    if (std::string tf = user->value("tokenFile", ""); !tf.empty()) {
      auto t = slurp(tf, "tokenFile");
      SLUICE_TRY(t);
      c.token = *t;
    }
  while (!c.token.empty() && (c.token.back() == '\n' || c.token.back() == '\r')) c.token.pop_back();
  if (c.token.empty()) return bad("the user has no token or tokenFile");
  if (j.contains("extensions") && j["extensions"].is_array())
    for (const auto& e : j["extensions"])
      if (e.is_object() && e.value("name", "") == kMeshExtension && e.contains("extension")) c.meshRules = e["extension"];
  return c;
}

Result<KubeCredentials> loadKubeconfig(const std::string& path) {
  auto text = slurp(path, "kubeconfig");
  SLUICE_TRY(text);
  return parseKubeconfig(*text, path);
}

ordered_json kubeconfigJson(const KubeCredentials& c) {
  ordered_json j{
      {"apiVersion", "v1"},
      {"kind", "Config"},
      {"clusters", {{{"name", "local"}, {"cluster", {{"server", c.server}, {"certificate-authority-data", base64(c.caPem)}}}}}},
      {"users", {{{"name", "sluice-cni"}, {"user", {{"token", c.token}}}}}},
      {"contexts", {{{"name", "sluice-cni-context"}, {"context", {{"cluster", "local"}, {"user", "sluice-cni"}}}}}},
      {"current-context", "sluice-cni-context"}};
  if (!c.meshRules.is_null()) j["extensions"] = {{{"name", kMeshExtension}, {"extension", c.meshRules}}};
  return j;
}

Result<KubeCredentials> serviceAccountCredentials(const std::string& dir, const EnvGet& env) {
  auto host = env("KUBERNETES_SERVICE_HOST");
  auto port = env("KUBERNETES_SERVICE_PORT");
  if (!host || host->empty()) return Error::msg("KUBERNETES_SERVICE_HOST is not set: not running in a pod?", EINVAL);
  if (!port || port->empty()) return Error::msg("KUBERNETES_SERVICE_PORT is not set: not running in a pod?", EINVAL);
  if (!isIpLiteral(*host))
    return Error::msg("KUBERNETES_SERVICE_HOST '" + *host + "' is not an IP address (sluice-cni resolves no names)", EINVAL);
  KubeCredentials c;
  c.server = "https://" + (host->find(':') != std::string::npos ? "[" + *host + "]" : *host) + ":" + *port;
  auto ca = slurp(dir + "/ca.crt", "the service account's CA");
  SLUICE_TRY(ca);
  auto token = slurp(dir + "/token", "the service account's token");
  SLUICE_TRY(token);
  c.caPem = *ca;
  c.token = *token;
  while (!c.token.empty() && (c.token.back() == '\n' || c.token.back() == '\r')) c.token.pop_back();
  if (c.token.empty()) return Error::msg(dir + "/token is empty", EINVAL);
  return c;
}

std::string kubeconfigText(const KubeCredentials& c) { return kubeconfigJson(c).dump(2) + "\n"; }

}  // namespace sluice::cni
