#include "engine/transport/ucx/ucx_context.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/transport/ucx/ucx_options.h"

namespace kvrail::transport {
namespace ucx_internal {

std::string Ucs(ucs_status_t status) { return ucs_status_string(status); }

absl::Status FromUcs(ucs_status_t status, const std::string& context) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrFormat("%s: UCX: %s", context, Ucs(status));
  if (status == UCS_ERR_CANCELED) return absl::CancelledError(message);
  return absl::UnavailableError(message);
}

namespace {

// Peer-failure handling over shared memory (off in UCX 1.13 by default): a peer whose process
// died then fails its endpoints through UCX's keepalive, where writes to it would otherwise stay
// pending for ever. UCX takes this one from the environment only: set through ucp_config_modify
// (MM_ERROR_HANDLING), endpoints accept UCP_ERR_HANDLING_MODE_PEER but two such processes never
// see each other die (measured: a writer's flush to a SIGKILLed target hung for a minute; with
// the variable in either process's environment it failed within the keepalive interval). So the
// first transport of a process sets UCX_MM_ERROR_HANDLING=y, unless the operator chose any of
// the variables that name it.
void EnableSharedMemoryPeerFailure() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"UCX_MM_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING",
                             "UCX_SYSV_ERROR_HANDLING", "UCX_SM_ERROR_HANDLING"}) {
      if (std::getenv(name) != nullptr) return;
    }
    setenv("UCX_MM_ERROR_HANDLING", "y", /*overwrite=*/0);
  });
}

// Whether UCX may load a transport whose name `tls` lists (UCX's own default loads them all).
bool TlsMayUse(const std::string& tls, std::initializer_list<const char*> names) {
  if (tls.empty()) return true;
  for (const char* name : names) {
    if (tls.find(name) != std::string::npos) return true;
  }
  return false;
}

// A UCX memory-units setting such as "64K", "65536" or "8kb"; 0 when it is none of those.
uint64_t ParseUcxBytes(const char* text) {
  char* end = nullptr;
  const unsigned long long number = std::strtoull(text, &end, 10);
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "b") return number;
  if (unit == "k" || unit == "kb") return number << 10;
  if (unit == "m" || unit == "mb") return number << 20;
  return 0;
}

}  // namespace

absl::Status CheckOptions(const UcxOptions& options) {
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx options: lanes is %d; at least 1 is needed", options.lanes));
  }
  if (options.max_write_bytes == 0) {
    return absl::InvalidArgumentError("ucx options: max_write_bytes is 0; it must be > 0");
  }
  constexpr uint64_t kMinSeg = uint64_t{1} << 10, kMaxSeg = uint64_t{16} << 20;
  if (options.tcp_tx_seg_bytes != 0 &&
      (options.tcp_tx_seg_bytes < kMinSeg || options.tcp_tx_seg_bytes > kMaxSeg)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: tcp_tx_seg_bytes is %u; it must be 0 (UCX's default) or in [%u, %u]",
        options.tcp_tx_seg_bytes, kMinSeg, kMaxSeg));
  }
  if (options.tcp_rx_seg_bytes != 0 && options.tcp_rx_seg_bytes < options.tcp_tx_seg_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: tcp_rx_seg_bytes is %u, smaller than tcp_tx_seg_bytes %u; a peer's rx "
        "segment must hold this side's tx segment",
        options.tcp_rx_seg_bytes, options.tcp_tx_seg_bytes));
  }
  if (options.keepalive_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx options: keepalive_interval is ",
                                                   absl::FormatDuration(options.keepalive_interval),
                                                   "; it must be >= 0"));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("ucx options: connect_timeout is ",
                                                   absl::FormatDuration(options.connect_timeout),
                                                   "; it must be > 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Context> CreateContext(const UcxOptions& options) {
  if (TlsMayUse(options.tls, {"sm", "posix", "sysv", "mm"})) EnableSharedMemoryPeerFailure();
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return FromUcs(s, "ucx: ucp_config_read");
  if (!options.tls.empty() &&
      (s = ucp_config_modify(config, "TLS", options.tls.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(
        absl::StrFormat("ucx options: tls \"%s\" was rejected by UCX: %s", options.tls, Ucs(s)));
  }
  if (!options.net_devices.empty() &&
      (s = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return absl::InvalidArgumentError(absl::StrFormat(
        "ucx options: net_devices \"%s\" was rejected by UCX: %s", options.net_devices, Ucs(s)));
  }
  // Allocate wants UCX's posix segments, which another process maps through an fd, before its
  // SysV ones, which no fd names (UCX's default order is sysv first).
  if (std::getenv("UCX_ALLOC_PRIO") == nullptr &&
      (s = ucp_config_modify(config, "ALLOC_PRIO", "md:posix,md:sysv,huge,thp,md:*,mmap,heap")) !=
          UCS_OK) {
    ucp_config_release(config);
    return FromUcs(s, "ucx: setting ALLOC_PRIO");
  }
  // UCX takes a transport's settings by their name inside the transport ("TX_SEG_SIZE" for
  // UCX_TCP_TX_SEG_SIZE, applied to every transport that has it), and only when that transport
  // is loaded: it warns about the rest. The operator's environment wins over each of them.
  struct Setting {
    std::string key;
    std::string value;
    std::vector<std::string> env;  // the variables that name it
  };
  const bool tcp = TlsMayUse(options.tls, {"tcp"});
  std::vector<Setting> settings;
  if (tcp) {
    for (const auto& [name, value] : UcxTuningEnvironment(options)) {
      settings.push_back({name.substr(std::string("UCX_TCP_").size()), value, {name}});
    }
    // connect(2) without blocking: a blocking one to an unreachable host would hold the lane's
    // thread, and so every other peer's posts on that lane, through the kernel's SYN retries.
    settings.push_back({"CONN_NB", "y", {"UCX_TCP_CONN_NB"}});
  }
  if (options.keepalive_interval > absl::ZeroDuration()) {
    const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(options.keepalive_interval));
    settings.push_back({"KEEPALIVE_INTERVAL", absl::StrCat(ms, "ms"), {"UCX_KEEPALIVE_INTERVAL"}});
    if (tcp) {
      const std::string seconds = absl::StrCat(std::max<int64_t>(1, (ms + 999) / 1000), "s");
      settings.push_back({"KEEPIDLE", seconds, {"UCX_TCP_KEEPIDLE"}});
      settings.push_back({"KEEPINTVL", seconds, {"UCX_TCP_KEEPINTVL"}});
    }
  }
  for (const Setting& setting : settings) {
    if (std::any_of(setting.env.begin(), setting.env.end(),
                    [](const std::string& name) { return std::getenv(name.c_str()) != nullptr; })) {
      continue;
    }
    if ((s = ucp_config_modify(config, setting.key.c_str(), setting.value.c_str())) != UCS_OK) {
      ucp_config_release(config);
      return FromUcs(s, absl::StrFormat("ucx: setting %s=%s", setting.env[0], setting.value));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // WAKEUP: an idle lane sleeps on its worker's event fd (RunLane), so a peer's message or a
  // socket that can take more wakes it at once. It changes transport selection only together
  // with UCP_FEATURE_TAG, which kvrail does not ask for.
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // workers of different lanes run at once
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) {
    return FromUcs(s, absl::StrFormat("ucx: ucp_init with tls \"%s\"", options.tls));
  }
  Context made{.context = context};
  // Over tcp UCX's puts can kill the target (see "Writes over tcp" in the header): writes go as
  // active messages of one tcp segment (less UCX's and our headers) wherever tcp may carry them.
  made.am_writes = tcp;
  uint64_t segment = options.tcp_tx_seg_bytes;
  if (const char* env = std::getenv("UCX_TCP_TX_SEG_SIZE"); env != nullptr) {
    segment = ParseUcxBytes(env);
  }
  if (segment == 0) segment = uint64_t{8} << 10;  // UCX's default
  made.am_slice_bytes = std::max<uint64_t>(segment, uint64_t{2} << 10) - 512;
  return made;
}

}  // namespace ucx_internal

namespace {

bool IsSharedMemoryTl(absl::string_view name) {
  return name == "sm" || name == "self" || name == "posix" || name == "sysv" || name == "xpmem" ||
         name == "cma" || name == "knem";
}

// Whether `tls` is not empty and each of its names passes `allowed`.
template <typename Allowed>
bool EveryTl(const std::string& tls, Allowed allowed) {
  if (tls.empty()) return false;  // UCX's default: every transport it finds
  for (absl::string_view name : absl::StrSplit(tls, ',')) {
    if (!allowed(name)) return false;
  }
  return true;
}

}  // namespace

bool SharedMemoryOnly(const std::string& tls) { return EveryTl(tls, IsSharedMemoryTl); }

bool TcpOnly(const std::string& tls) {
  return !SharedMemoryOnly(tls) && EveryTl(tls, [](absl::string_view name) {
    return name == "tcp" || IsSharedMemoryTl(name);
  });
}

uint64_t InflightBytesPerEndpoint(const UcxOptions& options) {
  if (options.max_inflight_bytes_per_endpoint != 0) return options.max_inflight_bytes_per_endpoint;
  if (SharedMemoryOnly(options.tls)) return uint64_t{1} << 20;
  if (TcpOnly(options.tls)) return uint64_t{4} << 20;
  return uint64_t{64} << 20;
}

std::vector<std::pair<std::string, std::string>> UcxTuningEnvironment(const UcxOptions& options) {
  std::vector<std::pair<std::string, std::string>> env;
  if (options.tcp_tx_seg_bytes != 0) {
    env.emplace_back("UCX_TCP_TX_SEG_SIZE", std::to_string(options.tcp_tx_seg_bytes));
  }
  if (options.tcp_rx_seg_bytes != 0) {
    env.emplace_back("UCX_TCP_RX_SEG_SIZE", std::to_string(options.tcp_rx_seg_bytes));
  }
  return env;
}

}  // namespace kvrail::transport
