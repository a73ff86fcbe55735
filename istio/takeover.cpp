#include "istio/takeover.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/netfilter/nf_conntrack_common.h>
#include <linux/netfilter/nf_conntrack_tcp.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/fd.h"
#include "istio/command.h"
#include "istio/state.h"

namespace sluice::istio {
namespace {

const std::set<std::string> kPodChains = {"ISTIO_OUTPUT", "ISTIO_PRERT"};
const std::set<std::string> kNodeChains = {"ISTIO_POSTRT"};
const std::set<std::string> kBuiltinChains = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"};
// Mangle's connmark restore for the proxy's connections opened under
// Istio's rules: it goes last (see the header).
const char* kRestoreTable = "mangle";
const char* kRestoreChain = "ISTIO_OUTPUT";
constexpr uint32_t kIstioConnmark = 0x111, kIstioConnmarkMask = 0xfff;
// The accept sluice puts first in each chain of Istio's native nat table
// while its rules must stay for the connections they translated.
const char* kUnhookComment = "sluice-takeover: Istio's redirect kept for its open connections only";

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// One table of `iptables-save` output.
struct SavedTable {
  std::set<std::string> chains;       // every chain declared
  std::vector<std::string> rules;     // "-A CHAIN ..." in order
};

std::map<std::string, SavedTable> parseSave(const std::string& text) {
  std::map<std::string, SavedTable> out;
  std::istringstream in(text);
  std::string line, table;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '*') {
      table = line.substr(1);
      out[table];
    } else if (line[0] == ':' && !table.empty()) {
      out[table].chains.insert(line.substr(1, line.find(' ') - 1));
    } else if (line.rfind("-A ", 0) == 0 && !table.empty()) {
      out[table].rules.push_back(line);
    }
  }
  return out;
}

std::string chainOf(const std::string& rule) {
  std::istringstream w(rule);
  std::string a, chain;
  w >> a >> chain;
  return chain;
}

// The rule's jump or goto target ("" when it has none).
std::string targetOf(const std::string& rule) {
  std::istringstream w(rule);
  std::string word, prev;
  while (w >> word) {
    if (prev == "-j" || prev == "-g" || prev == "--jump" || prev == "--goto") return word;
    prev = word;
  }
  return "";
}

// The restore script that takes @p wanted chains out of one table, or
// why the layout is not one this knows. @p keep: chains left for later.
// @p keep: chains left whole (their jumps too); @p unhook: chains whose
// jumps go but that stay, rules and all (what their rules translated keeps
// its translation).
Result<std::string> removalScript(const std::string& name, const SavedTable& t, const std::set<std::string>& wanted,
                                  const std::set<std::string>& keep, const std::set<std::string>& unhook,
                                  std::vector<std::string>& removedChains, bool& changes) {
  changes = false;
  std::vector<std::string> present;
  for (const auto& c : t.chains)
    if (wanted.count(c)) present.push_back(c);
  if (present.empty()) return std::string();
  std::string script = "*" + name + "\n";
  for (const auto& r : t.rules) {
    const std::string chain = chainOf(r), target = targetOf(r);
    if (wanted.count(chain)) {
      if (t.chains.count(target) && !wanted.count(target))
        return Error::msg(name + " table: " + chain + " jumps to " + target + ", a chain Istio does not make", EPROTO);
      continue;
    }
    if (!wanted.count(target)) continue;
    if (!kBuiltinChains.count(chain))
      return Error::msg(name + " table: " + target + " is jumped to from " + chain + ", not from a built-in chain",
                        EPROTO);
    if (!keep.count(target)) {
      script += "-D" + r.substr(2) + "\n";
      changes = true;
    }
  }
  for (const auto& c : present) {
    if (keep.count(c) || unhook.count(c)) continue;
    script += "-F " + c + "\n-X " + c + "\n";
    removedChains.push_back(c);
    changes = true;
  }
  return script + "COMMIT\n";
}

// One iptables backend and family: what it has of @p wanted goes (but the
// chains in @p keepByTable), atomically per table, in one iptables-restore.
// Every table is judged before anything changes: an unknown layout in one
// leaves all of them as they were. Order: raw, mangle, then nat, so that
// until the last step Istio's REDIRECT still answers what sluice's
// redirection has not taken yet (tc mode's DNS is lost while Istio's raw
// or connmark rules are there without its nat rules). nat's built-in
// chains stay, even empty: the NAT hooks they keep registered translate the
// connections Istio's REDIRECT opened until they close.
using ByTable = std::map<std::string, std::set<std::string>>;

Status removeFromBackend(const std::string& save, const std::string& restore, const std::string& label,
                         const std::set<std::string>& wanted, const ByTable& keepByTable, const ByTable& unhookByTable,
                         std::vector<std::string>& removed, std::vector<std::string>& kept,
                         std::vector<std::string>& unhooked) {
  auto out = runCommand({save});
  if (!out.ok()) return out.error().code == ENOENT ? Status{} : Status(out.error());
  if (out->exitCode != 0) return Error::msg(label + ": " + save + " exited " + std::to_string(out->exitCode), EIO);
  const auto tables = parseSave(out->out);
  std::map<std::string, std::string> scripts;
  std::vector<std::string> lines;
  static const std::set<std::string> none;
  for (const auto& [name, table] : tables) {
    auto k = keepByTable.find(name);
    const auto& keep = k == keepByTable.end() ? none : k->second;
    auto u = unhookByTable.find(name);
    const auto& unhook = u == unhookByTable.end() ? none : u->second;
    std::vector<std::string> chains;
    bool changes = false;
    auto s = removalScript(name, table, wanted, keep, unhook, chains, changes);
    if (!s.ok()) return Error::msg(label + " " + s.error().message + ": left as it is", s.error().code);
    for (const auto& c : keep)
      if (table.chains.count(c)) kept.push_back(label + " " + name + ": " + c);
    for (const auto& c : unhook)
      if (table.chains.count(c)) unhooked.push_back(label + " " + name + ": " + c);
    if (!changes) continue;
    scripts[name] = *s;
    if (!chains.empty()) lines.push_back(label + " " + name + ": " + joined(chains));
  }
  std::string script;
  for (const char* t : {"raw", "mangle", "nat"})
    if (scripts.count(t)) script += scripts[t];
  for (const auto& [name, text] : scripts)
    if (name != "raw" && name != "mangle" && name != "nat") script += text;
  if (script.empty()) return {};
  auto r = runCommand({restore, "--noflush"}, std::chrono::seconds(10), script);
  SLUICE_TRY(r);
  if (r->exitCode != 0)
    return Error::msg(label + ": " + restore + " exited " + std::to_string(r->exitCode) + ": " + r->err, EIO);
  removed.insert(removed.end(), lines.begin(), lines.end());
  return {};
}

struct Backend {
  const char* label;
  const char* save;
  const char* restore;
  const char* legacyProc;  // nullptr: the nft backend, always looked at
};
const Backend kBackends[] = {
    {"iptables-nft IPv4", "iptables-nft-save", "iptables-nft-restore", nullptr},
    {"iptables-nft IPv6", "ip6tables-nft-save", "ip6tables-nft-restore", nullptr},
    {"iptables-legacy IPv4", "iptables-legacy-save", "iptables-legacy-restore", "ip_tables_names"},
    {"iptables-legacy IPv6", "ip6tables-legacy-save", "ip6tables-legacy-restore", "ip6_tables_names"},
};

Status removeFromIptables(const std::set<std::string>& wanted, const ByTable& keepByTable, const ByTable& unhookByTable,
                          std::vector<std::string>& removed, std::vector<std::string>& kept,
                          std::vector<std::string>& unhooked) {
  for (const auto& b : kBackends) {
    if (b.legacyProc && !legacyTablesInUse(b.legacyProc)) continue;
    SLUICE_TRY(removeFromBackend(b.save, b.restore, b.label, wanted, keepByTable, unhookByTable, removed, kept, unhooked));
  }
  return {};
}

// Istio's native nftables tables (1.28+): nat and raw go; mangle goes
// whole when no connection needs its restore, else only its prerouting
// base chains (the connmark of new connections).
Status removeNativeTables(bool keepRestore, bool natInUse, std::vector<std::string>& removed,
                          std::vector<std::string>& kept, std::vector<std::string>& natKept) {
  auto list = runCommand({"nft", "-j", "list", "tables"});
  if (!list.ok()) return list.error().code == ENOENT ? Status{} : Status(list.error());
  if (list->exitCode != 0) return Error::msg("nft list tables exited " + std::to_string(list->exitCode), EIO);
  auto j = nlohmann::json::parse(list->out, nullptr, false);
  if (j.is_discarded()) return Error::msg("nft -j list tables: not JSON", EPROTO);
  std::string script;
  for (const auto& item : j.value("nftables", nlohmann::json::array())) {
    if (!item.contains("table")) continue;
    const std::string family = item["table"].value("family", ""), name = item["table"].value("name", "");
    if (name.rfind("istio-ambient-", 0) != 0) continue;
    const std::string table = family + " " + name;
    if (name == "istio-ambient-nat" && natInUse) {
      // Its redirect rules stay while connections they translated are
      // open (removing them ends those translations): an accept first in
      // each of its chains keeps them from new connections.
      auto t = runCommand({"nft", "-j", "list", "table", family, name});
      SLUICE_TRY(t);
      auto tj = nlohmann::json::parse(t->out, nullptr, false);
      if (t->exitCode != 0 || tj.is_discarded()) return Error::msg("nft -j list table " + table + " failed", EIO);
      std::set<std::string> guarded;
      for (const auto& x : tj.value("nftables", nlohmann::json::array()))
        if (x.contains("rule") && x["rule"].value("comment", "") == kUnhookComment)
          guarded.insert(x["rule"].value("chain", ""));
      for (const auto& x : tj.value("nftables", nlohmann::json::array()))
        if (x.contains("chain") && x["chain"].contains("hook") && !guarded.count(x["chain"].value("name", "")))
          script += "insert rule " + table + " " + x["chain"].value("name", "") + " accept comment \"" +
                    kUnhookComment + "\"\n";
      natKept.push_back("nftables: " + table);
      continue;
    }
    if (name != "istio-ambient-mangle" || !keepRestore) {
      script += "delete table " + table + "\n";
      removed.push_back("nftables: " + table);
      continue;
    }
    auto chains = runCommand({"nft", "-j", "list", "table", family, name});
    SLUICE_TRY(chains);
    auto cj = nlohmann::json::parse(chains->out, nullptr, false);
    if (chains->exitCode != 0 || cj.is_discarded()) return Error::msg("nft -j list table " + table + " failed", EIO);
    for (const auto& c : cj.value("nftables", nlohmann::json::array()))
      if (c.contains("chain") && c["chain"].value("hook", "") == "prerouting") {
        const std::string chain = c["chain"].value("name", "");
        script += "flush chain " + table + " " + chain + "\ndelete chain " + table + " " + chain + "\n";
        removed.push_back("nftables: " + table + " chain " + chain);
      }
    kept.push_back("nftables: " + table);
  }
  if (script.empty()) return {};
  auto r = runCommand({"nft", "-f", "-"}, std::chrono::seconds(10), script);
  SLUICE_TRY(r);
  if (r->exitCode != 0) return Error::msg("nft -f: exited " + std::to_string(r->exitCode) + ": " + r->err, EIO);
  return {};
}

// Attributes of a netlink message's payload after @p headerLen bytes.
std::map<int, std::string> attributes(const char* data, size_t len) {
  std::map<int, std::string> out;
  size_t at = 0;
  while (at + sizeof(nlattr) <= len) {
    const auto* a = reinterpret_cast<const nlattr*>(data + at);
    if (a->nla_len < sizeof(nlattr) || at + a->nla_len > len) break;
    out[a->nla_type & NLA_TYPE_MASK] = std::string(data + at + NLA_HDRLEN, a->nla_len - NLA_HDRLEN);
    at += NLA_ALIGN(a->nla_len);
  }
  return out;
}

// What a conntrack entry says: its connmark, status bits, and whether it is
// a TCP connection that is not closing (TIME_WAIT, CLOSE).
struct CtEntry {
  uint32_t mark = 0;
  uint32_t status = 0;
  bool openTcp = false;
};

CtEntry parseCtEntry(const char* payload, size_t len) {
  CtEntry e;
  auto attrs = attributes(payload, len);
  if (auto m = attrs.find(CTA_MARK); m != attrs.end() && m->second.size() >= 4) {
    uint32_t v;
    std::memcpy(&v, m->second.data(), 4);
    e.mark = ntohl(v);
  }
  if (auto st = attrs.find(CTA_STATUS); st != attrs.end() && st->second.size() >= 4) {
    uint32_t v;
    std::memcpy(&v, st->second.data(), 4);
    e.status = ntohl(v);
  }
  auto proto = attrs.find(CTA_PROTOINFO);
  if (proto == attrs.end()) return e;  // not TCP
  auto p = attributes(proto->second.data(), proto->second.size());
  auto tcp = p.find(CTA_PROTOINFO_TCP);
  if (tcp == p.end()) return e;
  auto t = attributes(tcp->second.data(), tcp->second.size());
  auto state = t.find(CTA_PROTOINFO_TCP_STATE);
  if (state == t.end() || state->second.empty()) {
    e.openTcp = true;
    return e;
  }
  auto v = static_cast<uint8_t>(state->second[0]);
  e.openTcp = v != TCP_CONNTRACK_TIME_WAIT && v != TCP_CONNTRACK_CLOSE;
  return e;
}

// Open TCP connections in the calling thread's netns whose conntrack entry
// @p counts.
Result<size_t> countConntrack(const std::function<bool(const CtEntry&)>& counts);

Result<size_t> countConntrack(const std::function<bool(const CtEntry&)>& counts) {
  Fd sock(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER));
  if (!sock.valid()) return Error::fromErrno(errno, "conntrack netlink socket");
  struct {
    nlmsghdr nh;
    nfgenmsg nf;
  } req{};
  req.nh.nlmsg_len = sizeof(req);
  req.nh.nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.nh.nlmsg_seq = 1;
  req.nf.nfgen_family = AF_UNSPEC;
  req.nf.version = NFNETLINK_V0;
  if (::send(sock.get(), &req, sizeof(req), 0) < 0) return Error::fromErrno(errno, "conntrack dump");
  size_t count = 0;
  std::vector<char> buf(1 << 16);
  for (;;) {
    ssize_t n = ::recv(sock.get(), buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::fromErrno(errno, "conntrack dump");
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE) return count;
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* e = reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(h));
        if (e->error == 0) continue;
        return Error::fromErrno(-e->error, "conntrack dump");
      }
      const char* payload = static_cast<const char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(sizeof(nfgenmsg));
      const size_t len = h->nlmsg_len - NLMSG_LENGTH(NLMSG_ALIGN(sizeof(nfgenmsg)));
      if (CtEntry e = parseCtEntry(payload, len); e.openTcp && counts(e)) count++;
    }
  }
}

}  // namespace

Result<size_t> openReturnMarkedConnections() {
  return countConntrack([](const CtEntry& e) { return (e.mark & kIstioConnmarkMask) == kIstioConnmark; });
}

Result<size_t> openTranslatedConnections() {
  return countConntrack([](const CtEntry& e) { return (e.status & (IPS_SRC_NAT | IPS_DST_NAT)) != 0; });
}

Result<PodRulesRemoval> removePodRules(bool socketCapture) {
  PodRulesRemoval r;
  // Conntrack unreadable: what the connections need stays (the safe side),
  // and the answer says why.
  auto open = openReturnMarkedConnections();
  const bool keepRestore = socketCapture && (!open.ok() || *open > 0);
  auto translated = openTranslatedConnections();
  const bool keepNat = socketCapture && (!translated.ok() || *translated > 0);
  ByTable keep, unhook;
  if (keepRestore) keep[kRestoreTable] = {kRestoreChain};
  if (keepNat) unhook["nat"] = kPodChains;
  std::vector<std::string> kept, unhooked, natKept;
  SLUICE_TRY(removeFromIptables(kPodChains, keep, unhook, r.removed, kept, unhooked));
  SLUICE_TRY(removeNativeTables(keepRestore, keepNat, r.removed, kept, natKept));
  auto why = [](Result<size_t>& n, const std::string& what) {
    return n.ok() ? std::to_string(*n) + " connection(s) " + what + " are open"
                  : "conntrack cannot be read (" + n.error().message + ")";
  };
  if (!kept.empty())
    r.waiting.push_back("connmark restore kept (" + joined(kept) + "): " +
                        why(open, "the proxy opened under Istio's rules"));
  unhooked.insert(unhooked.end(), natKept.begin(), natKept.end());
  if (!unhooked.empty())
    r.waiting.push_back("Istio's redirect rules kept, no longer reached (" + joined(unhooked) + "): " +
                        why(translated, "they translated"));
  return r;
}

Result<std::set<std::string>> probeSetAddresses() {
  std::set<std::string> out;
  for (const char* set : {"istio-inpod-probes-v4", "istio-inpod-probes-v6"}) {
    auto r = runCommand({"ipset", "list", set});
    SLUICE_TRY(r);
    if (r->exitCode != 0) continue;  // no such set
    std::istringstream in(r->out);
    std::string line;
    bool members = false;
    while (std::getline(in, line)) {
      if (members && !line.empty()) out.insert(line.substr(0, line.find(' ')));
      if (line == "Members:") members = true;
    }
  }
  return out;
}

Result<std::vector<std::string>> removeCniEntries(const std::string& dir, const std::string& type,
                                                  const std::string& unless) {
  std::vector<std::string> changed;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return Error::fromErrno(errno, dir);
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    std::string f = e->d_name;
    if (f.size() > 9 && f.compare(f.size() - 9, 9, ".conflist") == 0) files.push_back(f);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const std::string path = dir + "/" + f;
    std::ifstream in(path);
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("plugins") || !j["plugins"].is_array()) continue;
    auto& plugins = j["plugins"];
    auto isType = [](const nlohmann::json& p, const std::string& t) { return p.is_object() && p.value("type", "") == t; };
    if (std::none_of(plugins.begin(), plugins.end(), [&](const auto& p) { return isType(p, type); })) continue;
    if (!unless.empty() && std::none_of(plugins.begin(), plugins.end(), [&](const auto& p) { return isType(p, unless); }))
      continue;
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& p : plugins)
      if (!isType(p, type)) kept.push_back(p);
    if (kept.empty()) continue;  // the chain would be empty: not ours to decide
    plugins = kept;
    const std::string tmp = path + ".sluice-tmp";
    {
      std::ofstream out(tmp);
      out << j.dump(2) << "\n";
      if (!out) return Error::msg("cannot write " + tmp, EIO);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int e = errno;
      ::unlink(tmp.c_str());
      return Error::fromErrno(e, "rename " + tmp);
    }
    changed.push_back(path);
  }
  return changed;
}

Result<NodeRemoval> removeNodeState(const std::set<std::string>& covered, const std::string& cniConfDir) {
  NodeRemoval r;
  auto addrs = probeSetAddresses();
  SLUICE_TRY(addrs);
  std::vector<std::string> uncovered;
  for (const auto& a : *addrs)
    if (!covered.count(a)) uncovered.push_back(a);
  if (!uncovered.empty()) {
    r.kept.push_back("ISTIO_POSTRT and the istio-inpod-probes sets: sluice does not translate the probes of " +
                     std::to_string(uncovered.size()) + " of their address(es) yet (" + uncovered.front() + ", …)");
  } else {
    std::vector<std::string> kept;
    std::vector<std::string> unhooked;
    SLUICE_TRY(removeFromIptables(kNodeChains, {}, {}, r.removed, kept, unhooked));
    for (const char* set : {"istio-inpod-probes-v4", "istio-inpod-probes-v6"}) {
      auto exists = runCommand({"ipset", "list", "-n", set});
      SLUICE_TRY(exists);
      if (exists->exitCode != 0) continue;
      auto d = runCommand({"ipset", "destroy", set});
      SLUICE_TRY(d);
      if (d->exitCode != 0) return Error::msg("ipset destroy " + std::string(set) + ": " + d->err, EIO);
      r.removed.push_back(std::string("ipset ") + set);
    }
  }
  if (!cniConfDir.empty()) {
    auto changed = removeCniEntries(cniConfDir, "istio-cni", "sluice-cni");
    SLUICE_TRY(changed);
    for (const auto& f : *changed) r.removed.push_back("istio-cni from " + f);
    for (const auto& f : readNodeState(cniConfDir).cniEntries)
      r.kept.push_back("istio-cni in " + f + ": sluice-cni is not in that chain (a pod must never start with neither)");
  }
  return r;
}

}  // namespace sluice::istio
