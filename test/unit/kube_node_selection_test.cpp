// Whether a DaemonSet still selects a node (userspace/agent/kube/node_selection.h):
// the scheduler's rules for nodeSelector and required node affinity, and
// "unknown" for whatever this does not judge — never a guessed "not
// selected", which would uninstall sluice from the node on an update.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "userspace/agent/kube/node_selection.h"

namespace sluice::kube {
namespace {

using nlohmann::json;

json node(const json& labels) { return {{"metadata", {{"name", "node-a"}, {"labels", labels}}}}; }

json withSelector(const json& nodeSelector) {
  return {{"spec", {{"template", {{"spec", {{"nodeSelector", nodeSelector}}}}}}}};
}

json withTerms(const json& terms) {
  return {{"spec",
           {{"template",
             {{"spec",
               {{"affinity",
                 {{"nodeAffinity", {{"requiredDuringSchedulingIgnoredDuringExecution", {{"nodeSelectorTerms", terms}}}}}}}}}}}}}};
}

json expr(const std::string& key, const std::string& op, const json& values = json::array()) {
  return {{"key", key}, {"operator", op}, {"values", values}};
}

NodeSelection sel(const json& ds, const json& n) { return daemonSetSelectsNode(ds, n).selection; }

TEST(KubeNodeSelection, NoRulesSelectEveryNode) {
  EXPECT_EQ(sel(json::object(), node({{"a", "b"}})), NodeSelection::Selected);
  EXPECT_EQ(sel(withSelector(json::object()), node(json::object())), NodeSelection::Selected);
}

TEST(KubeNodeSelection, NodeSelectorNeedsEveryLabel) {
  const json ds = withSelector({{"mesh-node-agent", "sluice"}, {"kubernetes.io/os", "linux"}});
  EXPECT_EQ(sel(ds, node({{"mesh-node-agent", "sluice"}, {"kubernetes.io/os", "linux"}, {"x", "y"}})),
            NodeSelection::Selected);
  auto a = daemonSetSelectsNode(ds, node({{"mesh-node-agent", "istio"}, {"kubernetes.io/os", "linux"}}));
  EXPECT_EQ(a.selection, NodeSelection::NotSelected);
  EXPECT_EQ(a.why, "nodeSelector mesh-node-agent=sluice");
  EXPECT_EQ(sel(ds, node({{"kubernetes.io/os", "linux"}})), NodeSelection::NotSelected) << "label absent";
}

TEST(KubeNodeSelection, AffinityOperators) {
  const json n = node({{"zone", "a"}, {"cores", "8"}});
  struct Case {
    json e;
    NodeSelection want;
  } cases[] = {
      {expr("zone", "In", {"a", "b"}), NodeSelection::Selected},
      {expr("zone", "In", {"b"}), NodeSelection::NotSelected},
      {expr("missing", "In", {"a"}), NodeSelection::NotSelected},
      {expr("zone", "NotIn", {"b"}), NodeSelection::Selected},
      {expr("zone", "NotIn", {"a"}), NodeSelection::NotSelected},
      {expr("missing", "NotIn", {"a"}), NodeSelection::Selected},
      {expr("zone", "Exists"), NodeSelection::Selected},
      {expr("missing", "Exists"), NodeSelection::NotSelected},
      {expr("missing", "DoesNotExist"), NodeSelection::Selected},
      {expr("zone", "DoesNotExist"), NodeSelection::NotSelected},
      {expr("cores", "Gt", {"4"}), NodeSelection::Selected},
      {expr("cores", "Gt", {"8"}), NodeSelection::NotSelected},
      {expr("cores", "Lt", {"16"}), NodeSelection::Selected},
      {expr("zone", "Lt", {"16"}), NodeSelection::NotSelected},
      {expr("cores", "Gt", {"four"}), NodeSelection::Unknown},
      {expr("zone", "Near", {"a"}), NodeSelection::Unknown},
  };
  for (const auto& c : cases)
    EXPECT_EQ(sel(withTerms(json::array({{{"matchExpressions", json::array({c.e})}}})), n), c.want) << c.e;
}

TEST(KubeNodeSelection, TermsAreOredExpressionsAnded) {
  const json n = node({{"zone", "a"}, {"pool", "mesh"}});
  const json both = {{"matchExpressions", json::array({expr("zone", "In", {"a"}), expr("pool", "In", {"mesh"})})}};
  const json oneWrong = {{"matchExpressions", json::array({expr("zone", "In", {"a"}), expr("pool", "In", {"gpu"})})}};
  const json other = {{"matchExpressions", json::array({expr("zone", "In", {"b"})})}};
  EXPECT_EQ(sel(withTerms(json::array({both})), n), NodeSelection::Selected);
  EXPECT_EQ(sel(withTerms(json::array({oneWrong})), n), NodeSelection::NotSelected);
  EXPECT_EQ(sel(withTerms(json::array({oneWrong, other})), n), NodeSelection::NotSelected);
  EXPECT_EQ(sel(withTerms(json::array({other, both})), n), NodeSelection::Selected);
  // An empty term selects nothing; one not judged leaves the answer open
  // unless another term selects.
  EXPECT_EQ(sel(withTerms(json::array({json::object()})), n), NodeSelection::NotSelected);
  const json unjudged = {{"matchExpressions", json::array({expr("zone", "Near", {"a"})})}};
  EXPECT_EQ(sel(withTerms(json::array({unjudged, other})), n), NodeSelection::Unknown);
  EXPECT_EQ(sel(withTerms(json::array({unjudged, both})), n), NodeSelection::Selected);
  EXPECT_EQ(sel(withTerms(json::array()), n), NodeSelection::Unknown) << "the API refuses an empty list";
}

TEST(KubeNodeSelection, MatchFieldsByNodeName) {
  const json n = node(json::object());
  auto byName = [](const std::string& op, const std::string& name) {
    return withTerms(json::array({{{"matchFields", json::array({expr("metadata.name", op, {name})})}}}));
  };
  EXPECT_EQ(sel(byName("In", "node-a"), n), NodeSelection::Selected);
  EXPECT_EQ(sel(byName("In", "node-b"), n), NodeSelection::NotSelected);
  EXPECT_EQ(sel(byName("NotIn", "node-a"), n), NodeSelection::NotSelected);
  EXPECT_EQ(sel(withTerms(json::array({{{"matchFields", json::array({expr("spec.podCIDR", "In", {"x"})})}}})), n),
            NodeSelection::Unknown);
}

TEST(KubeNodeSelection, TheNodeSelectorAndTheAffinityBothApply) {
  json ds = withTerms(json::array({{{"matchExpressions", json::array({expr("zone", "In", {"a"})})}}}));
  ds["spec"]["template"]["spec"]["nodeSelector"] = {{"pool", "mesh"}};
  EXPECT_EQ(sel(ds, node({{"zone", "a"}, {"pool", "mesh"}})), NodeSelection::Selected);
  EXPECT_EQ(sel(ds, node({{"zone", "a"}})), NodeSelection::NotSelected);
  EXPECT_EQ(sel(ds, node({{"pool", "mesh"}})), NodeSelection::NotSelected);
  EXPECT_EQ(sel(ds, json::object()), NodeSelection::Unknown) << "a Node without a name";
}

}  // namespace
}  // namespace sluice::kube
