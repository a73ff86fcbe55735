#include "loader/features.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <mutex>
#include <thread>

#include "loader/cgroup.h"
#include "base/fd.h"

namespace sluice {

namespace {

// Debian bookworm's uapi headers predate tcx; the kernel's numbers are ABI
// (the same constants as in tc.cpp).
constexpr int kBpfTcxIngress = 46;

Feature yes(std::string how) { return Feature{true, std::move(how)}; }
Feature no(std::string how) { return Feature{false, std::move(how)}; }

// libbpf's helper probe loads a tiny program of the given type calling the
// helper and reads the verifier's verdict: 1 available, 0 not, <0 error.
Feature probeHelper(enum bpf_func_id id, const char* name) {
  int r = libbpf_probe_bpf_helper(BPF_PROG_TYPE_SCHED_CLS, id, nullptr);
  if (r == 1) return yes(std::string("helper probe: sched_cls may call ") + name);
  if (r == 0) return no(std::string("helper probe: the verifier refuses ") + name + " in sched_cls");
  return no(std::string("helper probe failed: ") + std::strerror(-r));
}

// A sched_cls program that returns TCX_NEXT (-1): attached anywhere it
// changes nothing.
Result<Fd> loadNoopTc() {
  const struct bpf_insn insns[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .src_reg = 0, .off = 0, .imm = -1},
      {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0},
  };
  int fd = bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, "sluice_probe", "Dual BSD/GPL", insns, 2, nullptr);
  if (fd < 0) return Error::fromErrno(errno, "load a probe program");
  return Fd(fd);
}

// tcx and bpf_link_update, probed for real: a tcx link on the loopback
// device of a network namespace that exists only for the probe (a fresh
// namespace's lo is ifindex 1), made on a thread of its own so the process
// never changes namespace. Kernels before 6.6 answer EINVAL to the unknown
// attach type.
void probeTcx(FeatureReport& r) {
  std::thread t([&r] {
    auto prog = loadNoopTc();
    if (!prog.ok()) {
      r.tcx = no("not probed: " + prog.error().message);
      r.tcxLinkUpdate = no("not probed: no tcx probe");
      return;
    }
    if (::unshare(CLONE_NEWNET) != 0) {
      r.tcx = no(std::string("not probed: unshare(CLONE_NEWNET): ") + std::strerror(errno));
      r.tcxLinkUpdate = no("not probed: no tcx probe");
      return;
    }
    int fd = bpf_link_create(prog->get(), 1, static_cast<enum bpf_attach_type>(kBpfTcxIngress), nullptr);
    if (fd < 0) {
      int err = errno;
      r.tcx = no(err == EINVAL ? std::string("link probe: BPF_LINK_CREATE refuses attach type BPF_TCX_INGRESS (EINVAL)")
                               : std::string("link probe failed: ") + std::strerror(err));
      r.tcxLinkUpdate = no("needs tcx");
      return;
    }
    Fd link(fd);
    r.tcx = yes("link probe: tcx link attached in a throwaway netns");
    auto other = loadNoopTc();
    if (!other.ok()) {
      r.tcxLinkUpdate = no("not probed: " + other.error().message);
      return;
    }
    if (bpf_link_update(link.get(), other->get(), nullptr) == 0)
      r.tcxLinkUpdate = yes("link probe: bpf_link_update replaced the program of that link");
    else
      r.tcxLinkUpdate = no(std::string("link probe: bpf_link_update: ") + std::strerror(errno));
  });
  t.join();
}

// Loads a two-instruction program (r0 = 1; exit), or with @p ctxRead a
// 4-byte read of the context at that offset first: the verifier refuses a
// context field or an attach type the kernel does not have.
int probeProgram(enum bpf_prog_type type, enum bpf_attach_type attach, int ctxRead) {
  struct bpf_insn insns[3];
  int n = 0;
  if (ctxRead >= 0)
    insns[n++] = {.code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = BPF_REG_2, .src_reg = BPF_REG_1,
                  .off = static_cast<__s16>(ctxRead), .imm = 0};
  insns[n++] = {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .src_reg = 0, .off = 0, .imm = 1};
  insns[n++] = {.code = BPF_JMP | BPF_EXIT, .dst_reg = 0, .src_reg = 0, .off = 0, .imm = 0};
  LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = attach);
  int fd = bpf_prog_load(type, "sluice_probe", "Dual BSD/GPL", insns, n, &opts);
  if (fd < 0) return -errno;
  ::close(fd);
  return 0;
}

// The socket mode's newest needs, probed for real: sk_lookup programs
// reading the packet's interface (5.17), sock_ops programs knowing their
// netns (5.15), getpeername hooks (5.8), getsockopt hooks (5.3), socket
// storage in sock_addr programs. The rest is older.
Feature probeSocketHooks() {
  if (probeProgram(BPF_PROG_TYPE_SK_LOOKUP, BPF_SK_LOOKUP, offsetof(struct bpf_sk_lookup, ingress_ifindex)) != 0)
    return no("program probe: sk_lookup programs cannot read ingress_ifindex (Linux 5.17+)");
  if (libbpf_probe_bpf_helper(BPF_PROG_TYPE_SOCK_OPS, BPF_FUNC_get_netns_cookie, nullptr) != 1)
    return no("helper probe: sock_ops programs cannot call bpf_get_netns_cookie (Linux 5.15+)");
  if (probeProgram(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, BPF_CGROUP_INET4_GETPEERNAME, -1) != 0)
    return no("program probe: no getpeername hooks (Linux 5.8+)");
  if (probeProgram(BPF_PROG_TYPE_CGROUP_SOCKOPT, BPF_CGROUP_GETSOCKOPT, -1) != 0)
    return no("program probe: no getsockopt hooks (Linux 5.3+)");
  if (libbpf_probe_bpf_helper(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, BPF_FUNC_sk_storage_get, nullptr) != 1)
    return no("helper probe: sock_addr programs cannot use socket storage");
  return yes("program and helper probes: sk_lookup with ingress_ifindex, sock_ops netns cookie, getpeername and "
             "getsockopt hooks, socket storage in sock_addr programs");
}

}  // namespace

std::string socketUnavailableReason(const FeatureReport& r) {
  if (!r.cgroup2.present) return "no cgroup v2 hierarchy is mounted (the socket hooks attach to one): " + r.cgroup2.how;
  if (!r.socketHooks.present) return "kernel " + r.release + " lacks the socket hooks: " + r.socketHooks.how;
  return "";
}

Result<KernelVersion> KernelVersion::parse(const std::string& release) {
  KernelVersion v;
  int n = 0;
  if (std::sscanf(release.c_str(), "%d.%d%n", &v.major, &v.minor, &n) != 2 || v.major < 0 || v.minor < 0)
    return Error::msg("cannot read the kernel version from '" + release + "' (expected MAJOR.MINOR...)", EINVAL);
  if (release[n] == '.') std::sscanf(release.c_str() + n + 1, "%d", &v.patch);
  return v;
}

std::string KernelVersion::str() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

const char* podCookieMethodName(PodCookieMethod m) {
  switch (m) {
    case PodCookieMethod::KernCtx: return "kfunc";
    case PodCookieMethod::ProbeRead: return "probe-read";
    case PodCookieMethod::None: return "none";
  }
  return "?";
}

Result<PodCookieMethod> parsePodCookieMethod(const std::string& s) {
  if (s == "kfunc") return PodCookieMethod::KernCtx;
  if (s == "probe-read") return PodCookieMethod::ProbeRead;
  return Error::msg("invalid pod-cookie method '" + s + "' (expected kfunc or probe-read)", EINVAL);
}

Status choosePodCookieMethod(FeatureReport& r, const std::string& override) {
  if (!override.empty()) {
    auto m = parsePodCookieMethod(override);
    if (!m.ok()) return Error::msg("SLUICE_POD_COOKIE: " + m.error().message, EINVAL);
    const Feature& need = *m == PodCookieMethod::KernCtx ? r.castToKernCtx : r.probeReadKernel;
    if (!need.present)
      return Error::msg(std::string("SLUICE_POD_COOKIE=") + override + ": the kernel cannot do it (" + need.how + ")",
                        ENOTSUP);
    r.cookieMethod = *m;
    r.cookieMethodHow = "forced by SLUICE_POD_COOKIE";
    return {};
  }
  if (r.castToKernCtx.present) {
    r.cookieMethod = PodCookieMethod::KernCtx;
    r.cookieMethodHow = "bpf_cast_to_kern_ctx: the device's netns read without a helper call";
  } else if (r.probeReadKernel.present) {
    r.cookieMethod = PodCookieMethod::ProbeRead;
    r.cookieMethodHow = "no bpf_cast_to_kern_ctx: bpf_probe_read_kernel through the __sk_buff pointer";
  } else {
    r.cookieMethod = PodCookieMethod::None;
    r.cookieMethodHow = "neither bpf_cast_to_kern_ctx nor bpf_probe_read_kernel";
  }
  return {};
}

Status checkMinimumFeatures(const FeatureReport& r) {
  auto lacks = [&r](const std::string& what) {
    return Error::msg("kernel " + r.release + " lacks " + what, ENOTSUP);
  };
  // Not probed one by one: both are plain version facts.
  if (!r.version.atLeast(5, 14))
    return lacks(
        "SO_NETNS_COOKIE and the mark kept across bpf_redirect (Linux 5.14+), needed to identify the pod and to carry "
        "the egress decision to ingress");
  if (!r.btf.present)
    return lacks("BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF=y), needed to relocate the programs to its structs");
  if (!r.skAssign.present)
    return lacks("bpf_sk_assign at TC (Linux 5.7+), needed to hand packets to the proxy's sockets");
  if (r.cookieMethod == PodCookieMethod::None)
    return lacks(
        "both bpf_cast_to_kern_ctx (Linux 6.2+) and bpf_probe_read_kernel at TC (needs root / CAP_PERFMON), one of which "
        "is needed to find the pod of a packet");
  return {};
}

std::string reuseportWarning(const FeatureReport& r) {
  if (r.reuseportAssign.present) return {};
  return "kernel " + r.release +
         " cannot hand packets to SO_REUSEPORT sockets (Linux 6.6+): a proxy whose listeners use SO_REUSEPORT "
         "(ztunnel's default) will not receive redirected traffic, and captured connections will be dropped";
}

std::string summarizeFeatures(const FeatureReport& r) {
  return "kernel " + r.release + ": capture " + (r.socketCapable() ? "at the socket" : "at TC (no socket hooks)") +
         "; attach " + (r.tcx.present ? "tcx links" : "clsact + cls_bpf (no tcx)") +
         "; pod cookie via " + podCookieMethodName(r.cookieMethod) + "; SO_REUSEPORT proxies " +
         (r.reuseportAssign.present ? "supported"
          : r.socketCapable()       ? "supported at the socket, NOT at TC (Linux 6.6+)"
                                    : "NOT supported (Linux 6.6+)");
}

Result<FeatureReport> probeKernelFeatures() {
  FeatureReport r;
  struct utsname u {};
  if (::uname(&u) != 0) return Error::fromErrno(errno, "uname");
  r.release = u.release;
  auto v = KernelVersion::parse(r.release);
  SLUICE_TRY(v);
  r.version = *v;

  struct btf* vmlinux = btf__load_vmlinux_btf();
  if (!vmlinux || libbpf_get_error(vmlinux)) {
    r.btf = no("/sys/kernel/btf/vmlinux missing or unreadable");
    r.castToKernCtx = no("needs BTF");
  } else {
    r.btf = yes("/sys/kernel/btf/vmlinux");
    // kfuncs are found by name in the kernel's BTF, as libbpf resolves them.
    if (btf__find_by_name_kind(vmlinux, "bpf_cast_to_kern_ctx", BTF_KIND_FUNC) >= 0)
      r.castToKernCtx = yes("kfunc in the kernel's BTF");
    else
      r.castToKernCtx = no("no such kfunc in the kernel's BTF (Linux 6.2+)");
    btf__free(vmlinux);
  }
  r.skAssign = probeHelper(BPF_FUNC_sk_assign, "bpf_sk_assign");
  r.probeReadKernel = probeHelper(BPF_FUNC_probe_read_kernel, "bpf_probe_read_kernel");
  probeTcx(r);
  // bpf_sk_assign answers -ESOCKTNOSUPPORT for a reuseport socket before
  // 6.6. A real probe would need a packet at TC ingress of a device and a
  // reuseport listener in the same netns, so the version decides (a vendor
  // backport reads as "no").
  r.reuseportAssign = r.version.atLeast(6, 6) ? yes("kernel 6.6 or later")
                                                : no("kernel before 6.6: bpf_sk_assign answers -ESOCKTNOSUPPORT");
  auto cg = cgroup2Mount();
  r.cgroup2 = cg.ok() ? yes("cgroup2 mounted at " + *cg) : no(cg.error().message);
  r.socketHooks = probeSocketHooks();
  const char* forced = std::getenv("SLUICE_POD_COOKIE");
  SLUICE_TRY(choosePodCookieMethod(r, forced ? forced : ""));
  return r;
}

namespace {
std::once_flag gFeaturesOnce;
std::optional<Result<FeatureReport>> gFeatures;
}  // namespace

Result<FeatureReport> kernelFeatures() {
  std::call_once(gFeaturesOnce, [] {
    gFeatures.emplace(probeKernelFeatures());
    if (gFeatures->ok()) spdlog::info("{}", summarizeFeatures(gFeatures->value()));
  });
  return *gFeatures;
}

void seedKernelFeatures(const FeatureReport& report) {
  std::call_once(gFeaturesOnce, [&report] {
    gFeatures.emplace(report);
    spdlog::debug("{} (as pinned)", summarizeFeatures(report));
  });
}

}  // namespace sluice
