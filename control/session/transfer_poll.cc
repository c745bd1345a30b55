#include "control/session/transfer_poll.h"

#include <algorithm>

namespace kvrail::session {

absl::string_view TransferPollName(TransferPoll poll) {
  switch (poll) {
    case TransferPoll::kFailed:
      return "Failed";
    case TransferPoll::kBootstrapping:
      return "Bootstrapping";
    case TransferPoll::kBootstrapped:
      return "Bootstrapped";
    case TransferPoll::kWaitingForInput:
      return "WaitingForInput";
    case TransferPoll::kTransferring:
      return "Transferring";
    case TransferPoll::kSuccess:
      return "Success";
  }
  return "Unknown";
}

std::optional<TransferPoll> TransferPollFromCode(int code) {
  if (code < 0 || code > static_cast<int>(TransferPoll::kSuccess)) return std::nullopt;
  return static_cast<TransferPoll>(code);
}

TransferPoll UpdateTransferPoll(std::optional<TransferPoll> current, TransferPoll update) {
  if (!current.has_value()) return update;
  if (*current == TransferPoll::kFailed || update == TransferPoll::kFailed) {
    return TransferPoll::kFailed;
  }
  return std::max(*current, update);
}

}  // namespace kvrail::session
