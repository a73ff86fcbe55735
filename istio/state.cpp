#include "istio/state.h"

#include <dirent.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "istio/command.h"

namespace sluice::istio {
namespace {

// The chains a pod's redirection is made of; the node's SNAT chain.
const std::set<std::string> kPodChains = {"ISTIO_OUTPUT", "ISTIO_PRERT"};
const std::set<std::string> kNodeChains = {"ISTIO_POSTRT"};

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// Which of @p wanted are chains in `iptables-save` output: ":ISTIO_OUTPUT - [0:0]".
std::set<std::string> chainsInSave(const std::string& text, const std::set<std::string>& wanted) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.size() > 1 && line[0] == ':') {
      std::string name = line.substr(1, line.find(' ') - 1);
      if (wanted.count(name)) out.insert(name);
    }
  return out;
}

void addSaved(Netfilter& nf, const std::string& label, const std::vector<std::string>& argv,
              const std::set<std::string>& wanted) {
  auto r = runCommand(argv);
  if (!r.ok()) {
    if (r.error().code != ENOENT) nf.unreadable.push_back(label + ": " + r.error().message);
    return;
  }
  if (r->exitCode != 0) {
    nf.unreadable.push_back(label + ": " + argv[0] + " exited " + std::to_string(r->exitCode));
    return;
  }
  if (auto chains = chainsInSave(r->out, wanted); !chains.empty()) nf.found.push_back(label + ": " + joined(chains));
}

// Where the chains @p wanted are in the calling netns (and, with
// @p nativeTables, Istio's own nftables tables): iptables' nft backend and
// the native tables through `nft list chains` (iptables-nft-save when nft
// is not installed), the legacy backend through iptables-legacy-save where
// the netns has legacy tables.
Netfilter readNetfilter(const std::set<std::string>& wanted, bool nativeTables) {
  Netfilter nf;
  auto nft = runCommand({"nft", "list", "chains"});
  if (nft.ok() && nft->exitCode == 0) {
    std::map<std::string, std::set<std::string>> byFamily;
    std::set<std::string> native;
    std::istringstream in(nft->out);
    std::string line, family, table;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string w;
      words >> w;
      if (w == "table") {
        words >> family >> table;
        if (nativeTables && table.rfind("istio-ambient-", 0) == 0) native.insert(family + " " + table);
      } else if (w == "chain") {
        std::string name;
        words >> name;
        if (wanted.count(name) && (family == "ip" || family == "ip6")) byFamily[family].insert(name);
      }
    }
    if (byFamily.count("ip")) nf.found.push_back("iptables-nft IPv4: " + joined(byFamily["ip"]));
    if (byFamily.count("ip6")) nf.found.push_back("iptables-nft IPv6: " + joined(byFamily["ip6"]));
    if (!native.empty()) nf.found.push_back("nftables: " + joined(native));
  } else if (!nft.ok() && nft.error().code == ENOENT) {
    addSaved(nf, "iptables-nft IPv4", {"iptables-nft-save"}, wanted);
    addSaved(nf, "iptables-nft IPv6", {"ip6tables-nft-save"}, wanted);
  } else {
    nf.unreadable.push_back("nft list chains: " +
                            (nft.ok() ? "exited " + std::to_string(nft->exitCode) : nft.error().message));
  }
  if (legacyTablesInUse("ip_tables_names")) addSaved(nf, "iptables-legacy IPv4", {"iptables-legacy-save"}, wanted);
  if (legacyTablesInUse("ip6_tables_names")) addSaved(nf, "iptables-legacy IPv6", {"ip6tables-legacy-save"}, wanted);
  return nf;
}

std::string describeLines(const std::vector<std::string>& lines, const std::vector<std::string>& unreadable) {
  std::string s;
  for (const auto& l : lines) s += (s.empty() ? "" : "; ") + l;
  for (const auto& u : unreadable) s += (s.empty() ? "" : "; ") + ("cannot tell: " + u);
  return s.empty() ? "none" : s;
}

}  // namespace

bool legacyTablesInUse(const char* procFile) {
  std::ifstream f(std::string("/proc/thread-self/net/") + procFile);
  std::string line;
  return f && std::getline(f, line) && !line.empty();
}

std::string PodRules::describe() const { return describeLines(rules.found, rules.unreadable); }

Result<PodRules> readPodRules() {
  PodRules p;
  p.rules = readNetfilter(kPodChains, true);
  return p;
}

std::string NodeState::describe() const {
  std::vector<std::string> all = snat.found;
  all.insert(all.end(), probeSets.begin(), probeSets.end());
  for (const auto& c : cniEntries) all.push_back("istio-cni in " + c);
  std::vector<std::string> cannot = snat.unreadable;
  cannot.insert(cannot.end(), unreadable.begin(), unreadable.end());
  return describeLines(all, cannot);
}

NodeState readNodeState(const std::string& cniConfDir) {
  NodeState n;
  n.snat = readNetfilter(kNodeChains, false);
  auto sets = runCommand({"ipset", "list", "-t"});
  if (sets.ok() && sets->exitCode == 0) {
    std::istringstream in(sets->out);
    std::string line, name;
    while (std::getline(in, line)) {
      if (line.rfind("Name: ", 0) == 0) name = line.substr(6);
      if (line.rfind("Number of entries: ", 0) == 0 && name.rfind("istio-inpod-probes", 0) == 0)
        n.probeSets.push_back(name + ": " + line.substr(19) + " address(es)");
    }
  } else if (!sets.ok() && sets.error().code != ENOENT) {
    n.unreadable.push_back("ipset: " + sets.error().message);
  } else if (!sets.ok()) {
    n.unreadable.push_back("ipset is not installed");
  }
  if (!cniConfDir.empty()) {
    DIR* d = ::opendir(cniConfDir.c_str());
    if (!d) {
      n.unreadable.push_back(cniConfDir + ": " + std::strerror(errno));
    } else {
      std::vector<std::string> files;
      while (dirent* e = ::readdir(d)) {
        std::string f = e->d_name;
        for (const char* ext : {".conflist", ".conf", ".json"})
          if (f.size() > std::strlen(ext) && f.compare(f.size() - std::strlen(ext), std::strlen(ext), ext) == 0)
            files.push_back(cniConfDir + "/" + f);
      }
      ::closedir(d);
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        std::ifstream in(f);
        auto j = nlohmann::json::parse(in, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        bool istio = j.value("type", "") == "istio-cni";
        if (j.contains("plugins") && j["plugins"].is_array())
          for (const auto& p : j["plugins"])
            istio |= p.is_object() && p.value("type", "") == "istio-cni";
        if (istio) n.cniEntries.push_back(f);
      }
    }
  }
  return n;
}

}  // namespace sluice::istio
