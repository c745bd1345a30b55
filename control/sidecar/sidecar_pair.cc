#include "control/sidecar/sidecar_pair.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/error.h"

namespace kvrail::sidecar::testing {

absl::StatusOr<std::unique_ptr<SidecarPair>> SidecarPair::Start(
    const std::function<void(SidecarOptions&)>& adjust, int prefill_tp) {
  std::unique_ptr<SidecarPair> pair(new SidecarPair());
  KVRAIL_RETURN_IF_ERROR(AddContext(pair->bootstrap_.Start("127.0.0.1", 0), "bootstrap server"));
  pair->bootstrap_address_ = absl::StrCat("127.0.0.1:", pair->bootstrap_.port());
  SidecarOptions options;
  options.engine_endpoint = "tcp://127.0.0.1:0";
  options.backend = "loopback";
  options.tls.clear();  // a UCX setting
  options.lanes = 1;
  for (int rank = 0; rank < prefill_tp; ++rank) {
    SidecarOptions prefill = options;
    prefill.role = Role::kPrefill;
    prefill.bootstrap = pair->bootstrap_address_;
    prefill.tp_size = prefill_tp;
    prefill.tp_rank = rank;
    if (adjust) adjust(prefill);
    KVRAIL_ASSIGN_OR_RETURN(std::unique_ptr<Sidecar> started, Sidecar::Start(prefill));
    pair->prefills_.push_back(std::move(started));
  }
  SidecarOptions decode = options;
  decode.role = Role::kDecode;
  if (adjust) adjust(decode);
  KVRAIL_ASSIGN_OR_RETURN(pair->decode_, Sidecar::Start(decode));
  return pair;
}

SidecarPair::~SidecarPair() {
  if (decode_) decode_->Stop();
  for (const std::unique_ptr<Sidecar>& prefill : prefills_) prefill->Stop();
  bootstrap_.Stop();
}

}  // namespace kvrail::sidecar::testing
