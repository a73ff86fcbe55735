#include "loader/programs.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdarg>
#include <mutex>

#include <bpf/btf.h>

#include "host_tc.skel.h"
#include "pod_tc.skel.h"

namespace sluice {

int possibleCpus() {
  static const int n = libbpf_num_possible_cpus();
  return n > 0 ? n : 1;
}

namespace {

int libbpfPrint(enum libbpf_print_level level, const char* fmt, va_list args) {
  char buf[1024];
  int n = vsnprintf(buf, sizeof(buf), fmt, args);
  std::string msg(buf, n > 0 ? std::min<size_t>(n, sizeof(buf) - 1) : 0);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  // One level lower than libbpf's own: its warnings are often expected
  // probes, its debug output is verifier-level detail.
  switch (level) {
    case LIBBPF_WARN: spdlog::info("libbpf: {}", msg); break;
    case LIBBPF_INFO: spdlog::debug("libbpf: {}", msg); break;
    default: spdlog::trace("libbpf: {}", msg); break;
  }
  return n;
}

// The kernel features the programs cannot load without, checked before the
// load so that the error names the feature rather than a verifier line.
Status checkKernelFeatures() {
  struct btf* vmlinux = btf__load_vmlinux_btf();
  if (!vmlinux || libbpf_get_error(vmlinux))
    return Error::msg("kernel has no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF=y is required)", ENOTSUP);
  int id = btf__find_by_name_kind(vmlinux, "bpf_cast_to_kern_ctx", BTF_KIND_FUNC);
  btf__free(vmlinux);
  if (id < 0)
    return Error::msg("kernel lacks the bpf_cast_to_kern_ctx kfunc (Linux 6.3+), needed to find the pod of an inbound packet",
                      ENOTSUP);
  return {};
}

// Points a typed wrapper at a skeleton map, checking the layouts agree.
template <typename K, typename V>
Status bindMap(const struct bpf_map* map, BpfMap<K, V>& out) {
  auto typed = BpfMap<K, V>::of(map);
  SLUICE_TRY(typed);
  out = *typed;
  return {};
}

}  // namespace

void routeLibbpfLogging() {
  static std::once_flag once;
  std::call_once(once, [] { libbpf_set_print(libbpfPrint); });
}

Result<std::unique_ptr<PodPrograms>> PodPrograms::load(const std::string& root) {
  routeLibbpfLogging();
  SLUICE_TRY(checkKernelFeatures());
  std::unique_ptr<PodPrograms> p(new PodPrograms());
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = root.c_str());
  p->skel_ = pod_tc__open_opts(&opts);
  if (!p->skel_) return Error::fromErrno(errno, "open BPF object pod_tc");
  if (int err = pod_tc__load(p->skel_); err != 0) {
    if (err == -EPERM || errno == EPERM)
      return Error::fromErrno(EPERM, "load BPF programs (needs root: CAP_BPF, CAP_NET_ADMIN)");
    return Error::fromErrno(err, "load BPF programs (run with --log-level debug for the verifier log)");
  }
  // The node programs second: their maps are the pod programs' (pinned by
  // name under the same root, so libbpf reuses them).
  p->host_ = host_tc__open_opts(&opts);
  if (!p->host_) return Error::fromErrno(errno, "open BPF object host_tc");
  if (int err = host_tc__load(p->host_); err != 0)
    return Error::fromErrno(err, "load node BPF programs (run with --log-level debug for the verifier log)");
  auto& m = p->skel_->maps;
  SLUICE_TRY(bindMap(m.settings, p->settings));
  SLUICE_TRY(bindMap(m.pod_config, p->podConfig));
  SLUICE_TRY(bindMap(m.pod_stats, p->podStats));
  SLUICE_TRY(bindMap(m.dns_nat, p->dnsNat));
  SLUICE_TRY(bindMap(m.pods, p->pods));
  SLUICE_TRY(bindMap(m.pod_addrs, p->podAddrs));
  SLUICE_TRY(bindMap(m.snat_fwd, p->snatFwd));
  SLUICE_TRY(bindMap(m.snat_rev, p->snatRev));
  SLUICE_TRY(bindMap(m.snat_closed, p->snatClosed));
  return p;
}

PodPrograms::~PodPrograms() {
  if (host_) host_tc__destroy(host_);
  if (skel_) pod_tc__destroy(skel_);
}

int PodPrograms::egressFd() const { return bpf_program__fd(skel_->progs.pod_egress); }
int PodPrograms::ingressFd() const { return bpf_program__fd(skel_->progs.pod_ingress); }
int PodPrograms::loEgressFd() const { return bpf_program__fd(skel_->progs.pod_lo_egress); }
int PodPrograms::hostEgressFd() const { return bpf_program__fd(host_->progs.host_egress); }
int PodPrograms::hostIngressFd() const { return bpf_program__fd(host_->progs.host_ingress); }

}  // namespace sluice
