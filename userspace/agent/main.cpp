// sluiced: see userspace/agent/agent.h and docs/agent-api.md.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "userspace/api/logging.h"
#include "userspace/agent/options.h"

int main(int argc, char** argv) {
  using namespace sluice;
  auto args = agent::parseDaemonArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) {
    std::cerr << "sluiced: " << args.error().message << "\n";
    return 2;
  }
  if (args->help) {
    std::cout << agent::daemonUsage();
    return 0;
  }
  if (args->version) {
    std::cout << "sluiced " << SLUICE_VERSION << "\n";
    return 0;
  }
  setupLogging("sluiced", args->logFormat, args->logLevel);
  // Signals are taken synchronously by this thread; every other thread
  // inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto a = agent::Agent::start(args->agent);
  if (!a.ok()) {
    spdlog::error("{}", a.error().message);
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("got {}; stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  // An update stops; an uninstall (the DaemonSet gone) also cleans up.
  (*a)->shutdown();
  return 0;
}
