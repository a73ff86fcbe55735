// Istio's ambient enablement selectors: which pods are in the mesh, as an
// operator may redefine it (istio/istio cni/pkg/util/enablement_selector.go;
// the istio-cni chart's `ambient.enablementSelectors`, passed to its agent
// as AMBIENT_ENABLEMENT_SELECTOR, and to its plugin as
// `enablement_selectors`).
//
// A list of {podSelector, namespaceSelector} Kubernetes label selectors
// (matchLabels and matchExpressions with In, NotIn, Exists, DoesNotExist);
// a pod is selected when one entry's podSelector matches its labels and the
// same entry's namespaceSelector matches its namespace's labels. An absent
// or empty selector matches everything.
//
// Stricter than Istio where Istio's reading would silently widen or empty
// the selection: an unknown key (a misspelt "podselector" that Istio
// ignores, turning the entry into match-all), an entry with neither
// selector, and an empty list are errors.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/result.h"

namespace sluice::kube {

using LabelMap = std::map<std::string, std::string>;

/// One matchExpressions entry.
struct LabelRequirement {
  enum class Op { In, NotIn, Exists, DoesNotExist };
  std::string key;
  Op op = Op::In;
  std::vector<std::string> values;
  bool operator==(const LabelRequirement&) const = default;
};

/// metav1.LabelSelector: every matchLabels pair and every requirement must
/// hold (k8s.io/apimachinery labels semantics: NotIn and DoesNotExist match
/// a missing label).
struct LabelSelector {
  LabelMap matchLabels;
  std::vector<LabelRequirement> matchExpressions;

  bool empty() const { return matchLabels.empty() && matchExpressions.empty(); }
  bool matches(const LabelMap& labels) const;
  /// "istio.io/dataplane-mode=ambient,app notin (none)" (kubectl's form);
  /// "everything" when empty.
  std::string describe() const;
  bool operator==(const LabelSelector&) const = default;
};

struct EnablementSelector {
  LabelSelector podSelector;
  LabelSelector namespaceSelector;
  bool operator==(const EnablementSelector&) const = default;
};

/// The OR of the entries.
struct EnablementSelectors {
  std::vector<EnablementSelector> entries;

  /// The istio-cni chart's default (manifests/charts/istio-cni/values.yaml):
  ///   - podSelector: {matchLabels: {istio.io/dataplane-mode: ambient}}
  ///   - podSelector: {matchExpressions: [{key: istio.io/dataplane-mode, operator: NotIn, values: [none]}]}
  ///     namespaceSelector: {matchLabels: {istio.io/dataplane-mode: ambient}}
  static EnablementSelectors istioDefault();
  bool isDefault() const { return *this == istioDefault(); }

  /// The index of the first entry that selects the pod, or nullopt.
  std::optional<size_t> match(const LabelMap& podLabels, const LabelMap& namespaceLabels) const;
  /// Istio's MatchesNamespace: a non-empty namespaceSelector matches.
  bool matchesNamespace(const LabelMap& namespaceLabels) const;
  /// "entry N (pod: ..., namespace: ...)" for logs.
  std::string describeEntry(size_t i) const;
  /// Istio's JSON form (the plugin's config, the conflist entry).
  nlohmann::json toJson() const;
  bool operator==(const EnablementSelectors&) const = default;
};

/// Kubernetes names (apimachinery validation): an RFC 1123 label
/// (namespace names), an RFC 1123 subdomain (node names), a label key
/// (optional DNS-subdomain prefix and '/', then 1-63 of [A-Za-z0-9-_.],
/// alphanumeric at both ends) and a label value (the same, or empty).
bool isDnsLabel(const std::string& s);
bool isDnsSubdomain(const std::string& s);
bool isLabelKey(const std::string& key);
bool isLabelValue(const std::string& value);

/// Reads the JSON form (a list of {podSelector, namespaceSelector}). The
/// error (EINVAL) is one line naming the entry and the field.
Result<EnablementSelectors> parseEnablementSelectors(const nlohmann::json& list);

/// Reads the text of AMBIENT_ENABLEMENT_SELECTOR: YAML as the istio-cni
/// chart writes it (`toYaml`), or JSON (which is YAML). Scalars are read as
/// strings. Empty or blank text gives istioDefault().
Result<EnablementSelectors> parseEnablementSelectorsText(const std::string& text);

}  // namespace sluice::kube
