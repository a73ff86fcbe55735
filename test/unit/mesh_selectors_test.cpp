// Istio's ambient enablement selectors (userspace/mesh/selectors.h): the
// chart's YAML and JSON read alike, label selector semantics (In, NotIn,
// Exists, DoesNotExist, matchLabels), the OR of entries, Istio's default,
// and every malformed selector refused with one line naming it.
#include <gtest/gtest.h>

#include "userspace/mesh/decisions.h"
#include "userspace/mesh/selectors.h"

namespace sluice::kube {
namespace {

using nlohmann::json;

// The istio-cni chart's default as `toYaml` writes it into
// AMBIENT_ENABLEMENT_SELECTOR (block style, keys sorted).
constexpr const char* kChartDefaultYaml = R"(- podSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
- namespaceSelector:
    matchLabels:
      istio.io/dataplane-mode: ambient
  podSelector:
    matchExpressions:
    - key: istio.io/dataplane-mode
      operator: NotIn
      values:
      - none
)";

EnablementSelectors parsed(const std::string& text) {
  auto s = parseEnablementSelectorsText(text);
  EXPECT_TRUE(s.ok()) << s.error().message;
  return s.ok() ? *s : EnablementSelectors{};
}

TEST(MeshSelectors, TheChartsDefaultInYamlJsonOrFlowStyleIsIstiosDefault) {
  EXPECT_TRUE(parsed(kChartDefaultYaml).isDefault());
  EXPECT_TRUE(parsed(EnablementSelectors::istioDefault().toJson().dump()).isDefault());
  // values.yaml's own flow style.
  EXPECT_TRUE(parsed("- podSelector:\n    matchLabels: {istio.io/dataplane-mode: ambient}\n"
                     "- podSelector:\n    matchExpressions:\n    - { key: istio.io/dataplane-mode, operator: NotIn, "
                     "values: [none] }\n  namespaceSelector:\n    matchLabels: {istio.io/dataplane-mode: ambient}\n")
                  .isDefault());
  // Unset or blank: the default.
  EXPECT_TRUE(parsed("").isDefault());
  EXPECT_TRUE(parsed("  \n").isDefault());
}

TEST(MeshSelectors, OperatorsFollowKubernetesLabelSemantics) {
  auto s = parsed(R"([{"podSelector": {"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["web", "api"]},
        {"key": "legacy", "operator": "NotIn", "values": ["true"]},
        {"key": "team", "operator": "Exists"},
        {"key": "debug", "operator": "DoesNotExist"}]}}])");
  ASSERT_EQ(s.entries.size(), 1u);
  const auto& sel = s.entries[0].podSelector;
  EXPECT_TRUE(sel.matches({{"tier", "web"}, {"team", "a"}}));
  EXPECT_TRUE(sel.matches({{"tier", "api"}, {"team", "a"}, {"legacy", "false"}}));
  EXPECT_FALSE(sel.matches({{"tier", "db"}, {"team", "a"}}));                      // In: other value
  EXPECT_FALSE(sel.matches({{"team", "a"}}));                                      // In: label missing
  EXPECT_FALSE(sel.matches({{"tier", "web"}, {"team", "a"}, {"legacy", "true"}}));  // NotIn
  EXPECT_FALSE(sel.matches({{"tier", "web"}}));                                    // Exists
  EXPECT_FALSE(sel.matches({{"tier", "web"}, {"team", "a"}, {"debug", ""}}));      // DoesNotExist
  EXPECT_EQ(sel.describe(), "tier in (web,api),legacy notin (true),team,!debug");
  // An empty selector matches everything, and says so.
  EXPECT_TRUE(LabelSelector{}.matches({}));
  EXPECT_EQ(LabelSelector{}.describe(), "everything");
}

TEST(MeshSelectors, EntriesAreOredAndEachNeedsBothOfItsSelectors) {
  auto s = parsed(R"(
- podSelector: {matchLabels: {mesh: "yes"}}
- namespaceSelector: {matchLabels: {team: payments}}
  podSelector: {matchExpressions: [{key: mesh, operator: NotIn, values: ["no"]}]}
)");
  ASSERT_EQ(s.entries.size(), 2u);
  EXPECT_FALSE(s.isDefault());
  EXPECT_EQ(s.match({{"mesh", "yes"}}, {}), 0u);
  EXPECT_EQ(s.match({}, {{"team", "payments"}}), 1u);
  EXPECT_EQ(s.match({{"mesh", "no"}}, {{"team", "payments"}}), std::nullopt);
  EXPECT_EQ(s.match({}, {{"team", "shop"}}), std::nullopt);
  EXPECT_TRUE(s.matchesNamespace({{"team", "payments"}}));
  EXPECT_FALSE(s.matchesNamespace({{"team", "shop"}}));
  // Scalars are strings: "yes" and yes read alike.
  EXPECT_EQ(parsed("- podSelector: {matchLabels: {mesh: yes}}").entries[0].podSelector.matchLabels.at("mesh"), "yes");
  // The JSON form round-trips.
  EXPECT_EQ(parsed(s.toJson().dump()), s);
}

TEST(MeshSelectors, CustomSelectorsDecideAndSayWhich) {
  Rules rules;
  rules.selectors = parsed("- podSelector: {matchLabels: {app: shop}}\n");
  Pod p;
  p.uid = "u1";
  p.name = "web";
  p.namespaceName = "shop";
  p.phase = "Running";
  p.labels = {{"app", "shop"}};
  auto d = decide(p, {}, rules);
  EXPECT_TRUE(d.enroll);
  EXPECT_EQ(d.reason, "selected by enablement selector 0 (pods: app=shop; namespaces: everything)");
  // The default's label no longer selects; the rules before the selectors
  // still apply.
  p.labels = {{"istio.io/dataplane-mode", "ambient"}};
  d = decide(p, {{"istio.io/dataplane-mode", "ambient"}}, rules);
  EXPECT_FALSE(d.enroll);
  EXPECT_EQ(d.reason, "no enablement selector selects it (namespace shop)");
  p.labels = {{"app", "shop"}};
  p.hostNetwork = true;
  EXPECT_EQ(decide(p, {}, rules).reason, "host network");
}

TEST(MeshSelectors, EveryMalformedSelectorIsRefusedWithOneLineNamingIt) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"- podSelector: [", "enablement selectors: not YAML: "},
      {"{}", "enablement selectors: must be a list of {podSelector, namespaceSelector}"},
      {"[]", "enablement selectors: the list is empty"},
      {"- {}", "enablement selector [0]: has neither podSelector nor namespaceSelector"},
      {"- podselector: {matchLabels: {a: b}}", "enablement selector [0]: unknown key \"podselector\""},
      {"- podSelector: {matchLabel: {a: b}}", "enablement selector [0].podSelector: unknown key \"matchLabel\""},
      {"- podSelector: {matchLabels: [a]}", "enablement selector [0].podSelector.matchLabels: must be a map"},
      {"- podSelector: {matchLabels: {\"bad key!\": b}}",
       "enablement selector [0].podSelector.matchLabels: \"bad key!\" is not a valid label key"},
      {"- podSelector: {matchLabels: {a: \"b c\"}}", "enablement selector [0].podSelector.matchLabels.a: \"b c\" is not a valid label value"},
      {"- namespaceSelector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}",
       "enablement selector [0].namespaceSelector.matchExpressions[0]: \"Equals\" is not a valid label selector operator"},
      {"- podSelector: {matchExpressions: [{key: a, operator: In}]}",
       "enablement selector [0].podSelector.matchExpressions[0]: operator In needs values"},
      {"- podSelector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}",
       "enablement selector [0].podSelector.matchExpressions[0]: operator Exists takes no values"},
      {"- podSelector: {matchExpressions: [{operator: Exists}]}",
       "enablement selector [0].podSelector.matchExpressions[0]: \"key\" must be a valid label key"},
      {"- podSelector: {matchLabels: {a: b}}\n- 7", "enablement selector [1]: must be {podSelector, namespaceSelector}"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    auto s = parseEnablementSelectorsText(c.text);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, EINVAL);
    EXPECT_EQ(s.error().message.rfind(c.message, 0), 0u) << s.error().message;
    EXPECT_EQ(s.error().message.find('\n'), std::string::npos) << s.error().message;
  }
  // Deliberately everything is allowed, and explicit.
  auto all = parsed("- podSelector: {}");
  EXPECT_EQ(all.match({}, {}), 0u);
  EXPECT_EQ(all.toJson(), json::parse(R"([{"podSelector": {}}])"));
}

TEST(MeshNames, KubernetesNameRules) {
  EXPECT_TRUE(isDnsLabel("kube-system"));
  EXPECT_FALSE(isDnsLabel("Kube"));
  EXPECT_FALSE(isDnsLabel("-a"));
  EXPECT_TRUE(isDnsSubdomain("node-a.example"));
  EXPECT_FALSE(isDnsSubdomain("node-a."));
  EXPECT_TRUE(isLabelKey("istio.io/dataplane-mode"));
  EXPECT_FALSE(isLabelKey("istio.io/"));
  EXPECT_FALSE(isLabelKey("Bad_Prefix/x"));
  EXPECT_TRUE(isLabelValue(""));
  EXPECT_FALSE(isLabelValue("a b"));
}

}  // namespace
}  // namespace sluice::kube
