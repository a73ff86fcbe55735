#include "loader/programs.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdarg>
#include <mutex>
#include <type_traits>

#include "host_tc.skel.h"
#include "loader/migrate.h"
#include "pod_sock.skel.h"
#include "pod_sock_compat.skel.h"
#include "pod_tc.skel.h"
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

template <typename Bind>
Status PodPrograms::bindAll(Bind&& bind) {
  SLUICE_TRY(bind(settings, SLUICE_PIN_SETTINGS));
  SLUICE_TRY(bind(podConfig, SLUICE_PIN_POD_CONFIG));
  SLUICE_TRY(bind(podStats, SLUICE_PIN_POD_STATS));
  SLUICE_TRY(bind(dnsNat, SLUICE_PIN_DNS_NAT));
  SLUICE_TRY(bind(pods, SLUICE_PIN_PODS));
  SLUICE_TRY(bind(podAddrs, SLUICE_PIN_POD_ADDRS));
  SLUICE_TRY(bind(snatRev, SLUICE_PIN_SNAT_REV));
  SLUICE_TRY(bind(snatClosed, SLUICE_PIN_SNAT_CLOSED));
  SLUICE_TRY(bind(podListeners, SLUICE_PIN_POD_LISTENERS));
  SLUICE_TRY(bind(layouts, SLUICE_PIN_LAYOUTS));
  SLUICE_TRY(bind(proxyIdentity, SLUICE_PIN_PROXY_IDENTITY));
  return bind(proxyCgroups, SLUICE_PIN_PROXY_CGROUPS);
}

template <typename Bind>
Status PodPrograms::bindSocketMaps(Bind&& bind) {
  SLUICE_TRY(bind(podSock, SLUICE_PIN_POD_SOCK));
  SLUICE_TRY(bind(sockListeners, SLUICE_PIN_SOCK_LISTENERS));
  SLUICE_TRY(bind(origDst, SLUICE_PIN_ORIG_DST));
  SLUICE_TRY(bind(skLookupPod, SLUICE_PIN_SK_LOOKUP_POD));
  return bind(skLookupProg, SLUICE_PIN_SK_LOOKUP_PROG);
}

namespace {
// A loaded object's map by name; an object without it is not this build's.
Result<const struct bpf_map*> mapByName(const struct bpf_object* obj, const char* name) {
  const struct bpf_map* m = bpf_object__find_map_by_name(obj, name);
  if (!m) return Error::msg(std::string("BPF object has no map '") + name + "'", EINVAL);
  return m;
}

// bind() for the maps of a loaded object, by name.
auto bindFromObject(const struct bpf_object* obj) {
  return [obj](auto& out, const char* name) -> Status {
    auto m = mapByName(obj, name);
    SLUICE_TRY(m);
    return bindMap(*m, out);
  };
}
}  // namespace

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
  return bindAll(bindFromObject(skel->obj));
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
  SLUICE_TRY(bindSocketMaps(bindFromObject(skel->obj)));
  socketLoaded_ = true;
  return {};
}

namespace {
// SocketPrograms' members in PinnedProg order (from kFirstSocketProg).
constexpr int SocketPrograms::*kSocketProgOrder[] = {
    &SocketPrograms::connect4,     &SocketPrograms::connect6,     &SocketPrograms::sendmsg4,
    &SocketPrograms::sendmsg6,     &SocketPrograms::recvmsg4,     &SocketPrograms::recvmsg6,
    &SocketPrograms::getpeername4, &SocketPrograms::getpeername6, &SocketPrograms::getsockopt,
    &SocketPrograms::sockops,      &SocketPrograms::skbIngress,   &SocketPrograms::skbEgress,
    &SocketPrograms::skLookup,     &SocketPrograms::sockCreate,
};
static_assert(std::size(kSocketProgOrder) == kPinnedProgs - kFirstSocketProg);
}  // namespace

std::string buildIdentity(PodCookieMethod method) {
  // Hashed once per method and process (the objects are this binary's).
  static std::once_flag once[2];
  static std::string ids[2];
  int i = method == PodCookieMethod::KernCtx ? 0 : 1;
  std::call_once(once[i], [&] {
    size_t podSize = 0, sockSize = 0, hostSize = 0;
    const void* pod = i == 0 ? pod_tc__elf_bytes(&podSize) : pod_tc_compat__elf_bytes(&podSize);
    const void* sock = i == 0 ? pod_sock__elf_bytes(&sockSize) : pod_sock_compat__elf_bytes(&sockSize);
    const void* host = host_tc__elf_bytes(&hostSize);
    ids[i] = identityOf({{pod, podSize}, {sock, sockSize}, {host, hostSize}}, method);
  });
  return ids[i];
}

Status PodPrograms::usePins(ProgramPins pins) {
  const auto& names = boundMapNames();
  auto fromPins = [&](auto& out, const char* name) -> Status {
    for (size_t i = 0; i < names.size(); i++)
      if (std::string(names[i]) == name) {
        auto typed = std::remove_reference_t<decltype(out)>::ofFd(pins.maps[i].get(), name);
        SLUICE_TRY(typed);
        out = *typed;
        return {};
      }
    return Error::msg(std::string("no pinned map ") + name, EINVAL);
  };
  SLUICE_TRY(bindAll(fromPins));
  socketError_ = pins.socketError;
  if (socketError_.empty()) {
    SLUICE_TRY(bindSocketMaps(fromPins));
    for (int i = kFirstSocketProg; i < kPinnedProgs; i++)
      socketProgs_.*kSocketProgOrder[i - kFirstSocketProg] = pins.progs[i].get();
    socketLoaded_ = true;
  }
  auto prog = [&pins](PinnedProg p) { return pins.progs[static_cast<int>(p)].get(); };
  egressFd_ = prog(PinnedProg::PodEgress);
  ingressFd_ = prog(PinnedProg::PodIngress);
  loEgressFd_ = prog(PinnedProg::PodLoEgress);
  hostEgressFd_ = prog(PinnedProg::HostEgress);
  hostIngressFd_ = prog(PinnedProg::HostIngress);
  cookieMethod_ = pins.features.cookieMethod;
  identity_ = pins.identity;
  reused_ = true;
  // What the loader probed stands for this process's probes (the
  // reuseport warning of `pod add` reads it).
  seedKernelFeatures(pins.features);
  pins_ = std::move(pins);
  return {};
}

Result<std::unique_ptr<PodPrograms>> PodPrograms::load(const std::string& root, uint32_t snatEntries, Sharing sharing) {
  routeLibbpfLogging();
  if (sharing == Sharing::Shared) {
    // The fast path: this build's programs, loaded and verified once per
    // root, taken from their pins with the maps they were loaded against.
    auto pins = openProgramPins(root, snatEntries);
    SLUICE_TRY(pins);
    // The layouts too: pins the programs were loaded against, but with a
    // layout recorded since by another build, go through Migration::plan.
    if (*pins) {
      auto same = pinnedLayoutsAreThisBuilds(root);
      SLUICE_TRY(same);
      if (!*same) {
        spdlog::info("layouts pinned under {} are not this build's; loading", root);
        pins->reset();
      }
    }
    if (*pins) {
      std::unique_ptr<PodPrograms> p(new PodPrograms());
      SLUICE_TRY(p->usePins(std::move(**pins)));
      spdlog::debug("reusing programs {} pinned under {}", p->identity_, root);
      return p;
    }
  }
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
    p->socketLoaded_ = false;
  }
  SLUICE_TRY(migration->complete({p->pods, p->podAddrs, p->snatRev, p->layouts}));
  // The node programs last: their maps are the pod programs' (pinned by
  // name under the same root, so libbpf reuses them).
  p->host_ = host_tc__open_opts(&opts);
  if (!p->host_) return Error::fromErrno(errno, "open BPF object host_tc");
  bpf_map__set_max_entries(p->host_->maps.snat_rev, snatEntries);
  if (int err = host_tc__load(p->host_); err != 0)
    return Error::fromErrno(err, "load node BPF programs (run with --log-level debug for the verifier log)");
  p->hostEgressFd_ = bpf_program__fd(p->host_->progs.host_egress);
  p->hostIngressFd_ = bpf_program__fd(p->host_->progs.host_ingress);
  if (sharing == Sharing::Shared) {
    int progs[kPinnedProgs] = {p->egressFd_, p->ingressFd_, p->loEgressFd_, p->hostEgressFd_, p->hostIngressFd_};
    for (int i = kFirstSocketProg; i < kPinnedProgs; i++)
      progs[i] = p->socketLoaded_ ? p->socketProgs_.*kSocketProgOrder[i - kFirstSocketProg] : -1;
    std::vector<int> maps;
    const auto& names = boundMapNames();
    for (size_t i = 0; i < names.size(); i++) {
      const bool socketMap = i >= firstSocketMap();
      if (socketMap && !p->socketLoaded_) {
        maps.push_back(-1);
        continue;
      }
      const struct bpf_object* obj = socketMap ? (p->sock_ ? p->sock_->obj : p->sockCompat_->obj)
                                               : (p->skel_ ? p->skel_->obj : p->compat_->obj);
      auto m = mapByName(obj, names[i]);
      SLUICE_TRY(m);
      maps.push_back(bpf_map__fd(*m));
    }
    SLUICE_TRY(pinPrograms(root, *features, progs, maps, p->socketError_));
    p->identity_ = buildIdentity(p->cookieMethod_);
  }
  return p;
}

PodPrograms::~PodPrograms() {
  stubs_.reset();  // its thread stopped first
  if (host_) host_tc__destroy(host_);
  if (sock_) pod_sock__destroy(sock_);
  if (sockCompat_) pod_sock_compat__destroy(sockCompat_);
  if (skel_) pod_tc__destroy(skel_);
  if (compat_) pod_tc_compat__destroy(compat_);
}

Result<Fd> PodPrograms::skLookupStub(uint64_t netnsCookie) const {
  if (!socketLoaded_) return Error::msg("socket mode unavailable: " + socketError_, ENOTSUP);
  if (stubs_) return stubs_->take(netnsCookie);
  auto stub = loadSkLookupStub(skLookupPod.fd(), skLookupProg.fd());
  SLUICE_TRY(stub);
  SLUICE_TRY(nameSkLookupStub(*stub, netnsCookie));
  return std::move(stub->prog);
}

Status PodPrograms::keepSkLookupStubs(size_t depth) {
  if (!socketLoaded_) return Error::msg("socket mode unavailable: " + socketError_, ENOTSUP);
  if (stubs_ || depth == 0) return {};
  auto pool = SkLookupStubPool::start(skLookupPod.fd(), skLookupProg.fd(), depth);
  SLUICE_TRY(pool);
  stubs_ = std::move(*pool);
  return {};
}

int PodPrograms::egressFd() const { return egressFd_; }
int PodPrograms::ingressFd() const { return ingressFd_; }
int PodPrograms::loEgressFd() const { return loEgressFd_; }
int PodPrograms::hostEgressFd() const { return hostEgressFd_; }
int PodPrograms::hostIngressFd() const { return hostIngressFd_; }

}  // namespace sluice
