#include "userspace/cni/install.h"

#include <fcntl.h>
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

}  // namespace

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
    } else if (auto mesh = forInstall ? parseMeshInstallFlag(o.mesh, args, i) : Result<bool>(false); !mesh.ok() || *mesh) {
      SLUICE_TRY(mesh);
    } else {
      return Error::msg("unknown argument '" + a + "'", EINVAL);
    }
  }
  if (o.confDir.empty()) return Error::msg("--cni-conf-dir is required", EINVAL);
  if (o.binDir.empty()) return Error::msg("--cni-bin-dir is required", EINVAL);
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
  for (const auto& key : {"cniVersion", "name"})
    if (!conflist.contains(key) || !conflist[key].is_string())
      return Error::msg(file + " has no \"" + std::string(key) + "\": not a valid CNI conflist", EINVAL);
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

Result<ChainPlan> planChain(const std::string& confDir, const std::string& agentSocket) {
  auto files = configFiles(confDir);
  SLUICE_TRY(files);
  if (files->empty())
    return Error::msg("no CNI network configuration in " + confDir +
                          " yet (*.conflist): install the primary CNI first, sluice-cni chains after it",
                      ENOENT);
  ChainPlan plan;
  plan.path = (fs::path(confDir) / files->front()).string();
  if (!endsWith(plan.path, ".conflist"))
    return Error::msg("the primary CNI configuration " + plan.path +
                          " is a single-plugin file; sluice-cni can only join a .conflist chain (rewrite it as a "
                          ".conflist, see deploy/README.md)",
                      EINVAL);
  auto current = readJson(plan.path);
  SLUICE_TRY(current);
  plan.current = std::move(*current);
  auto updated = withSluice(plan.current, agentSocket, plan.path);
  SLUICE_TRY(updated);
  plan.updated = std::move(*updated);
  return plan;
}

Status writeChain(const ChainPlan& plan) { return writeJson(plan.path, plan.updated); }

Result<Actions> install(const InstallOptions& o) {
  SLUICE_TRY(requireDir(o.confDir, "--cni-conf-dir"));
  SLUICE_TRY(requireDir(o.binDir, "--cni-bin-dir"));
  auto plan = planChain(o.confDir, o.agentSocket);
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
    actions.push_back("sluice-cni already last in " + plan->path);
  } else {
    SLUICE_TRY(writeChain(*plan));
    actions.push_back("added sluice-cni to " + plan->path);
  }
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
    if (!endsWith(name, ".conflist")) continue;
    const std::string path = (fs::path(o.confDir) / name).string();
    auto j = readJson(path);
    if (!j.ok()) continue;  // not ours to judge; it can't name sluice-cni usefully either
    bool removed = false;
    auto stripped = withoutSluice(*j, removed);
    if (!removed) continue;
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
  auto actions = forInstall ? install(*opts) : uninstall(*opts);
  if (!actions.ok()) {
    err << "sluice-cni " << args[0] << ": " << actions.error().message << "\n";
    return 1;
  }
  for (const auto& a : *actions) out << a << "\n";
  return 0;
}

}  // namespace sluice::cni
