// The decisions and messages built on the kernel feature report, with
// made-up kernels (no privileges, no probing): version parsing, the
// pod-cookie method, the minimum-kernel errors, the reuseport warning and
// `sluicectl status`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loader/features.h"
#include "userspace/sluicectl/cli.h"

namespace sluice {
namespace {

Feature on(const char* how = "probe said yes") { return Feature{true, how}; }
Feature off(const char* how = "probe said no") { return Feature{false, how}; }

// What probeKernelFeatures() reports on Debian 12's kernel.
FeatureReport linux61() {
  FeatureReport r;
  r.release = "6.1.0-57-amd64";
  r.version = *KernelVersion::parse(r.release);
  r.btf = on();
  r.skAssign = on();
  r.castToKernCtx = off("no such kfunc in the kernel's BTF (Linux 6.2+)");
  r.probeReadKernel = on();
  r.tcx = off("link probe: BPF_LINK_CREATE refuses attach type BPF_TCX_INGRESS (EINVAL)");
  r.tcxLinkUpdate = off("needs tcx");
  r.reuseportAssign = off("kernel before 6.6: bpf_sk_assign answers -ESOCKTNOSUPPORT");
  EXPECT_TRUE(choosePodCookieMethod(r, "").ok());
  return r;
}

FeatureReport linux618() {
  FeatureReport r = linux61();
  r.release = "6.18.44-fc-v1045";
  r.version = *KernelVersion::parse(r.release);
  r.castToKernCtx = on("kfunc in the kernel's BTF");
  r.tcx = on();
  r.tcxLinkUpdate = on();
  r.reuseportAssign = on("kernel 6.6 or later");
  EXPECT_TRUE(choosePodCookieMethod(r, "").ok());
  return r;
}

TEST(KernelVersion, ParsesReleaseStrings) {
  auto v = KernelVersion::parse("6.1.0-57-amd64");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->str(), "6.1.0");
  v = KernelVersion::parse("5.15.0-91-generic");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->str(), "5.15.0");
  EXPECT_TRUE(v->atLeast(5, 7));
  EXPECT_FALSE(v->atLeast(6, 6));
  v = KernelVersion::parse("6.6-rc1");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->str(), "6.6.0");
  EXPECT_TRUE(v->atLeast(6, 6));
  EXPECT_TRUE(KernelVersion::parse("7.0.1")->atLeast(6, 6));
  EXPECT_EQ(KernelVersion::parse("linux").error().message,
            "cannot read the kernel version from 'linux' (expected MAJOR.MINOR...)");
}

TEST(PodCookieMethod, KfuncWhenPresentElseProbeRead) {
  EXPECT_EQ(linux618().cookieMethod, PodCookieMethod::KernCtx);
  FeatureReport old = linux61();
  EXPECT_EQ(old.cookieMethod, PodCookieMethod::ProbeRead);
  EXPECT_EQ(old.cookieMethodHow, "no bpf_cast_to_kern_ctx: bpf_probe_read_kernel through the __sk_buff pointer");
  old.probeReadKernel = off();
  ASSERT_TRUE(choosePodCookieMethod(old, "").ok());
  EXPECT_EQ(old.cookieMethod, PodCookieMethod::None);
}

TEST(PodCookieMethod, Override) {
  FeatureReport r = linux618();
  ASSERT_TRUE(choosePodCookieMethod(r, "probe-read").ok());
  EXPECT_EQ(r.cookieMethod, PodCookieMethod::ProbeRead);
  EXPECT_EQ(r.cookieMethodHow, "forced by SLUICE_POD_COOKIE");

  FeatureReport old = linux61();
  Status st = choosePodCookieMethod(old, "kfunc");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message,
            "SLUICE_POD_COOKIE=kfunc: the kernel cannot do it (no such kfunc in the kernel's BTF (Linux 6.2+))");
  st = choosePodCookieMethod(old, "fast");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message, "SLUICE_POD_COOKIE: invalid pod-cookie method 'fast' (expected kfunc or probe-read)");
}

TEST(MinimumFeatures, NewAndOldKernelsPass) {
  EXPECT_TRUE(checkMinimumFeatures(linux618()).ok());
  EXPECT_TRUE(checkMinimumFeatures(linux61()).ok());
}

TEST(MinimumFeatures, ErrorsNameTheMissingFeature) {
  FeatureReport r = linux61();
  r.btf = off();
  Status st = checkMinimumFeatures(r);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ENOTSUP);
  EXPECT_EQ(st.error().message,
            "kernel 6.1.0-57-amd64 lacks BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF=y), needed to relocate "
            "the programs to its structs");

  r = linux61();
  r.release = "5.10.0-28-amd64";
  r.version = *KernelVersion::parse(r.release);
  EXPECT_EQ(checkMinimumFeatures(r).error().message,
            "kernel 5.10.0-28-amd64 lacks SO_NETNS_COOKIE and the mark kept across bpf_redirect (Linux 5.14+), needed "
            "to identify the pod and to carry the egress decision to ingress");

  r = linux61();
  r.release = "5.15.0-1-amd64";
  r.skAssign = off();
  EXPECT_EQ(checkMinimumFeatures(r).error().message,
            "kernel 5.15.0-1-amd64 lacks bpf_sk_assign at TC (Linux 5.7+), needed to hand packets to the proxy's "
            "sockets");

  r = linux61();
  r.probeReadKernel = off();
  ASSERT_TRUE(choosePodCookieMethod(r, "").ok());
  EXPECT_EQ(checkMinimumFeatures(r).error().message,
            "kernel 6.1.0-57-amd64 lacks both bpf_cast_to_kern_ctx (Linux 6.2+) and bpf_probe_read_kernel at TC "
            "(needs root / CAP_PERFMON), one of which is needed to find the pod of a packet");
}

TEST(ReuseportWarning, OnlyBefore66) {
  EXPECT_EQ(reuseportWarning(linux618()), "");
  EXPECT_EQ(reuseportWarning(linux61()),
            "kernel 6.1.0-57-amd64 cannot hand packets to SO_REUSEPORT sockets (Linux 6.6+): a proxy whose listeners "
            "use SO_REUSEPORT (ztunnel's default) will not receive redirected traffic, and captured connections will "
            "be dropped");
}

TEST(FeatureSummary, OneLogLine) {
  EXPECT_EQ(summarizeFeatures(linux618()),
            "kernel 6.18.44-fc-v1045: attach tcx links; pod cookie via kfunc; SO_REUSEPORT proxies supported");
  EXPECT_EQ(summarizeFeatures(linux61()),
            "kernel 6.1.0-57-amd64: attach clsact + cls_bpf (no tcx); pod cookie via probe-read; SO_REUSEPORT proxies "
            "NOT supported (Linux 6.6+)");
}

TEST(StatusCommand, Parse) {
  auto c = cli::parse({"status"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->verb, cli::Verb::Status);
  EXPECT_FALSE(c->json);
  c = cli::parse({"--tc-mode", "legacy", "status", "--json"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->json);
  EXPECT_EQ(c->tcMode, TcMode::Legacy);
  c = cli::parse({"status", "--id", "web"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "unknown option --id for this command (see sluicectl --help)");
  EXPECT_NE(cli::usage().find("  status     [--json]"), std::string::npos);
}

TEST(StatusCommand, TextOnOldKernel) {
  std::string s = cli::formatStatus(linux61(), TcMode::Auto, false);
  EXPECT_NE(s.find("kernel             6.1.0-57-amd64\n"), std::string::npos) << s;
  EXPECT_NE(s.find("supported          yes\n"), std::string::npos) << s;
  EXPECT_NE(s.find("attach mode        legacy (auto: no tcx, clsact + cls_bpf)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("pod cookie         probe-read (no bpf_cast_to_kern_ctx"), std::string::npos) << s;
  EXPECT_NE(s.find("reuseport proxies  NO: run the proxy without SO_REUSEPORT"), std::string::npos) << s;
  EXPECT_NE(s.find("  tcx links              no   pinned attachments"), std::string::npos) << s;
  EXPECT_NE(s.find("probe: link probe: BPF_LINK_CREATE refuses attach type BPF_TCX_INGRESS (EINVAL)\n"),
            std::string::npos)
      << s;
  s = cli::formatStatus(linux61(), TcMode::Tcx, false);
  EXPECT_NE(s.find("attach mode        tcx (forced, but the kernel lacks tcx: pod add will fail)\n"), std::string::npos)
      << s;
}

TEST(StatusCommand, TextOnUnsupportedKernel) {
  FeatureReport r = linux61();
  r.skAssign = off();
  std::string s = cli::formatStatus(r, TcMode::Auto, false);
  EXPECT_NE(s.find("supported          NO: kernel 6.1.0-57-amd64 lacks bpf_sk_assign at TC"), std::string::npos) << s;
}

TEST(StatusCommand, Json) {
  auto j = nlohmann::json::parse(cli::formatStatus(linux618(), TcMode::Auto, true));
  EXPECT_EQ(j["kernel"]["release"], "6.18.44-fc-v1045");
  EXPECT_EQ(j["kernel"]["version"], "6.18.44");
  EXPECT_EQ(j["supported"], true);
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_EQ(j["tc_mode"]["effective"], "tcx");
  EXPECT_EQ(j["pod_cookie"]["method"], "kfunc");
  EXPECT_EQ(j["reuseport_proxies"], true);
  for (const char* k :
       {"btf", "sk_assign", "cast_to_kern_ctx", "probe_read_kernel", "tcx", "tcx_link_update", "reuseport_assign"}) {
    ASSERT_TRUE(j["features"].contains(k)) << k;
    EXPECT_EQ(j["features"][k]["present"], true) << k;
    EXPECT_FALSE(j["features"][k]["why"].get<std::string>().empty()) << k;
  }
  j = nlohmann::json::parse(cli::formatStatus(linux61(), TcMode::Auto, true));
  EXPECT_EQ(j["tc_mode"]["effective"], "legacy");
  EXPECT_EQ(j["pod_cookie"]["method"], "probe-read");
  EXPECT_EQ(j["features"]["tcx"]["present"], false);
}

// The node proxy: how its traffic is told apart, and its ZDS connections.
TEST(StatusCommand, NodeProxy) {
  cli::ProxyStatus p;
  std::string s = cli::formatStatus(linux618(), TcMode::Auto, false, &p);
  EXPECT_NE(s.find("node proxy         no pinned state under this bpffs root"), std::string::npos) << s;
  EXPECT_NE(s.find("ztunnel            no agent answered"), std::string::npos) << s;
  p.pinned = true;
  p.mark = 0x539;
  p.mask = 0xfff;
  p.agent = true;
  s = cli::formatStatus(linux618(), TcMode::Auto, false, &p);
  EXPECT_NE(s.find("mark 0x539/0xfff alone (Istio's rule; no node proxy seen over ZDS)"), std::string::npos) << s;
  EXPECT_NE(s.find("the agent hands no pod to a node proxy (no --ztunnel-socket)"), std::string::npos) << s;
  p.identity.cgroupCheck = true;
  p.identity.cgroups = {{4242, 17, 1}};
  p.ztunnelSocket = "/var/run/ztunnel/ztunnel.sock";
  p.ztunnelConnections = 2;
  s = cli::formatStatus(linux618(), TcMode::Auto, false, &p);
  EXPECT_NE(s.find("mark 0x539/0xfff only from the node proxy's cgroups: 4242 (pid 17)"), std::string::npos) << s;
  EXPECT_NE(s.find("2 connection(s) on /var/run/ztunnel/ztunnel.sock"), std::string::npos) << s;
  auto j = nlohmann::json::parse(cli::formatStatus(linux618(), TcMode::Auto, true, &p));
  EXPECT_EQ(j["node_proxy"]["cgroup_check"], true);
  EXPECT_EQ(j["node_proxy"]["cgroups"][0]["id"], 4242);
  EXPECT_EQ(j["node_proxy"]["mark"], 0x539);
  EXPECT_EQ(j["node_proxy"]["ztunnel_connections"], 2);
}

}  // namespace
}  // namespace sluice
