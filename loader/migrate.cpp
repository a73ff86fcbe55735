#include "loader/migrate.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <type_traits>
#include <map>
#include <optional>

#include "base/fd.h"
#include "maps/sluice_maps.h"

namespace sluice {

namespace {

// ---- The layouts before this build's, frozen: what a migration reads. ----

// `pods` layout 1 (v0.1.0): the record up to the addresses.
struct PodRecordV1 {
  char netns_path[SLUICE_NETNS_PATH_LEN];
  __u64 netns_cookie;
  __u64 netns_ino;
  __u64 enrolled_at_ns;
  __u32 tc_mode;
  __u32 routes;
  __u32 iface_count;
  __u32 lo_ifindex;
  sluice_pod_iface ifaces[SLUICE_MAX_POD_IFACES];
  sluice_pod_config config;
  char node_netns_path[SLUICE_NETNS_PATH_LEN];
  __u64 node_netns_cookie;
  sluice_pod_iface host_iface;
  __u32 addr_count;
  __u32 lo_created_clsact;
  sluice_pod_addr addrs[SLUICE_MAX_POD_ADDRS];
};
static_assert(sizeof(PodRecordV1) == 992, "pods layout 1 as v0.1.0 pinned it");
static_assert(offsetof(sluice_pod_record, identity) == sizeof(PodRecordV1),
              "layout 2 of pods extends layout 1 at its end");

// `pods` layout 2: layout 1 plus the identity and the hand-off, all TC.
struct PodRecordV2 {
  PodRecordV1 v1;
  sluice_pod_identity identity;
  sluice_pod_handoff handoff;
};
static_assert(sizeof(PodRecordV2) == 1760, "pods layout 2");
static_assert(offsetof(sluice_pod_record, capture) == sizeof(PodRecordV2),
              "layout 3 of pods extends layout 2 at its end");

// Copies every entry of an old map into a new one through @p convert; an
// entry already in the new map (a resumed migration) is kept.
// @p amend, when given, may change a converted value knowing its key.
template <typename K, typename OldV, typename NewV, typename Convert>
Status copyEntries(int oldFd, const BpfMap<K, NewV>& into, Convert convert, size_t& copied,
                   const std::type_identity_t<std::function<void(const K&, NewV&)>>& amend = {}) {
  K cur{}, next{};
  const K* prev = nullptr;
  while (bpf_map_get_next_key(oldFd, prev, &next) == 0) {
    cur = next;
    prev = &cur;
    OldV old{};
    if (bpf_map_lookup_elem(oldFd, &cur, &old) != 0) continue;  // deleted meanwhile
    if (into.lookup(cur)) continue;
    NewV v = convert(old);
    if (amend) amend(cur, v);
    SLUICE_TRY(into.update(cur, v, BPF_NOEXIST));
    copied++;
  }
  return {};
}

// Every older `pods` layout is a prefix of the current one: the record is
// copied and what it lacks is what those builds did (identity and hand-off
// none, TC capture, no sysctl of the socket mode touched).
template <typename Old>
Status migratePodsPrefix(int oldFd, MigrationMaps& p, uint32_t from, size_t& copied) {
  struct bpf_map_info info = {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(oldFd, &info, &len) != 0) return Error::fromErrno(errno, "read the old pods map");
  if (info.value_size != sizeof(Old) || info.key_size != sizeof(sluice_pod_id))
    return Error::msg("old pods map has value size " + std::to_string(info.value_size) + ", layout " +
                          std::to_string(from) + " has " + std::to_string(sizeof(Old)),
                      EPROTO);
  return copyEntries<sluice_pod_id, Old>(
      oldFd, p.pods,
      [](const Old& old) {
        sluice_pod_record rec{};
        std::memcpy(&rec, &old, sizeof(old));
        rec.capture = SLUICE_CAPTURE_TC;
        rec.fwmark_accept_before = -1;
        return rec;
      },
      copied);
}

Status migratePodsFrom1(int oldFd, MigrationMaps& p, const std::string& /*root*/, size_t& copied) {
  return migratePodsPrefix<PodRecordV1>(oldFd, p, 1, copied);
}
Status migratePodsFrom2(int oldFd, MigrationMaps& p, const std::string& /*root*/, size_t& copied) {
  return migratePodsPrefix<PodRecordV2>(oldFd, p, 2, copied);
}

// `snat_rev` layout 1: the reverse half of a probe connection, its FIN flags
// in the forward half (snat_fwd, same key and value types, keyed prober ->
// pod as the prober sends it). Layout 2 is one element per connection: the
// old reverse entries as they are, with the flags of their forward entries.
Status migrateSnatRevFrom1(int oldFd, MigrationMaps& p, const std::string& root, size_t& copied) {
  std::string fwdPin = root + "/" + SLUICE_PIN_RETIRED_SNAT_FWD;
  Fd fwd(bpf_obj_get(fwdPin.c_str()));  // absent: no flags to carry over
  return copyEntries<sluice_snat_key, sluice_snat_value>(
      oldFd, p.snatRev,
      [&](const sluice_snat_value& old) { return old; }, copied, [&](const sluice_snat_key& k, sluice_snat_value& v) {
        if (!fwd.valid()) return;
        sluice_snat_key fk{};
        std::memcpy(fk.saddr, v.addr, sizeof(fk.saddr));
        std::memcpy(fk.daddr, k.saddr, sizeof(fk.daddr));
        fk.sport = v.port;
        fk.dport = k.sport;
        fk.family = k.family;
        sluice_snat_value fv{};
        if (bpf_map_lookup_elem(fwd.get(), &fk, &fv) == 0) v.flags = fv.flags;
      });
}

// `pod_addrs` layout 1: the pod's netns cookie alone. Layout 2 adds the
// netns whose sockets the node's probe hook binds (bpf/node_probe.bpf.c):
// 0 for every pod enrolled by a layout-1 build, whose host-side veth still
// runs that build's probe SNAT (host_egress/host_ingress, left attached
// until the pod is removed). Bound there too, a new probe could get a port
// whose old translation (snat_closed) still sends its replies to another
// prober; left to the old programs, every probe of the pod is translated
// as before. A pod enrolled afterwards gets its node's netns.
Status migratePodAddrsFrom1(int oldFd, MigrationMaps& p, const std::string& /*root*/, size_t& copied) {
  return copyEntries<sluice_pod_addr, uint64_t>(
      oldFd, p.podAddrs, [](const uint64_t& podCookie) { return sluice_pod_addr_info{podCookie, 0}; }, copied);
}

using MigrateFn = Status (*)(int oldFd, MigrationMaps& p, const std::string& root, size_t& copied);
struct Migrator {
  const char* name;
  uint32_t from;
  MigrateFn fn;
};
const Migrator kMigrators[] = {
    {SLUICE_PIN_PODS, 1, migratePodsFrom1},
    {SLUICE_PIN_PODS, 2, migratePodsFrom2},
    {SLUICE_PIN_SNAT_REV, 1, migrateSnatRevFrom1},
    {SLUICE_PIN_POD_ADDRS, 1, migratePodAddrsFrom1},
};

// Maps earlier builds pinned and this one does not use: unpinned (and their
// layouts forgotten) once every migration is done. A program still attached
// keeps its map until its hook is switched.
const char* const kRetiredPins[] = {SLUICE_PIN_RETIRED_SNAT_FWD};

const Migrator* migratorFor(const std::string& name, uint32_t from) {
  for (const auto& m : kMigrators)
    if (name == m.name && from == m.from) return &m;
  return nullptr;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// Old maps are set aside under <root>/migrate/ as NAME-vN (bpffs refuses
// names with a dot) until their entries are copied.
std::string asideDir(const std::string& root) { return root + "/migrate"; }
std::string asidePin(const std::string& root, const std::string& name, uint32_t version) {
  return asideDir(root) + "/" + name + "-v" + std::to_string(version);
}

// Pins left set aside by an interrupted migration: name -> N.
std::map<std::string, uint32_t> asidePins(const std::string& root) {
  std::map<std::string, uint32_t> out;
  DIR* d = ::opendir(asideDir(root).c_str());
  if (!d) return out;
  while (auto* e = ::readdir(d)) {
    std::string n = e->d_name;
    auto dash = n.rfind("-v");
    if (dash == std::string::npos || dash == 0 || dash + 2 >= n.size()) continue;
    std::string num = n.substr(dash + 2);
    if (num.size() > 6 || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    out[n.substr(0, dash)] = static_cast<uint32_t>(std::stoul(num));
  }
  ::closedir(d);
  return out;
}

// The layouts map pinned under root: name -> version; nullopt when there is
// none (nothing pinned, or v0.1.0's state).
Result<std::optional<std::map<std::string, uint32_t>>> readLayouts(const std::string& root) {
  std::string pin = root + "/" + SLUICE_PIN_LAYOUTS;
  Fd fd(bpf_obj_get(pin.c_str()));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<std::map<std::string, uint32_t>>();
    return Error::fromErrno(errno, "open " + pin);
  }
  std::map<std::string, uint32_t> out;
  sluice_layout_key cur{}, next{};
  const sluice_layout_key* prev = nullptr;
  while (bpf_map_get_next_key(fd.get(), prev, &next) == 0) {
    cur = next;
    prev = &cur;
    sluice_layout_value v{};
    if (bpf_map_lookup_elem(fd.get(), &cur, &v) == 0) out[std::string(cur.name, strnlen(cur.name, sizeof(cur.name)))] = v.version;
  }
  return std::optional<std::map<std::string, uint32_t>>(out);
}

std::string differences(const struct bpf_map_info& pinned, const struct bpf_map* want) {
  std::string d;
  auto add = [&](const char* what, uint64_t have, uint64_t wanted) {
    if (have != wanted)
      d += std::string(d.empty() ? "" : ", ") + what + " " + std::to_string(have) + " (this build: " + std::to_string(wanted) + ")";
  };
  add("type", pinned.type, bpf_map__type(want));
  add("key size", pinned.key_size, bpf_map__key_size(want));
  add("value size", pinned.value_size, bpf_map__value_size(want));
  add("max entries", pinned.max_entries, bpf_map__max_entries(want));
  add("flags", pinned.map_flags, bpf_map__map_flags(want));
  return d;
}

std::string refusal(const std::string& root) {
  return "; the running data plane is left as it is: run a sluice build that reads it, or remove " + root +
         " to start over (that unenrolls every pod)";
}

}  // namespace

const std::vector<MapLayout>& mapLayouts() {
  static const std::vector<MapLayout> v = {
      {SLUICE_PIN_SETTINGS, SLUICE_LAYOUT_SETTINGS},   {SLUICE_PIN_POD_CONFIG, SLUICE_LAYOUT_POD_CONFIG},
      {SLUICE_PIN_POD_STATS, SLUICE_LAYOUT_POD_STATS}, {SLUICE_PIN_DNS_NAT, SLUICE_LAYOUT_DNS_NAT},
      {"sock_verdict", SLUICE_LAYOUT_SOCK_VERDICT},    {SLUICE_PIN_POD_LISTENERS, SLUICE_LAYOUT_POD_LISTENERS},
      {SLUICE_PIN_PODS, SLUICE_LAYOUT_PODS},           {SLUICE_PIN_POD_ADDRS, SLUICE_LAYOUT_POD_ADDRS},
      {SLUICE_PIN_SNAT_REV, SLUICE_LAYOUT_SNAT_REV},
      {SLUICE_PIN_SNAT_CLOSED, SLUICE_LAYOUT_SNAT_CLOSED}, {SLUICE_PIN_LAYOUTS, SLUICE_LAYOUT_LAYOUTS},
      {SLUICE_PIN_PROXY_IDENTITY, SLUICE_LAYOUT_PROXY_IDENTITY}, {SLUICE_PIN_PROXY_CGROUPS, SLUICE_LAYOUT_PROXY_CGROUPS},
      {SLUICE_PIN_POD_SOCK, SLUICE_LAYOUT_POD_SOCK},   {SLUICE_PIN_SOCK_ORIG, SLUICE_LAYOUT_SOCK_ORIG},
      {SLUICE_PIN_ORIG_DST, SLUICE_LAYOUT_ORIG_DST},   {SLUICE_PIN_SOCK_LISTENERS, SLUICE_LAYOUT_SOCK_LISTENERS},
      {SLUICE_PIN_SK_LOOKUP_POD, SLUICE_LAYOUT_SK_LOOKUP_POD}, {SLUICE_PIN_SK_LOOKUP_PROG, SLUICE_LAYOUT_SK_LOOKUP_PROG},
      {SLUICE_PIN_PROXY_CONNS, SLUICE_LAYOUT_PROXY_CONNS},
  };
  return v;
}

Result<Migration> Migration::plan(const std::string& root, const std::vector<const struct bpf_object*>& objs) {
  Migration m;
  m.root_ = root;
  auto layouts = readLayouts(root);
  SLUICE_TRY(layouts);
  auto aside = asidePins(root);
  for (const auto& want : mapLayouts()) {
    std::string name = want.name;
    const struct bpf_map* def = nullptr;
    for (const auto* obj : objs)
      if (!def) def = bpf_object__find_map_by_name(obj, want.name);
    if (!def) return Error::msg("BPF object has no map '" + name + "' (build error: maps/ and bpf/ disagree)", EINVAL);
    if (auto a = aside.find(name); a != aside.end()) {
      // An interrupted migration: its old map is still set aside.
      if (!migratorFor(name, a->second) || a->second >= want.version)
        return Error::msg("pinned map '" + name + "' was being migrated from layout " + std::to_string(a->second) +
                              ", which this build cannot read" + refusal(root),
                          EPROTO);
      m.steps_.push_back({name, a->second, want.version, asidePin(root, name, a->second), true});
      continue;
    }
    std::string pin = root + "/" + name;
    Fd fd(bpf_obj_get(pin.c_str()));
    if (!fd.valid()) {
      if (errno == ENOENT) continue;  // created by the load
      return Error::fromErrno(errno, "open pinned map " + pin);
    }
    uint32_t version = want.version;
    if (!*layouts)
      version = 1;  // pinned by v0.1.0, before layouts were recorded
    else if (auto v = (*layouts)->find(name); v != (*layouts)->end())
      version = v->second;
    // else: pinned by a build with layouts whose load was interrupted before
    // it recorded them; the definitions are compared below.
    if (version > want.version)
      return Error::msg("pinned map '" + name + "' has layout " + std::to_string(version) + ", newer than this build's " +
                            std::to_string(want.version) + " (written by a newer sluice)" + refusal(root),
                        EPROTO);
    if (version < want.version) {
      if (!migratorFor(name, version))
        return Error::msg("pinned map '" + name + "' has layout " + std::to_string(version) +
                              ", which this build cannot migrate to " + std::to_string(want.version) + refusal(root),
                          EPROTO);
      m.steps_.push_back({name, version, want.version, asidePin(root, name, version), false});
      continue;
    }
    struct bpf_map_info info = {};
    __u32 len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0) return Error::fromErrno(errno, "read pinned map " + pin);
    if (std::string d = differences(info, def); !d.empty())
      return Error::msg("pinned map '" + name + "' differs from this build's at the same layout " + std::to_string(version) +
                            ": " + d + refusal(root),
                        EPROTO);
  }
  return m;
}

std::vector<std::string> Migration::describe() const {
  std::vector<std::string> out;
  for (const auto& s : steps_)
    out.push_back(s.name + " " + std::to_string(s.from) + " -> " + std::to_string(s.to) + (s.resumed ? " (resumed)" : ""));
  return out;
}

Status Migration::prepare() {
  for (const auto& s : steps_) {
    if (s.resumed) continue;
    if (::mkdir(asideDir(root_).c_str(), 0700) != 0 && errno != EEXIST)
      return Error::fromErrno(errno, "mkdir " + asideDir(root_));
    std::string pin = root_ + "/" + s.name;
    // bpffs supports rename: the old map stays pinned (under another name)
    // until its entries are copied, so a crash in between loses nothing.
    if (::rename(pin.c_str(), s.asidePin.c_str()) != 0)
      return Error::fromErrno(errno, "set pinned map " + pin + " aside for its migration");
    spdlog::info("migrating pinned map {} from layout {} to {}: old map set aside as {}", s.name, s.from, s.to, s.asidePin);
  }
  return {};
}

Status Migration::complete(MigrationMaps maps) {
  for (const auto& s : steps_) {
    Fd old(bpf_obj_get(s.asidePin.c_str()));
    if (!old.valid()) return Error::fromErrno(errno, "open the old map " + s.asidePin);
    size_t copied = 0;
    SLUICE_TRY(migratorFor(s.name, s.from)->fn(old.get(), maps, root_, copied));
    if (::unlink(s.asidePin.c_str()) != 0) return Error::fromErrno(errno, "unpin " + s.asidePin);
    (void)::rmdir(asideDir(root_).c_str());  // when it is empty
    spdlog::info("migrated pinned map {} from layout {} to {}: {} entr{} copied", s.name, s.from, s.to, copied,
                 copied == 1 ? "y" : "ies");
  }
  for (const char* name : kRetiredPins) {
    std::string pin = root_ + "/" + name;
    if (::unlink(pin.c_str()) == 0)
      spdlog::info("removed pinned map {}, which this build no longer uses", pin);
    else if (errno != ENOENT)
      return Error::fromErrno(errno, "unpin " + pin);
    sluice_layout_key k{};
    std::strncpy(k.name, name, sizeof(k.name) - 1);
    (void)maps.layouts.erase(k);
  }
  for (const auto& l : mapLayouts()) {
    sluice_layout_key k{};
    std::strncpy(k.name, l.name, sizeof(k.name) - 1);
    SLUICE_TRY(maps.layouts.update(k, sluice_layout_value{l.version, 0}));
  }
  return {};
}

Result<bool> pinnedLayoutsAreThisBuilds(const std::string& root) {
  auto layouts = readLayouts(root);
  SLUICE_TRY(layouts);
  if (!*layouts || !asidePins(root).empty()) return false;
  for (const auto& l : mapLayouts()) {
    auto it = (*layouts)->find(l.name);
    if (it == (*layouts)->end() || it->second != l.version) return false;
  }
  return true;
}

Result<std::vector<PinnedLayout>> pinnedLayouts(const std::string& root) {
  auto layouts = readLayouts(root);
  SLUICE_TRY(layouts);
  std::vector<PinnedLayout> out;
  for (const auto& l : mapLayouts()) {
    if (!exists(root + "/" + l.name)) continue;
    uint32_t v = 1;
    if (*layouts) {
      auto it = (*layouts)->find(l.name);
      v = it == (*layouts)->end() ? 0 : it->second;
    }
    out.push_back({l.name, v});
  }
  return out;
}

}  // namespace sluice
