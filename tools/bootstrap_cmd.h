// `kvrail bootstrap`: the CachePD bootstrap server of one prefill node (CACHEPD §2), in the
// foreground. It logs one line per accepted registration to stderr, and refusals (refused
// registrations, requests and connections the server closed) at most once per peer address per
// log interval, with the count held back; it exits 0 on SIGINT or SIGTERM. docs/SECURITY.md
// says what each bound and option guards against.
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
  // A file holding the token PUT /route must carry as "Authorization: Bearer <token>"; empty:
  // no token (the reference's wire, unchanged).
  std::string bearer_token_file;
  // GET /metrics (Prometheus text) on this port, bound to metrics_host; -1: off, 0: a free
  // port, reported in the "bootstrap ready" line as metrics=host:port.
  int metrics_port = -1;
  std::string metrics_host = "127.0.0.1";
  // The node's sizes and contract, fixed before any rank registers; 0 or empty: the first
  // accepted registration fixes them (CACHEPD §2.1).
  int world_size = 0;
  int dp_size = 0;
  std::string cache_layout_file;  // a contract (CACHEPD §4), compared in canonical form
  // Server bounds (control/bootstrap/server.h).
  size_t max_connections = 512;
  double request_deadline_seconds = 5;
  size_t max_body_bytes = size_t{1} << 20;
  double log_interval_seconds = 10;  // refusals: one line per peer address per interval
  std::string log_format = "text";   // or "json" (tools/json_log_format.h)
  // --registry etcd://host:port (control/registry/bootstrap_store.h): the node description
  // published leased for registry_ttl_seconds, and the registrations kept there and replayed at
  // start. Empty: off.
  std::string registry;
  double registry_ttl_seconds = 10;
  // --cachepd-revision: "auto" (both revisions, the default), "snapshot" or "2026-09" (behave
  // as a server of that revision alone; control/bootstrap/server.h).
  std::string cachepd_revision = "auto";
};

// Serves until SIGINT or SIGTERM arrives. Returns the process exit code: 0 after a signal,
// 1 when the address cannot be bound or a file option cannot be read (after one "error: ..."
// line on stderr).
// Blocks SIGINT and SIGTERM in the calling thread (and so in the server's threads) and waits
// for them with sigwait; the caller must not rely on other handlers for them.
int RunBootstrap(const BootstrapOptions& options);

// Adds the `bootstrap` subcommand to `app`; its callback stores RunBootstrap's result in
// `exit_code`.
void AddBootstrap(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_BOOTSTRAP_CMD_H_
