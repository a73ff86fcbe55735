#include "userspace/mesh/objects.h"

namespace sluice::kube {

using nlohmann::json;

namespace {

std::string stringAt(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const json& objectAt(const json& j, const char* key) {
  static const json empty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : empty;
}

// Labels and annotations: string values only (the API allows nothing else).
std::map<std::string, std::string> stringMap(const json& j) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j.items())
    if (v.is_string()) out.emplace(k, v.get<std::string>());
  return out;
}

}  // namespace

std::string resourceVersionOf(const json& object) {
  if (!object.is_object()) return "";
  return stringAt(objectAt(object, "metadata"), "resourceVersion");
}

Result<Pod> Pod::fromJson(const json& j) {
  if (!j.is_object()) return Error::msg("pod is not a JSON object");
  const json& meta = objectAt(j, "metadata");
  const json& spec = objectAt(j, "spec");
  const json& status = objectAt(j, "status");
  Pod p;
  p.uid = stringAt(meta, "uid");
  p.name = stringAt(meta, "name");
  p.namespaceName = stringAt(meta, "namespace");
  if (p.uid.empty()) return Error::msg("pod " + p.namespaceName + "/" + p.name + " without metadata.uid");
  if (p.name.empty() || p.namespaceName.empty()) return Error::msg("pod " + p.uid + " without metadata.name or metadata.namespace");
  p.resourceVersion = stringAt(meta, "resourceVersion");
  p.labels = stringMap(objectAt(meta, "labels"));
  p.annotations = stringMap(objectAt(meta, "annotations"));
  p.terminating = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  p.nodeName = stringAt(spec, "nodeName");
  p.serviceAccount = stringAt(spec, "serviceAccountName");
  auto hn = spec.find("hostNetwork");
  p.hostNetwork = hn != spec.end() && hn->is_boolean() && hn->get<bool>();
  p.phase = stringAt(status, "phase");
  auto ips = status.find("podIPs");
  if (ips != status.end() && ips->is_array() && !ips->empty()) {
    for (const auto& e : *ips)
      if (e.is_object() && e.contains("ip") && e["ip"].is_string()) p.ips.push_back(e["ip"].get<std::string>());
  } else if (auto ip = stringAt(status, "podIP"); !ip.empty()) {
    p.ips.push_back(ip);
  }
  return p;
}

Result<Namespace> Namespace::fromJson(const json& j) {
  if (!j.is_object()) return Error::msg("namespace is not a JSON object");
  const json& meta = objectAt(j, "metadata");
  Namespace n;
  n.name = stringAt(meta, "name");
  if (n.name.empty()) return Error::msg("namespace without metadata.name");
  n.uid = stringAt(meta, "uid");
  n.resourceVersion = stringAt(meta, "resourceVersion");
  n.labels = stringMap(objectAt(meta, "labels"));
  return n;
}

}  // namespace sluice::kube
