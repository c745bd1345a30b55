#include "tools/json_log_format.h"

#include <spdlog/common.h>
#include <spdlog/details/log_msg.h>

#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

namespace kvrail::tools {
namespace {

bool KeyStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }

bool KeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

// "2026-12-03T21:45:00.123Z": UTC, milliseconds.
std::string Timestamp(std::chrono::system_clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  const int64_t millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[80];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(millis));
  return text;
}

// An integer without a sign's '+' or leading zeros becomes a JSON number; the rest stays text.
nlohmann::json Value(const std::string& text) {
  if (text.empty() || text.size() > 18) return text;
  const size_t digits = text[0] == '-' ? 1 : 0;
  if (digits == text.size() || (text[digits] == '0' && text.size() > digits + 1)) return text;
  for (size_t i = digits; i < text.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return text;
  }
  return std::stoll(text);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> KeyValuePairs(std::string_view message) {
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t i = 0;
  while (i < message.size()) {
    while (i < message.size() && message[i] == ' ') ++i;  // the next word
    const size_t start = i;
    while (i < message.size() && KeyChar(message[i])) ++i;
    const bool pair = i > start && KeyStart(message[start]) && i < message.size() &&
                      message[i] == '=' && (i + 1 == message.size() || message[i + 1] != '=');
    if (!pair) {
      while (i < message.size() && message[i] != ' ') ++i;  // not a pair: skip the word
      continue;
    }
    std::string key(message.substr(start, i - start));
    ++i;  // '='
    std::string value;
    if (i < message.size() && message[i] == '"') {
      for (++i; i < message.size() && message[i] != '"'; ++i) {
        if (message[i] == '\\' && i + 1 < message.size() &&
            (message[i + 1] == '"' || message[i + 1] == '\\')) {
          ++i;
        }
        value.push_back(message[i]);
      }
      if (i < message.size()) ++i;  // the closing '"'
    } else {
      while (i < message.size() && message[i] != ' ') value.push_back(message[i++]);
    }
    pairs.emplace_back(std::move(key), std::move(value));
  }
  return pairs;
}

JsonLogFormatter::JsonLogFormatter(std::string role, int rank)
    : role_(std::move(role)), rank_(rank) {}

void JsonLogFormatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  const std::string text(msg.payload.data(), msg.payload.size());
  nlohmann::ordered_json line;
  line["ts"] = Timestamp(msg.time);
  const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
  line["level"] = std::string(level.data(), level.size());
  line["logger"] = std::string(msg.logger_name.data(), msg.logger_name.size());
  if (!role_.empty()) line["role"] = role_;
  if (rank_ >= 0) line["rank"] = rank_;
  line["msg"] = text;
  for (auto& [key, value] : KeyValuePairs(text)) {
    const bool fixed = key == "ts" || key == "level" || key == "logger" || key == "role" ||
                       key == "rank" || key == "msg";
    line[fixed ? "kv_" + key : key] = Value(value);
  }
  const std::string out =
      line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  dest.append(out.data(), out.data() + out.size());
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const {
  return std::make_unique<JsonLogFormatter>(role_, rank_);
}

}  // namespace kvrail::tools
