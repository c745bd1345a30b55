#include "tools/config_file.h"

#include <toml++/toml.h>

#include <charconv>
#include <cstdint>
#include <fstream>
#include <istream>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace kvrail::tools {
namespace {

// What a key's value must be, from its option.
enum class Kind { kFlag, kInteger, kNumber, kString };

Kind KindOf(const CLI::Option& option) {
  if (option.get_expected_min() == 0) return Kind::kFlag;
  const std::string type = option.get_type_name();
  const std::string base = type.substr(0, type.find_first_of(": "));
  if (base == "INT" || base == "UINT") return Kind::kInteger;
  if (base == "FLOAT") return Kind::kNumber;
  return Kind::kString;
}

bool IsList(const CLI::Option& option) { return option.get_items_expected_max() > 1; }

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kFlag:
      return "a boolean";
    case Kind::kInteger:
      return "an integer";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
  }
  return "";
}

std::string Where(const std::string& path, const toml::source_region& source) {
  std::ostringstream out;
  out << path << ":" << source.begin.line << ":" << source.begin.column;
  return out.str();
}

[[noreturn]] void Refuse(const std::string& where, const std::string& message) {
  throw CLI::ConfigError(where + ": " + message, CLI::ExitCodes::ConfigError);
}

std::string ShortestDouble(double value) {
  char buffer[64];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// A scalar TOML value as the string the option would take on the command line, or nothing when
// its type is not the option's.
std::optional<std::string> ScalarInput(const toml::node& node, Kind kind) {
  switch (kind) {
    case Kind::kFlag:
      if (const auto* b = node.as_boolean()) return b->get() ? "true" : "false";
      return std::nullopt;
    case Kind::kInteger:
      if (const auto* i = node.as_integer()) return std::to_string(i->get());
      return std::nullopt;
    case Kind::kNumber:
      if (const auto* i = node.as_integer()) return std::to_string(i->get());
      if (const auto* f = node.as_floating_point()) return ShortestDouble(f->get());
      return std::nullopt;
    case Kind::kString:
      if (const auto* s = node.as_string()) return s->get();
      return std::nullopt;
  }
  return std::nullopt;
}

std::string TypeOf(const toml::node& node) {
  std::ostringstream out;
  out << node.type();
  return out.str();
}

// The item for `key = node`, checked against `option`.
CLI::ConfigItem Item(const std::string& where, const std::string& key, const toml::node& node,
                     const CLI::Option& option) {
  const Kind kind = KindOf(option);
  const std::string wanted = std::string(KindName(kind)) + " (--" + key + " " +
                             (kind == Kind::kFlag ? "is a flag" : option.get_type_name()) + ")";
  CLI::ConfigItem item;
  item.name = key;
  if (const toml::array* array = node.as_array()) {
    if (!IsList(option))
      Refuse(where, "key '" + key + "' takes one value, not an array: " + wanted);
    for (const toml::node& element : *array) {
      std::optional<std::string> input = ScalarInput(element, kind);
      if (!input) {
        Refuse(where, "key '" + key + "' wants an array of " + KindName(kind) + " values, not " +
                          TypeOf(element) + " elements");
      }
      item.inputs.push_back(*std::move(input));
    }
    return item;
  }
  std::optional<std::string> input = ScalarInput(node, kind);
  if (!input) Refuse(where, "key '" + key + "' wants " + wanted + ", not a " + TypeOf(node));
  item.inputs.push_back(*std::move(input));
  return item;
}

std::vector<CLI::ConfigItem> Items(const toml::table& table, const CLI::App* command,
                                   const std::string& path) {
  std::vector<CLI::ConfigItem> items;
  for (const auto& [toml_key, node] : table) {
    const std::string key(toml_key.str());
    const std::string where = Where(path, toml_key.source());
    if (node.is_table()) {
      Refuse(where, "key '" + key + "' is a table; keys are flat, one per long flag");
    }
    if (command == nullptr) {  // from_config: no command to check against
      CLI::ConfigItem item;
      item.name = key;
      item.inputs.push_back(node.is_boolean() ? (node.as_boolean()->get() ? "true" : "false")
                                              : node.value_or(std::string()));
      items.push_back(std::move(item));
      continue;
    }
    const CLI::Option* option = command->get_option_no_throw("--" + key);
    if (option == nullptr) {
      Refuse(where, "unknown key '" + key + "': `kvrail " + command->get_name() + "` has no --" +
                        key + " flag (keys are its long flags without --)");
    }
    if (!option->get_configurable()) {
      Refuse(where, "key '" + key + "' cannot be set in a config file");
    }
    items.push_back(Item(where, key, node, *option));
  }
  return items;
}

toml::table Parse(std::istream& input, const std::string& path) {
  try {
    return toml::parse(input, path);
  } catch (const toml::parse_error& error) {
    Refuse(Where(path, error.source()), std::string(error.description()));
  }
}

// An option's value as TOML, from what the command line or the file gave, else its default.
// Empty when it has neither.
std::string TomlValue(const CLI::Option& option, bool default_also) {
  std::vector<std::string> values = option.results();
  if (values.empty() && default_also && !option.get_default_str().empty()) {
    values = {option.get_default_str()};
  }
  if (values.empty()) return "";
  const Kind kind = KindOf(option);
  auto scalar = [kind](const std::string& value) -> std::string {
    switch (kind) {
      case Kind::kFlag:
        return CLI::detail::to_flag_value(value) > 0 ? "true" : "false";
      case Kind::kInteger:
      case Kind::kNumber:
        return value;
      case Kind::kString:
        break;
    }
    std::ostringstream out;
    out << toml::value<std::string>(value);
    return out.str();
  };
  if (kind == Kind::kFlag) return scalar(values.back());  // a repeated flag: the last wins
  if (!IsList(option)) return scalar(values.back());
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i == 0 ? "" : ", ") + scalar(values[i]);
  }
  return out + "]";
}

// `text` as '#' comment lines of at most 100 columns.
std::string Comment(const std::string& text) {
  std::string out, line = "#";
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    if (line.size() + 1 + word.size() > 100 && line != "#") {
      out += line + "\n";
      line = "#";
    }
    line += " " + word;
  }
  return out + line + "\n";
}

}  // namespace

std::string TomlConfig::to_config(const CLI::App* app, bool default_also, bool write_description,
                                  std::string prefix) const {
  std::string out = "# kvrail " + app->get_name() +
                    ": one key per long flag, flags on the command line win over this file\n";
  for (const CLI::Option* option : app->get_options()) {
    if (!option->get_configurable() || option->get_lnames().empty()) continue;
    if (option->get_group().empty()) continue;  // hidden, as in --help (a renamed flag)
    const std::string key = prefix + option->get_lnames().front();
    out += "\n";
    if (write_description && !option->get_description().empty()) {
      out += Comment(option->get_description());
    }
    const std::string value = TomlValue(*option, default_also);
    if (value.empty()) {
      out += "# " + key + " = " +
             (KindOf(*option) == Kind::kFlag ? "true"
                                             : "...  (unset; " + option->get_type_name() + ")") +
             "\n";
    } else {
      out += key + " = " + value + "\n";
    }
  }
  return out;
}

std::vector<CLI::ConfigItem> TomlConfig::from_config(std::istream& input) const {
  return Items(Parse(input, "config"), nullptr, "config");
}

std::vector<CLI::ConfigItem> TomlConfig::Read(const CLI::App& command, const std::string& path) {
  std::ifstream input(path, std::ios::binary);
  if (!input) throw CLI::FileError::Missing(path);
  return Items(Parse(input, path), &command, path);
}

void AddConfigFile(CLI::App* command, std::ostream& out) {
  command->config_formatter(std::make_shared<TomlConfig>());
  command
      ->add_option_function<std::string>(
          "--config",
          [command](const std::string& path) {
            for (const CLI::ConfigItem& item : TomlConfig::Read(*command, path)) {
              CLI::Option* option = command->get_option("--" + item.name);
              if (option->count() > 0) continue;  // the command line wins
              if (option->get_expected_min() == 0) {
                option->add_result(option->get_flag_value(item.name, item.inputs.front()));
              } else {
                option->add_result(item.inputs);
              }
              option->run_callback();  // its validators and its variable, as for a flag
            }
          },
          "A TOML file whose keys are this command's long flags without -- (tp-size = 2); flags "
          "on the command line win over it. --print-config writes one")
      ->configurable(false)
      ->check(CLI::ExistingFile);
  command
      ->add_flag_callback(
          "--print-config",
          [command, &out] {
            // Options added after this one have not run their callbacks (their validators) yet.
            for (CLI::Option* option : command->get_options()) {
              if (option->get_lnames() == std::vector<std::string>{"print-config"}) continue;
              if (option->count() > 0 && !option->get_callback_run()) option->run_callback();
            }
            out << command->config_to_str(true, true);
            out.flush();
            throw CLI::Success();
          },
          "Print the effective configuration (--config's file, the flags over it, the defaults) "
          "as TOML and exit")
      ->configurable(false);
}

}  // namespace kvrail::tools
