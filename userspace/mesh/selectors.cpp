#include "userspace/mesh/selectors.h"

#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <set>
#include <sstream>

namespace sluice::kube {

using nlohmann::json;

namespace {

bool lowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool labelName(const std::string& s) {
  auto an = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (s.empty() || s.size() > 63 || !an(s.front()) || !an(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return an(c) || c == '-' || c == '_' || c == '.'; });
}

const char* opText(LabelRequirement::Op op) {
  switch (op) {
    case LabelRequirement::Op::In: return "In";
    case LabelRequirement::Op::NotIn: return "NotIn";
    case LabelRequirement::Op::Exists: return "Exists";
    case LabelRequirement::Op::DoesNotExist: return "DoesNotExist";
  }
  return "?";
}

Error bad(const std::string& where, const std::string& what) { return Error::msg(where + ": " + what, EINVAL); }

Status onlyKeys(const json& j, const std::string& where, std::initializer_list<const char*> keys) {
  for (const auto& [k, v] : j.items())
    if (std::none_of(keys.begin(), keys.end(), [&](const char* a) { return k == a; })) {
      std::string allowed;
      for (const char* a : keys) allowed += (allowed.empty() ? "" : ", ") + std::string(a);
      return bad(where, "unknown key \"" + k + "\" (expected " + allowed + ")");
    }
  return {};
}

Result<LabelSelector> parseSelector(const json& j, const std::string& where) {
  LabelSelector s;
  if (j.is_null()) return s;
  if (!j.is_object()) return bad(where, "must be a label selector (matchLabels, matchExpressions)");
  SLUICE_TRY(onlyKeys(j, where, {"matchLabels", "matchExpressions"}));
  if (j.contains("matchLabels") && !j["matchLabels"].is_null()) {
    const json& ml = j["matchLabels"];
    if (!ml.is_object()) return bad(where + ".matchLabels", "must be a map of label keys to values");
    for (const auto& [k, v] : ml.items()) {
      if (!isLabelKey(k)) return bad(where + ".matchLabels", "\"" + k + "\" is not a valid label key");
      if (!v.is_string() || !isLabelValue(v.get<std::string>()))
        return bad(where + ".matchLabels." + k, "\"" + (v.is_string() ? v.get<std::string>() : v.dump()) +
                                                    "\" is not a valid label value");
      s.matchLabels[k] = v.get<std::string>();
    }
  }
  if (j.contains("matchExpressions") && !j["matchExpressions"].is_null()) {
    const json& me = j["matchExpressions"];
    if (!me.is_array()) return bad(where + ".matchExpressions", "must be a list of {key, operator, values}");
    for (size_t i = 0; i < me.size(); i++) {
      const std::string at = where + ".matchExpressions[" + std::to_string(i) + "]";
      const json& e = me[i];
      if (!e.is_object()) return bad(at, "must be {key, operator, values}");
      SLUICE_TRY(onlyKeys(e, at, {"key", "operator", "values"}));
      LabelRequirement r;
      if (!e.contains("key") || !e["key"].is_string() || !isLabelKey(e["key"].get<std::string>()))
        return bad(at, "\"key\" must be a valid label key");
      r.key = e["key"].get<std::string>();
      std::string op = e.contains("operator") && e["operator"].is_string() ? e["operator"].get<std::string>() : "";
      if (op == "In")
        r.op = LabelRequirement::Op::In;
      else if (op == "NotIn")
        r.op = LabelRequirement::Op::NotIn;
      else if (op == "Exists")
        r.op = LabelRequirement::Op::Exists;
      else if (op == "DoesNotExist")
        r.op = LabelRequirement::Op::DoesNotExist;
      else
        return bad(at, "\"" + op + "\" is not a valid label selector operator (In, NotIn, Exists, DoesNotExist)");
      if (e.contains("values") && !e["values"].is_null()) {
        if (!e["values"].is_array()) return bad(at, "\"values\" must be a list");
        for (const auto& v : e["values"]) {
          if (!v.is_string() || !isLabelValue(v.get<std::string>()))
            return bad(at, "\"" + (v.is_string() ? v.get<std::string>() : v.dump()) + "\" is not a valid label value");
          r.values.push_back(v.get<std::string>());
        }
      }
      bool set = r.op == LabelRequirement::Op::In || r.op == LabelRequirement::Op::NotIn;
      if (set && r.values.empty()) return bad(at, std::string("operator ") + opText(r.op) + " needs values");
      if (!set && !r.values.empty()) return bad(at, std::string("operator ") + opText(r.op) + " takes no values");
      s.matchExpressions.push_back(std::move(r));
    }
  }
  return s;
}

json selectorJson(const LabelSelector& s) {
  json j = json::object();
  if (!s.matchLabels.empty()) j["matchLabels"] = s.matchLabels;
  if (!s.matchExpressions.empty()) {
    j["matchExpressions"] = json::array();
    for (const auto& r : s.matchExpressions) {
      json e = {{"key", r.key}, {"operator", opText(r.op)}};
      if (!r.values.empty()) e["values"] = r.values;
      j["matchExpressions"].push_back(e);
    }
  }
  return j;
}

// ---- YAML (libyaml's document API) to JSON, every scalar a string ----

struct YamlParser {
  yaml_parser_t p;
  YamlParser() { yaml_parser_initialize(&p); }
  ~YamlParser() { yaml_parser_delete(&p); }
};
struct YamlDocument {
  yaml_document_t d;
  bool loaded = false;
  ~YamlDocument() {
    if (loaded) yaml_document_delete(&d);
  }
};

Result<json> nodeJson(yaml_document_t* doc, yaml_node_t* n, int depth) {
  if (!n) return json(nullptr);
  if (depth > 32) return Error::msg("nested too deeply", EINVAL);
  switch (n->type) {
    case YAML_SCALAR_NODE: {
      std::string v(reinterpret_cast<const char*>(n->data.scalar.value), n->data.scalar.length);
      // A plain "null", "~" or nothing is YAML's null.
      if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && (v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL"))
        return json(nullptr);
      return json(v);
    }
    case YAML_SEQUENCE_NODE: {
      json out = json::array();
      for (auto* it = n->data.sequence.items.start; it < n->data.sequence.items.top; ++it) {
        auto v = nodeJson(doc, yaml_document_get_node(doc, *it), depth + 1);
        SLUICE_TRY(v);
        out.push_back(std::move(*v));
      }
      return out;
    }
    case YAML_MAPPING_NODE: {
      json out = json::object();
      for (auto* it = n->data.mapping.pairs.start; it < n->data.mapping.pairs.top; ++it) {
        yaml_node_t* k = yaml_document_get_node(doc, it->key);
        if (!k || k->type != YAML_SCALAR_NODE) return Error::msg("a map key is not a plain value", EINVAL);
        std::string key(reinterpret_cast<const char*>(k->data.scalar.value), k->data.scalar.length);
        auto v = nodeJson(doc, yaml_document_get_node(doc, it->value), depth + 1);
        SLUICE_TRY(v);
        out[key] = std::move(*v);
      }
      return out;
    }
    default:
      return json(nullptr);
  }
}

Result<json> yamlToJson(const std::string& text) {
  YamlParser parser;
  yaml_parser_set_input_string(&parser.p, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  YamlDocument doc;
  if (!yaml_parser_load(&parser.p, &doc.d)) {
    std::string what = parser.p.problem ? parser.p.problem : "not YAML";
    return Error::msg(what + " at line " + std::to_string(parser.p.problem_mark.line + 1) + ", column " +
                          std::to_string(parser.p.problem_mark.column + 1),
                      EINVAL);
  }
  doc.loaded = true;
  return nodeJson(&doc.d, yaml_document_get_root_node(&doc.d), 0);
}

}  // namespace

bool isDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63 || !lowerAlnum(s.front()) || !lowerAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return lowerAlnum(c) || c == '-'; });
}

bool isDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  std::stringstream ss(s);
  std::string label;
  size_t labels = 0;
  while (std::getline(ss, label, '.')) {
    if (!isDnsLabel(label)) return false;
    labels++;
  }
  return labels > 0 && s.back() != '.';
}

bool isLabelKey(const std::string& key) {
  auto slash = key.find('/');
  if (slash == std::string::npos) return labelName(key);
  return isDnsSubdomain(key.substr(0, slash)) && labelName(key.substr(slash + 1));
}

bool isLabelValue(const std::string& v) { return v.empty() || labelName(v); }

bool LabelSelector::matches(const LabelMap& labels) const {
  for (const auto& [k, v] : matchLabels) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  for (const auto& r : matchExpressions) {
    auto it = labels.find(r.key);
    bool has = it != labels.end();
    bool in = has && std::find(r.values.begin(), r.values.end(), it->second) != r.values.end();
    switch (r.op) {
      case LabelRequirement::Op::In:
        if (!in) return false;
        break;
      case LabelRequirement::Op::NotIn:
        if (in) return false;
        break;
      case LabelRequirement::Op::Exists:
        if (!has) return false;
        break;
      case LabelRequirement::Op::DoesNotExist:
        if (has) return false;
        break;
    }
  }
  return true;
}

std::string LabelSelector::describe() const {
  if (empty()) return "everything";
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ",") + s; };
  for (const auto& [k, v] : matchLabels) add(k + "=" + v);
  for (const auto& r : matchExpressions) {
    std::string vals;
    for (const auto& v : r.values) vals += (vals.empty() ? "" : ",") + v;
    switch (r.op) {
      case LabelRequirement::Op::In: add(r.key + " in (" + vals + ")"); break;
      case LabelRequirement::Op::NotIn: add(r.key + " notin (" + vals + ")"); break;
      case LabelRequirement::Op::Exists: add(r.key); break;
      case LabelRequirement::Op::DoesNotExist: add("!" + r.key); break;
    }
  }
  return out;
}

EnablementSelectors EnablementSelectors::istioDefault() {
  const std::string mode = "istio.io/dataplane-mode";
  EnablementSelectors s;
  EnablementSelector byPod;
  byPod.podSelector.matchLabels = {{mode, "ambient"}};
  EnablementSelector byNamespace;
  byNamespace.podSelector.matchExpressions = {{mode, LabelRequirement::Op::NotIn, {"none"}}};
  byNamespace.namespaceSelector.matchLabels = {{mode, "ambient"}};
  s.entries = {byPod, byNamespace};
  return s;
}

std::optional<size_t> EnablementSelectors::match(const LabelMap& podLabels, const LabelMap& namespaceLabels) const {
  for (size_t i = 0; i < entries.size(); i++)
    if (entries[i].podSelector.matches(podLabels) && entries[i].namespaceSelector.matches(namespaceLabels)) return i;
  return std::nullopt;
}

bool EnablementSelectors::matchesNamespace(const LabelMap& namespaceLabels) const {
  return std::any_of(entries.begin(), entries.end(), [&](const EnablementSelector& e) {
    return !e.namespaceSelector.empty() && e.namespaceSelector.matches(namespaceLabels);
  });
}

std::string EnablementSelectors::describeEntry(size_t i) const {
  if (i >= entries.size()) return "no entry";
  return "enablement selector " + std::to_string(i) + " (pods: " + entries[i].podSelector.describe() +
         "; namespaces: " + entries[i].namespaceSelector.describe() + ")";
}

json EnablementSelectors::toJson() const {
  json out = json::array();
  for (const auto& e : entries) {
    json j = json::object();
    if (!e.podSelector.empty()) j["podSelector"] = selectorJson(e.podSelector);
    if (!e.namespaceSelector.empty()) j["namespaceSelector"] = selectorJson(e.namespaceSelector);
    // An entry of two empty selectors (every pod) stays explicit.
    if (j.empty()) j["podSelector"] = json::object();
    out.push_back(j);
  }
  return out;
}

Result<EnablementSelectors> parseEnablementSelectors(const json& list) {
  if (!list.is_array()) return bad("enablement selectors", "must be a list of {podSelector, namespaceSelector}");
  if (list.empty())
    return bad("enablement selectors", "the list is empty (it would select no pod; leave it unset for Istio's default)");
  EnablementSelectors out;
  for (size_t i = 0; i < list.size(); i++) {
    const std::string at = "enablement selector [" + std::to_string(i) + "]";
    const json& e = list[i];
    if (!e.is_object()) return bad(at, "must be {podSelector, namespaceSelector}");
    SLUICE_TRY(onlyKeys(e, at, {"podSelector", "namespaceSelector"}));
    if (!e.contains("podSelector") && !e.contains("namespaceSelector"))
      return bad(at, "has neither podSelector nor namespaceSelector (write podSelector: {} to select every pod)");
    EnablementSelector s;
    auto pod = parseSelector(e.value("podSelector", json(nullptr)), at + ".podSelector");
    SLUICE_TRY(pod);
    auto ns = parseSelector(e.value("namespaceSelector", json(nullptr)), at + ".namespaceSelector");
    SLUICE_TRY(ns);
    s.podSelector = std::move(*pod);
    s.namespaceSelector = std::move(*ns);
    out.entries.push_back(std::move(s));
  }
  return out;
}

Result<EnablementSelectors> parseEnablementSelectorsText(const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return EnablementSelectors::istioDefault();
  auto j = yamlToJson(text);
  if (!j.ok()) return Error::msg("enablement selectors: not YAML: " + j.error().message, EINVAL);
  return parseEnablementSelectors(*j);
}

}  // namespace sluice::kube
