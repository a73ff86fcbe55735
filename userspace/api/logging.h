// Log set-up shared by sluice's daemons and plugins: spdlog on stderr, as
// plain text or one JSON object per line.
#pragma once

#include <string>

#include "base/result.h"

namespace sluice {

/// Checks "text"/"json" and a spdlog level name; errors name the bad value.
Status validateLogOptions(const std::string& format, const std::string& level);

/// Installs a stderr logger named `name` as spdlog's default.
/// text: "2026-12-02T17:00:00.123Z info sluiced: message"
/// json: {"time":"...","level":"info","logger":"sluiced","msg":"..."}
/// With @p file, every line is appended there too (a CNI plugin's stderr is
/// dropped by runtimes when it succeeds); a file that cannot be opened is
/// said on stderr, not fatal.
void setupLogging(const std::string& name, const std::string& format, const std::string& level,
                  const std::string& file = "");

}  // namespace sluice
