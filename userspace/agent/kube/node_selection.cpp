#include "userspace/agent/kube/node_selection.h"

#include <algorithm>
#include <charconv>
#include <optional>

namespace sluice::kube {

namespace {

using nlohmann::json;

const json& at(const json& j, std::initializer_list<const char*> path) {
  static const json none;
  const json* cur = &j;
  for (const char* k : path) {
    if (!cur->is_object() || !cur->contains(k)) return none;
    cur = &(*cur)[k];
  }
  return *cur;
}

std::optional<long long> integer(const std::string& s) {
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// One requirement {key, operator, values} against the value @p have (nullopt:
// the label is absent), as k8s.io/apimachinery's labels.Requirement.Matches.
NodeSelectionAnswer requirement(const json& r, const std::optional<std::string>& have, const std::string& what) {
  if (!r.is_object() || !r.value("key", json()).is_string() || !r.value("operator", json()).is_string())
    return {NodeSelection::Unknown, "a malformed " + what + " requirement"};
  const std::string key = r["key"], op = r["operator"];
  std::vector<std::string> values;
  for (const auto& v : r.value("values", json::array()))
    if (v.is_string()) values.push_back(v);
  auto in = [&] { return have && std::find(values.begin(), values.end(), *have) != values.end(); };
  const std::string desc = what + " " + key + " " + op;
  bool ok = false;
  if (op == "In") {
    ok = in();
  } else if (op == "NotIn") {
    ok = !in();
  } else if (op == "Exists") {
    ok = have.has_value();
  } else if (op == "DoesNotExist") {
    ok = !have.has_value();
  } else if (op == "Gt" || op == "Lt") {
    if (values.size() != 1 || !integer(values[0])) return {NodeSelection::Unknown, "a malformed " + desc};
    auto n = have ? integer(*have) : std::nullopt;
    ok = n && (op == "Gt" ? *n > *integer(values[0]) : *n < *integer(values[0]));
  } else {
    return {NodeSelection::Unknown, "an operator this does not judge: " + desc};
  }
  return {ok ? NodeSelection::Selected : NodeSelection::NotSelected, desc};
}

std::optional<std::string> label(const json& node, const std::string& key) {
  const json& v = at(node, {"metadata", "labels"});
  if (!v.is_object() || !v.contains(key) || !v[key].is_string()) return std::nullopt;
  return v[key].get<std::string>();
}

// A node selector term: every expression and field requirement (an empty
// term selects nothing, as the scheduler has it).
NodeSelectionAnswer term(const json& t, const json& node) {
  const json& exprs = at(t, {"matchExpressions"});
  const json& fields = at(t, {"matchFields"});
  if ((!exprs.is_array() || exprs.empty()) && (!fields.is_array() || fields.empty()))
    return {NodeSelection::NotSelected, "an empty node selector term"};
  NodeSelectionAnswer last{NodeSelection::Selected, ""};
  for (const auto& e : exprs.is_array() ? exprs : json::array()) {
    last = requirement(e, e.is_object() && e.value("key", json()).is_string() ? label(node, e["key"]) : std::nullopt,
                       "label");
    if (last.selection != NodeSelection::Selected) return last;
  }
  for (const auto& f : fields.is_array() ? fields : json::array()) {
    if (!f.is_object() || f.value("key", "") != "metadata.name")
      return {NodeSelection::Unknown, "a field requirement this does not judge"};
    last = requirement(f, at(node, {"metadata", "name"}).get<std::string>(), "field");
    if (last.selection != NodeSelection::Selected) return last;
  }
  return last;
}

}  // namespace

NodeSelectionAnswer daemonSetSelectsNode(const json& ds, const json& node) {
  if (!at(node, {"metadata", "name"}).is_string()) return {NodeSelection::Unknown, "a Node without a name"};
  const json& selector = at(ds, {"spec", "template", "spec", "nodeSelector"});
  if (selector.is_object())
    for (const auto& [k, v] : selector.items()) {
      auto have = label(node, k);
      if (!v.is_string()) return {NodeSelection::Unknown, "a malformed nodeSelector"};
      if (!have || *have != v.get<std::string>())
        return {NodeSelection::NotSelected, "nodeSelector " + k + "=" + v.get<std::string>()};
    }
  const json& terms = at(ds, {"spec", "template", "spec", "affinity", "nodeAffinity",
                              "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"});
  if (terms.is_null()) return {NodeSelection::Selected, "no node selection rules out the node"};
  if (!terms.is_array() || terms.empty()) return {NodeSelection::Unknown, "malformed nodeSelectorTerms"};
  // Any term selects (OR); an unjudged one leaves the answer unknown unless
  // another term selects.
  NodeSelectionAnswer answer{NodeSelection::NotSelected, ""};
  std::string notSelected;
  for (const auto& t : terms) {
    NodeSelectionAnswer a = term(t, node);
    if (a.selection == NodeSelection::Selected) return {NodeSelection::Selected, "required node affinity: " + a.why};
    if (a.selection == NodeSelection::Unknown) answer = a;
    if (a.selection == NodeSelection::NotSelected) notSelected += (notSelected.empty() ? "" : "; ") + a.why;
  }
  if (answer.selection == NodeSelection::Unknown) return answer;
  return {NodeSelection::NotSelected, "required node affinity: " + notSelected};
}

}  // namespace sluice::kube
