// sluice-standin: the ztunnel stand-in as a program, for live demos. One JSON
// object per line on stdout for every event; logs go to stderr. Per pod
// (--netns, or the current namespace) or as the node proxy that gets its
// pods from the node agent over ZDS (--zds).
#include <signal.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "test/standin/node_proxy.h"
#include "test/standin/standin.h"

namespace {

constexpr const char* kUsage =
    "Usage: sluice-standin [options]\n"
    "A stand-in for ztunnel's sockets: listeners on the outbound, inbound, HBONE\n"
    "and DNS ports; prints one JSON object per line for every connection/query.\n"
    "\n"
    "Options:\n"
    "  --netns PATH          open every socket in that network namespace\n"
    "                        (e.g. /run/netns/NAME)\n"
    "  --zds PATH            be the node proxy: connect to the node agent's ZDS\n"
    "                        socket (retrying while nobody listens) and run the\n"
    "                        listeners inside each pod it hands over; prints the\n"
    "                        per-pod events (add, del, snapshot, proxy-*) too\n"
    "  --retry-interval MS   with --zds: retry a pod whose proxy failed to start\n"
    "                        this often, default 5000\n"
    "  --no-ipv6             0.0.0.0 listeners and DNS on 127.0.0.1 only\n"
    "  --no-reuseport        no SO_REUSEPORT on listeners\n"
    "  --no-transparent      no IP_TRANSPARENT on the relay/HBONE listeners\n"
    "  --outbound-port N     default 15001\n"
    "  --inbound-port N      default 15006\n"
    "  --hbone-port N        default 15008\n"
    "  --dns-port N          default 15053\n"
    "  --mark N              SO_MARK of every socket, default 0x539\n"
    "  --dns-answer-v4 IP    A answer, default 10.96.0.99\n"
    "  --dns-answer-v6 IP    AAAA answer, default fd00::99\n"
    "  --upstream ADDR       relay to ADDR (1.2.3.4:80 or [::1]:80) instead of\n"
    "                        the original destination\n"
    "  --verbose             debug logs on stderr\n"
    "  -h, --help            this text\n";

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::optional<unsigned long> parseNumber(const std::string& text, unsigned long max) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  unsigned long v = std::strtoul(text.c_str(), &end, 0);  // 0x539 or 1337
  if (errno != 0 || *end != '\0' || v > max || text[0] == '-') return std::nullopt;
  return v;
}

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "sluice-standin: %s\nTry 'sluice-standin --help'.\n", message.c_str());
  std::exit(2);
}

std::mutex stdoutMutex;

void printLine(const std::string& line) {
  std::lock_guard lock(stdoutMutex);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

/// Starts the stand-in with @p start, prints {"ready":true} (no event line
/// comes before it) and serves until SIGINT/SIGTERM; 1 when it cannot start.
template <typename Start>
int serveUntilSignal(Start start, const sigset_t& signals) {
  std::unique_lock readyLock(stdoutMutex);
  auto running = start();
  if (!running) {
    std::fprintf(stderr, "sluice-standin: %s\n", running.error().message.c_str());
    return 1;
  }
  std::fputs("{\"ready\":true}\n", stdout);
  std::fflush(stdout);
  readyLock.unlock();
  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  (*running)->stop();
  return 0;
}

/// The JSON fields of one connection/query (without braces).
std::string connectionFields(const sluice::ProxyEvent& ev) {
  return "\"listener\":" + jsonString(ev.listener) + ",\"port\":" + std::to_string(ev.listenerPort) +
         ",\"orig_dst\":" + jsonString(ev.origDst) + ",\"orig_dst_from\":" + jsonString(ev.origDstFrom) +
         ",\"peer\":" + jsonString(ev.peer) +
         ",\"detail\":" + jsonString(ev.detail);
}

/// --zds: the node proxy until SIGINT/SIGTERM. Connection lines carry the
/// pod's uid; every other event is {"event": TYPE, ...}.
int runNodeProxy(const sluice::StandInConfig& perPod, const std::string& zdsPath, long retryMs,
                 const sigset_t& signals) {
  sluice::NodeProxyConfig config;
  sluice::StandInConfig proxy = perPod;
  // ztunnel decides per pod whether it has IPv6; --no-ipv6 turns it off.
  proxy.detectIpv6 = perPod.ipv6;
  proxy.backlog = sluice::NodeProxyConfig::defaultProxyConfig().backlog;
  config.proxy = proxy;
  config.zdsPath = zdsPath;
  config.retryInterval = std::chrono::milliseconds(retryMs);
  config.onEvent = [](const sluice::NodeProxyEvent& e) {
    if (e.type == "connection") {
      printLine("{\"uid\":" + jsonString(e.uid) + "," + connectionFields(e.proxy) + "}");
      return;
    }
    std::string line = "{\"event\":" + jsonString(e.type);
    if (e.connection) line += ",\"connection\":" + std::to_string(e.connection);
    if (!e.uid.empty()) {
      line += ",\"uid\":" + jsonString(e.uid) + ",\"name\":" + jsonString(e.name) +
              ",\"namespace\":" + jsonString(e.ns);
    }
    printLine(line + ",\"detail\":" + jsonString(e.detail) + "}");
  };
  return serveUntilSignal([&] { return sluice::NodeProxyStandIn::start(config); }, signals);
}

}  // namespace

int main(int argc, char** argv) {
  sluice::StandInConfig config;
  bool verbose = false;
  std::string zdsPath;
  long retryMs = 5000;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usageError("option " + arg + " needs a value");
      return argv[++i];
    };
    auto port = [&]() -> uint16_t {
      std::string v = value();
      auto n = parseNumber(v, 65535);
      if (!n || *n == 0) usageError("invalid port '" + v + "' for " + arg);
      return static_cast<uint16_t>(*n);
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--netns") {
      config.netnsPath = value();
    } else if (arg == "--zds") {
      zdsPath = value();
      if (zdsPath.empty()) usageError("--zds needs a path");
    } else if (arg == "--retry-interval") {
      std::string v = value();
      auto n = parseNumber(v, 3600 * 1000);
      if (!n || *n == 0) usageError("invalid retry interval '" + v + "' (milliseconds, 1..3600000)");
      retryMs = static_cast<long>(*n);
    } else if (arg == "--no-ipv6") {
      config.ipv6 = false;
    } else if (arg == "--no-reuseport") {
      config.reuseport = false;
    } else if (arg == "--no-transparent") {
      config.transparent = false;
    } else if (arg == "--outbound-port") {
      config.outboundPort = port();
    } else if (arg == "--inbound-port") {
      config.inboundPort = port();
    } else if (arg == "--hbone-port") {
      config.hbonePort = port();
    } else if (arg == "--dns-port") {
      config.dnsPort = port();
    } else if (arg == "--mark") {
      std::string v = value();
      auto n = parseNumber(v, 0xffffffffUL);
      if (!n) usageError("invalid mark '" + v + "'");
      config.mark = static_cast<uint32_t>(*n);
    } else if (arg == "--dns-answer-v4") {
      config.dnsAnswerV4 = value();
    } else if (arg == "--dns-answer-v6") {
      config.dnsAnswerV6 = value();
    } else if (arg == "--upstream") {
      config.upstreamOverride = value();
    } else if (arg == "--verbose") {
      verbose = true;
    } else {
      usageError("unknown option '" + arg + "'");
    }
  }

  if (!zdsPath.empty() && !config.netnsPath.empty()) {
    usageError("--zds and --netns exclude each other (the node proxy gets each pod's netns over ZDS)");
  }

  // stdout carries the JSON lines only.
  auto logger = spdlog::stderr_color_mt("sluice-standin");
  spdlog::set_default_logger(logger);
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::warn);

  // Blocked before any thread starts, so only sigwait() below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (!zdsPath.empty()) return runNodeProxy(config, zdsPath, retryMs, signals);

  config.onEvent = [](const sluice::ProxyEvent& ev) { printLine("{" + connectionFields(ev) + "}"); };

  return serveUntilSignal([&] { return sluice::ProxyStandIn::start(config); }, signals);
}
