// The long-running subcommands: `kvrail sidecar`, `kvrail engine-sim` and `kvrail demo`.
#ifndef KVRAIL_TOOLS_SERVE_CMDS_H_
#define KVRAIL_TOOLS_SERVE_CMDS_H_

#include <CLI/CLI.hpp>

namespace kvrail::tools {

void AddSidecar(CLI::App& app, int& exit_code);
void AddEngineSim(CLI::App& app, int& exit_code);
void AddDemo(CLI::App& app, int& exit_code);
// `kvrail contract`: the CachePD contract (CACHEPD §4) of a model shape at one TP size, for an
// engine (or a test) that has no contract of its own yet.
void AddContract(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_SERVE_CMDS_H_
