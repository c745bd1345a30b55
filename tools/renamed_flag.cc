#include "tools/renamed_flag.h"

#include <cstdio>
#include <string>

namespace kvrail::tools {
namespace {

constexpr int kExitUsage = 2;

// "demo", "bench kv": the names from below the top-level app down to `command`.
std::string CommandPath(const CLI::App& command) {
  std::string path = command.get_name();
  for (const CLI::App* up = command.get_parent(); up != nullptr && up->get_parent() != nullptr;
       up = up->get_parent()) {
    path = up->get_name() + " " + path;
  }
  return path;
}

}  // namespace

std::string RenamedFlagMessage(const CLI::App& command, const std::string& old_flag,
                               const std::string& new_flag) {
  return "kvrail " + CommandPath(command) + ": " + old_flag + " was renamed " + new_flag;
}

void AddRenamedFlag(CLI::App* command, const std::string& old_flag, const std::string& new_flag) {
  const std::string message = RenamedFlagMessage(*command, old_flag, new_flag);
  command
      ->add_option_function<std::string>(old_flag,
                                         [message](const std::string&) {
                                           std::fprintf(stderr, "error: %s\n", message.c_str());
                                           // RuntimeError: CLI11 prints nothing more, and kvrail
                                           // exits with its code.
                                           throw CLI::RuntimeError(kExitUsage);
                                         })
      ->group("")  // hidden: out of --help and --print-config
      ->trigger_on_parse();
}

}  // namespace kvrail::tools
