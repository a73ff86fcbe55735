#include "loader/tc.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "loader/fd.h"

namespace sluice {

namespace {

// Debian bookworm's uapi headers and libbpf 1.1 predate tcx; the kernel's
// numbers are stable ABI.
constexpr int kBpfTcxIngress = 46;
constexpr int kBpfTcxEgress = 47;
constexpr int kBpfLinkTypeTcx = 11;

// sluice's cls_bpf filter: a fixed handle and priority so removal finds it.
constexpr __u32 kLegacyHandle = 0x51ce;
constexpr __u32 kLegacyPriority = 0x51ce;

bpf_tc_attach_point legacyPoint(TcHook hook) { return hook == TcHook::Ingress ? BPF_TC_INGRESS : BPF_TC_EGRESS; }

}  // namespace

const char* tcHookName(TcHook h) { return h == TcHook::Ingress ? "ingress" : "egress"; }

Error tcxAttachError(int err, TcHook hook, int ifindex) {
  // Kernels before 6.6 reject the unknown attach type with EINVAL.
  if (err == EINVAL) return Error::msg("kernel lacks tcx (BPF_TCX_*, Linux 6.6+); use --tc-mode legacy", EOPNOTSUPP);
  return Error::fromErrno(err, std::string("attach tcx ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
}

Status attachTcx(int ifindex, TcHook hook, int progFd, const std::string& pinPath) {
  int type = hook == TcHook::Ingress ? kBpfTcxIngress : kBpfTcxEgress;
  int fd = bpf_link_create(progFd, ifindex, static_cast<enum bpf_attach_type>(type), nullptr);
  if (fd < 0) return tcxAttachError(errno, hook, ifindex);
  Fd link(fd);
  ::unlink(pinPath.c_str());  // a stale pin of a link whose device is gone
  if (bpf_obj_pin(link.get(), pinPath.c_str()) != 0)
    return Error::fromErrno(errno, "pin tcx link at " + pinPath);
  spdlog::debug("attached tcx {} on ifindex {} pinned at {}", tcHookName(hook), ifindex, pinPath);
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

Status detachLegacy(int ifindex, TcHook hook, bool destroyClsact) {
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  LIBBPF_OPTS(bpf_tc_opts, o, .handle = kLegacyHandle, .priority = kLegacyPriority);
  int err = bpf_tc_detach(&h, &o);
  if (err != 0 && err != -ENOENT && err != -EINVAL && err != -ENODEV)
    return Error::fromErrno(err, std::string("detach cls_bpf ") + tcHookName(hook) + " on ifindex " + std::to_string(ifindex));
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
  LIBBPF_OPTS(bpf_tc_hook, h, .ifindex = ifindex, .attach_point = legacyPoint(hook));
  LIBBPF_OPTS(bpf_tc_opts, o, .handle = kLegacyHandle, .priority = kLegacyPriority);
  if (bpf_tc_query(&h, &o) != 0) return 0;
  return o.prog_id;
}

Status replaceLegacyProgram(int ifindex, TcHook hook, int progFd) {
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
