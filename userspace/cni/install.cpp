#include "userspace/cni/install.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/fd.h"
#include "userspace/cni/plugin.h"

namespace sluice::cni {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<std::string> readFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error::fromErrno(errno, "read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Error::fromErrno(EIO, "read " + path);
  return ss.str();
}

Result<ordered_json> readJson(const std::string& path) {
  auto text = readFile(path);
  SLUICE_TRY(text);
  try {
    return ordered_json::parse(*text);
  } catch (const ordered_json::parse_error& e) {
    return Error::msg(path + " is not valid JSON: " + e.what(), EINVAL);
  }
}

bool isSluice(const ordered_json& plugin) {
  return plugin.is_object() && plugin.contains("type") && plugin["type"] == kPluginType;
}

unsigned modeOf(const std::string& path, unsigned fallback) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : fallback;
}

Status writeJson(const std::string& path, const ordered_json& j) {
  return writeFileAtomic(path, j.dump(2) + "\n", modeOf(path, 0644));
}

Status copyBinary(const std::string& from, const std::string& to) {
  auto bytes = readFile(from);
  SLUICE_TRY(bytes);
  return writeFileAtomic(to, *bytes, 0755);
}

Status requireDir(const std::string& dir, const char* flag) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error::msg(std::string(flag) + " " + dir + " is not a directory", ENOENT);
  return {};
}

bool isConfigName(const std::string& name) {
  return endsWith(name, ".conf") || endsWith(name, ".conflist") || endsWith(name, ".json");
}

bool fileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A file name in the conf dir: no directory part, not hidden (runtimes
// skip nothing, but temporary files are dot names), a config extension.
Status checkFileName(const std::string& flag, const std::string& name, bool conflistOnly) {
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return Error::msg(flag + " must be a file name in the CNI conf dir, not '" + name + "'", EINVAL);
  if (conflistOnly ? !endsWith(name, ".conflist") : !isConfigName(name))
    return Error::msg(flag + " '" + name + "' must end in " + (conflistOnly ? ".conflist" : ".conf, .conflist or .json"),
                      EINVAL);
  return {};
}

// The file a chained install starts from: --cni-conf-name (or its .conf /
// .conflist twin, as Istio's getCNIConfigFilepath accepts), else the
// lexically first config but the owned conflist. "" when not there yet.
std::string findPrimary(const std::string& confDir, const std::vector<std::string>& files, const ConfMode& mode) {
  if (!mode.confName.empty()) {
    const std::string& n = mode.confName;
    for (const std::string& candidate :
         {n, endsWith(n, ".conf") ? n + "list" : endsWith(n, ".conflist") ? n.substr(0, n.size() - 4) : std::string()})
      if (!candidate.empty() && fileExists((fs::path(confDir) / candidate).string())) return candidate;
    return "";
  }
  for (const auto& f : files)
    if (!mode.owned || f != mode.ownedName) return f;
  return "";
}

// The keys every network configuration has (the runtime injects them into
// each plugin's config).
Status requireVersionAndName(const ordered_json& j, const std::string& file, const std::string& what) {
  for (const auto& key : {"cniVersion", "name"})
    if (!j.contains(key) || !j[key].is_string())
      return Error::msg(file + " has no \"" + std::string(key) + "\": not a valid " + what, EINVAL);
  return {};
}

Error notYet(const std::string& confDir, const ConfMode& mode) {
  if (!mode.confName.empty())
    return Error::msg("the primary CNI configuration " + (fs::path(confDir) / mode.confName).string() +
                          " (--cni-conf-name) is not there yet",
                      ENOENT);
  return Error::msg("no CNI network configuration in " + confDir +
                        " yet (*.conf, *.conflist, *.json): install the primary CNI first, sluice-cni chains after it",
                    ENOENT);
}

}  // namespace

bool isConfModeFlag(const std::string& flag, bool& takesValue) {
  takesValue = flag == "--cni-conf-name" || flag == "--cni-owned-conflist-name";
  return takesValue || flag == "--cni-owned-conflist" || flag == "--cni-unchained";
}

Status applyConfModeFlag(ConfMode& m, const std::string& flag, const std::string& value) {
  if (flag == "--cni-conf-name") {
    SLUICE_TRY(checkFileName(flag, value, false));
    m.confName = value;
  } else if (flag == "--cni-owned-conflist-name") {
    SLUICE_TRY(checkFileName(flag, value, true));
    m.ownedName = value;
    m.owned = true;
  } else if (flag == "--cni-owned-conflist") {
    m.owned = true;
  } else if (flag == "--cni-unchained") {
    m.chained = false;
  } else {
    return Error::msg("unknown argument '" + flag + "'", EINVAL);
  }
  return {};
}

Status validateConfMode(const ConfMode& m) {
  if (!m.chained && m.owned)
    return Error::msg("--cni-unchained and --cni-owned-conflist contradict each other (a standalone config has no "
                      "primary plugins to copy)",
                      EINVAL);
  if (!m.chained && endsWith(m.confName, ".conflist"))
    return Error::msg("--cni-unchained writes a single-plugin config: --cni-conf-name must end in .conf or .json, not '" +
                          m.confName + "'",
                      EINVAL);
  if (m.owned && m.confName == m.ownedName)
    return Error::msg("--cni-conf-name names the primary's file: it cannot be the owned conflist '" + m.ownedName + "'",
                      EINVAL);
  return {};
}

Result<InstallOptions> parseInstallArgs(const std::vector<std::string>& args, bool forInstall) {
  InstallOptions o;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    auto value = [&](std::string& out) -> Status {
      if (i + 1 >= args.size() || args[i + 1].empty()) return Error::msg(a + " needs a value", EINVAL);
      out = args[++i];
      return {};
    };
    if (a == "--cni-conf-dir") {
      SLUICE_TRY(value(o.confDir));
    } else if (a == "--cni-bin-dir") {
      SLUICE_TRY(value(o.binDir));
    } else if (forInstall && a == "--agent-socket") {
      SLUICE_TRY(value(o.agentSocket));
      if (o.agentSocket.front() != '/') return Error::msg("--agent-socket must be an absolute path", EINVAL);
    } else if (forInstall && a == "--binary") {
      SLUICE_TRY(value(o.binary));
    } else if (forInstall && a == "--wait-timeout") {
      std::string v;
      SLUICE_TRY(value(v));
      if (v.size() > 7 || !std::all_of(v.begin(), v.end(), ::isdigit))
        return Error::msg("invalid --wait-timeout '" + v + "' (expected whole seconds; 0: do not wait)", EINVAL);
      o.waitTimeout = std::chrono::seconds(std::stoul(v));
    } else if (bool takesValue = false; isConfModeFlag(a, takesValue)) {
      std::string v;
      if (takesValue) SLUICE_TRY(value(v));
      SLUICE_TRY(applyConfModeFlag(o.mode, a, v));
    } else if (auto mesh = forInstall ? parseMeshInstallFlag(o.mesh, args, i) : Result<bool>(false); !mesh.ok() || *mesh) {
      SLUICE_TRY(mesh);
    } else {
      return Error::msg("unknown argument '" + a + "'", EINVAL);
    }
  }
  if (o.confDir.empty()) return Error::msg("--cni-conf-dir is required", EINVAL);
  if (o.binDir.empty()) return Error::msg("--cni-bin-dir is required", EINVAL);
  SLUICE_TRY(validateConfMode(o.mode));
  if (o.waitTimeout && !o.mode.chained)
    return Error::msg("--wait-timeout: --cni-unchained waits for nothing (it writes its own config)", EINVAL);
  return o;
}

Result<std::vector<std::string>> configFiles(const std::string& confDir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(confDir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!it->is_regular_file(ec)) continue;
    if (endsWith(name, ".conf") || endsWith(name, ".conflist") || endsWith(name, ".json")) out.push_back(name);
  }
  if (ec) return Error::fromErrno(ec.value(), "list " + confDir);
  std::sort(out.begin(), out.end());
  return out;
}

Result<ordered_json> withSluice(const ordered_json& conflist, const std::string& agentSocket, const std::string& file) {
  if (!conflist.is_object() || !conflist.contains("plugins") || !conflist["plugins"].is_array())
    return Error::msg(file + " has no \"plugins\" array: not a CNI conflist", EINVAL);
  SLUICE_TRY(requireVersionAndName(conflist, file, "CNI conflist"));
  bool removed = false;
  ordered_json out = withoutSluice(conflist, removed);
  for (const auto& p : out["plugins"])
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      return Error::msg(file + " has a plugin without \"type\": not a valid CNI conflist", EINVAL);
  if (out["plugins"].empty()) return Error::msg(file + " has no plugins before sluice-cni to chain after", EINVAL);
  out["plugins"].push_back(ordered_json{{"type", kPluginType}, {"agentSocket", agentSocket}});
  return out;
}

ordered_json withoutSluice(const ordered_json& conflist, bool& removed) {
  removed = false;
  ordered_json out = conflist;
  if (!out.is_object() || !out.contains("plugins") || !out["plugins"].is_array()) return out;
  ordered_json kept = ordered_json::array();
  for (const auto& p : out["plugins"]) {
    if (isSluice(p))
      removed = true;
    else
      kept.push_back(p);
  }
  out["plugins"] = kept;
  return out;
}

Status writeFileAtomic(const std::string& path, const std::string& content, unsigned mode) {
  fs::path p(path);
  // A dot name ending in .sluice-tmp: no runtime loads it as a config.
  std::string tmp = (p.parent_path() / ("." + p.filename().string() + "." + std::to_string(::getpid()) + ".sluice-tmp")).string();
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Error::fromErrno(errno, "create " + tmp);
  auto fail = [&](const std::string& what) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Error::fromErrno(e, what);
  };
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write " + tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd.get(), mode) != 0) return fail("chmod " + tmp);
  if (::fsync(fd.get()) != 0) return fail("fsync " + tmp);
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename " + tmp + " to " + path);
  return {};
}

Result<ordered_json> asConflist(const ordered_json& config, const std::string& file) {
  if (config.is_object() && config.contains("plugins")) return config;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    return Error::msg(file + " has neither \"plugins\" nor \"type\": not a CNI network configuration", EINVAL);
  SLUICE_TRY(requireVersionAndName(config, file, "CNI network configuration"));
  ordered_json plugin = config;
  plugin.erase("cniVersion");
  plugin.erase("name");
  return ordered_json{{"cniVersion", config["cniVersion"]}, {"name", config["name"]}, {"plugins", {plugin}}};
}

ordered_json standaloneConf(const std::string& agentSocket) {
  // 0.3.1 as Istio's standalone istio-cni config (cni/pkg/install/cniconfig.go):
  // every Multus reads it.
  return ordered_json{{"cniVersion", "0.3.1"},
                      {"name", kPluginType},
                      {"type", kPluginType},
                      {"agentSocket", agentSocket},
                      {"chained", false}};
}

Result<ChainPlan> planChain(const std::string& confDir, const std::string& agentSocket, const ConfMode& mode) {
  auto files = configFiles(confDir);
  SLUICE_TRY(files);
  ChainPlan plan;
  auto readCurrent = [&plan](const std::string& path) {
    if (!fileExists(path)) return;
    auto j = readJson(path);
    if (j.ok()) plan.current = std::move(*j);
    plan.mode = modeOf(path, plan.mode);
  };
  if (!mode.chained) {
    plan.path = (fs::path(confDir) / (mode.confName.empty() ? kDefaultStandaloneConf : mode.confName)).string();
    plan.updated = standaloneConf(agentSocket);
    readCurrent(plan.path);
    return plan;
  }
  const std::string primaryName = findPrimary(confDir, *files, mode);
  if (primaryName.empty()) return notYet(confDir, mode);
  plan.primary = (fs::path(confDir) / primaryName).string();
  auto primary = readJson(plan.primary);
  SLUICE_TRY(primary);
  // A .conflist is judged as one (withSluice's errors); a .conf / .json
  // is a single plugin's config, as libcni reads it.
  auto list = endsWith(primaryName, ".conflist") ? Result<ordered_json>(*primary) : asConflist(*primary, plan.primary);
  SLUICE_TRY(list);
  auto updated = withSluice(*list, agentSocket, plan.primary);
  SLUICE_TRY(updated);
  plan.updated = std::move(*updated);
  plan.mode = modeOf(plan.primary, 0644);

  if (mode.owned) {
    // The runtime must pick the owned file: nothing but it may sort first.
    for (const auto& f : *files)
      if (f != mode.ownedName && f < mode.ownedName)
        return Error::msg((fs::path(confDir) / f).string() + " sorts before the owned conflist " + mode.ownedName +
                              ": the runtime would use it and start pods without sluice-cni (choose a "
                              "--cni-owned-conflist-name that sorts first)",
                          EINVAL);
    plan.path = (fs::path(confDir) / mode.ownedName).string();
    readCurrent(plan.path);
    return plan;
  }
  if (endsWith(primaryName, ".conflist")) {
    plan.path = plan.primary;
    plan.current = std::move(*primary);
    return plan;
  }
  // A single-plugin .conf / .json becomes a .conflist of that plugin then
  // sluice-cni, in its place (Istio's insertCNIConfig, then its rename).
  const std::string stem = primaryName.substr(0, primaryName.rfind('.'));
  const std::string listName = stem + ".conflist";
  plan.path = (fs::path(confDir) / listName).string();
  plan.replaces = plan.primary;
  if (mode.confName.empty())
    for (const auto& f : *files)
      if (f != primaryName && f < listName)
        return Error::msg("converting " + plan.primary + " to " + listName + " would let " + f +
                              " sort first and become the runtime's network (name the file with --cni-conf-name, or "
                              "use --cni-owned-conflist)",
                          EINVAL);
  readCurrent(plan.path);
  if (fileExists(plan.path)) {
    bool ours = false;
    if (plan.current) (void)withoutSluice(*plan.current, ours);
    if (!ours)
      return Error::msg("converting " + plan.primary + " would overwrite " + plan.path +
                            ", which is not sluice-cni's (it has no sluice-cni entry)",
                        EINVAL);
  }
  return plan;
}

Status writeChain(const ChainPlan& plan) {
  SLUICE_TRY(writeFileAtomic(plan.path, plan.updated.dump(2) + "\n", plan.mode));
  if (!plan.replaces.empty() && ::unlink(plan.replaces.c_str()) != 0 && errno != ENOENT)
    return Error::fromErrno(errno, "remove " + plan.replaces + " (replaced by " + plan.path + ")");
  return {};
}

namespace {

// Waits for the primary config as Istio's installer does (inotify on the
// dir; getCNIConfigFilepath), up to @p timeout (nullopt: for ever).
Result<ChainPlan> planWhenThere(const InstallOptions& o) {
  auto plan = planChain(o.confDir, o.agentSocket, o.mode);
  if (plan.ok() || plan.error().code != ENOENT || (o.waitTimeout && o.waitTimeout->count() == 0)) return plan;
  Fd in(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  if (!in.valid()) return Error::fromErrno(errno, "inotify_init1");
  if (::inotify_add_watch(in.get(), o.confDir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ONLYDIR) < 0)
    return Error::fromErrno(errno, "inotify_add_watch " + o.confDir);
  const auto start = std::chrono::steady_clock::now();
  const std::string waitFor = o.mode.confName.empty() ? "a CNI network configuration in " + o.confDir
                                                      : (fs::path(o.confDir) / o.mode.confName).string();
  if (o.progress)
    o.progress("waiting for the primary CNI to write " + waitFor +
               (o.waitTimeout ? " (up to " + std::to_string(o.waitTimeout->count()) + " s)" : std::string()));
  for (;;) {
    // Checked again after every event, and every second (an event lost to
    // a re-mounted dir).
    plan = planChain(o.confDir, o.agentSocket, o.mode);
    if (plan.ok() || plan.error().code != ENOENT) {
      if (plan.ok() && o.progress)
        o.progress(plan->primary + " appeared after " +
                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count()) +
                   " ms");
      return plan;
    }
    auto left = std::chrono::milliseconds(1000);
    if (o.waitTimeout) {
      auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(*o.waitTimeout - (std::chrono::steady_clock::now() - start));
      if (remaining.count() <= 0)
        return Error::msg("the primary CNI did not write " + waitFor + " within " +
                              std::to_string(o.waitTimeout->count()) + " s (--wait-timeout); nothing written",
                          ETIMEDOUT);
      left = std::min(left, remaining);
    }
    pollfd p{in.get(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) > 0) {
      char buf[4096];
      while (::read(in.get(), buf, sizeof(buf)) > 0) {
      }
    }
  }
}

}  // namespace

Result<Actions> install(const InstallOptions& o) {
  SLUICE_TRY(requireDir(o.confDir, "--cni-conf-dir"));
  SLUICE_TRY(requireDir(o.binDir, "--cni-bin-dir"));
  SLUICE_TRY(validateConfMode(o.mode));
  auto plan = planWhenThere(o);
  SLUICE_TRY(plan);

  Actions actions;
  auto mesh = planMeshInstall(o.mesh, [](const char* n) -> std::optional<std::string> {
    const char* v = std::getenv(n);
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
  SLUICE_TRY(mesh);
  if (!mesh->kubeconfigPath.empty()) {
    SLUICE_TRY(writeFileAtomic(mesh->kubeconfigPath, mesh->kubeconfigText, 0600));
    actions.push_back("wrote the Kubernetes credentials for the API at " + mesh->server + " to " + mesh->kubeconfigPath +
                      " (mode 0600)");
  }
  for (const auto& [k, v] : mesh->keys.items()) plan->updated["plugins"].back()[k] = v;
  // The binary first: a chain naming a plugin the runtime can't find would
  // fail every pod's start.
  const std::string bin = (fs::path(o.binDir) / kPluginType).string();
  SLUICE_TRY(copyBinary(o.binary, bin));
  actions.push_back("installed " + bin);
  if (!plan->changes()) {
    actions.push_back(plan->primary == plan->path ? "sluice-cni already last in " + plan->path
                                                  : plan->path + " already as it should be");
    return actions;
  }
  SLUICE_TRY(writeChain(*plan));
  if (!o.mode.chained)
    actions.push_back("wrote the standalone network config " + plan->path + " (sluice-cni alone, unchained)");
  else if (o.mode.owned)
    actions.push_back("wrote " + plan->path + ": the plugins of " + plan->primary + " then sluice-cni (" +
                      plan->primary + " untouched)");
  else if (!plan->replaces.empty())
    actions.push_back("converted " + plan->replaces + " to " + plan->path + " with sluice-cni added");
  else
    actions.push_back("added sluice-cni to " + plan->path);
  return actions;
}

Result<Actions> uninstall(const InstallOptions& o) {
  SLUICE_TRY(requireDir(o.confDir, "--cni-conf-dir"));
  auto files = configFiles(o.confDir);
  SLUICE_TRY(files);
  Actions actions;
  // The chains first: once the binary is gone a chain still naming it
  // would fail every pod's start.
  for (const auto& name : *files) {
    const std::string path = (fs::path(o.confDir) / name).string();
    auto j = readJson(path);
    if (!j.ok()) continue;  // not ours to judge; it can't name sluice-cni usefully either
    bool removed = false;
    auto stripped = withoutSluice(*j, removed);
    // Ours whole: a standalone config (--cni-unchained), the owned conflist.
    if (isSluice(*j) || (removed && name == o.mode.ownedName)) {
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Error::fromErrno(errno, "remove " + path);
      actions.push_back("removed " + path);
      continue;
    }
    if (!removed || !endsWith(name, ".conflist")) continue;
    SLUICE_TRY(writeJson(path, stripped));
    actions.push_back("removed sluice-cni from " + path);
  }
  const std::string bin = (fs::path(o.binDir) / kPluginType).string();
  if (::unlink(bin.c_str()) == 0)
    actions.push_back("removed " + bin);
  else if (errno != ENOENT)
    return Error::fromErrno(errno, "remove " + bin);
  if (actions.empty()) actions.push_back("sluice-cni was not installed in " + o.confDir + " / " + o.binDir);
  return actions;
}

int installMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const bool forInstall = args.at(0) == "install";
  auto opts = parseInstallArgs(std::vector<std::string>(args.begin() + 1, args.end()), forInstall);
  if (!opts.ok()) {
    err << "sluice-cni " << args[0] << ": " << opts.error().message << " (see sluice-cni --help)\n";
    return 2;
  }
  opts->progress = [&out](const std::string& line) { out << line << std::endl; };
  auto actions = forInstall ? install(*opts) : uninstall(*opts);
  if (!actions.ok()) {
    err << "sluice-cni " << args[0] << ": " << actions.error().message << "\n";
    return 1;
  }
  for (const auto& a : *actions) out << a << "\n";
  return 0;
}

}  // namespace sluice::cni
