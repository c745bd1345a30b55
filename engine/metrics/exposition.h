// The Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/), written by hand: Debian has no
// Prometheus C++ client library. This file is the only place that knows the format.
//
// A scrape is a list of families; each family is written as
//   # HELP <name> <help, with \ and newline escaped>
//   # TYPE <name> counter|gauge|histogram
//   <name><suffix>{<label>="<value, with \, " and newline escaped>",...} <value>
// one line per sample, in the order given. A histogram's samples are its `_bucket` lines (with
// `le`, cumulative, the last `le="+Inf"`), then `_sum` and `_count`: Registry::Collect makes them
// so, and ExposeText writes what it is given.
#ifndef KVRAIL_ENGINE_METRICS_EXPOSITION_H_
#define KVRAIL_ENGINE_METRICS_EXPOSITION_H_

#include <string>
#include <utility>
#include <vector>

namespace kvrail::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// Label names and values, in the order they are written.
using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  std::string suffix;  // "" or, for a histogram, "_bucket", "_sum", "_count"
  Labels labels;
  double value = 0;
};

struct MetricFamily {
  std::string name;  // [a-zA-Z_:][a-zA-Z0-9_:]*
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<Sample> samples;
};

// A label value as the format escapes it: backslash as \\, double quote as \", newline as \n.
// HELP text escapes backslash and newline only.
std::string EscapeLabelValue(const std::string& value);
std::string EscapeHelp(const std::string& help);

// A sample value: integers without a fraction, "+Inf", "-Inf", "NaN", else the shortest
// decimal that reads back as the same double.
std::string FormatValue(double value);

// The whole exposition of `families`, each family's HELP and TYPE lines then its samples. A
// family without samples is written with its HELP and TYPE only.
std::string ExposeText(const std::vector<MetricFamily>& families);

// What GET /metrics answers with.
inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace kvrail::metrics

#endif  // KVRAIL_ENGINE_METRICS_EXPOSITION_H_
