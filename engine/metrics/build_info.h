// kvrail's version as the *_info metrics report it (kvrail_sidecar_info, kvrail_bootstrap_info);
// the Python package (python/pyproject.toml) carries the same.
#ifndef KVRAIL_ENGINE_METRICS_BUILD_INFO_H_
#define KVRAIL_ENGINE_METRICS_BUILD_INFO_H_

namespace kvrail::metrics {

inline constexpr char kKvrailVersion[] = "0.16.0";

}  // namespace kvrail::metrics

#endif  // KVRAIL_ENGINE_METRICS_BUILD_INFO_H_
