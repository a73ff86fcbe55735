#include "userspace/mesh/decisions.h"

#include <algorithm>

namespace sluice::kube {

namespace {

const std::string* find(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

// The kernel's dev_valid_name(): what `ip link` would accept as a name.
bool validIfaceName(std::string_view name) {
  if (name.empty() || name.size() > 15 || name == "." || name == "..") return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    return c == '/' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  });
}

// Go's strings.TrimSpace for the ASCII whitespace an annotation can hold.
std::string_view trimSpace(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// CheckBooleanAnnotation: the value when present and valid; a warning and
// nullopt when present but not a Go boolean.
std::optional<bool> boolAnnotation(const Pod& pod, const char* name, std::vector<std::string>* warnings) {
  const std::string* v = find(pod.annotations, name);
  if (!v) return std::nullopt;
  auto b = parseBool(*v);
  if (!b.ok()) {
    if (warnings) warnings->push_back("pod " + pod.fullName() + ": annotation " + name + ": " + b.error().message + "; ignored");
    return std::nullopt;
  }
  return *b;
}

}  // namespace

Result<bool> parseBool(std::string_view v) {
  if (v == "1" || v == "t" || v == "T" || v == "TRUE" || v == "true" || v == "True") return true;
  if (v == "0" || v == "f" || v == "F" || v == "FALSE" || v == "false" || v == "False") return false;
  return Error::msg("invalid boolean \"" + std::string(v) + "\" (want 1, t, T, TRUE, true, True, 0, f, F, FALSE, false or False)",
                    EINVAL);
}

bool isZtunnelPod(const Pod& pod, const Rules& rules) {
  const std::string* v = find(pod.labels, rules.ztunnelLabelKey);
  return pod.namespaceName == rules.systemNamespace && v && *v == rules.ztunnelLabelValue;
}

bool isTerminal(const Pod& pod) { return pod.phase == "Succeeded" || pod.phase == "Failed"; }

bool namespaceSelected(const std::map<std::string, std::string>& labels, const Rules& rules) {
  return rules.selectors.matchesNamespace(labels);
}

PodSettings podSettings(const Pod& pod, const Rules& rules, std::vector<std::string>* warnings) {
  PodSettings s;
  s.dnsCapture = rules.dnsCaptureDefault;
  if (auto bypass = boolAnnotation(pod, kBypassInboundCaptureAnnotation, warnings)) s.inboundCapture = !*bypass;
  if (auto dns = boolAnnotation(pod, kDnsCaptureAnnotation, warnings)) s.dnsCapture = *dns;
  if (const std::string* virt = find(pod.annotations, kRerouteVirtualInterfacesAnnotation)) {
    std::string_view rest = *virt;
    for (;;) {
      auto comma = rest.find(',');
      std::string_view item = trimSpace(rest.substr(0, comma));
      if (!item.empty()) {
        if (!validIfaceName(item)) {
          if (warnings)
            warnings->push_back("pod " + pod.fullName() + ": annotation " + kRerouteVirtualInterfacesAnnotation +
                                ": \"" + std::string(item) + "\" is not an interface name; ignored");
        } else if (std::find(s.rerouteIfaces.begin(), s.rerouteIfaces.end(), item) == s.rerouteIfaces.end()) {
          s.rerouteIfaces.emplace_back(item);
        }
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return s;
}

Decision decide(const Pod& pod, const std::map<std::string, std::string>& nsLabels, const Rules& rules) {
  Decision d;
  auto no = [&](std::string reason) {
    d.reason = std::move(reason);
    return d;
  };
  if (pod.hostNetwork) return no("host network");
  if (pod.annotations.count(kSidecarStatusAnnotation))
    return no(std::string("has a sidecar (annotation ") + kSidecarStatusAnnotation + ")");
  if (isZtunnelPod(pod, rules))
    return no("ztunnel's own pod (namespace " + rules.systemNamespace + ", label " + rules.ztunnelLabelKey + "=" +
              rules.ztunnelLabelValue + ")");
  if (rules.excludeNamespaces.count(pod.namespaceName)) return no("namespace " + pod.namespaceName + " is excluded");
  if (isTerminal(pod)) return no("pod has finished (phase " + pod.phase + ")");

  auto selected = rules.selectors.match(pod.labels, nsLabels);
  if (rules.selectors.isDefault()) {
    // Istio's default selectors, told in their own words.
    const std::string* podMode = find(pod.labels, kDataplaneModeLabel);
    const std::string label = std::string(kDataplaneModeLabel) + "=";
    if (podMode && *podMode == kDataplaneModeAmbient) {
      d.reason = "pod labelled " + label + kDataplaneModeAmbient;
    } else if (selected) {
      d.reason = "namespace labelled " + label + kDataplaneModeAmbient;
    } else if (podMode && *podMode == kDataplaneModeNone && rules.selectors.matchesNamespace(nsLabels)) {
      return no("pod opts out with " + label + kDataplaneModeNone);
    } else {
      return no("neither the pod nor namespace " + pod.namespaceName + " is labelled " + label + kDataplaneModeAmbient);
    }
  } else if (selected) {
    d.reason = "selected by " + rules.selectors.describeEntry(*selected);
  } else {
    return no("no enablement selector selects it (namespace " + pod.namespaceName + ")");
  }
  d.enroll = true;
  d.settings = podSettings(pod, rules, &d.warnings);
  return d;
}

nlohmann::json redirectionPatch(const std::optional<std::string>& value) {
  nlohmann::json v = value ? nlohmann::json(*value) : nlohmann::json(nullptr);
  return {{"metadata", {{"annotations", {{kRedirectionAnnotation, v}}}}}};
}

}  // namespace sluice::kube
