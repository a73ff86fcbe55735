#include "test/common/cni_runtime.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>

#include "test/common/tempdir.h"

namespace sluice::test {

using nlohmann::json;

namespace {

bool pathExists(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

std::atomic<int> gStdinCounter{0};

}  // namespace

std::string shellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ChainOutcome::describe() const {
  std::string s;
  for (const auto& r : runs) s += "[" + r.type + ": " + r.result.describe() + "] ";
  return s;
}

Result<json> runtimeNetwork(const std::string& confDir, std::string* file) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(confDir)) {
    std::string n = e.path().filename().string();
    for (const char* ext : {".conf", ".conflist", ".json"})
      if (e.is_regular_file() && n.ends_with(ext)) names.push_back(n);
  }
  if (names.empty()) return Error::msg("no network configuration in " + confDir, ENOENT);
  std::sort(names.begin(), names.end());
  if (file) *file = names.front();
  const std::string path = confDir + "/" + names.front();
  json j = json::parse(readTextFile(path), nullptr, false);
  if (!j.is_object()) return Error::msg(path + " is not a JSON object", EINVAL);
  if (names.front().ends_with(".conflist")) {
    if (!j.contains("plugins")) return Error::msg(path + " has no plugins", EINVAL);
    return j;
  }
  if (!j.contains("type")) return Error::msg(path + " has no type; perhaps this is a .conflist?", EINVAL);
  json plugin = j;
  plugin.erase("cniVersion");
  plugin.erase("name");
  return json{{"cniVersion", j["cniVersion"]}, {"name", j["name"]}, {"plugins", {plugin}}};
}

std::string CniRuntime::pluginPath(const std::string& type) const {
  for (const auto& dir : {binDir_, std::string(kSystemCniDir)})
    if (pathExists(dir + "/" + type)) return dir + "/" + type;
  return binDir_ + "/" + type;
}

CommandResult CniRuntime::invoke(const std::string& binary, const std::string& command, const CniParams& p,
                                 const std::string& stdinText) const {
  std::string in = scratch_ + "/stdin-" + std::to_string(::getpid()) + "-" + std::to_string(gStdinCounter++) + ".json";
  writeTextFile(in, stdinText);
  std::string env = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
  auto add = [&](const char* k, const std::string& v) {
    if (!v.empty()) env += std::string(" ") + k + "=" + shellQuote(v);
  };
  add("CNI_COMMAND", command);
  add("CNI_CONTAINERID", p.containerId);
  add("CNI_NETNS", p.netns);
  add("CNI_IFNAME", p.ifname);
  add("CNI_ARGS", p.args);
  add("CNI_PATH", cniPath());
  std::string cd = cwd.empty() ? "" : "cd " + shellQuote(cwd) + " && ";
  auto r = sh(cd + "nsenter --net=" + shellQuote(node_.path()) + " env -i " + env + " " + shellQuote(binary) + " < " +
              shellQuote(in));
  ::unlink(in.c_str());
  return r;
}

CommandResult CniRuntime::invokePlugin(const json& list, const json& plugin, const std::string& command,
                                       const CniParams& p, const json& prevResult) const {
  json conf = plugin;
  conf["cniVersion"] = list["cniVersion"];
  conf["name"] = list["name"];
  if (!prevResult.is_null()) conf["prevResult"] = prevResult;
  return invoke(pluginPath(plugin["type"]), command, p, conf.dump());
}

ChainOutcome CniRuntime::add(const json& list, const CniParams& p) const {
  ChainOutcome o;
  json prev;
  for (const auto& plugin : list["plugins"]) {
    auto r = invokePlugin(list, plugin, "ADD", p, prev);
    o.runs.push_back({plugin["type"], r});
    if (r.exitCode != 0) {
      o.error = json::parse(r.out, nullptr, false);
      return o;
    }
    prev = json::parse(r.out, nullptr, false);
  }
  o.ok = true;
  o.result = prev;
  return o;
}

ChainOutcome CniRuntime::checkOrDel(const json& list, const CniParams& p, const std::string& command,
                                    const json& cached) const {
  ChainOutcome o;
  std::vector<json> plugins(list["plugins"].begin(), list["plugins"].end());
  if (command == "DEL") std::reverse(plugins.begin(), plugins.end());
  for (const auto& plugin : plugins) {
    auto r = invokePlugin(list, plugin, command, p, cached);
    o.runs.push_back({plugin["type"], r});
    if (r.exitCode != 0) {
      o.error = json::parse(r.out, nullptr, false);
      return o;
    }
  }
  o.ok = true;
  return o;
}

}  // namespace sluice::test
