// Whether a DaemonSet's pods still belong on a node: its pod template's
// nodeSelector and required node affinity against the Node's labels and
// name, as the scheduler judges them. The agent asks it on SIGTERM: a
// DaemonSet that no longer selects its node will not bring the agent back
// there (Istio's node agent checks the required node affinity so:
// cni/pkg/nodeagent/server.go; this also reads the nodeSelector). Pure;
// unit-tested.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace sluice::kube {

enum class NodeSelection {
  Selected,     ///< the template's pods may run on the node
  NotSelected,  ///< they may not: a label or the name rules the node out
  Unknown,      ///< something this does not judge (an unknown operator, a malformed term)
};

struct NodeSelectionAnswer {
  NodeSelection selection = NodeSelection::Unknown;
  std::string why;  ///< one phrase: the requirement that decided, or what could not be judged
};

/// @p daemonSet: an apps/v1 DaemonSet; @p node: a v1 Node.
NodeSelectionAnswer daemonSetSelectsNode(const nlohmann::json& daemonSet, const nlohmann::json& node);

}  // namespace sluice::kube
