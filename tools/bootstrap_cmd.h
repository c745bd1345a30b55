// `kvrail bootstrap`: the CachePD bootstrap server of one prefill node (CACHEPD §2), in the
// foreground. It logs one line per registration to stderr and exits 0 on SIGINT or SIGTERM.
#ifndef KVRAIL_TOOLS_BOOTSTRAP_CMD_H_
#define KVRAIL_TOOLS_BOOTSTRAP_CMD_H_

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace kvrail::tools {

struct BootstrapOptions {
  // The reference binds every interface; a deployment usually wants the node's data-centre
  // address only (CACHEPD §11 item 3).
  std::string host = "0.0.0.0";
  int port = 0;  // 0: a free port, reported in the "event=listening" line
};

// Serves until SIGINT or SIGTERM arrives. Returns the process exit code: 0 after a signal,
// 1 when the address cannot be bound (after one "error: ..." line on stderr).
// Blocks SIGINT and SIGTERM in the calling thread (and so in the server's threads) and waits
// for them with sigwait; the caller must not rely on other handlers for them.
int RunBootstrap(const BootstrapOptions& options);

// Adds the `bootstrap` subcommand to `app`; its callback stores RunBootstrap's result in
// `exit_code`.
void AddBootstrap(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_BOOTSTRAP_CMD_H_
