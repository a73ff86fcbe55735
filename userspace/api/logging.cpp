#include "userspace/api/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <ctime>
#include <nlohmann/json.hpp>

namespace sluice {

namespace {

std::string isoTime(spdlog::log_clock::time_point tp) {
  auto t = spdlog::log_clock::to_time_t(tp);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(tp.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ms));
  return out;
}

// One JSON object per line; the message is escaped by nlohmann::json.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::json j = {{"time", isoTime(msg.time)},
                        {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                                              spdlog::level::to_string_view(msg.level).size())},
                        {"logger", std::string(msg.logger_name.data(), msg.logger_name.size())},
                        {"msg", std::string(msg.payload.data(), msg.payload.size())}};
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

Status validateLogOptions(const std::string& format, const std::string& level) {
  if (format != "text" && format != "json")
    return Error::msg("invalid --log-format '" + format + "' (expected text or json)", EINVAL);
  if (spdlog::level::from_str(level) == spdlog::level::off && level != "off")
    return Error::msg("invalid --log-level '" + level + "' (expected trace, debug, info, warn, error or off)", EINVAL);
  return {};
}

void setupLogging(const std::string& name, const std::string& format, const std::string& level,
                  const std::string& file) {
  auto logger = spdlog::get(name);
  if (!logger) logger = spdlog::stderr_logger_mt(name);
  // The stderr sink stays; a file sink of an earlier call is replaced.
  logger->sinks().resize(1);
  std::string fileError;
  if (!file.empty()) {
    try {
      logger->sinks().push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
      // Each line reaches the file at once (a plugin logs a few lines and
      // may be killed before exit).
      logger->flush_on(spdlog::level::trace);
    } catch (const spdlog::spdlog_ex& e) {
      fileError = e.what();
    }
  }
  spdlog::set_default_logger(logger);
  if (format == "json")
    logger->set_formatter(std::make_unique<JsonFormatter>());
  else
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %l %n: %v", spdlog::pattern_time_type::utc);
  spdlog::set_level(spdlog::level::from_str(level));
  if (!fileError.empty()) spdlog::warn("cannot log to {}: {}", file, fileError);
}

}  // namespace sluice
