#include "loader/programs.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdarg>
#include <mutex>

#include "host_tc.skel.h"
#include "loader/migrate.h"
#include "pod_tc.skel.h"
#include "pod_sock.skel.h"
#include "pod_sock_compat.skel.h"
#include "pod_tc_compat.skel.h"

namespace sluice {

int possibleCpus() {
  static const int n = libbpf_num_possible_cpus();
  return n > 0 ? n : 1;
}

namespace {

int libbpfPrint(enum libbpf_print_level level, const char* fmt, va_list args) {
  // Whole: a verifier log is one message of many kilobytes, and its end is
  // the part that says why.
  va_list again;
  va_copy(again, args);
  int n = vsnprintf(nullptr, 0, fmt, args);
  std::string msg(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) vsnprintf(msg.data(), msg.size() + 1, fmt, again);
  va_end(again);
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

template <typename Skel>
Status PodPrograms::loadPod(Skel* skel, int (*loadFn)(Skel*)) {
  if (int err = loadFn(skel); err != 0) {
    if (err == -EPERM || errno == EPERM)
      return Error::fromErrno(EPERM, "load BPF programs (needs root: CAP_BPF, CAP_NET_ADMIN)");
    return Error::fromErrno(err, "load BPF programs (run with --log-level debug for the verifier log)");
  }
  egressFd_ = bpf_program__fd(skel->progs.pod_egress);
  ingressFd_ = bpf_program__fd(skel->progs.pod_ingress);
  loEgressFd_ = bpf_program__fd(skel->progs.pod_lo_egress);
  auto& m = skel->maps;
  SLUICE_TRY(bindMap(m.settings, settings));
  SLUICE_TRY(bindMap(m.pod_config, podConfig));
  SLUICE_TRY(bindMap(m.pod_stats, podStats));
  SLUICE_TRY(bindMap(m.dns_nat, dnsNat));
  SLUICE_TRY(bindMap(m.pods, pods));
  SLUICE_TRY(bindMap(m.pod_addrs, podAddrs));
  SLUICE_TRY(bindMap(m.snat_rev, snatRev));
  SLUICE_TRY(bindMap(m.snat_closed, snatClosed));
  SLUICE_TRY(bindMap(m.pod_listeners, podListeners));
  SLUICE_TRY(bindMap(m.layouts, layouts));
  SLUICE_TRY(bindMap(m.proxy_identity, proxyIdentity));
  SLUICE_TRY(bindMap(m.proxy_cgroups, proxyCgroups));
  return {};
}

template <typename Skel>
Status PodPrograms::loadSocket(Skel* skel, int (*loadFn)(Skel*)) {
  if (int err = loadFn(skel); err != 0)
    return Error::fromErrno(err, "the kernel refused the socket programs (--log-level debug shows the verifier log)");
  auto& pr = skel->progs;
  socketProgs_ = SocketPrograms{
      bpf_program__fd(pr.pod_connect4),     bpf_program__fd(pr.pod_connect6),    bpf_program__fd(pr.pod_sendmsg4),
      bpf_program__fd(pr.pod_sendmsg6),     bpf_program__fd(pr.pod_recvmsg4),    bpf_program__fd(pr.pod_recvmsg6),
      bpf_program__fd(pr.pod_getpeername4), bpf_program__fd(pr.pod_getpeername6), bpf_program__fd(pr.pod_getsockopt),
      bpf_program__fd(pr.pod_sockops),      bpf_program__fd(pr.pod_skb_ingress), bpf_program__fd(pr.pod_skb_egress),
      bpf_program__fd(pr.pod_sk_lookup),    bpf_program__fd(pr.pod_sock_create),
  };
  auto& m = skel->maps;
  SLUICE_TRY(bindMap(m.pod_sock, podSock));
  SLUICE_TRY(bindMap(m.sock_listeners, sockListeners));
  SLUICE_TRY(bindMap(m.orig_dst, origDst));
  SLUICE_TRY(bindMap(m.sk_lookup_pod, skLookupPod));
  SLUICE_TRY(bindMap(m.sk_lookup_prog, skLookupProg));
  return {};
}

Result<std::unique_ptr<PodPrograms>> PodPrograms::load(const std::string& root, uint32_t snatEntries) {
  routeLibbpfLogging();
  // Checked before the load so that the error names the feature rather
  // than a verifier line.
  auto features = kernelFeatures();
  SLUICE_TRY(features);
  SLUICE_TRY(checkMinimumFeatures(*features));
  std::unique_ptr<PodPrograms> p(new PodPrograms());
  p->cookieMethod_ = features->cookieMethod;
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = root.c_str());
  // Two objects from one source each (bpf/pod_tc_compat.bpf.c,
  // bpf/pod_sock_compat.bpf.c): only the ones this kernel can load are
  // opened, so the fast path stays as it is.
  const bool kfunc = p->cookieMethod_ == PodCookieMethod::KernCtx;
  std::vector<const struct bpf_object*> objs;
  if (kfunc) {
    p->skel_ = pod_tc__open_opts(&opts);
    if (!p->skel_) return Error::fromErrno(errno, "open BPF object pod_tc");
    bpf_map__set_max_entries(p->skel_->maps.snat_rev, snatEntries);
    p->sock_ = pod_sock__open_opts(&opts);
    if (!p->sock_) return Error::fromErrno(errno, "open BPF object pod_sock");
    objs = {p->skel_->obj, p->sock_->obj};
  } else {
    p->compat_ = pod_tc_compat__open_opts(&opts);
    if (!p->compat_) return Error::fromErrno(errno, "open BPF object pod_tc_compat");
    bpf_map__set_max_entries(p->compat_->maps.snat_rev, snatEntries);
    p->sockCompat_ = pod_sock_compat__open_opts(&opts);
    if (!p->sockCompat_) return Error::fromErrno(errno, "open BPF object pod_sock_compat");
    objs = {p->compat_->obj, p->sockCompat_->obj};
  }
  // Before libbpf reuses the pins: pins of other layouts would make it
  // refuse them (or worse, a same-sized other layout would be misread).
  auto migration = Migration::plan(root, objs);
  SLUICE_TRY(migration);
  SLUICE_TRY(migration->prepare());
  if (kfunc)
    SLUICE_TRY(p->loadPod(p->skel_, pod_tc__load));
  else
    SLUICE_TRY(p->loadPod(p->compat_, pod_tc_compat__load));
  // The socket programs second, reusing the pod programs' maps by pin.
  Status sock = kfunc ? p->loadSocket(p->sock_, pod_sock__load) : p->loadSocket(p->sockCompat_, pod_sock_compat__load);
  if (!sock.ok()) {
    p->socketError_ = sock.error().message;
    spdlog::info("socket mode unavailable: {}", p->socketError_);
    if (p->sock_) pod_sock__destroy(p->sock_);
    if (p->sockCompat_) pod_sock_compat__destroy(p->sockCompat_);
    p->sock_ = nullptr;
    p->sockCompat_ = nullptr;
    p->socketProgs_ = {};
  }
  SLUICE_TRY(migration->complete(*p));
  // The node programs last: their maps are the pod programs' (pinned by
  // name under the same root, so libbpf reuses them).
  p->host_ = host_tc__open_opts(&opts);
  if (!p->host_) return Error::fromErrno(errno, "open BPF object host_tc");
  bpf_map__set_max_entries(p->host_->maps.snat_rev, snatEntries);
  if (int err = host_tc__load(p->host_); err != 0)
    return Error::fromErrno(err, "load node BPF programs (run with --log-level debug for the verifier log)");
  return p;
}

PodPrograms::~PodPrograms() {
  if (host_) host_tc__destroy(host_);
  if (sock_) pod_sock__destroy(sock_);
  if (sockCompat_) pod_sock_compat__destroy(sockCompat_);
  if (skel_) pod_tc__destroy(skel_);
  if (compat_) pod_tc_compat__destroy(compat_);
}

int PodPrograms::egressFd() const { return egressFd_; }
int PodPrograms::ingressFd() const { return ingressFd_; }
int PodPrograms::loEgressFd() const { return loEgressFd_; }
int PodPrograms::hostEgressFd() const { return bpf_program__fd(host_->progs.host_egress); }
int PodPrograms::hostIngressFd() const { return bpf_program__fd(host_->progs.host_ingress); }

}  // namespace sluice
