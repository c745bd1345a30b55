#include "control/bootstrap/python_json.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::bootstrap {
namespace {

void AppendEscapedUnit(uint32_t unit, std::string& out) {
  absl::StrAppendFormat(&out, "\\u%04x", unit);
}

// Decodes one UTF-8 sequence at text[i]; returns U+FFFD and advances one byte on bad input.
uint32_t NextCodePoint(const std::string& text, size_t& i) {
  const auto byte = [&text](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  int extra = 0;
  uint32_t cp = 0;
  if (lead < 0x80) {
    ++i;
    return lead;
  } else if ((lead & 0xE0) == 0xC0) {
    extra = 1;
    cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    extra = 2;
    cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    extra = 3;
    cp = lead & 0x07;
  } else {
    ++i;
    return 0xFFFD;
  }
  for (int k = 1; k <= extra; ++k) {
    if (i + k >= text.size() || (byte(i + k) & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  i += extra + 1;
  return cp > 0x10FFFF ? 0xFFFD : cp;
}

void AppendString(const std::string& text, std::string& out) {
  out.push_back('"');
  for (size_t i = 0; i < text.size();) {
    const uint32_t cp = NextCodePoint(text, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (cp >= 0x20 && cp <= 0x7E) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x10000) {
      AppendEscapedUnit(cp, out);
    } else {
      const uint32_t v = cp - 0x10000;
      AppendEscapedUnit(0xD800 + (v >> 10), out);
      AppendEscapedUnit(0xDC00 + (v & 0x3FF), out);
    }
  }
  out.push_back('"');
}

void Append(const nlohmann::ordered_json& value, std::string& out) {
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        AppendString(it.key(), out);
        out += ": ";
        Append(it.value(), out);
      }
      out.push_back('}');
      return;
    }
    case nlohmann::ordered_json::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        Append(item, out);
      }
      out.push_back(']');
      return;
    }
    case nlohmann::ordered_json::value_t::string:
      AppendString(value.get_ref<const std::string&>(), out);
      return;
    default:  // null, booleans and numbers print the same in both languages
      out += value.dump();
      return;
  }
}

}  // namespace

std::string DumpPythonJson(const nlohmann::ordered_json& value) {
  std::string out;
  Append(value, out);
  return out;
}

}  // namespace kvrail::bootstrap
