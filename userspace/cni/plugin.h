// What names sluice-cni, for the plugin (cni.h) and its installer
// (install.h) alike: the installer needs the plugin's type and nothing else
// of it, so it includes this instead of cni.h.
#pragma once

namespace sluice::cni {

/// The plugin's `type` in a conflist, and its binary's name.
inline constexpr const char* kPluginType = "sluice-cni";

/// The spec version this plugin implements (and answers VERSION with).
inline constexpr const char* kSpecVersion = "1.0.0";

}  // namespace sluice::cni
