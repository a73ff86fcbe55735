// Which pods the node agent enrolls, and with which settings: Istio's
// ambient rules as pure functions of a pod and its namespace's labels.
// Shared by the agent's controller (userspace/agent/kube) and sluice-cni,
// which judges a pod itself when the agent cannot be reached, so both
// decide alike.
//
// Sources in istio/istio (the rule each function follows):
//  - selection: cni/pkg/util/enablement_selector.go (Matches: hostNetwork,
//    sidecar, then the enablement selectors) with the default selectors of
//    manifests/charts/istio-cni/values.yaml (ambient.enablementSelectors);
//  - excluded namespaces: cni/pkg/nodeagent/informers.go (reconcilePod:
//    shouldBeEnabled = matchesSelector && !namespaceExcluded), default
//    [kube-system] from the same values.yaml (excludeNamespaces);
//  - ztunnel's own pods: cni/pkg/util/podutil.go IsZtunnelPod;
//  - terminal pods: pkg/kube/util.go CheckPodTerminal;
//  - per-pod settings: cni/pkg/nodeagent/net.go getPodLevelTrafficOverrides
//    with cni/pkg/util/podutil.go CheckBooleanAnnotation (strconv.ParseBool;
//    an unparsable value is logged and treated as absent);
//  - annotation names and values: istio/api annotation/ and
//    pkg/config/constants/constants.go.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"
#include "userspace/mesh/objects.h"
#include "userspace/mesh/selectors.h"

namespace sluice::kube {

/// Label that puts a pod or a namespace in (or, on a pod, out of) the mesh.
inline constexpr const char* kDataplaneModeLabel = "istio.io/dataplane-mode";
inline constexpr const char* kDataplaneModeAmbient = "ambient";
inline constexpr const char* kDataplaneModeNone = "none";
/// Present on pods that have an Istio sidecar.
inline constexpr const char* kSidecarStatusAnnotation = "sidecar.istio.io/status";
/// true: no inbound capture ("ingress mode").
inline constexpr const char* kBypassInboundCaptureAnnotation = "ambient.istio.io/bypass-inbound-capture";
/// true/false: DNS capture on/off for this pod; absent: the node default.
inline constexpr const char* kDnsCaptureAnnotation = "ambient.istio.io/dns-capture";
/// Comma-separated interfaces whose inbound TCP is treated as outbound.
inline constexpr const char* kRerouteVirtualInterfacesAnnotation = "istio.io/reroute-virtual-interfaces";
/// The status annotation the node agent writes (pods/status).
inline constexpr const char* kRedirectionAnnotation = "ambient.istio.io/redirection";
inline constexpr const char* kRedirectionEnabled = "enabled";
inline constexpr const char* kRedirectionPending = "pending";

/// Node-wide configuration of the rules (Istio's defaults).
struct Rules {
  /// Namespace of ztunnel's pods (Istio's SystemNamespace).
  std::string systemNamespace = "istio-system";
  /// Label that marks ztunnel's pods in systemNamespace.
  std::string ztunnelLabelKey = "app";
  std::string ztunnelLabelValue = "ztunnel";
  /// Pods in these namespaces are never enrolled, labels or not (the
  /// istio-cni chart's excludeNamespaces default).
  std::set<std::string> excludeNamespaces = {"kube-system"};
  /// DNS capture for pods without a valid dns-capture annotation.
  bool dnsCaptureDefault = true;
  /// Which pods are in the mesh (AMBIENT_ENABLEMENT_SELECTOR).
  EnablementSelectors selectors = EnablementSelectors::istioDefault();
};

/// How an enrolled pod's traffic is captured (its annotations over the node
/// defaults). Field names match the loader's PodSpec.
struct PodSettings {
  bool dnsCapture = true;
  bool inboundCapture = true;
  std::vector<std::string> rerouteIfaces;
  bool operator==(const PodSettings&) const = default;
};

/// What the rules say about one pod.
struct Decision {
  /// Enroll it (selected and not finished).
  bool enroll = false;
  /// Why, in a few words ("namespace labelled istio.io/dataplane-mode=ambient",
  /// "host network", ...): for logs and for the CNI plugin's answer.
  std::string reason;
  /// The pod's settings (meaningful when enroll).
  PodSettings settings;
  /// Annotations that could not be used (one line each; the default was
  /// applied instead): the caller logs them.
  std::vector<std::string> warnings;
};

/// Go's strconv.ParseBool: "1", "t", "T", "TRUE", "true", "True" are true;
/// "0", "f", "F", "FALSE", "false", "False" are false; anything else
/// (including "", "yes", " true") is an error that quotes the value.
Result<bool> parseBool(std::string_view value);

/// Istio's IsZtunnelPod with the configured namespace and label.
bool isZtunnelPod(const Pod& pod, const Rules& rules);

/// Phase Succeeded or Failed: its containers are gone for good.
bool isTerminal(const Pod& pod);

/// Whether namespace labels alone select pods (Istio's MatchesNamespace:
/// a non-empty namespaceSelector of the rules' selectors matches); with the
/// default selectors, istio.io/dataplane-mode=ambient.
bool namespaceSelected(const std::map<std::string, std::string>& namespaceLabels, const Rules& rules = {});

/// The pod's settings from its annotations; unusable values add a warning
/// and leave the default (Istio logs and ignores them too). Interface names
/// the kernel would refuse (empty, over 15 bytes, ".", "..", or with '/',
/// ':' or whitespace) are dropped with a warning; duplicates are dropped.
PodSettings podSettings(const Pod& pod, const Rules& rules, std::vector<std::string>* warnings = nullptr);

/// The whole decision for @p pod in a namespace with @p namespaceLabels.
/// Checked in this order: host network, sidecar, ztunnel's own pod, excluded
/// namespace, finished (Succeeded/Failed), then the rules' enablement
/// selectors; by default the pod's label istio.io/dataplane-mode=ambient,
/// or the namespace's label istio.io/dataplane-mode=ambient without the
/// pod's istio.io/dataplane-mode=none.
Decision decide(const Pod& pod, const std::map<std::string, std::string>& namespaceLabels, const Rules& rules);

/// The merge patch of pods/{name}/status that sets the redirection
/// annotation to @p value, or removes it (null) when @p value is nullopt.
nlohmann::json redirectionPatch(const std::optional<std::string>& value);

}  // namespace sluice::kube
