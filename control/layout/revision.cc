#include "control/layout/revision.h"

namespace kvrail::layout {

absl::string_view RevisionName(Revision revision) {
  switch (revision) {
    case Revision::kSnapshot:
      return "snapshot";
    case Revision::k2026_09:
      return "2026-09";
  }
  return "snapshot";
}

std::optional<Revision> RevisionFromName(absl::string_view name) {
  if (name == "snapshot") return Revision::kSnapshot;
  if (name == "2026-09") return Revision::k2026_09;
  return std::nullopt;
}

}  // namespace kvrail::layout
