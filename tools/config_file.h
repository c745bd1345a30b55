// `--config FILE` and `--print-config` on a kvrail subcommand (`kvrail sidecar`, `kvrail
// bootstrap`): a TOML file whose every key is one of the command's long flags without its `--`
// (`role = "decode"`, `tp-size = 2`, `populate-arena = false`, arrays for list options), read
// with toml++, flags on the command line winning over the file.
//
// The keys are the command's options themselves, looked up when the file is read: a flag added
// to the command, before or after AddConfigFile, is a key without anything else to do.
//
// CLI11 2.1 reads a config file only for the top-level app, so the file is applied here, from
// the `--config` option's callback: each key the command line left unset gets the file's value
// and its option's callback (validators included) runs, as if given as a flag.
#ifndef KVRAIL_TOOLS_CONFIG_FILE_H_
#define KVRAIL_TOOLS_CONFIG_FILE_H_

#include <CLI/CLI.hpp>
#include <iosfwd>
#include <string>
#include <vector>

namespace kvrail::tools {

// TOML for CLI11: from_config parses with toml++ (errors carry its line and column), to_config
// writes a command's effective options, each under its description, in the order of --help.
// Keys are flat: one per long flag; a table or an inline table is an error.
class TomlConfig : public CLI::Config {
 public:
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;
  // Throws CLI::ConfigError naming the line and column of a TOML syntax error.
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

  // Reads `path` for `command`: every key must name one of its options, with a value of that
  // option's type (a boolean for a flag, an integer for INT/UINT, a number for FLOAT, a string
  // otherwise; an array of them for a list option). Throws CLI::ConfigError naming the file,
  // the line and the key otherwise.
  static std::vector<CLI::ConfigItem> Read(const CLI::App& command, const std::string& path);
};

// Adds `--config FILE` and `--print-config` to `command` and makes TomlConfig its config
// formatter. `--print-config` writes the effective configuration (the file's values, the
// command line's over them, the defaults) to `out` as TOML and ends the parse with
// CLI::Success (exit 0) before the command's callback runs or its required flags are checked:
// an operator's starting file, `kvrail sidecar --print-config > sidecar.toml`.
void AddConfigFile(CLI::App* command, std::ostream& out);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_CONFIG_FILE_H_
