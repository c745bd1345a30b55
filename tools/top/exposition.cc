#include "tools/top/exposition.h"

#include <charconv>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvrail::top {
namespace {

constexpr size_t kQuotedLineChars = 120;  // how much of a bad line an error quotes

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsBlank(char c) { return c == ' ' || c == '\t'; }

absl::string_view Trim(absl::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

bool EndsWith(absl::string_view s, absl::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A cursor over one line; each Take* consumes what it returns.
class LineReader {
 public:
  explicit LineReader(absl::string_view line) : rest_(line) {}

  bool AtEnd() const { return rest_.empty(); }
  char Peek() const { return rest_.empty() ? '\0' : rest_.front(); }
  void Skip() { rest_.remove_prefix(1); }
  void SkipBlanks() {
    while (!rest_.empty() && IsBlank(rest_.front())) rest_.remove_prefix(1);
  }
  // A metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), or "" when none starts here. Label names are
  // the same without ':'; the caller checks.
  absl::string_view TakeName() {
    size_t n = 0;
    if (!rest_.empty() && IsNameStart(rest_[0])) {
      while (n < rest_.size() && IsNameChar(rest_[n])) ++n;
    }
    absl::string_view name = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return name;
  }
  // Up to the next blank (or the end).
  absl::string_view TakeToken() {
    size_t n = 0;
    while (n < rest_.size() && !IsBlank(rest_[n])) ++n;
    absl::string_view token = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return token;
  }
  absl::string_view Rest() const { return rest_; }

 private:
  absl::string_view rest_;
};

absl::StatusOr<double> ParseValue(absl::string_view token) {
  if (token.empty()) return absl::InvalidArgumentError("empty value");
  absl::string_view digits = token;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  double value = 0;
  if (!digits.empty() && digits.front() != '-' && digits.front() != '+') {
    // from_chars takes "inf", "infinity" and "nan" in any case, as Go's ParseFloat does.
    std::from_chars_result r = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (r.ec == std::errc() && r.ptr == digits.data() + digits.size()) return value;
  } else if (token.front() == '-' && token.size() > 1 && token[1] != '+' && token[1] != '-') {
    absl::StatusOr<double> magnitude = ParseValue(token.substr(1));
    if (magnitude.ok()) return -*magnitude;
  }
  return absl::InvalidArgumentError(absl::StrCat("value '", token, "' is not a number"));
}

// The HELP text's escapes: \\ and \n (any other backslash stays as written).
std::string UnescapeHelp(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '\\' || text[i + 1] == 'n')) {
      out.push_back(text[i + 1] == 'n' ? '\n' : '\\');
      ++i;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// A quoted label value after its opening quote: up to the closing quote, unescaping \\, \"
// and \n; fails on another escape or a missing closing quote.
absl::StatusOr<std::string> TakeLabelValue(LineReader& in, absl::string_view label) {
  std::string value;
  while (!in.AtEnd()) {
    char c = in.Peek();
    in.Skip();
    if (c == '"') return value;
    if (c != '\\') {
      value.push_back(c);
      continue;
    }
    char escaped = in.Peek();
    if (escaped != '\\' && escaped != '"' && escaped != 'n') {
      return absl::InvalidArgumentError(
          absl::StrCat("label value of '", label, "' has an escape other than \\\\, \\\" or \\n"));
    }
    in.Skip();
    value.push_back(escaped == 'n' ? '\n' : escaped);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("label value of '", label, "' has no closing quote"));
}

absl::StatusOr<Labels> TakeLabels(LineReader& in) {
  Labels labels;
  in.Skip();  // '{'
  while (true) {
    in.SkipBlanks();
    if (in.Peek() == '}') break;
    absl::string_view name = in.TakeName();
    if (name.empty() || name.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError("expected a label name ([a-zA-Z_][a-zA-Z0-9_]*)");
    }
    for (const auto& [seen, unused] : labels) {
      if (seen == name) {
        return absl::InvalidArgumentError(absl::StrCat("label '", name, "' appears twice"));
      }
    }
    in.SkipBlanks();
    if (in.Peek() != '=') {
      return absl::InvalidArgumentError(absl::StrCat("label '", name, "' has no '='"));
    }
    in.Skip();
    in.SkipBlanks();
    if (in.Peek() != '"') {
      return absl::InvalidArgumentError(absl::StrCat("label value of '", name, "' is not quoted"));
    }
    in.Skip();
    absl::StatusOr<std::string> value = TakeLabelValue(in, name);
    if (!value.ok()) return value.status();
    labels.emplace_back(std::string(name), *std::move(value));
    in.SkipBlanks();
    if (in.Peek() == ',') {
      in.Skip();
      continue;
    }
    if (in.Peek() != '}') {
      return absl::InvalidArgumentError("labels are not closed with '}'");
    }
    break;
  }
  in.Skip();  // '}'
  return labels;
}

absl::StatusOr<MetricType> ParseType(absl::string_view word) {
  if (word == "counter") return MetricType::kCounter;
  if (word == "gauge") return MetricType::kGauge;
  if (word == "histogram") return MetricType::kHistogram;
  if (word == "summary") return MetricType::kSummary;
  if (word == "untyped") return MetricType::kUntyped;
  return absl::InvalidArgumentError(
      absl::StrCat("TYPE '", word, "' is not counter, gauge, histogram, summary or untyped"));
}

class Parser {
 public:
  absl::Status Line(absl::string_view line) {
    line = Trim(line);
    if (line.empty()) return absl::OkStatus();
    if (line.front() == '#') return Comment(line);
    return SampleLine(line);
  }
  Exposition Take() { return std::move(out_); }

 private:
  Family* FamilyNamed(absl::string_view name) {
    for (Family& family : out_.families) {
      if (family.name == name) return &family;
    }
    return nullptr;
  }
  Family& FamilyFor(absl::string_view name) {
    if (Family* family = FamilyNamed(name)) return *family;
    out_.families.push_back(Family{std::string(name)});
    return out_.families.back();
  }

  // `# HELP name text` and `# TYPE name type`; any other `#` line is a comment.
  absl::Status Comment(absl::string_view line) {
    LineReader in(line.substr(1));
    in.SkipBlanks();
    absl::string_view keyword = in.TakeToken();
    if (keyword != "HELP" && keyword != "TYPE") return absl::OkStatus();
    in.SkipBlanks();
    absl::string_view name = in.TakeName();
    if (name.empty() || (!in.AtEnd() && !IsBlank(in.Peek()))) {
      return absl::InvalidArgumentError(absl::StrCat(keyword, " needs a metric name"));
    }
    in.SkipBlanks();
    Family& family = FamilyFor(name);
    if (keyword == "HELP") {
      if (seen_help_.count(std::string(name))) {
        return absl::InvalidArgumentError(absl::StrCat("second HELP for '", name, "'"));
      }
      seen_help_.insert(std::string(name));
      family.help = UnescapeHelp(in.Rest());
      return absl::OkStatus();
    }
    if (seen_type_.count(std::string(name))) {
      return absl::InvalidArgumentError(absl::StrCat("second TYPE for '", name, "'"));
    }
    if (sampled_.count(std::string(name))) {
      return absl::InvalidArgumentError(
          absl::StrCat("TYPE for '", name, "' comes after its samples"));
    }
    absl::StatusOr<MetricType> type = ParseType(Trim(in.Rest()));
    if (!type.ok()) return type.status();
    seen_type_.insert(std::string(name));
    family.type = *type;
    return absl::OkStatus();
  }

  // The family a series belongs to: `x` for x_bucket, x_sum and x_count of a histogram (or
  // summary) x declared before; else the series' own name.
  absl::string_view FamilyOf(absl::string_view series) {
    for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
      if (!EndsWith(series, suffix)) continue;
      absl::string_view base = series.substr(0, series.size() - suffix.size());
      const Family* family = FamilyNamed(base);
      if (family == nullptr) continue;
      if (family->type == MetricType::kHistogram ||
          (family->type == MetricType::kSummary && suffix != "_bucket")) {
        return base;
      }
    }
    return series;
  }

  absl::Status SampleLine(absl::string_view line) {
    LineReader in(line);
    Sample sample;
    sample.name = std::string(in.TakeName());
    if (sample.name.empty()) {
      return absl::InvalidArgumentError("expected a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
    }
    in.SkipBlanks();
    if (in.Peek() == '{') {
      absl::StatusOr<Labels> labels = TakeLabels(in);
      if (!labels.ok()) return labels.status();
      sample.labels = *std::move(labels);
    }
    in.SkipBlanks();
    absl::string_view value_token = in.TakeToken();
    if (value_token.empty()) return absl::InvalidArgumentError("the sample has no value");
    absl::StatusOr<double> value = ParseValue(value_token);
    if (!value.ok()) return value.status();
    sample.value = *value;
    in.SkipBlanks();
    if (!in.AtEnd()) {
      absl::string_view stamp = in.TakeToken();
      int64_t ms = 0;
      if (!absl::SimpleAtoi(stamp, &ms)) {
        return absl::InvalidArgumentError(
            absl::StrCat("timestamp '", stamp, "' is not integer milliseconds"));
      }
      sample.timestamp_ms = ms;
      in.SkipBlanks();
      if (!in.AtEnd()) {
        return absl::InvalidArgumentError("text after the timestamp");
      }
    }
    absl::string_view family = FamilyOf(sample.name);
    if (absl::Status valid = CheckHistogram(family, sample); !valid.ok()) return valid;
    sampled_.insert(std::string(family));
    out_.samples.push_back(std::move(sample));
    return absl::OkStatus();
  }

  absl::Status CheckHistogram(absl::string_view family, const Sample& sample) {
    if (out_.TypeOf(family) != MetricType::kHistogram) return absl::OkStatus();
    if (sample.name == family) {
      return absl::InvalidArgumentError(absl::StrCat("histogram '", family,
                                                     "' has a sample without _bucket, _sum "
                                                     "or _count"));
    }
    if (!EndsWith(sample.name, "_bucket")) return absl::OkStatus();
    std::string le = sample.Label("le");
    if (le.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(sample.name, " has no 'le' label"));
    }
    absl::StatusOr<double> bound = ParseValue(le);
    if (!bound.ok() || std::isnan(*bound)) {
      return absl::InvalidArgumentError(
          absl::StrCat(sample.name, " has le=\"", le, "\", not a bucket bound"));
    }
    return absl::OkStatus();
  }

  Exposition out_;
  absl::flat_hash_set<std::string> seen_help_, seen_type_, sampled_;
};

}  // namespace

std::string Sample::Label(absl::string_view key) const {
  for (const auto& [name, value] : labels) {
    if (name == key) return value;
  }
  return "";
}

std::vector<const Sample*> Exposition::Named(absl::string_view name) const {
  std::vector<const Sample*> named;
  for (const Sample& sample : samples) {
    if (sample.name == name) named.push_back(&sample);
  }
  return named;
}

MetricType Exposition::TypeOf(absl::string_view name) const {
  for (const Family& family : families) {
    if (family.name == name) return family.type;
  }
  return MetricType::kUntyped;
}

absl::StatusOr<Exposition> ParseExposition(absl::string_view text) {
  Parser parser;
  int number = 0;
  while (!text.empty()) {
    ++number;
    size_t end = text.find('\n');
    absl::string_view line = text.substr(0, end);
    text.remove_prefix(end == absl::string_view::npos ? text.size() : end + 1);
    absl::Status status = parser.Line(line);
    if (!status.ok()) {
      absl::string_view quoted = Trim(line).substr(0, kQuotedLineChars);
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": ", status.message(), ": ", quoted));
    }
  }
  return parser.Take();
}

}  // namespace kvrail::top
