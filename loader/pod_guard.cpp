#include "loader/pod_guard.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/btf.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "pod_guard.skel.h"
#include "base/fd.h"
#include "loader/tc.h"
#include "maps/sluice_maps.h"

namespace sluice {

namespace {

constexpr const char* kDefaultLsmFile = "/sys/kernel/security/lsm";

struct GuardHook {
  const char* pin;  // under node_links/
  bpf_program* (*prog)(pod_guard*);
};

const GuardHook kHooks[] = {
    {"guard_socket_create", [](pod_guard* s) { return s->progs.guard_socket_create; }},
    {"guard_socket_bind", [](pod_guard* s) { return s->progs.guard_socket_bind; }},
};

std::string pinOf(const std::string& root, const char* name) {
  return root + "/" + SLUICE_PIN_NODE_LINKS_DIR + "/" + name;
}

Status mountSecurityfs() {
  struct stat st {};
  if (::stat(kDefaultLsmFile, &st) == 0) return {};
  if (::mount("securityfs", "/sys/kernel/security", "securityfs", 0, nullptr) != 0 && errno != EBUSY)
    return Error::fromErrno(errno, "mount securityfs at /sys/kernel/security");
  spdlog::info("mounted securityfs at /sys/kernel/security (to read the active LSMs)");
  return {};
}

// Loads the smallest BPF LSM program (return 0) at socket_create: some
// kernels list bpf among their LSMs and still refuse such programs (a
// policy of the machine's; seen as EPERM on a firecracker guest here).
std::string lsmProgramRefused() {
  struct btf* vmlinux = btf__load_vmlinux_btf();
  if (!vmlinux) return "no kernel BTF (/sys/kernel/btf/vmlinux)";
  int id = btf__find_by_name_kind(vmlinux, "bpf_lsm_socket_create", BTF_KIND_FUNC);
  btf__free(vmlinux);
  if (id < 0) return "the kernel has no BPF LSM hook socket_create (CONFIG_BPF_LSM)";
  const struct bpf_insn insns[] = {
      {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0},
      {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},
  };
  LIBBPF_OPTS(bpf_prog_load_opts, o, .expected_attach_type = BPF_LSM_MAC, .attach_btf_id = static_cast<__u32>(id));
  Fd prog(bpf_prog_load(BPF_PROG_TYPE_LSM, "sluice_lsm_probe", "Dual BSD/GPL", insns, 2, &o));
  if (!prog.valid()) return std::string("the kernel refuses BPF LSM programs (") + std::strerror(errno) + ")";
  return "";
}

// Why the guard cannot run here ("" when it can).
Result<std::string> guardUnavailable() {
  auto lsm = bpfLsmActive();
  SLUICE_TRY(lsm);
  if (!*lsm) return std::string("the kernel's active LSMs lack bpf (boot with lsm=...,bpf)");
  static const std::string refused = lsmProgramRefused();
  return refused;
}

}  // namespace

std::string podGuardUnsupported() {
  auto why = guardUnavailable();
  return why.ok() ? *why : why.error().message;
}

bool podGuardWanted() {
  const char* v = std::getenv("SLUICE_POD_GUARD");
  return !(v && std::string(v) == "off");
}

bool lsmListHasBpf(const std::string& list) {
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name == "bpf") return true;
  }
  return false;
}

Result<bool> bpfLsmActive(const std::string& lsmFile) {
  if (lsmFile == kDefaultLsmFile) SLUICE_TRY(mountSecurityfs());
  std::ifstream f(lsmFile);
  if (!f) return Error::fromErrno(errno ? errno : ENOENT, "read the active LSMs from " + lsmFile);
  std::string list((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return lsmListHasBpf(list);
}

PodGuardReport podGuardState(const std::string& root) {
  PodGuardReport r;
  r.why = podGuardUnsupported();
  if (!r.why.empty()) return r;
  for (const auto& h : kHooks) {
    Fd link(bpf_obj_get(pinOf(root, h.pin).c_str()));
    if (!link.valid()) {
      r.why = std::string("no link pinned at ") + pinOf(root, h.pin);
      return r;
    }
  }
  r.active = true;
  return r;
}

Result<PodGuardReport> ensurePodGuard(const std::string& root) {
  PodGuardReport r;
  auto why = guardUnavailable();
  SLUICE_TRY(why);
  if (!why->empty()) {
    r.why = *why;
    return r;
  }
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = root.c_str());
  std::unique_ptr<pod_guard, void (*)(pod_guard*)> skel(pod_guard__open_opts(&opts), pod_guard__destroy);
  if (!skel) return Error::fromErrno(errno, "open the pod guard's programs");
  if (int err = pod_guard__load(skel.get()); err != 0)
    return Error::fromErrno(-err, "the kernel refused the pod guard's programs (--log-level debug shows why)");
  const std::string dir = root + "/" + SLUICE_PIN_NODE_LINKS_DIR;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Error::fromErrno(errno, "mkdir " + dir);
  for (const auto& h : kHooks) {
    const std::string pin = pinOf(root, h.pin);
    bpf_program* prog = h.prog(skel.get());
    Fd old(bpf_obj_get(pin.c_str()));
    if (old.valid() && linkedProgramTag(old.get()) == programTag(bpf_program__fd(prog))) continue;
    bpf_link* link = bpf_program__attach_lsm(prog);
    if (!link) return Error::fromErrno(errno, std::string("attach the pod guard's ") + h.pin);
    const std::string next = pin + "_next";  // bpffs refuses dots in names
    ::unlink(next.c_str());
    int pinErr = bpf_link__pin(link, next.c_str());
    if (pinErr == 0 && ::rename(next.c_str(), pin.c_str()) != 0) pinErr = -errno;
    if (pinErr != 0) {
      bpf_link__destroy(link);
      ::unlink(next.c_str());
      return Error::fromErrno(-pinErr, "pin the pod guard's link at " + pin);
    }
    bpf_link__disconnect(link);  // the pin keeps it attached
    bpf_link__destroy(link);
    if (old.valid()) (void)bpf_link_detach(old.get());  // the previous build's: the new one is in place
    r.attached++;
  }
  r.active = true;
  if (r.attached) spdlog::info("pod guard: {} BPF LSM link(s) attached, pinned under {}", r.attached, dir);
  return r;
}

}  // namespace sluice
