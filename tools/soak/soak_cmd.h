// `kvrail soak`: its flags and callback (tools/soak/soak.h does the work).
#ifndef KVRAIL_TOOLS_SOAK_SOAK_CMD_H_
#define KVRAIL_TOOLS_SOAK_SOAK_CMD_H_

#include <CLI/CLI.hpp>

namespace kvrail::soak {

// Adds `soak` to `app`; its callback sets `exit_code` (0 every check held, 1 a check failed or
// the run could not start, printing one "error: ..." line on stderr).
void AddSoak(CLI::App& app, int& exit_code);

}  // namespace kvrail::soak

#endif  // KVRAIL_TOOLS_SOAK_SOAK_CMD_H_
