#include "control/bootstrap/registry.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/bootstrap/refusal.h"

namespace kvrail::bootstrap {
namespace {

absl::Status Conflict(absl::string_view member, absl::string_view got, absl::string_view first) {
  return Refuse(Refusal::kConflict,
                absl::StrCat("registration ", member, ": ", got,
                             " differs from the node's first registration, which set ", first,
                             "; every rank of a prefill node registers the same value "
                             "(CACHEPD §2.1)"));
}

// Where two canonical layouts part, with a little of each, for the incompatible-layouts error.
std::string LayoutDifference(absl::string_view stored, absl::string_view got) {
  size_t at = 0;
  while (at < stored.size() && at < got.size() && stored[at] == got[at]) ++at;
  const size_t from = at < 24 ? 0 : at - 24;
  auto excerpt = [from](absl::string_view wire) { return absl::CHexEscape(wire.substr(from, 64)); };
  return absl::StrCat("the canonical forms differ from byte ", at, ": registered first \"...",
                      excerpt(stored), "...\", this one \"...", excerpt(got), "...\"");
}

std::string PlacementText(const std::optional<plan::PipelineLayout>& pipeline, bool placed) {
  if (!placed || !pipeline.has_value()) {
    return "no stage placement (one stage holding every field)";
  }
  std::vector<std::string> stages;
  for (const auto& stage : pipeline->fields_by_stage) {
    stages.push_back(absl::StrCat("[", absl::StrJoin(stage, ","), "]"));
  }
  return absl::StrCat("placement [", absl::StrJoin(stages, ","), "]");
}

// §12.3 step 6: the stored placement (`placed`: the first registration gave it) against a
// registration's. No placement means one stage holding every field.
bool SamePlacement(const plan::PipelineLayout& stored, bool placed,
                   const std::optional<plan::PipelineLayout>& got) {
  if (!got.has_value()) return stored.pp_size == 1;
  if (!placed) return got->pp_size == 1;
  return stored.pp_size == got->pp_size && stored.fields_by_stage == got->fields_by_stage;
}

absl::Status Unconfigured(absl::string_view member, absl::string_view got,
                          absl::string_view configured, absl::string_view flag) {
  return Refuse(Refusal::kConflict,
                absl::StrCat("registration ", member, ": ", got, " differs from ", configured,
                             ", which this bootstrap server was started with (", flag,
                             "); every rank of the node must register it"));
}

// The 16 bytes of an IPv6 address, an IPv4 one as IPv4-mapped; nullopt for anything else.
std::optional<std::array<unsigned char, 16>> AddressBytes(const std::string& ip) {
  std::array<unsigned char, 16> bytes{};
  in_addr v4{};
  if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) {
    bytes[10] = bytes[11] = 0xFF;
    std::memcpy(bytes.data() + 12, &v4, 4);
    return bytes;
  }
  if (::inet_pton(AF_INET6, ip.c_str(), bytes.data()) == 1) return bytes;
  return std::nullopt;
}

// Whether the connection came from the host a rank registered (its rank_ip, an IP literal).
bool FromHostOf(const std::string& peer_ip, const RankEndpoint& registered) {
  const auto peer = AddressBytes(peer_ip);
  const auto rank = AddressBytes(registered.rank_ip);
  return peer.has_value() && rank.has_value() && *peer == *rank;
}

}  // namespace

nlohmann::ordered_json NodeDescription::ToJson(layout::Revision revision) const {
  const bool r2026 = revision == layout::Revision::k2026_09;
  nlohmann::ordered_json out;
  out["prefill_tp_size"] = world_size ? nlohmann::ordered_json(*world_size) : nullptr;
  out["prefill_dp_size"] = dp_size ? nlohmann::ordered_json(*dp_size) : nullptr;
  if (r2026) out["prefill_pp_size"] = pipeline ? pipeline->pp_size : 1;
  out["cache_layout"] = cache_layout ? nlohmann::ordered_json(*cache_layout) : nullptr;
  if (r2026) {
    out["cache_fields_by_stage"] =
        pipeline ? nlohmann::ordered_json(pipeline->fields_by_stage) : nullptr;
  }
  return out;
}

PrefillRegistry::PrefillRegistry(ConfiguredNode configured) : configured_(std::move(configured)) {}

absl::StatusOr<RegistrationOutcome> PrefillRegistry::Register(const ParsedRegistration& parsed,
                                                              const Registrant& from) {
  const PrefillRegistration& r = parsed.registration;
  if (configured_.world_size.has_value() && *configured_.world_size != r.world_size) {
    return Unconfigured("world_size", absl::StrCat(r.world_size),
                        absl::StrCat(*configured_.world_size), "--world-size");
  }
  if (configured_.dp_size.has_value() && *configured_.dp_size != r.dp_size) {
    return Unconfigured("dp_size", absl::StrCat(r.dp_size), absl::StrCat(*configured_.dp_size),
                        "--dp-size");
  }
  if (configured_.canonical_layout.has_value() &&
      *configured_.canonical_layout != parsed.comparable_layout) {
    return Unconfigured(
        "cache_layout", "the contract",
        absl::StrCat("the configured one (",
                     LayoutDifference(*configured_.canonical_layout, parsed.comparable_layout),
                     ")"),
        "--cache-layout");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (node_.cache_layout.has_value()) {
    // §12.3 step 6: the placement, the order inside each stage included.
    if (!SamePlacement(*node_.pipeline, placed_, r.pipeline)) {
      return Refuse(
          Refusal::kReferenceRaises,
          absl::StrCat("registration cache_fields_by_stage: CachePD prefill ranks "
                       "registered incompatible field placement: ",
                       PlacementText(r.pipeline, true), " differs from the first registration's ",
                       PlacementText(node_.pipeline, placed_), " (CACHEPD §12.3)"));
    }
    // §2.1 step 1, §12.3 step 7: byte-for-byte comparison of the canonical forms, both in the
    // 2026-09 form whatever form each registration came in.
    if (comparable_layout_ != parsed.comparable_layout) {
      return Refuse(Refusal::kReferenceRaises,
                    absl::StrCat("registration cache_layout: CachePD prefill ranks registered "
                                 "incompatible layouts: ",
                                 LayoutDifference(comparable_layout_, parsed.comparable_layout),
                                 " (CACHEPD §2.1, §12.3)"));
    }
    if (*node_.world_size != r.world_size) {
      return Conflict("world_size", absl::StrCat(r.world_size), absl::StrCat(*node_.world_size));
    }
    if (*node_.dp_size != r.dp_size) {
      return Conflict("dp_size", absl::StrCat(r.dp_size), absl::StrCat(*node_.dp_size));
    }
  }

  RegistrationOutcome outcome;
  outcome.world_size = r.world_size;
  if (r.role == kPrefillRole) {
    outcome.recorded = true;
    outcome.dp_group = r.DpGroup();
    outcome.rank_in_group = r.RankInDpGroup();
    std::map<int, RankEndpoint>& group = table_[outcome.dp_group];
    auto it = group.find(outcome.rank_in_group);
    if (it == group.end()) {
      group.emplace(outcome.rank_in_group, r.endpoint);
      ++registered_ranks_;
    } else if (it->second != r.endpoint) {
      if (!from.has_token && !FromHostOf(from.peer_ip, it->second)) {
        return Refuse(
            Refusal::kConflict,
            absl::StrCat("registration engine_rank ", r.engine_rank, ": rank ",
                         outcome.rank_in_group, " of dp group ", outcome.dp_group,
                         " is registered at ", it->second.rank_ip, ":", it->second.rank_port,
                         "; another endpoint (", r.endpoint.rank_ip, ":", r.endpoint.rank_port,
                         ") is accepted only from ", it->second.rank_ip,
                         " (the rank restarting on its host) or with the bootstrap token, and "
                         "this came from ",
                         from.peer_ip.empty() ? std::string("an unknown address") : from.peer_ip,
                         " without it"));
      }
      outcome.replaced = it->second;
      it->second = r.endpoint;
    }
  }
  if (!node_.cache_layout.has_value()) {
    node_.world_size = r.world_size;
    node_.dp_size = r.dp_size;
    node_.cache_layout = parsed.canonical_layout;
    node_.layout_revision = r.contract.revision;
    comparable_layout_ = parsed.comparable_layout;
    placed_ = r.pipeline.has_value();
    node_.pipeline = r.pipeline.value_or(plan::PipelineLayout::SingleStage(r.contract));
  }
  outcome.registered_ranks = registered_ranks_;
  return outcome;
}

NodeDescription PrefillRegistry::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  return node_;
}

absl::StatusOr<RankEndpoint> PrefillRegistry::Lookup(int64_t rank_in_group,
                                                     int64_t dp_group) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto group = table_.find(static_cast<int>(std::clamp<int64_t>(dp_group, -1, kMaxWorldSize)));
  if (group == table_.end() || dp_group != group->first) {
    return Refuse(Refusal::kReferenceRaises,
                  absl::StrCat("route: no prefill rank has registered in dp group ", dp_group,
                               " (CACHEPD §2.2)"));
  }
  auto rank =
      group->second.find(static_cast<int>(std::clamp<int64_t>(rank_in_group, -1, kMaxWorldSize)));
  if (rank == group->second.end() || rank_in_group != rank->first) {
    return Refuse(Refusal::kReferenceRaises,
                  absl::StrCat("route: prefill rank ", rank_in_group, " of dp group ", dp_group,
                               " has not registered (CACHEPD §2.2)"));
  }
  return rank->second;
}

RouteTable PrefillRegistry::Table() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

}  // namespace kvrail::bootstrap
