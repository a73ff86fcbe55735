#include "test/common/istio_node.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "test/common/tempdir.h"
#include "test/common/zds_peers.h"

namespace sluice::test {

using ordered_json = nlohmann::ordered_json;

// ---- IstioZdsStandIn ------------------------------------------------------------

Result<std::unique_ptr<IstioZdsStandIn>> IstioZdsStandIn::start(const std::string& socketPath,
                                                                 const std::vector<IstioPod>& pods) {
  std::unique_ptr<IstioZdsStandIn> s(new IstioZdsStandIn());
  for (const auto& p : pods) SLUICE_TRY(s->remember(p));
  // istio-cni's newZtunnelServer: os.Remove(addr), then listen. Whoever
  // served the old file keeps its connections but gets no new ones.
  if (::unlink(socketPath.c_str()) != 0 && errno != ENOENT)
    return Error::fromErrno(errno, "istio stand-in: unlink " + socketPath);
  zds::ServerOptions o = testServerOptions(socketPath, std::chrono::milliseconds(2000));
  IstioZdsStandIn* self = s.get();
  o.snapshot = [self] { return self->snapshot(); };
  auto server = zds::Server::start(std::move(o));
  SLUICE_TRY(server);
  s->server_ = std::move(*server);
  return s;
}

IstioZdsStandIn::~IstioZdsStandIn() { stop(); }

Status IstioZdsStandIn::remember(const IstioPod& pod) {
  Fd fd(::open(pod.netnsPath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::fromErrno(errno, "istio stand-in: open " + pod.netnsPath);
  std::lock_guard lock(mu_);
  for (auto& [w, netns] : pods_) {
    if (w.uid != pod.workload.uid) continue;
    w = pod.workload;
    netns = std::move(fd);
    return {};
  }
  pods_.emplace_back(pod.workload, std::move(fd));
  return {};
}

Status IstioZdsStandIn::add(const IstioPod& pod) {
  SLUICE_TRY(remember(pod));
  Fd fd(::open(pod.netnsPath.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::fromErrno(errno, "istio stand-in: open " + pod.netnsPath);
  return server_->add(pod.workload, fd.get());
}

std::vector<zds::SnapshotEntry> IstioZdsStandIn::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<zds::SnapshotEntry> out;
  for (const auto& [w, netns] : pods_) out.push_back({w, Fd(::fcntl(netns.get(), F_DUPFD_CLOEXEC, 0))});
  return out;
}

void IstioZdsStandIn::stop() {
  if (server_) server_->stop();
}

std::vector<zds::Peer> IstioZdsStandIn::peers() const { return server_ ? server_->peers() : std::vector<zds::Peer>{}; }

// ---- The CNI chain --------------------------------------------------------------

namespace {

// istio-cni's entry as its installer writes it (cni/pkg/install).
ordered_json istioCniEntry() {
  return {{"type", "istio-cni"},
          {"log_level", "info"},
          {"log_uds_address", "/var/run/istio-cni/log.sock"},
          {"cni_agent_run_dir", "/var/run/istio-cni"},
          {"ambient_enabled", true},
          {"enablement_selectors", {{{"podSelector", {{"matchLabels", {{"istio.io/dataplane-mode", "ambient"}}}}}}}},
          {"exclude_namespaces", {"istio-system", "kube-system"}},
          {"kubernetes", {{"kubeconfig", "/etc/cni/net.d/ZZZ-istio-cni-kubeconfig"}, {"cni_bin_dir", "/opt/cni/bin"}}}};
}

Result<ordered_json> readConflist(const std::string& path) {
  auto j = ordered_json::parse(readTextFile(path), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("plugins") || !j["plugins"].is_array())
    return Error::msg(path + " is not a conflist", EINVAL);
  return j;
}

}  // namespace

Result<std::string> writeIstioChainedConflist(const std::string& dir, const std::string& file) {
  ordered_json c = {{"name", "k8s-pod-network"},
                    {"cniVersion", "0.3.1"},
                    {"plugins",
                     {{{"type", "calico"},
                       {"datastore_type", "kubernetes"},
                       {"nodename", "node-a"},
                       {"mtu", 0},
                       {"ipam", {{"type", "calico-ipam"}}},
                       {"policy", {{"type", "k8s"}}},
                       {"kubernetes", {{"kubeconfig", "/etc/cni/net.d/calico-kubeconfig"}}}},
                      {{"type", "portmap"}, {"snat", true}, {"capabilities", {{"portMappings", true}}}},
                      istioCniEntry()}}};
  const std::string path = dir + "/" + file;
  if (!writeTextFile(path, c.dump(2))) return Error::msg("cannot write " + path);
  return path;
}

Status chainIstioCni(const std::string& conflistPath) {
  auto c = readConflist(conflistPath);
  SLUICE_TRY(c);
  ordered_json plugins = ordered_json::array();
  for (const auto& p : (*c)["plugins"])
    if (p.value("type", "") != "istio-cni") plugins.push_back(p);
  plugins.push_back(istioCniEntry());
  (*c)["plugins"] = plugins;
  // Atomically, as the installer does: the agent's watch never reads half a file.
  const std::string tmp = conflistPath + ".istio-tmp";
  if (!writeTextFile(tmp, c->dump(2))) return Error::msg("cannot write " + tmp);
  if (::rename(tmp.c_str(), conflistPath.c_str()) != 0) return Error::fromErrno(errno, "rename to " + conflistPath);
  return {};
}

std::vector<std::string> pluginTypes(const std::string& conflistPath) {
  std::vector<std::string> out;
  auto c = readConflist(conflistPath);
  if (!c.ok()) return out;
  for (const auto& p : (*c)["plugins"]) out.push_back(p.value("type", ""));
  return out;
}

// ---- Reading Istio's state in a test netns --------------------------------------

Result<istio::PodRules> readIstioPodRules(const TestNetns& ns) {
  Result<istio::PodRules> out = Error::msg("not read");
  Status st = ns.run([&]() -> Status {
    out = istio::readPodRules();
    return {};
  });
  if (!st.ok()) return st.error();
  return out;
}

istio::NodeState readIstioNodeState(const TestNetns& node, const std::string& cniConfDir) {
  istio::NodeState n;
  Status st = node.run([&]() -> Status {
    n = istio::readNodeState(cniConfDir);
    return {};
  });
  if (!st.ok()) n.unreadable.push_back("entering " + node.name() + ": " + st.error().message);
  return n;
}

std::string sharedReturnPathMissing(const TestNetns& ns) {
  std::string missing;
  for (const char* family : {"-4", "-6"}) {
    CommandResult rule = ns.ip(std::string(family) + " rule show");
    if (rule.exitCode != 0 || rule.out.find("32764:\tfrom all fwmark 0x111/0xfff lookup 100") == std::string::npos)
      missing += std::string(family) + " rule: " + rule.out + rule.err + "; ";
    CommandResult route = ns.ip(std::string(family) + " route show table 100");
    if (route.exitCode != 0 || route.out.find("local default dev lo") == std::string::npos)
      missing += std::string(family) + " table 100: " + route.out + route.err + "; ";
  }
  return missing;
}

}  // namespace sluice::test
