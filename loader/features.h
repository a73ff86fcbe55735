// What the running kernel offers sluice, probed once at start-up: the
// capture mode (at the socket or at TC), the attach path (tcx or clsact),
// how the pod programs find their pod, and whether the TC mode can hand
// packets to a SO_REUSEPORT proxy. The report is plain
// data so that the decisions and messages built on it are unit-tested with
// made-up kernels.
#pragma once

#include <string>

#include "base/result.h"
#include "loader/tc.h"

namespace sluice {

/// A kernel release reduced to what the version checks compare.
struct KernelVersion {
  int major = 0;
  int minor = 0;
  int patch = 0;

  /// "6.1.0-57-amd64" -> 6.1.0, "5.15.0-91-generic" -> 5.15.0. Fails on a
  /// string that does not start with MAJOR.MINOR.
  static Result<KernelVersion> parse(const std::string& release);
  bool atLeast(int maj, int min) const { return major > maj || (major == maj && minor >= min); }
  std::string str() const;
};

/// How the pod programs learn the pod (netns cookie) of a packet.
enum class PodCookieMethod {
  /// bpf_cast_to_kern_ctx kfunc + CO-RE field reads (Linux 6.2+): no helper call.
  KernCtx,
  /// bpf_probe_read_kernel through the __sk_buff pointer (any kernel with
  /// BTF; needs CAP_PERFMON / root, for the verifier lets a context pointer
  /// be passed to the helper only when pointer leaks are allowed).
  ProbeRead,
  /// Neither works: the pod programs cannot be loaded.
  None,
};

/// "kfunc" | "probe-read" | "none".
const char* podCookieMethodName(PodCookieMethod m);
/// Inverse of podCookieMethodName for "kfunc" and "probe-read".
Result<PodCookieMethod> parsePodCookieMethod(const std::string& s);

/// One probed feature: whether the kernel has it and how that was decided
/// (which probe answered what, or which version rule applied).
struct Feature {
  bool present = false;
  std::string how;
};

/// What the kernel offers. Fill it with probeKernelFeatures(); tests build
/// their own.
struct FeatureReport {
  std::string release;          ///< uname -r
  KernelVersion version;
  Feature btf;                  ///< /sys/kernel/btf/vmlinux (CO-RE; required)
  Feature skAssign;             ///< bpf_sk_assign in sched_cls (Linux 5.7; required)
  Feature castToKernCtx;        ///< bpf_cast_to_kern_ctx kfunc in the kernel's BTF (6.2)
  Feature probeReadKernel;      ///< bpf_probe_read_kernel in sched_cls (the fallback)
  Feature tcx;                  ///< BPF_TCX_* links (6.6)
  Feature tcxLinkUpdate;        ///< bpf_link_update on a tcx link (atomic program replacement)
  Feature reuseportAssign;      ///< bpf_sk_assign of SO_REUSEPORT sockets (6.6)
  Feature cgroup2;              ///< a cgroup v2 hierarchy (the socket mode's hooks attach there)
  Feature socketHooks;          ///< the socket mode's hooks (sk_lookup with its ingress interface: 5.17)
  PodCookieMethod cookieMethod = PodCookieMethod::None;
  std::string cookieMethodHow;  ///< why that method (including an override)

  /// The attach mode `--tc-mode auto` resolves to on this kernel.
  TcMode autoTcMode() const { return tcx.present ? TcMode::Tcx : TcMode::Legacy; }
  /// Whether the kernel has what the socket mode needs.
  bool socketCapable() const { return cgroup2.present && socketHooks.present; }
  /// The capture `--capture auto` resolves to on this kernel.
  CaptureMode autoCapture() const { return socketCapable() ? CaptureMode::Socket : CaptureMode::Tc; }
};

/// Probes the running kernel: uname, BTF, helper probes (libbpf), a tcx
/// link on the loopback device of a throwaway network namespace (and a
/// bpf_link_update on it). Needs root for the BPF probes; without it those
/// features read "no" with the errno in `how`. The environment variable
/// SLUICE_POD_COOKIE=kfunc|probe-read forces the pod-cookie method (tests
/// use it to run the fallback on new kernels); an unknown value is an error.
Result<FeatureReport> probeKernelFeatures();

/// The process-wide report, probed on first use and logged once at info
/// (the chosen paths); later calls return the same report.
Result<FeatureReport> kernelFeatures();

/// Makes @p report the process-wide one when nothing has been probed yet:
/// a process reusing pinned programs takes the report their loader
/// probed (loader/program_pins.h) instead of probing again.
void seedKernelFeatures(const FeatureReport& report);

/// Picks the pod-cookie method from the probed features (and the override,
/// empty for none): kfunc when the kernel has it, else probe-read when
/// bpf_probe_read_kernel is available at TC, else None. Sets cookieMethod
/// and cookieMethodHow. An override the kernel cannot honour is an error.
Status choosePodCookieMethod(FeatureReport& r, const std::string& override);

/// Success when the pod programs can run on this kernel; otherwise the
/// error names the first missing feature, the kernel that has it, and what
/// sluice needs it for (code ENOTSUP).
Status checkMinimumFeatures(const FeatureReport& r);

/// The warning for a TC-mode `pod add` on a kernel that cannot assign
/// SO_REUSEPORT sockets; empty when it can.
std::string reuseportWarning(const FeatureReport& r);

/// Why the socket mode cannot run here (the first missing piece), "" when
/// it can; code ENOTSUP.
std::string socketUnavailableReason(const FeatureReport& r);

/// One line for the log: kernel, capture, attach path, pod-cookie method,
/// reuseport.
std::string summarizeFeatures(const FeatureReport& r);

}  // namespace sluice
