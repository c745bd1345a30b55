// A flag a kvrail command had under another name: kept hidden (out of --help and --print-config),
// so that an old command line or config file fails at once with one line naming the new flag
// instead of doing something else, e.g.
//
//   error: kvrail demo: --transport was renamed --link (shm, tcp or verbs)
//
// on stderr and exit code 2, as any usage error. A config file key of the old name (a command
// with --config) fails the same way.
#ifndef KVRAIL_TOOLS_RENAMED_FLAG_H_
#define KVRAIL_TOOLS_RENAMED_FLAG_H_

#include <CLI/CLI.hpp>
#include <string>

namespace kvrail::tools {

// The line `command`'s `old_flag` fails with: "kvrail <command path>: <old_flag> was renamed
// <new_flag>", `new_flag` with what it takes, e.g. "--link (shm, tcp or verbs)".
std::string RenamedFlagMessage(const CLI::App& command, const std::string& old_flag,
                               const std::string& new_flag);

// Adds `old_flag` (taking a value, as it did) to `command`, hidden; its use prints
// RenamedFlagMessage as "error: ..." on stderr and ends the parse with exit code 2.
void AddRenamedFlag(CLI::App* command, const std::string& old_flag, const std::string& new_flag);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_RENAMED_FLAG_H_
