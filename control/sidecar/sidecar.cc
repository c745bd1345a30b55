// Sidecar: Start's checks of the options both roles take, and which role's sidecar starts
// (prefill_sidecar.h, decode_sidecar.h); everything else is theirs and sidecar_core.h's.
#include "control/sidecar/sidecar.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/sidecar/prefill_sidecar.h"
#include "control/sidecar/sidecar_core.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

Sidecar::Sidecar(std::unique_ptr<SidecarCore> core) : core_(std::move(core)) {}

absl::StatusOr<std::unique_ptr<Sidecar>> Sidecar::Start(const SidecarOptions& options) {
  if (options.tp_size < 1 || options.tp_rank < 0 || options.tp_rank >= options.tp_size) {
    return absl::InvalidArgumentError(absl::StrFormat("--tp-rank %d must lie in [0, --tp-size %d)",
                                                      options.tp_rank, options.tp_size));
  }
  if (options.dp_size < 1 || options.dp_rank < 0 || options.dp_rank >= options.dp_size) {
    return absl::InvalidArgumentError(absl::StrFormat("--dp-rank %d must lie in [0, --dp-size %d)",
                                                      options.dp_rank, options.dp_size));
  }
  if (options.pp_size < 1 || options.pp_rank < 0 || options.pp_rank >= options.pp_size) {
    return absl::InvalidArgumentError(absl::StrFormat("--pp-rank %d must lie in [0, --pp-size %d)",
                                                      options.pp_rank, options.pp_size));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, absl::Duration>{"--handshake-timeout", options.handshake_timeout},
        {"--connect-timeout", options.connect_timeout},
        {"--fence-timeout", options.fence_timeout},
        {"--fence-wait", options.fence_wait},
        {"--preallocation-wait", options.timeouts.unmatched_preallocation_timeout}}) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " ", absl::FormatDuration(value), " must be positive"));
    }
  }
  // spdlog's registry is made on first use, inside libspdlog, whose guard TSan does not see: made
  // here, before the threads that log, for an engine that runs the sidecar in-process.
  (void)spdlog::default_logger_raw();
  // The one place that asks which role this is.
  std::unique_ptr<SidecarCore> core;
  switch (options.role) {
    case Role::kPrefill:
      core = std::make_unique<PrefillSidecar>(options);
      break;
    case Role::kDecode:
      core = std::make_unique<DecodeSidecar>(options);
      break;
  }
  KVRAIL_RETURN_IF_ERROR(core->Start());
  return std::unique_ptr<Sidecar>(new Sidecar(std::move(core)));
}

Sidecar::~Sidecar() { Stop(); }

void Sidecar::Stop() { core_->Stop(); }

const std::string& Sidecar::engine_endpoint() const { return core_->api->endpoint(); }
const std::string& Sidecar::cachepd_endpoint() const { return core_->cachepd_advertised; }
const std::string& Sidecar::session_id() const { return core_->session_id; }

SidecarStats Sidecar::stats() const { return core_->Stats(); }
const metrics::Registry& Sidecar::metrics() const { return core_->metrics.registry(); }

}  // namespace kvrail::sidecar
