#include "loader/tc.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/fd.h"

namespace sluice {

namespace {

// Debian bookworm's uapi headers and libbpf 1.1 predate tcx; the kernel's
// numbers are stable ABI.
constexpr int kBpfTcxIngress = 46;
constexpr int kBpfTcxEgress = 47;
constexpr int kBpfLinkTypeTcx = 11;
constexpr __u32 kBpfFBefore = 1U << 3;  // mprog: before the anchor; none given: at the front

// sluice's cls_bpf filter: a fixed handle and priority so removal finds it.
// Priority 1 runs before every other priority (tc.h); earlier builds used
// 0x51ce, which the sweep moves.
constexpr __u32 kLegacyHandle = 0x51ce;
constexpr __u32 kLegacyPriority = 1;
constexpr __u32 kOldLegacyPriority = 0x51ce;

int tcxAttachType(TcHook hook) { return hook == TcHook::Ingress ? kBpfTcxIngress : kBpfTcxEgress; }

// A tcx link of progFd at the front of the hook.
Result<Fd> createTcxLink(int ifindex, TcHook hook, int progFd) {
  LIBBPF_OPTS(bpf_link_create_opts, o, .flags = kBpfFBefore);
  int fd = bpf_link_create(progFd, ifindex, static_cast<enum bpf_attach_type>(tcxAttachType(hook)), &o);
  if (fd < 0) return tcxAttachError(errno, hook, ifindex);
  return Fd(fd);
}

// BPF_PROG_QUERY's attributes as Linux 6.6 defines them (bookworm's uapi
// header and libbpf 1.1 predate link_ids).
struct ProgQueryAttr {
  __u32 targetIfindex;
  __u32 attachType;
  __u32 queryFlags;
  __u32 attachFlags;
  __u64 progIds;
  __u32 count;
  __u32 pad;
  __u64 progAttachFlags;
  __u64 linkIds;
  __u64 linkAttachFlags;
  __u64 revision;
};
static_assert(sizeof(ProgQueryAttr) == 64);

uint32_t linkIdOf(int linkFd) {
  struct bpf_link_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(linkFd, &info, &len) != 0) return 0;
  return info.id;
}

bpf_tc_attach_point legacyPoint(TcHook hook) { return hook == TcHook::Ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS; }

}  // namespace

const char* tcHookName(TcHook h) { return h == TcHook::Ingress ? "ingress" : "egress"; }

Error tcxAttachError(int err, TcHook hook, int ifindex) {
  // Kernels before 6.6 reject the unknown attach type with EINVAL.
  if (err == EINVAL) return Error::msg("kernel lacks tcx (BPF_TCX_*, Linux 6.6+); use --tc-mode legacy", EOPNOTSUPP);
  return Error::fromErrno(err, std::string("attach tcx ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
}

Status attachTcx(int ifindex, TcHook hook, int progFd, const std::string& pinPath) {
  auto link = createTcxLink(ifindex, hook, progFd);
  SLUICE_TRY(link);
  ::unlink(pinPath.c_str());  // a stale pin of a link whose device is gone
  if (bpf_obj_pin(link->get(), pinPath.c_str()) != 0)
    return Error::fromErrno(errno, "pin tcx link at " + pinPath);
  spdlog::debug("attached tcx {} on ifindex {} pinned at {}", tcHookName(hook), ifindex, pinPath);
  return {};
}

Result<int> tcxPosition(int ifindex, TcHook hook, const std::string& pinPath) {
  Fd link(bpf_obj_get(pinPath.c_str()));
  if (!link.valid()) return Error::fromErrno(errno, "open pinned link " + pinPath);
  uint32_t mine = linkIdOf(link.get());
  std::vector<__u32> progs(64), links(64);
  ProgQueryAttr attr{};
  attr.targetIfindex = static_cast<__u32>(ifindex);
  attr.attachType = static_cast<__u32>(tcxAttachType(hook));
  attr.progIds = reinterpret_cast<__u64>(progs.data());
  attr.linkIds = reinterpret_cast<__u64>(links.data());
  attr.count = static_cast<__u32>(progs.size());
  if (::syscall(__NR_bpf, BPF_PROG_QUERY, &attr, sizeof(attr)) != 0)
    return Error::fromErrno(errno, std::string("query tcx ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
  for (__u32 i = 0; i < attr.count && i < links.size(); i++)
    if (links[i] == mine) return static_cast<int>(i);
  return Error::msg("tcx link " + pinPath + " is not attached on ifindex " + std::to_string(ifindex), ENOENT);
}

Status moveTcxToFront(int ifindex, TcHook hook, int progFd, int stagingProgFd, const std::string& pinPath) {
  Fd old(bpf_obj_get(pinPath.c_str()));
  auto link = createTcxLink(ifindex, hook, stagingProgFd);
  SLUICE_TRY(link);
  // The new link takes the pin over in one rename (bpffs replaces the old
  // pin, dropping its reference); ours keeps the old link until detached.
  std::string tmp = pinPath + "_moving";  // bpffs refuses dots in names
  ::unlink(tmp.c_str());
  if (bpf_obj_pin(link->get(), tmp.c_str()) != 0) return Error::fromErrno(errno, "pin tcx link at " + tmp);
  if (::rename(tmp.c_str(), pinPath.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Error::fromErrno(err, "move pin " + tmp + " to " + pinPath);
  }
  if (old.valid() && bpf_link_detach(old.get()) != 0 && errno != ENOLINK && errno != ENOENT && errno != EINVAL)
    return Error::fromErrno(errno, "detach the old link of " + pinPath);
  if (bpf_link_update(link->get(), progFd, nullptr) != 0)
    return Error::fromErrno(errno, "switch the moved link " + pinPath + " to program " + std::to_string(programId(progFd)));
  spdlog::debug("moved tcx {} on ifindex {} to the front ({})", tcHookName(hook), ifindex, pinPath);
  return {};
}

Status detachTcx(const std::string& pinPath) {
  int fd = bpf_obj_get(pinPath.c_str());
  if (fd < 0) {
    if (errno == ENOENT) return {};
    return Error::fromErrno(errno, "open pinned link " + pinPath);
  }
  Fd link(fd);
  // Detach explicitly: another process may hold the link open, and the
  // unpin alone would leave it attached until that process exits.
  if (bpf_link_detach(link.get()) != 0 && errno != ENOLINK && errno != ENOENT && errno != EINVAL)
    return Error::fromErrno(errno, "detach link " + pinPath);
  if (::unlink(pinPath.c_str()) != 0 && errno != ENOENT) return Error::fromErrno(errno, "unpin " + pinPath);
  spdlog::debug("detached tcx link {}", pinPath);
  return {};
}

bool tcxAttached(const std::string& pinPath) {
  int fd = bpf_obj_get(pinPath.c_str());
  if (fd < 0) return false;
  Fd link(fd);
  struct bpf_link_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(link.get(), &info, &len) != 0) return false;
  // A tcx link whose device went away reports ifindex 0.
  if (info.type != kBpfLinkTypeTcx) return false;
  // The tcx member follows the common header; libbpf 1.1's struct lacks it,
  // so read it from the raw union: { __u32 ifindex; __u32 attach_type; } at offset 16.
  __u32 ifindex = 0;
  static_assert(sizeof(info) >= 16 + sizeof(__u32));
  memcpy(&ifindex, reinterpret_cast<const char*>(&info) + 16, sizeof(ifindex));
  return ifindex != 0;
}

Result<bool> attachLegacy(int ifindex, TcHook hook, int progFd) {
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  bool created = false;
  int err = bpf_tc_hook_create(&h);
  if (err == 0) {
    created = true;
  } else if (err != -EEXIST) {
    return Error::fromErrno(err, "create clsact qdisc on ifindex " + std::to_string(ifindex));
  }
  LIBBPF_OPTS(bpf_tc_opts, o, .prog_fd = progFd, .flags = BPF_TC_F_REPLACE, .handle = kLegacyHandle,
              .priority = kLegacyPriority);
  err = bpf_tc_attach(&h, &o);
  if (err != 0)
    return Error::fromErrno(err, std::string("attach cls_bpf ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
  spdlog::debug("attached cls_bpf {} on ifindex {}", tcHookName(hook), ifindex);
  return created;
}

namespace {
Status detachLegacyAt(int ifindex, TcHook hook, __u32 priority) {
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  LIBBPF_OPTS(bpf_tc_opts, o, .handle = kLegacyHandle, .priority = priority);
  int err = bpf_tc_detach(&h, &o);
  if (err != 0 && err != -ENOENT && err != -EINVAL && err != -ENODEV)
    return Error::fromErrno(err, std::string("detach cls_bpf ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
  return {};
}

uint32_t legacyProgramIdAt(int ifindex, TcHook hook, __u32 priority) {
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  LIBBPF_OPTS(bpf_tc_opts, o, .handle = kLegacyHandle, .priority = priority);
  if (bpf_tc_query(&h, &o) != 0) return 0;
  return o.prog_id;
}
}  // namespace

bool legacyAtOldPriority(int ifindex, TcHook hook) { return legacyProgramIdAt(ifindex, hook, kOldLegacyPriority) != 0; }

Status moveLegacyToFront(int ifindex, TcHook hook, int progFd) {
  SLUICE_TRY(attachLegacy(ifindex, hook, progFd));
  return detachLegacyAt(ifindex, hook, kOldLegacyPriority);
}

Status detachLegacy(int ifindex, TcHook hook, bool destroyClsact) {
  SLUICE_TRY(detachLegacyAt(ifindex, hook, kLegacyPriority));
  SLUICE_TRY(detachLegacyAt(ifindex, hook, kOldLegacyPriority));
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  int err = 0;
  if (destroyClsact) {
    // Destroying the clsact qdisc takes both hooks with it.
    h.attach_point = static_cast<bpf_tc_attach_point>(BPF_TC_INGRESS | BPF_TC_EGRESS);
    err = bpf_tc_hook_destroy(&h);
    if (err != 0 && err != -ENOENT && err != -EINVAL && err != -ENODEV)
      return Error::fromErrno(err, "destroy clsact on ifindex " + std::to_string(ifindex));
  }
  return {};
}

bool legacyAttached(int ifindex, TcHook hook) { return legacyProgramId(ifindex, hook) != 0; }

uint32_t legacyProgramId(int ifindex, TcHook hook) {
  if (uint32_t id = legacyProgramIdAt(ifindex, hook, kLegacyPriority)) return id;
  return legacyProgramIdAt(ifindex, hook, kOldLegacyPriority);
}

Status replaceLegacyProgram(int ifindex, TcHook hook, int progFd) {
  // An earlier build's filter: the new program goes in at priority 1.
  if (legacyAtOldPriority(ifindex, hook)) return moveLegacyToFront(ifindex, hook, progFd);
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  LIBBPF_OPTS(bpf_tc_opts, o, .prog_fd = progFd, .flags = BPF_TC_F_REPLACE, .handle = kLegacyHandle,
              .priority = kLegacyPriority);
  if (int err = bpf_tc_attach(&h, &o); err != 0)
    return Error::fromErrno(err, std::string("replace cls_bpf ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
  return {};
}

uint32_t programId(int progFd) {
  struct bpf_prog_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(progFd, &info, &len) != 0) return 0;
  return info.id;
}

std::string programTag(int progFd) {
  struct bpf_prog_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(progFd, &info, &len) != 0) return "";
  return std::string(reinterpret_cast<const char*>(info.tag), sizeof(info.tag));
}

std::string linkedProgramTag(int linkFd) {
  struct bpf_link_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(linkFd, &info, &len) != 0) return "";
  Fd prog(bpf_prog_get_fd_by_id(info.prog_id));
  return prog.valid() ? programTag(prog.get()) : "";
}

uint32_t tcxProgramId(const std::string& pinPath) {
  if (!tcxAttached(pinPath)) return 0;
  int fd = bpf_obj_get(pinPath.c_str());
  if (fd < 0) return 0;
  Fd link(fd);
  struct bpf_link_info info {};
  __u32 len = sizeof(info);
  if (bpf_obj_get_info_by_fd(link.get(), &info, &len) != 0) return 0;
  return info.prog_id;
}

Status updateTcx(const std::string& pinPath, int progFd) {
  int fd = bpf_obj_get(pinPath.c_str());
  if (fd < 0) return Error::fromErrno(errno, "open pinned link " + pinPath);
  Fd link(fd);
  if (bpf_link_update(link.get(), progFd, nullptr) != 0) return Error::fromErrno(errno, "update link " + pinPath);
  spdlog::debug("link {} now runs program {}", pinPath, programId(progFd));
  return {};
}

}  // namespace sluice
