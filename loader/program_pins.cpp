#include "loader/program_pins.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "loader/bpffs.h"
#include "maps/sluice_maps.h"

namespace sluice {

namespace {

constexpr const char* kCurrent = "current";
constexpr const char* kRecord = "record";

// Bumped when PinRecord changes; part of the identity, so a build with
// another record never reads this one's.
constexpr uint32_t kRecordVersion = 2;  // 2: the socket mode's programs and maps
constexpr char kMagic[8] = {'s', 'l', 'u', 'i', 'c', 'e', 'p', 'p'};

// What the loading process knew, pinned beside the programs (an array map
// of one element: bpffs holds no plain files). The feature bits spare a
// reusing process the probes (a throwaway netns, helper probes, the
// kernel's BTF), which cost as much as the rest of its run.
struct PinRecord {
  char magic[8];
  uint32_t version;
  uint32_t cookieMethod;  ///< PodCookieMethod
  char identity[24];
  char cookieOverride[16];  ///< SLUICE_POD_COOKIE of the load ("" none)
  uint64_t loadedAtNs;      ///< CLOCK_REALTIME
  uint32_t progIds[kPinnedProgs];  ///< 0: not loaded (the socket mode's, refused)
  uint32_t mapIds[24];       ///< boundMapNames() order: the maps the programs were loaded against
  uint32_t featureBits;
  char release[65];
  char cookieMethodHow[131];
  char socketError[256];  ///< why the kernel refused the socket programs
};
static_assert(sizeof(PinRecord) % 8 == 0, "plain array value");

enum FeatureBit : uint32_t {
  kBtf = 1u << 0,
  kSkAssign = 1u << 1,
  kCastToKernCtx = 1u << 2,
  kProbeReadKernel = 1u << 3,
  kTcx = 1u << 4,
  kTcxLinkUpdate = 1u << 5,
  kReuseportAssign = 1u << 6,
  kCgroup2 = 1u << 7,
  kSocketHooks = 1u << 8,
};

struct FeatureField {
  Feature FeatureReport::*field;
  uint32_t bit;
};
const FeatureField kFeatureFields[] = {
    {&FeatureReport::btf, kBtf},
    {&FeatureReport::skAssign, kSkAssign},
    {&FeatureReport::castToKernCtx, kCastToKernCtx},
    {&FeatureReport::probeReadKernel, kProbeReadKernel},
    {&FeatureReport::tcx, kTcx},
    {&FeatureReport::tcxLinkUpdate, kTcxLinkUpdate},
    {&FeatureReport::reuseportAssign, kReuseportAssign},
    {&FeatureReport::cgroup2, kCgroup2},
    {&FeatureReport::socketHooks, kSocketHooks},
};

template <size_t N>
void copyFixed(char (&dst)[N], const std::string& s) {
  std::memset(dst, 0, N);
  std::memcpy(dst, s.data(), std::min(s.size(), N - 1));
}
template <size_t N>
std::string fromFixed(const char (&src)[N]) {
  return std::string(src, strnlen(src, N));
}

std::string cookieOverride() {
  const char* v = std::getenv("SLUICE_POD_COOKIE");
  return v ? v : "";
}

// "bpf-prog", "bpf-map", ...: what kind of BPF object an fd from
// bpf_obj_get is. BPF_OBJ_GET_INFO_BY_FD cannot tell (it fills whatever
// struct the object has into the caller's buffer).
std::string objectKind(int fd) {
  char link[64] = {};
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  if (n <= 0) return "?";
  std::string s(link, static_cast<size_t>(n));
  const std::string prefix = "anon_inode:";
  return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : s;
}

Error foreign(const std::string& path, const std::string& what, const std::string& root) {
  return Error::msg(path + " " + what + ", not what sluice pinned there: remove " + programsDir(root) +
                        " and run again to load the programs anew (enrolled pods keep running)",
                    EPROTO);
}

// The object pinned at @p path, which must be a @p kind ("bpf-prog",
// "bpf-map"); missing or another kind is foreign.
Result<Fd> openPinned(const std::string& path, const std::string& kind, const std::string& root) {
  Fd fd(bpf_obj_get(path.c_str()));
  if (!fd.valid()) {
    if (errno == ENOENT) return foreign(path, "is missing", root);
    return Error::fromErrno(errno, "open " + path);
  }
  if (std::string have = objectKind(fd.get()); have != kind) return foreign(path, "is a " + have, root);
  return fd;
}

bool isDir(const std::string& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Result<std::optional<std::string>> readCurrent(const std::string& root) {
  std::string cur = programsDir(root) + "/" + kCurrent;
  struct stat st {};
  if (::lstat(cur.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Error::fromErrno(errno, "stat " + cur);
  }
  if (!S_ISLNK(st.st_mode)) return foreign(cur, "is not a symlink to the pinned identity", root);
  char target[64] = {};
  ssize_t n = ::readlink(cur.c_str(), target, sizeof(target) - 1);
  if (n < 0) return Error::fromErrno(errno, "readlink " + cur);
  std::string id(target, static_cast<size_t>(n));
  if (id.empty() || id.find('/') != std::string::npos)
    return foreign(cur, "points at '" + id + "'", root);
  return std::optional<std::string>(id);
}

// The record of identity @p id; an error when it is not one.
Result<PinRecord> readRecord(const std::string& root, const std::string& id) {
  std::string path = programsDir(root) + "/" + id + "/" + kRecord;
  auto fd = openPinned(path, "bpf-map", root);
  SLUICE_TRY(fd);
  struct bpf_map_info info = {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd->get(), &info, &len) != 0) return Error::fromErrno(errno, "read " + path);
  if (info.type != BPF_MAP_TYPE_ARRAY || info.key_size != 4 || info.value_size != sizeof(PinRecord) ||
      info.max_entries != 1)
    return foreign(path, "is a map of another shape (value size " + std::to_string(info.value_size) + ")", root);
  PinRecord rec{};
  __u32 zero = 0;
  if (bpf_map_lookup_elem(fd->get(), &zero, &rec) != 0) return Error::fromErrno(errno, "read " + path);
  if (std::memcmp(rec.magic, kMagic, sizeof(kMagic)) != 0 || rec.version != kRecordVersion ||
      fromFixed(rec.identity) != id)
    return foreign(path, "does not record identity " + id, root);
  return rec;
}

FeatureReport featuresOf(const PinRecord& rec, const std::string& id) {
  FeatureReport r;
  r.release = fromFixed(rec.release);
  if (auto v = KernelVersion::parse(r.release); v.ok()) r.version = *v;
  std::string how = "probed by the process that pinned programs " + id;
  for (const auto& f : kFeatureFields) r.*f.field = Feature{(rec.featureBits & f.bit) != 0, how};
  r.cookieMethod = static_cast<PodCookieMethod>(rec.cookieMethod);
  r.cookieMethodHow = fromFixed(rec.cookieMethodHow);
  return r;
}

std::string kernelRelease() {
  struct utsname u {};
  return ::uname(&u) == 0 ? u.release : "";
}

}  // namespace

const char* pinnedProgName(PinnedProg p) {
  switch (p) {
    case PinnedProg::PodEgress: return "pod_egress";
    case PinnedProg::PodIngress: return "pod_ingress";
    case PinnedProg::PodLoEgress: return "pod_lo_egress";
    case PinnedProg::HostEgress: return "host_egress";
    case PinnedProg::HostIngress: return "host_ingress";
    case PinnedProg::SockConnect4: return "pod_connect4";
    case PinnedProg::SockConnect6: return "pod_connect6";
    case PinnedProg::SockSendmsg4: return "pod_sendmsg4";
    case PinnedProg::SockSendmsg6: return "pod_sendmsg6";
    case PinnedProg::SockRecvmsg4: return "pod_recvmsg4";
    case PinnedProg::SockRecvmsg6: return "pod_recvmsg6";
    case PinnedProg::SockGetpeername4: return "pod_getpeername4";
    case PinnedProg::SockGetpeername6: return "pod_getpeername6";
    case PinnedProg::SockGetsockopt: return "pod_getsockopt";
    case PinnedProg::SockSockops: return "pod_sockops";
    case PinnedProg::SockSkbIngress: return "pod_skb_ingress";
    case PinnedProg::SockSkbEgress: return "pod_skb_egress";
    case PinnedProg::SockSkLookup: return "pod_sk_lookup";
    case PinnedProg::SockCreate: return "pod_sock_create";
    case PinnedProg::Count: break;
  }
  return "?";
}

const std::vector<const char*>& boundMapNames() {
  static const std::vector<const char*> v = {
      SLUICE_PIN_SETTINGS,  SLUICE_PIN_POD_CONFIG,    SLUICE_PIN_POD_STATS,     SLUICE_PIN_DNS_NAT,
      SLUICE_PIN_PODS,      SLUICE_PIN_POD_ADDRS,     SLUICE_PIN_SNAT_REV,      SLUICE_PIN_SNAT_CLOSED,
      SLUICE_PIN_POD_LISTENERS, SLUICE_PIN_LAYOUTS,   SLUICE_PIN_PROXY_IDENTITY, SLUICE_PIN_PROXY_CGROUPS,
      "sock_verdict",  // socket storage: used by the programs only
      // The socket mode's (firstSocketMap()).
      SLUICE_PIN_POD_SOCK, SLUICE_PIN_SOCK_ORIG, SLUICE_PIN_ORIG_DST, SLUICE_PIN_SOCK_LISTENERS,
      SLUICE_PIN_PROXY_CONNS, SLUICE_PIN_SK_LOOKUP_POD, SLUICE_PIN_SK_LOOKUP_PROG,
  };
  static_assert(sizeof(PinRecord::mapIds) / sizeof(uint32_t) >= 20);
  return v;
}

size_t firstSocketMap() {
  // Derived from the list, so a map added to the TC part moves it.
  static const size_t first = [] {
    const auto& names = boundMapNames();
    for (size_t i = 0; i < names.size(); i++)
      if (std::string(names[i]) == SLUICE_PIN_POD_SOCK) return i;
    return names.size();
  }();
  return first;
}

std::string programsDir(const std::string& root) { return root + "/" + SLUICE_PIN_PROGRAMS_DIR; }

std::string identityOf(const std::vector<ElfBytes>& objects, PodCookieMethod method) {
  // FNV-1a over 8-byte words: the objects are ~250 KiB each and a reusing
  // process hashes them on every run, so bytewise would cost ~1 ms.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h = (h ^ n) * 0x100000001b3ull;
  };
  for (const auto& o : objects) mix(o.data, o.size);
  uint32_t m = static_cast<uint32_t>(method);
  mix(&m, sizeof(m));
  mix(&kRecordVersion, sizeof(kRecordVersion));
  std::string release = kernelRelease();  // CO-RE relocations are the kernel's
  mix(release.data(), release.size());
  std::string libbpf = libbpf_version_string();  // and libbpf does them
  mix(libbpf.data(), libbpf.size());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

Result<std::optional<ProgramPins>> openProgramPins(const std::string& root, uint32_t snatEntries) {
  using Out = std::optional<ProgramPins>;
  auto current = readCurrent(root);
  SLUICE_TRY(current);
  if (!*current) return Out();
  const std::string& id = **current;
  // The identities this process could load: the forced method's, else
  // either (which one the probes would pick is what the record says).
  std::string override = cookieOverride();
  std::optional<PodCookieMethod> method;
  if (!override.empty()) {
    auto m = parsePodCookieMethod(override);
    if (!m.ok()) return Out();  // the load reports it
    if (buildIdentity(*m) == id) method = *m;
  } else {
    for (auto m : {PodCookieMethod::KernCtx, PodCookieMethod::ProbeRead})
      if (buildIdentity(m) == id) method = m;
  }
  if (!method) {
    spdlog::debug("programs pinned under {} are another build's ({}); loading this build's", root, id);
    return Out();
  }
  // From here on the pins claim to be this build's: anything else is an error.
  auto rec = readRecord(root, id);
  SLUICE_TRY(rec);
  std::string dir = programsDir(root) + "/" + id;
  if (rec->cookieMethod != static_cast<uint32_t>(*method))
    return foreign(dir + "/" + kRecord, "records another pod-cookie method", root);
  if (override.empty() && rec->cookieOverride[0] != '\0') {
    spdlog::debug("programs pinned under {} were loaded with SLUICE_POD_COOKIE={}; probing", root,
                  fromFixed(rec->cookieOverride));
    return Out();
  }
  ProgramPins pins;
  pins.identity = id;
  pins.socketError = fromFixed(rec->socketError);
  const bool socket = pins.socketError.empty();
  for (int i = 0; i < kPinnedProgs; i++) {
    if (i >= kFirstSocketProg && !socket) continue;  // refused by the kernel at the load
    const char* name = pinnedProgName(static_cast<PinnedProg>(i));
    std::string path = dir + "/" + name;
    auto fd = openPinned(path, "bpf-prog", root);
    SLUICE_TRY(fd);
    struct bpf_prog_info info = {};
    __u32 len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd->get(), &info, &len) != 0) return Error::fromErrno(errno, "read pinned program " + path);
    // The kernel keeps BPF_OBJ_NAME_LEN - 1 characters of a name.
    std::string kernelName = std::string(name).substr(0, BPF_OBJ_NAME_LEN - 1);
    bool tc = info.type == BPF_PROG_TYPE_SCHED_CLS;
    if (tc != (i < kFirstSocketProg) || std::string(info.name) != kernelName || info.id != rec->progIds[i])
      return foreign(path, "is program " + std::to_string(info.id) + " '" + info.name + "' (recorded: " +
                               std::to_string(rec->progIds[i]) + " '" + name + "')",
                     root);
    pins.progs[i] = std::move(*fd);
  }
  // The programs use the maps they were loaded against: maps re-created
  // since (a root cleared of its maps) would split them from the pins.
  const auto& names = boundMapNames();
  for (size_t i = 0; i < names.size(); i++) {
    if (i >= firstSocketMap() && !socket) {
      pins.maps.emplace_back();  // the socket programs' maps: none was loaded against
      continue;
    }
    std::string path = root + "/" + names[i];
    Fd fd(bpf_obj_get(path.c_str()));
    struct bpf_map_info info = {};
    __u32 len = sizeof(info);
    if (!fd.valid() || bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0 || info.id != rec->mapIds[i]) {
      spdlog::info("pinned map {} is not the one programs {} were loaded against; loading them anew", path, id);
      return Out();
    }
    if (names[i] == std::string(SLUICE_PIN_SNAT_REV) && info.max_entries != snatEntries) return Out();  // the load names it
    pins.maps.push_back(std::move(fd));
  }
  pins.features = featuresOf(*rec, id);
  return Out(std::move(pins));
}

Status pinPrograms(const std::string& root, const FeatureReport& features, const int (&progFds)[kPinnedProgs],
                   const std::vector<int>& mapFds, const std::string& socketError) {
  std::string dir = programsDir(root);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + dir);
  if (auto cur = readCurrent(root); !cur.ok()) return cur.error();  // a foreign `current` is not replaced
  std::string id = buildIdentity(features.cookieMethod);
  PinRecord rec{};
  std::memcpy(rec.magic, kMagic, sizeof(kMagic));
  rec.version = kRecordVersion;
  rec.cookieMethod = static_cast<uint32_t>(features.cookieMethod);
  copyFixed(rec.identity, id);
  copyFixed(rec.cookieOverride, cookieOverride());
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  rec.loadedAtNs = static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
  copyFixed(rec.socketError, socketError);
  for (int i = 0; i < kPinnedProgs; i++) {
    if (progFds[i] < 0) continue;  // the socket mode's, refused
    struct bpf_prog_info info = {};
    __u32 len = sizeof(info);
    if (bpf_obj_get_info_by_fd(progFds[i], &info, &len) != 0) return Error::fromErrno(errno, "read a loaded program");
    rec.progIds[i] = info.id;
  }
  for (size_t i = 0; i < mapFds.size() && i < boundMapNames().size(); i++) {
    if (mapFds[i] < 0) continue;
    struct bpf_map_info info = {};
    __u32 len = sizeof(info);
    if (bpf_obj_get_info_by_fd(mapFds[i], &info, &len) != 0) return Error::fromErrno(errno, "read a loaded map");
    rec.mapIds[i] = info.id;
  }
  for (const auto& f : kFeatureFields)
    if ((features.*f.field).present) rec.featureBits |= f.bit;
  copyFixed(rec.release, features.release);
  copyFixed(rec.cookieMethodHow, features.cookieMethodHow);

  // Written aside under a name no reader looks at, then renamed into place
  // and pointed at: bpffs supports rename, and a rename is atomic.
  std::string pid = std::to_string(::getpid());
  std::string tmp = dir + "/" + id + "-new-" + pid;
  (void)removeTree(tmp);
  if (::mkdir(tmp.c_str(), 0700) != 0) return Error::fromErrno(errno, "mkdir " + tmp);
  struct Undo {
    std::string path;
    ~Undo() {
      if (!path.empty()) (void)removeTree(path);
    }
  } undo{tmp};
  for (int i = 0; i < kPinnedProgs; i++) {
    if (progFds[i] < 0) continue;
    std::string path = tmp + "/" + pinnedProgName(static_cast<PinnedProg>(i));
    if (bpf_obj_pin(progFds[i], path.c_str()) != 0) return Error::fromErrno(errno, "pin program " + path);
  }
  LIBBPF_OPTS(bpf_map_create_opts, mopts);
  Fd recFd(bpf_map_create(BPF_MAP_TYPE_ARRAY, "sluice_pins", 4, sizeof(PinRecord), 1, &mopts));
  if (!recFd.valid()) return Error::fromErrno(errno, "create the pinned programs' record");
  __u32 zero = 0;
  if (bpf_map_update_elem(recFd.get(), &zero, &rec, BPF_ANY) != 0)
    return Error::fromErrno(errno, "write the pinned programs' record");
  std::string recPath = tmp + "/" + kRecord;
  if (bpf_obj_pin(recFd.get(), recPath.c_str()) != 0) return Error::fromErrno(errno, "pin " + recPath);
  std::string final = dir + "/" + id;
  // This identity's pins, no longer usable (maps re-created): replaced.
  if (isDir(final)) SLUICE_TRY(removeTree(final));
  if (::rename(tmp.c_str(), final.c_str()) != 0) return Error::fromErrno(errno, "rename " + tmp + " to " + final);
  undo.path = final;
  std::string link = dir + "/" + kCurrent + "-new-" + pid;
  (void)::unlink(link.c_str());
  if (::symlink(id.c_str(), link.c_str()) != 0) return Error::fromErrno(errno, "symlink " + link);
  std::string cur = dir + "/" + kCurrent;
  if (::rename(link.c_str(), cur.c_str()) != 0) {
    int err = errno;
    (void)::unlink(link.c_str());
    return Error::fromErrno(err, "rename " + link + " to " + cur);
  }
  undo.path.clear();
  spdlog::info("pinned programs {} ({}) under {}", id, podCookieMethodName(features.cookieMethod), dir);
  if (auto gone = removeStaleProgramPins(root); !gone.ok())
    spdlog::warn("could not remove stale program pins: {}", gone.error().message);
  return {};
}

Result<std::vector<std::string>> removeStaleProgramPins(const std::string& root) {
  std::vector<std::string> removed;
  std::string dir = programsDir(root);
  auto current = readCurrent(root);
  SLUICE_TRY(current);
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return removed;
    return Error::fromErrno(errno, "open " + dir);
  }
  std::vector<std::pair<std::string, bool>> entries;
  while (auto* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || n == kCurrent || (*current && n == **current)) continue;
    entries.emplace_back(n, e->d_type == DT_DIR);
  }
  ::closedir(d);
  Status st;
  for (const auto& [name, isDirectory] : entries) {
    std::string path = dir + "/" + name;
    // Never recursing through a symlink (removeTree would follow it).
    Status one = isDirectory ? removeTree(path)
                             : (::unlink(path.c_str()) == 0 || errno == ENOENT ? Status()
                                                                               : Status(Error::fromErrno(errno, "unlink " + path)));
    if (one.ok()) {
      removed.push_back(name);
      spdlog::info("removed stale program pins {}", path);
    } else if (st.ok()) {
      st = one;
    }
  }
  if (!st.ok()) return st.error();
  return removed;
}

PinnedProgramsInfo inspectProgramPins(const std::string& root) {
  PinnedProgramsInfo out;
  auto current = readCurrent(root);
  if (!current.ok()) {
    out.problem = current.error().message;
    return out;
  }
  if (!*current) return out;
  out.identity = **current;
  auto rec = readRecord(root, out.identity);
  if (!rec.ok()) {
    out.problem = rec.error().message;
    return out;
  }
  auto method = static_cast<PodCookieMethod>(rec->cookieMethod);
  out.cookieMethod = podCookieMethodName(method);
  out.loadedAtNs = rec->loadedAtNs;
  std::string override = cookieOverride();
  out.thisBuild = buildIdentity(method) == out.identity &&
                  (override.empty() ? rec->cookieOverride[0] == '\0' : override == out.cookieMethod);
  for (int i = 0; i < kPinnedProgs; i++) out.programIds.push_back(rec->progIds[i]);
  return out;
}

}  // namespace sluice
