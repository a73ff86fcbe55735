#include "loader/sock_hooks.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>
#include <set>

#include "loader/cgroup.h"
#include "base/fd.h"
#include "loader/programs.h"
#include "loader/tc.h"
#include "maps/sluice_maps.h"

namespace sluice {

namespace {

std::string nodeDir(const std::string& root) { return root + "/" + SLUICE_PIN_NODE_LINKS_DIR; }

// What a pinned link is: its kind, its program, and for a cgroup link the
// cgroup it is attached to (0 once that cgroup was removed), for a netns
// link the netns (0 once it is gone).
struct LinkState {
  bool pinned = false;
  uint32_t type = 0;
  uint32_t progId = 0;
  uint64_t cgroupId = 0;
  uint32_t netnsIno = 0;
};

LinkState linkState(const std::string& pin) {
  LinkState s;
  Fd fd(bpf_obj_get(pin.c_str()));
  if (!fd.valid()) return s;
  s.pinned = true;
  struct bpf_link_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0) return s;
  s.type = info.type;
  s.progId = info.prog_id;
  if (info.type == BPF_LINK_TYPE_CGROUP) s.cgroupId = info.cgroup.cgroup_id;
  if (info.type == BPF_LINK_TYPE_NETNS) s.netnsIno = info.netns.netns_ino;
  return s;
}

Status detachPinned(const std::string& pin) {
  Fd fd(bpf_obj_get(pin.c_str()));
  if (!fd.valid()) {
    if (errno == ENOENT) return {};
    return Error::fromErrno(errno, "open pinned link " + pin);
  }
  // Detach explicitly: another process may hold the link open, and the
  // unpin alone would leave it attached until that process exits.
  if (bpf_link_detach(fd.get()) != 0 && errno != ENOLINK && errno != ENOENT && errno != EINVAL)
    return Error::fromErrno(errno, "detach link " + pin);
  if (::unlink(pin.c_str()) != 0 && errno != ENOENT) return Error::fromErrno(errno, "unpin " + pin);
  return {};
}

Status pinLink(int linkFd, const std::string& pin) {
  ::unlink(pin.c_str());  // a stale pin of a link that went away
  if (bpf_obj_pin(linkFd, pin.c_str()) != 0) return Error::fromErrno(errno, "pin link at " + pin);
  return {};
}

// Slot 0 of sk_lookup_prog: the shared program, when empty (or, with
// replace, running another one). Reading a program array gives program ids.
Result<bool> ensureSharedLookup(PodPrograms& p, bool replace) {
  const int fd = p.socketPrograms().skLookup;
  auto have = p.skLookupProg.lookup(0);
  if (have && (!replace || *have == programId(fd))) return false;
  SLUICE_TRY(p.skLookupProg.update(0, static_cast<__u32>(fd)));
  return true;
}

// BPF_F_BEFORE without an anchor: the front of the cgroup's list for that
// hook (Linux 6.16+; the uapi of this build may predate it).
constexpr uint32_t kBpfFBefore = 1U << 3;

// Links @p progFd at @p cgFd in front of every program already there, so
// that sluice runs before another owner's (a CNI's connect-time load
// balancer attached when the node booted); a kernel without ordered cgroup
// links (EINVAL) appends, as every kernel did. -1 with errno on failure.
int linkFirst(int progFd, int cgFd, int attachType) {
  static std::atomic<int> ordered{-1};  // -1 unknown, 0 no, 1 yes
  if (ordered.load() != 0) {
    LIBBPF_OPTS(bpf_link_create_opts, o, .flags = kBpfFBefore);
    int fd = bpf_link_create(progFd, cgFd, static_cast<enum bpf_attach_type>(attachType), &o);
    if (fd >= 0 || errno != EINVAL || ordered.load() == 1) {
      if (fd >= 0) ordered = 1;
      return fd;
    }
    ordered = 0;
  }
  return bpf_link_create(progFd, cgFd, static_cast<enum bpf_attach_type>(attachType), nullptr);
}

}  // namespace

std::vector<NodeHook> nodeHooks(const PodPrograms& p) {
  if (!p.socketLoaded()) return {};
  const SocketPrograms& s = p.socketPrograms();
  return {
      {"connect4", BPF_CGROUP_INET4_CONNECT, s.connect4},
      {"connect6", BPF_CGROUP_INET6_CONNECT, s.connect6},
      {"sendmsg4", BPF_CGROUP_UDP4_SENDMSG, s.sendmsg4},
      {"sendmsg6", BPF_CGROUP_UDP6_SENDMSG, s.sendmsg6},
      {"recvmsg4", BPF_CGROUP_UDP4_RECVMSG, s.recvmsg4},
      {"recvmsg6", BPF_CGROUP_UDP6_RECVMSG, s.recvmsg6},
      {"getpeername4", BPF_CGROUP_INET4_GETPEERNAME, s.getpeername4},
      {"getpeername6", BPF_CGROUP_INET6_GETPEERNAME, s.getpeername6},
      {"getsockopt", BPF_CGROUP_GETSOCKOPT, s.getsockopt},
      {"sockops", BPF_CGROUP_SOCK_OPS, s.sockops},
      {"skb_ingress", BPF_CGROUP_INET_INGRESS, s.skbIngress},
      {"skb_egress", BPF_CGROUP_INET_EGRESS, s.skbEgress},
      {"sock_create", BPF_CGROUP_INET_SOCK_CREATE, s.sockCreate},
  };
}

Result<std::string> nodeHookCgroup(const std::string& requested) {
  if (requested.empty()) return cgroup2Mount();
  struct stat st {};
  if (::stat(requested.c_str(), &st) != 0) return Error::fromErrno(errno, "cgroup " + requested);
  if (!S_ISDIR(st.st_mode) || ::access((requested + "/cgroup.procs").c_str(), F_OK) != 0)
    return Error::msg("cgroup " + requested + " is not a cgroup v2 directory", ENOTDIR);
  return requested;
}

Result<NodeHooksReport> ensureCgroupLinks(const std::string& root, const std::string& cgroupPath,
                                          const std::vector<NodeHook>& hooks, bool replace, const std::string& what) {
  auto cgId = cgroupIdOfPath(cgroupPath);
  SLUICE_TRY(cgId);
  Fd cg(::open(cgroupPath.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cg.valid()) return Error::fromErrno(errno, "open cgroup " + cgroupPath);
  if (::mkdir(nodeDir(root).c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + nodeDir(root));

  NodeHooksReport report;
  std::vector<std::string> made;  // undone if a later hook fails: all or nothing
  auto undo = [&made] {
    for (const auto& pin : made) (void)detachPinned(pin);
  };
  for (const auto& h : hooks) {
    std::string pin = nodeDir(root) + "/" + h.name;
    LinkState s = linkState(pin);
    if (s.pinned && s.type == BPF_LINK_TYPE_CGROUP && s.cgroupId != 0) {
      if (s.cgroupId != *cgId) {
        undo();
        return Error::msg("the " + what + " " + h.name + " under " + root + " is attached at cgroup id " +
                              std::to_string(s.cgroupId) + ", not at " + cgroupPath + " (id " + std::to_string(*cgId) +
                              "); remove the pod state or use the same --cgroup",
                          EEXIST);
      }
      if (replace && s.progId != programId(h.progFd)) {
        Fd link(bpf_obj_get(pin.c_str()));
        if (!link.valid() || bpf_link_update(link.get(), h.progFd, nullptr) != 0) {
          undo();
          return Error::fromErrno(errno, "switch the " + what + " " + h.name + " to program " +
                                             std::to_string(programId(h.progFd)));
        }
        report.replaced++;
      }
      continue;
    }
    int fd = linkFirst(h.progFd, cg.get(), h.attachType);
    if (fd < 0) {
      int err = errno;
      undo();
      return Error::fromErrno(err, "attach the " + what + " " + h.name + " at cgroup " + cgroupPath);
    }
    Fd link(fd);
    if (Status st = pinLink(link.get(), pin); !st.ok()) {
      undo();
      return st.error();
    }
    made.push_back(pin);
    report.attached++;
  }
  if (report.attached)
    spdlog::info("{}: {} link(s) attached at cgroup {}, pinned under {}", what, report.attached, cgroupPath,
                 nodeDir(root));
  return report;
}

Result<NodeHooksReport> ensureNodeHooks(const std::string& root, const std::string& cgroupPath, PodPrograms& p,
                                        bool replace) {
  if (!p.socketLoaded()) return Error::msg("socket mode unavailable: " + p.socketError(), ENOTSUP);
  SLUICE_TRY(cgroupIdOfPath(cgroupPath));
  // The shared sk_lookup program first: a new connect6 may send IPv6 to
  // [::1] in the port block only once the program that hands such a
  // connection to the proxy runs (it leaves all else as before).
  auto shared = ensureSharedLookup(p, replace);
  SLUICE_TRY(shared);
  auto report = ensureCgroupLinks(root, cgroupPath, nodeHooks(p), replace, "socket mode node hook");
  SLUICE_TRY(report);
  if (*shared && replace) report->replaced++;
  return report;
}

std::vector<ForeignHookAhead> foreignHooksAhead(const std::string& root, const std::string& cgroupPath) {
  std::vector<ForeignHookAhead> out;
  // Every program of sluice's node links (the probe hook's connect4/6 too).
  std::set<uint32_t> ours;
  if (DIR* d = ::opendir(nodeDir(root).c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.')
        if (LinkState s = linkState(nodeDir(root) + "/" + e->d_name); s.pinned && s.progId) ours.insert(s.progId);
    ::closedir(d);
  }
  Fd cg(::open(cgroupPath.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cg.valid()) return out;
  const std::pair<const char*, int> hooks[] = {{"connect4", BPF_CGROUP_INET4_CONNECT},
                                               {"connect6", BPF_CGROUP_INET6_CONNECT},
                                               {"sendmsg4", BPF_CGROUP_UDP4_SENDMSG},
                                               {"sendmsg6", BPF_CGROUP_UDP6_SENDMSG}};
  for (const auto& [name, type] : hooks) {
    LinkState mine = linkState(nodeDir(root) + "/" + name);
    if (!mine.pinned || !mine.progId) continue;
    __u32 ids[64] = {}, count = 64, flags = 0;
    if (bpf_prog_query(cg.get(), static_cast<enum bpf_attach_type>(type), 0, &flags, ids, &count) != 0) continue;
    for (__u32 i = 0; i < count && ids[i] != mine.progId; i++) {
      if (ours.count(ids[i])) continue;
      ForeignHookAhead f{name, ids[i], ""};
      Fd prog(bpf_prog_get_fd_by_id(ids[i]));
      bpf_prog_info info{};
      __u32 len = sizeof(info);
      if (prog.valid() && bpf_obj_get_info_by_fd(prog.get(), &info, &len) == 0) f.progName = info.name;
      out.push_back(f);
    }
  }
  return out;
}

std::vector<std::string> checkCgroupLinks(const std::string& root, const std::string& cgroupPath,
                                          const std::vector<std::string>& names, const std::string& what) {
  std::vector<std::string> out;
  auto cgId = cgroupIdOfPath(cgroupPath);
  for (const auto& name : names) {
    std::string pin = nodeDir(root) + "/" + name;
    LinkState s = linkState(pin);
    if (!s.pinned)
      out.push_back(what + " " + name + " is not attached");
    else if (s.type != BPF_LINK_TYPE_CGROUP || s.cgroupId == 0)
      out.push_back(what + " " + name + " is detached (its cgroup is gone)");
    else if (cgId.ok() && s.cgroupId != *cgId)
      out.push_back(what + " " + name + " is attached at another cgroup (id " + std::to_string(s.cgroupId) + ")");
  }
  return out;
}

std::vector<std::string> checkNodeHooks(const std::string& root, const std::string& cgroupPath, const PodPrograms& p) {
  std::vector<std::string> names;
  for (const auto& h : nodeHooks(p)) names.push_back(h.name);
  auto out = checkCgroupLinks(root, cgroupPath, names, "node hook");
  if (p.socketLoaded() && !p.skLookupProg.lookup(0)) out.push_back("the shared sk_lookup program is missing");
  return out;
}

bool nodeLinksPinned(const std::string& root, const std::vector<std::string>& names) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(nodeDir(root).c_str()), ::closedir);
  if (!dir) return false;
  std::set<std::string> pinned;
  while (const dirent* e = ::readdir(dir.get())) pinned.insert(e->d_name);
  for (const auto& n : names)
    if (!pinned.count(n)) return false;
  return true;
}

Status detachNodeLink(const std::string& root, const std::string& name) { return detachPinned(nodeDir(root) + "/" + name); }

bool nodeHooksComplete(const std::string& root, const PodPrograms& p) {
  std::vector<std::string> names;
  for (const auto& h : nodeHooks(p)) names.push_back(h.name);
  return nodeLinksPinned(root, names) && p.socketLoaded() && p.skLookupProg.lookup(0).has_value();
}

// The socket mode's node hooks by pin name (nodeHooks() names them for
// loaded programs), then the node's probe hook (loader/probe_hook.h).
const char* const kSocketHookNames[] = {"connect4",     "connect6",     "sendmsg4",   "sendmsg6", "recvmsg4",    "recvmsg6",
                                        "getpeername4", "getpeername6", "getsockopt", "sockops",  "skb_ingress", "skb_egress",
                                        "sock_create"};
const char* const kProbeHookNames[] = {"probe_connect4", "probe_connect6"};

bool nodeHooksPinned(const std::string& root) {
  // node_links/ holds the probe hook and the pod guard too: a socket hook's pin.
  struct stat st {};
  for (const char* n : kSocketHookNames)
    if (::lstat((nodeDir(root) + "/" + n).c_str(), &st) == 0) return true;
  return false;
}

Status removeNodeHooks(const std::string& root) {
  Status first;
  std::vector<const char*> names(std::begin(kSocketHookNames), std::end(kSocketHookNames));
  names.insert(names.end(), std::begin(kProbeHookNames), std::end(kProbeHookNames));
  for (const char* n : names) {
    Status st = detachNodeLink(root, n);
    if (!st.ok() && first.ok()) first = st;
  }
  if (::rmdir(nodeDir(root).c_str()) != 0 && errno != ENOENT && first.ok())
    first = Error::fromErrno(errno, "rmdir " + nodeDir(root));
  return first;
}

Status attachPodSkLookup(const PodPrograms& p, uint64_t cookie, int netnsFd, const std::string& pin) {
  auto stub = p.skLookupStub(cookie);
  SLUICE_TRY(stub);
  int fd = bpf_link_create(stub->get(), netnsFd, BPF_SK_LOOKUP, nullptr);
  if (fd < 0) return Error::fromErrno(errno, "link the pod's sk_lookup program to its netns");
  Fd link(fd);
  return pinLink(link.get(), pin);
}

Status detachPodSkLookup(const std::string& pin) { return detachPinned(pin); }

bool podSkLookupAttached(const std::string& pin) {
  LinkState s = linkState(pin);
  return s.pinned && s.type == BPF_LINK_TYPE_NETNS && s.netnsIno != 0;
}

}  // namespace sluice
