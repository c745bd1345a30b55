#include "tools/plan_cmd.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/plan/copy_plan.h"
#include "control/plan/plan_json.h"
#include "control/plan/planner.h"
#include "engine/base/error.h"

namespace kvrail::tools {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<std::string> ReadFile(const std::string& path, ErrorCategory category,
                                     absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return MakeError(category, absl::StrCat(flag, ": cannot read file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<layout::Contract> LoadContract(const std::string& path, absl::string_view flag) {
  KVRAIL_ASSIGN_OR_RETURN(std::string text, ReadFile(path, ErrorCategory::kInvalidContract, flag));
  absl::StatusOr<layout::Contract> contract = layout::ParseContract(text);
  if (!contract.ok()) return AddContext(contract.status(), absl::StrCat(flag, " ", path));
  return contract;
}

absl::StatusOr<layout::Manifest> LoadManifest(const std::string& path, absl::string_view flag,
                                              const layout::Contract& contract) {
  KVRAIL_ASSIGN_OR_RETURN(std::string text, ReadFile(path, ErrorCategory::kInvalidManifest, flag));
  absl::StatusOr<layout::Manifest> manifest = layout::ParseManifest(text);
  if (!manifest.ok()) return AddContext(manifest.status(), absl::StrCat(flag, " ", path));
  KVRAIL_RETURN_IF_ERROR(
      AddContext(layout::ValidateManifest(*manifest, contract), absl::StrCat(flag, " ", path)));
  return manifest;
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
}

// One room's copies for every sending (p, d) pair.
absl::StatusOr<ordered_json> RoomCopies(const plan::Planner& planner,
                                        const layout::Contract& prefill,
                                        const layout::Contract& decode, const layout::Manifest& src,
                                        const layout::Manifest& dst) {
  if (src.prefix_len != dst.prefix_len || src.prompt_len != dst.prompt_len) {
    return MakeError(ErrorCategory::kInvalidManifest,
                     "the prefill and decode manifests disagree on (prefix_len, prompt_len) "
                     "(CACHEPD §5.2)");
  }
  ordered_json pairs = ordered_json::array();
  for (int p = 0; p < planner.prefill_tp_size(); ++p) {
    for (int d = 0; d < planner.decode_tp_size(); ++d) {
      plan::RegistrationOutcome outcome = planner.OnRegistration(p, d);
      if (outcome.kind != plan::RegistrationOutcome::Kind::kSend) continue;
      KVRAIL_ASSIGN_OR_RETURN(
          plan::CopyPlan copy_plan,
          plan::CopyPlan::Bind(prefill, decode, outcome.fragments, outcome.owner_filters));
      plan::CopyList copies;
      KVRAIL_RETURN_IF_ERROR(copy_plan.Expand(src, dst, copies));
      const size_t before = copies.size();
      uint64_t bytes = 0;
      for (const plan::Copy& c : copies) bytes += c.length;
      plan::Coalesce(copies);
      ordered_json list = ordered_json::array();
      for (const plan::Copy& c : copies) list.push_back({c.src_offset, c.dst_offset, c.length});
      pairs.push_back({{"prefill_tp_rank", p},
                       {"decode_tp_rank", d},
                       {"copies_before_coalescing", before},
                       {"copies_after_coalescing", copies.size()},
                       {"bytes", bytes},
                       {"copies", std::move(list)}});
    }
  }
  return pairs;
}

std::string Table(const ordered_json& plan, int prefill_tp, int decode_tp, bool whole_field) {
  std::string out;
  absl::StrAppend(&out, absl::StrFormat("route: prefill TP=%d -> decode TP=%d%s\n\n", prefill_tp,
                                        decode_tp, whole_field ? " (whole-field copies)" : ""));
  for (const auto& d : plan["decode_ranks"]) {
    const int rank = d["decode_tp_rank"];
    if (d.contains("error")) {
      absl::StrAppend(&out, absl::StrFormat("decode rank %d: error: %s: %s\n\n", rank,
                                            d["error"]["category"].get<std::string>(),
                                            d["error"]["message"].get<std::string>()));
      continue;
    }
    absl::StrAppend(&out,
                    absl::StrFormat("decode rank %d: targets %s  expected %s  dummies %s\n", rank,
                                    Ranks(d["target_tp_ranks"]), Ranks(d["expected_prefill_ranks"]),
                                    Ranks(d["dummy_tp_ranks"])));
    for (const auto& source : d["fragments_by_prefill_rank"]) {
      const auto& fragments = source["fragments"];
      absl::StrAppend(
          &out,
          absl::StrFormat("  from prefill rank %d: %s\n", source["prefill_tp_rank"].get<int>(),
                          fragments.empty() ? "every field, whole pages"
                                            : absl::StrCat(fragments.size(), " fragments")));
      if (source.contains("owner_filters")) {
        for (const auto& [group, f] : source["owner_filters"].items()) {
          if (f.is_null()) {
            absl::StrAppend(&out, absl::StrFormat("    owner filter: group %s, none\n", group));
            continue;
          }
          const int k = f["owner_count"].get<int>();
          const int o = f["owner_rank"].get<int>();
          absl::StrAppend(&out, absl::StrFormat("    owner filter: group %s, owner %d of %d: "
                                                "virtual ids v with (v - 1) %% %d == %d\n",
                                                group, o, k, k, o));
        }
      }
      if (fragments.empty()) continue;
      absl::StrAppend(
          &out, absl::StrFormat("    %-18s %-22s %8s %8s %9s %5s %8s %8s\n", "group", "field",
                                "src_off", "dst_off", "bytes/row", "rows", "src_strd", "dst_strd"));
      for (const auto& f : fragments) {
        absl::StrAppend(
            &out, absl::StrFormat(
                      "    %-18s %-22s %8d %8d %9d %5d %8d %8d\n", f["group_id"].get<std::string>(),
                      f["field_id"].get<std::string>(), f["src_byte_offset"].get<int64_t>(),
                      f["dst_byte_offset"].get<int64_t>(), f["bytes_per_row"].get<int64_t>(),
                      f["rows_per_page"].get<int64_t>(), f["src_row_stride_bytes"].get<int64_t>(),
                      f["dst_row_stride_bytes"].get<int64_t>()));
      }
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "registrations (what prefill rank p does with decode rank d's):\n");
  absl::StrAppend(&out, absl::StrFormat("  %6s", "p \\ d"));
  for (int d = 0; d < decode_tp; ++d) absl::StrAppend(&out, absl::StrFormat(" %7d", d));
  absl::StrAppend(&out, absl::StrFormat("   %s\n", "pre-allocations per room"));
  std::vector<std::vector<std::string>> grid(prefill_tp, std::vector<std::string>(decode_tp));
  for (const auto& r : plan["prefill_registrations"]) {
    grid[r["prefill_tp_rank"].get<int>()][r["decode_tp_rank"].get<int>()] = r["outcome"];
  }
  const auto& pre = plan["required_counts"]["preallocations_per_room_by_prefill_rank"];
  for (int p = 0; p < prefill_tp; ++p) {
    absl::StrAppend(&out, absl::StrFormat("  %6d", p));
    for (int d = 0; d < decode_tp; ++d) absl::StrAppend(&out, absl::StrFormat(" %7s", grid[p][d]));
    absl::StrAppend(&out, absl::StrFormat("   %s\n", pre[p].dump()));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> RunPlan(const PlanOptions& options) {
  KVRAIL_ASSIGN_OR_RETURN(layout::Contract prefill,
                          LoadContract(options.prefill_contract_path, "--prefill-contract"));
  KVRAIL_ASSIGN_OR_RETURN(layout::Contract decode,
                          LoadContract(options.decode_contract_path, "--decode-contract"));
  KVRAIL_ASSIGN_OR_RETURN(
      plan::Planner planner,
      plan::Planner::Create(options.prefill_tp, options.decode_tp, prefill, decode));
  ordered_json plan = plan::PlanToJson(planner);
  const bool with_room =
      !options.prefill_manifest_path.empty() || !options.decode_manifest_path.empty();
  ordered_json room;
  if (with_room) {
    if (options.prefill_manifest_path.empty() || options.decode_manifest_path.empty()) {
      return MakeError(ErrorCategory::kInvalidManifest,
                       "--prefill-manifest and --decode-manifest go together");
    }
    KVRAIL_ASSIGN_OR_RETURN(layout::Manifest src, LoadManifest(options.prefill_manifest_path,
                                                               "--prefill-manifest", prefill));
    KVRAIL_ASSIGN_OR_RETURN(layout::Manifest dst, LoadManifest(options.decode_manifest_path,
                                                               "--decode-manifest", decode));
    KVRAIL_ASSIGN_OR_RETURN(room, RoomCopies(planner, prefill, decode, src, dst));
  }
  if (options.json) {
    if (with_room) plan["room_copies"] = room;
    return plan.dump(2) + "\n";
  }
  std::string out = Table(plan, options.prefill_tp, options.decode_tp, planner.whole_field_copy());
  if (with_room) {
    absl::StrAppend(&out, "\none room's copies (arena offsets; the data plane adds the bases):\n");
    for (const auto& pair : room) {
      absl::StrAppend(
          &out, absl::StrFormat(
                    "  prefill %d -> decode %d: %d copies, %d after coalescing, "
                    "%d bytes\n",
                    pair["prefill_tp_rank"].get<int>(), pair["decode_tp_rank"].get<int>(),
                    pair["copies_before_coalescing"].get<int64_t>(),
                    pair["copies_after_coalescing"].get<int64_t>(), pair["bytes"].get<int64_t>()));
      int shown = 0;
      for (const auto& c : pair["copies"]) {
        if (++shown > 8) {
          absl::StrAppend(&out, absl::StrFormat("    ... %d more (--json lists all)\n",
                                                pair["copies"].size() - 8));
          break;
        }
        absl::StrAppend(&out,
                        absl::StrFormat("    src %10d  dst %10d  len %8d\n", c[0].get<uint64_t>(),
                                        c[1].get<uint64_t>(), c[2].get<uint64_t>()));
      }
    }
  }
  return out;
}

}  // namespace kvrail::tools
