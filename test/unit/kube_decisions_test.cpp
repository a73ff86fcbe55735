// Istio's ambient enrollment rules (userspace/mesh/decisions.h): Go's
// ParseBool, selection by pod and namespace labels, the pods that are never
// selected, per-pod settings from annotations, the status patch.
#include <gtest/gtest.h>

#include "userspace/mesh/decisions.h"

namespace sluice::kube {
namespace {

using Labels = std::map<std::string, std::string>;

Pod makePod(Labels labels = {}, Labels annotations = {}) {
  Pod p;
  p.uid = "0d5b0f3e-1b0e-4e0e-9d0c-3f1b2a6e7c10";
  p.name = "web-1";
  p.namespaceName = "shop";
  p.phase = "Running";
  p.ips = {"10.1.0.5"};
  p.labels = std::move(labels);
  p.annotations = std::move(annotations);
  return p;
}

const Labels kAmbientNs{{"istio.io/dataplane-mode", "ambient"}};

TEST(KubeParseBool, AcceptsExactlyGosSpellings) {
  for (const char* t : {"1", "t", "T", "TRUE", "true", "True"}) {
    auto r = parseBool(t);
    ASSERT_TRUE(r.ok()) << t;
    EXPECT_TRUE(*r) << t;
  }
  for (const char* f : {"0", "f", "F", "FALSE", "false", "False"}) {
    auto r = parseBool(f);
    ASSERT_TRUE(r.ok()) << f;
    EXPECT_FALSE(*r) << f;
  }
}

TEST(KubeParseBool, RefusesEverythingElseWithTheValueQuoted) {
  for (const char* bad : {"", "yes", "no", "on", "off", "tRUE", "TRue", "fALSE", " true", "true ", "2", "00", "y", "enabled"}) {
    auto r = parseBool(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, EINVAL);
    EXPECT_EQ(r.error().message, "invalid boolean \"" + std::string(bad) +
                                     "\" (want 1, t, T, TRUE, true, True, 0, f, F, FALSE, false or False)");
  }
}

// The default enablement selectors: {pod: ambient} or {namespace: ambient,
// pod: NotIn [none]} — every combination of the two labels.
TEST(KubeDecide, SelectorMatrix) {
  struct Case {
    const char* pod;  // nullptr: no label
    const char* ns;
    bool enroll;
    std::string reason;
  };
  const std::string none = "neither the pod nor namespace shop is labelled istio.io/dataplane-mode=ambient";
  const std::string byPod = "pod labelled istio.io/dataplane-mode=ambient";
  const std::string byNs = "namespace labelled istio.io/dataplane-mode=ambient";
  const std::string optOut = "pod opts out with istio.io/dataplane-mode=none";
  const Case cases[] = {
      {nullptr, nullptr, false, none}, {nullptr, "ambient", true, byNs}, {nullptr, "none", false, none},
      {nullptr, "other", false, none}, {"ambient", nullptr, true, byPod}, {"ambient", "ambient", true, byPod},
      {"ambient", "none", true, byPod}, {"ambient", "other", true, byPod}, {"none", nullptr, false, none},
      {"none", "ambient", false, optOut}, {"none", "none", false, none}, {"other", nullptr, false, none},
      {"other", "ambient", true, byNs},  // NotIn [none]: any other value is still in
      {"other", "other", false, none},    {"", "ambient", true, byNs},    {"Ambient", nullptr, false, none},
  };
  for (const auto& c : cases) {
    Labels podLabels, nsLabels;
    if (c.pod) podLabels["istio.io/dataplane-mode"] = c.pod;
    if (c.ns) nsLabels["istio.io/dataplane-mode"] = c.ns;
    auto d = decide(makePod(podLabels), nsLabels, Rules{});
    SCOPED_TRACE(std::string("pod=") + (c.pod ? c.pod : "-") + " ns=" + (c.ns ? c.ns : "-"));
    EXPECT_EQ(d.enroll, c.enroll);
    EXPECT_EQ(d.reason, c.reason);
  }
}

TEST(KubeDecide, OtherLabelsDoNotSelect) {
  EXPECT_FALSE(decide(makePod({{"app", "ambient"}}), {{"istio-injection", "enabled"}}, Rules{}).enroll);
  EXPECT_FALSE(namespaceSelected({{"istio.io/dataplane-mode", "none"}}));
  EXPECT_TRUE(namespaceSelected(kAmbientNs));
  EXPECT_FALSE(namespaceSelected({}));
}

TEST(KubeDecide, HostNetworkIsNeverSelected) {
  Pod p = makePod({{"istio.io/dataplane-mode", "ambient"}});
  p.hostNetwork = true;
  auto d = decide(p, kAmbientNs, Rules{});
  EXPECT_FALSE(d.enroll);
  EXPECT_EQ(d.reason, "host network");
  // Host network comes first, before the sidecar.
  p.annotations["sidecar.istio.io/status"] = "{}";
  EXPECT_EQ(decide(p, kAmbientNs, Rules{}).reason, "host network");
}

TEST(KubeDecide, SidecarPodsAreNeverSelected) {
  for (const char* v : {"{\"containers\":[\"istio-proxy\"]}", ""}) {  // presence alone counts
    Pod p = makePod({{"istio.io/dataplane-mode", "ambient"}}, {{"sidecar.istio.io/status", v}});
    auto d = decide(p, kAmbientNs, Rules{});
    EXPECT_FALSE(d.enroll);
    EXPECT_EQ(d.reason, "has a sidecar (annotation sidecar.istio.io/status)");
  }
}

TEST(KubeDecide, ZtunnelsOwnPodsAreNeverSelected) {
  Pod zt = makePod({{"app", "ztunnel"}, {"istio.io/dataplane-mode", "ambient"}});
  zt.namespaceName = "istio-system";
  auto d = decide(zt, kAmbientNs, Rules{});
  EXPECT_FALSE(d.enroll);
  EXPECT_EQ(d.reason, "ztunnel's own pod (namespace istio-system, label app=ztunnel)");
  EXPECT_TRUE(isZtunnelPod(zt, Rules{}));

  // Both must hold: the label elsewhere, or another pod of istio-system, is an ordinary pod.
  Pod elsewhere = zt;
  elsewhere.namespaceName = "shop";
  EXPECT_TRUE(decide(elsewhere, kAmbientNs, Rules{}).enroll);
  Pod other = zt;
  other.labels.erase("app");
  EXPECT_TRUE(decide(other, kAmbientNs, Rules{}).enroll);

  // Configurable namespace and label.
  Rules r;
  r.systemNamespace = "mesh";
  r.ztunnelLabelKey = "app.kubernetes.io/name";
  r.ztunnelLabelValue = "zt";
  EXPECT_TRUE(decide(zt, kAmbientNs, r).enroll);
  Pod custom = makePod({{"app.kubernetes.io/name", "zt"}, {"istio.io/dataplane-mode", "ambient"}});
  custom.namespaceName = "mesh";
  d = decide(custom, kAmbientNs, r);
  EXPECT_FALSE(d.enroll);
  EXPECT_EQ(d.reason, "ztunnel's own pod (namespace mesh, label app.kubernetes.io/name=zt)");
}

TEST(KubeDecide, ExcludedNamespacesWinOverLabels) {
  Pod p = makePod({{"istio.io/dataplane-mode", "ambient"}});
  p.namespaceName = "kube-system";  // the default list
  auto d = decide(p, kAmbientNs, Rules{});
  EXPECT_FALSE(d.enroll);
  EXPECT_EQ(d.reason, "namespace kube-system is excluded");

  Rules r;
  r.excludeNamespaces = {"shop", "legacy"};
  d = decide(makePod({{"istio.io/dataplane-mode", "ambient"}}), kAmbientNs, r);
  EXPECT_FALSE(d.enroll);
  EXPECT_EQ(d.reason, "namespace shop is excluded");
  EXPECT_TRUE(decide(p, kAmbientNs, r).enroll) << "kube-system is only excluded by default";
}

TEST(KubeDecide, FinishedPodsAreNotEnrolled) {
  for (const char* phase : {"Succeeded", "Failed"}) {
    Pod p = makePod();
    p.phase = phase;
    auto d = decide(p, kAmbientNs, Rules{});
    EXPECT_FALSE(d.enroll) << phase;
    EXPECT_EQ(d.reason, std::string("pod has finished (phase ") + phase + ")");
    EXPECT_TRUE(isTerminal(p));
  }
  for (const char* phase : {"Pending", "Running", "Unknown", ""}) {
    Pod p = makePod();
    p.phase = phase;
    EXPECT_TRUE(decide(p, kAmbientNs, Rules{}).enroll) << phase;
    EXPECT_FALSE(isTerminal(p));
  }
}

TEST(KubeSettings, DefaultsWithoutAnnotations) {
  auto d = decide(makePod(), kAmbientNs, Rules{});
  ASSERT_TRUE(d.enroll);
  EXPECT_TRUE(d.settings.dnsCapture);
  EXPECT_TRUE(d.settings.inboundCapture);
  EXPECT_TRUE(d.settings.rerouteIfaces.empty());
  EXPECT_TRUE(d.warnings.empty());
  Rules noDns;
  noDns.dnsCaptureDefault = false;
  EXPECT_FALSE(decide(makePod(), kAmbientNs, noDns).settings.dnsCapture);
}

TEST(KubeSettings, BypassInboundCapture) {
  for (const char* t : {"1", "t", "T", "TRUE", "true", "True"})
    EXPECT_FALSE(podSettings(makePod({}, {{"ambient.istio.io/bypass-inbound-capture", t}}), Rules{}).inboundCapture) << t;
  for (const char* f : {"0", "f", "F", "FALSE", "false", "False"})
    EXPECT_TRUE(podSettings(makePod({}, {{"ambient.istio.io/bypass-inbound-capture", f}}), Rules{}).inboundCapture) << f;
  std::vector<std::string> warnings;
  auto s = podSettings(makePod({}, {{"ambient.istio.io/bypass-inbound-capture", "yes"}}), Rules{}, &warnings);
  EXPECT_TRUE(s.inboundCapture) << "an invalid value is ignored (Istio's CheckBooleanAnnotation)";
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "pod shop/web-1: annotation ambient.istio.io/bypass-inbound-capture: invalid boolean \"yes\" (want 1, t, T, "
            "TRUE, true, True, 0, f, F, FALSE, false or False); ignored");
}

TEST(KubeSettings, DnsCaptureOverridesTheNodeDefaultEitherWay) {
  for (bool nodeDefault : {true, false}) {
    Rules r;
    r.dnsCaptureDefault = nodeDefault;
    EXPECT_TRUE(podSettings(makePod({}, {{"ambient.istio.io/dns-capture", "true"}}), r).dnsCapture);
    EXPECT_FALSE(podSettings(makePod({}, {{"ambient.istio.io/dns-capture", "F"}}), r).dnsCapture);
    EXPECT_EQ(podSettings(makePod(), r).dnsCapture, nodeDefault);
    std::vector<std::string> warnings;
    EXPECT_EQ(podSettings(makePod({}, {{"ambient.istio.io/dns-capture", "off"}}), r, &warnings).dnsCapture, nodeDefault);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("annotation ambient.istio.io/dns-capture: invalid boolean \"off\""), std::string::npos);
  }
}

TEST(KubeSettings, RerouteVirtualInterfaces) {
  auto ifaces = [](const std::string& v, std::vector<std::string>* w = nullptr) {
    return podSettings(makePod({}, {{"istio.io/reroute-virtual-interfaces", v}}), Rules{}, w).rerouteIfaces;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(ifaces("tun0"), V{"tun0"});
  EXPECT_EQ(ifaces("tun0,ppp1"), (V{"tun0", "ppp1"}));
  EXPECT_EQ(ifaces(" tun0 ,\tppp1 ,, ,"), (V{"tun0", "ppp1"}));
  EXPECT_EQ(ifaces(""), V{});
  EXPECT_EQ(ifaces("tun0,tun0"), V{"tun0"});
  EXPECT_EQ(ifaces("abcdefghijklmno"), V{"abcdefghijklmno"}) << "15 bytes is IFNAMSIZ-1";
  std::vector<std::string> w;
  EXPECT_EQ(ifaces("abcdefghijklmnop,a/b,x:y,..,.,eth1", &w), V{"eth1"});
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w[0],
            "pod shop/web-1: annotation istio.io/reroute-virtual-interfaces: \"abcdefghijklmnop\" is not an interface "
            "name; ignored");
  EXPECT_NE(w[1].find("\"a/b\""), std::string::npos);
  EXPECT_NE(w[2].find("\"x:y\""), std::string::npos);
}

TEST(KubeSettings, DecideCarriesSettingsAndWarnings) {
  Pod p = makePod({}, {{"ambient.istio.io/bypass-inbound-capture", "true"},
                       {"ambient.istio.io/dns-capture", "false"},
                       {"istio.io/reroute-virtual-interfaces", "tun0"},
                       {"ambient.istio.io/redirection", "enabled"}});
  auto d = decide(p, kAmbientNs, Rules{});
  ASSERT_TRUE(d.enroll);
  EXPECT_EQ(d.settings, (PodSettings{false, false, {"tun0"}}));
  EXPECT_TRUE(d.warnings.empty());
}

TEST(KubeStatusPatch, SetsOrRemovesTheRedirectionAnnotation) {
  EXPECT_EQ(redirectionPatch("enabled").dump(), R"({"metadata":{"annotations":{"ambient.istio.io/redirection":"enabled"}}})");
  EXPECT_EQ(redirectionPatch("pending").dump(), R"({"metadata":{"annotations":{"ambient.istio.io/redirection":"pending"}}})");
  EXPECT_EQ(redirectionPatch(std::nullopt).dump(), R"({"metadata":{"annotations":{"ambient.istio.io/redirection":null}}})");
}

TEST(KubeObjects, PodFromJson) {
  auto j = nlohmann::json::parse(R"({
    "kind": "Pod", "apiVersion": "v1",
    "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1", "resourceVersion": "42",
                 "labels": {"app": "web"}, "annotations": {"a": "b", "n": 5},
                 "deletionTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"nodeName": "node-a", "serviceAccountName": "web", "hostNetwork": true},
    "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}
  })");
  auto p = Pod::fromJson(j);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->uid, "u-1");
  EXPECT_EQ(p->fullName(), "shop/web-1");
  EXPECT_EQ(p->resourceVersion, "42");
  EXPECT_EQ(p->labels, (Labels{{"app", "web"}}));
  EXPECT_EQ(p->annotations, (Labels{{"a", "b"}})) << "non-string values are not annotations";
  EXPECT_TRUE(p->terminating);
  EXPECT_EQ(p->nodeName, "node-a");
  EXPECT_EQ(p->serviceAccount, "web");
  EXPECT_TRUE(p->hostNetwork);
  EXPECT_EQ(p->phase, "Running");
  EXPECT_EQ(p->ips, (std::vector<std::string>{"10.0.0.1", "fd00::1"}));

  // podIP alone (no podIPs), nothing set at all.
  j["status"] = {{"podIP", "10.0.0.9"}};
  EXPECT_EQ(Pod::fromJson(j)->ips, std::vector<std::string>{"10.0.0.9"});
  j["status"] = nlohmann::json::object();
  j["spec"] = nlohmann::json::object();
  j["metadata"].erase("deletionTimestamp");
  p = Pod::fromJson(j);
  EXPECT_TRUE(p->ips.empty());
  EXPECT_FALSE(p->hostNetwork);
  EXPECT_FALSE(p->terminating);
  EXPECT_EQ(p->phase, "");
}

TEST(KubeObjects, PodAndNamespaceErrors) {
  EXPECT_EQ(Pod::fromJson(nlohmann::json::parse(R"({"metadata":{"name":"a","namespace":"b"}})")).error().message,
            "pod b/a without metadata.uid");
  EXPECT_EQ(Pod::fromJson(nlohmann::json::parse(R"({"metadata":{"uid":"u"}})")).error().message,
            "pod u without metadata.name or metadata.namespace");
  EXPECT_EQ(Pod::fromJson(nlohmann::json::array()).error().message, "pod is not a JSON object");
  EXPECT_EQ(Namespace::fromJson(nlohmann::json::parse(R"({"metadata":{}})")).error().message,
            "namespace without metadata.name");
  auto ns = Namespace::fromJson(nlohmann::json::parse(
      R"({"metadata":{"name":"shop","uid":"n-1","resourceVersion":"7","labels":{"istio.io/dataplane-mode":"ambient"}}})"));
  ASSERT_TRUE(ns.ok());
  EXPECT_EQ(ns->key(), "shop");
  EXPECT_EQ(ns->resourceVersion, "7");
  EXPECT_TRUE(namespaceSelected(ns->labels));
}

}  // namespace
}  // namespace sluice::kube
