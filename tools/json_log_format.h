// `--log-format json`: spdlog lines as one JSON object per line, for a log collector.
//
// A line is {"ts", "level", "logger", "role", "rank", "msg", ...}: `msg` is the message as the
// text format prints it, and each `key=value` pair the message carries (the project's log lines
// are key=value: `event=curve_refused peer=tcp://10.0.0.2:5000 reason="bad key"`) is also a
// field of its own, after the fixed ones: a quoted value unquoted (`\"` and `\\` undone), an
// integer as a JSON number, anything else as a string. A key that would overwrite a fixed field
// is kept with a `kv_` prefix. Bytes that are not UTF-8 come out as U+FFFD.
#ifndef KVRAIL_TOOLS_JSON_LOG_FORMAT_H_
#define KVRAIL_TOOLS_JSON_LOG_FORMAT_H_

#include <spdlog/formatter.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvrail::tools {

// The `key=value` pairs of a message, in order. A pair is a word of the message that starts
// with a key ([A-Za-z_][A-Za-z0-9_.-]*) and one '='; its value runs to the next space, or, when it
// starts with '"', to the closing unescaped '"'. Other words are skipped.
std::vector<std::pair<std::string, std::string>> KeyValuePairs(std::string_view message);

class JsonLogFormatter : public spdlog::formatter {
 public:
  // `role` and `rank` go on every line ("role": "prefill", "rank": 0); an empty role and a
  // negative rank are left out.
  JsonLogFormatter(std::string role, int rank);

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;

 private:
  std::string role_;
  int rank_;
};

// The values `--log-format` accepts.
inline constexpr const char* kLogFormatHelp =
    "Log lines on stderr: text (key=value), or json (one object per line: ts, level, logger, "
    "role, rank, msg and each key=value pair as a field)";

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_JSON_LOG_FORMAT_H_
