// The Prometheus text exposition format, version 0.0.4, parsed into samples (pure).
//
// What `kvrail top` reads from each sidecar's and bootstrap server's `GET /metrics`. The rules
// are those of Prometheus' text format: `# HELP name text` (escapes \\ and \n), `# TYPE name
// counter|gauge|histogram|summary|untyped` (once per family, before its samples), any other `#`
// line a comment, empty lines ignored, and a sample `name{label="value",...} value [timestamp]`
// with label values escaped as \\, \" and \n, a value a float (NaN, +Inf and -Inf included)
// and the timestamp integer milliseconds.
#ifndef KVRAIL_TOOLS_TOP_EXPOSITION_H_
#define KVRAIL_TOOLS_TOP_EXPOSITION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrail::top {

enum class MetricType { kUntyped, kCounter, kGauge, kHistogram, kSummary };

// Labels in the order the line gave them (label names are unique within a sample).
using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  std::string name;  // the series name as written: `x_bucket`, `x_sum` for histogram x
  Labels labels;
  double value = 0;
  std::optional<int64_t> timestamp_ms;

  // The value of label `key`, or "" when the sample has none (Prometheus' own rule: an
  // absent label and an empty one are the same).
  std::string Label(absl::string_view key) const;
};

struct Family {
  std::string name;
  MetricType type = MetricType::kUntyped;
  std::string help;  // unescaped
};

struct Exposition {
  std::vector<Family> families;  // those with a HELP or TYPE line, in order of appearance
  std::vector<Sample> samples;   // in order of appearance

  // The samples named exactly `name`.
  std::vector<const Sample*> Named(absl::string_view name) const;
  // The family `name`'s declared type; kUntyped when it has no TYPE line.
  MetricType TypeOf(absl::string_view name) const;
};

// Parses a whole exposition. Fails with InvalidArgument on the first line that breaks the
// format, naming its 1-based line number and the rule, e.g.
// "line 7: label value of 'peer' is not quoted: kvrail_bytes_total{peer=a} 1".
absl::StatusOr<Exposition> ParseExposition(absl::string_view text);

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_EXPOSITION_H_
