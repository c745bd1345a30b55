// Fuzz harness: the bootstrap server's decisions (CACHEPD §2) over a sequence of requests: the
// registration body of PUT /route (bootstrap::ParseRegistration), the registry that files it
// (PrefillRegistry::Register), and the query of GET /route with what it answers.
//
// The input is split into requests at every two-byte separator 0x00 0xFF (as wire_fuzz splits
// frames); a request that starts with '?' is a GET /route query string, any other a PUT /route
// body. All of them go, in order, to one PrefillRegistry. A first request "!snapshot" or
// "!2026-09" pins the server to that revision (kvrail bootstrap --cachepd-revision); otherwise
// it speaks both (auto).
//
// The server's own routing (control/bootstrap/server.cc AnswerGetRoute: which parameters, and
// Python's int() of each) is not exposed; it is replayed here on the same calls: httplib's
// query parse (httplib::detail::parse_query_text, then Request::get_param_value, as httplib's
// server does before the handler runs), wire::ParsePythonInt, then Describe or Lookup, and
// DumpPythonJson of the answer. httplib's request-line and header parsing need a socket.
//
// Properties: no crash, leak or undefined behaviour; a refused body has the status of a refusal
// (400 or 500) and a one-line reason; an accepted one serialises and parses back to the same
// registration; a refused registration changes nothing (all or nothing); an accepted one is
// what Lookup answers for its rank, the route table is exactly the accepted ranks, and the
// node's description is the first accepted registration's, its layout in that registration's
// form (CACHEPD §12.4); registrations are compared in the revision-neutral form, so one
// contract in either form agrees; a pinned server accepts only its revision's registrations; a
// sync answer has cache_fields_by_stage exactly when it is 2026-09's, and prefill_pp_size is
// its number of stages; every answer body is printable ASCII JSON (Python's json.dumps) that
// reads back as the value written.
#include <httplib.h>

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "control/bootstrap/python_json.h"
#include "control/bootstrap/refusal.h"
#include "control/bootstrap/registration.h"
#include "control/bootstrap/registry.h"
#include "control/layout/revision.h"
#include "control/plan/pipeline.h"
#include "control/wire/python_int.h"
#include "tests/fuzz/check.h"

namespace {

using kvrail::fuzz::Check;
namespace bootstrap = kvrail::bootstrap;

constexpr size_t kMaxRequests = 16;

std::vector<std::string> SplitRequests(const uint8_t* data, size_t size) {
  std::vector<std::string> requests(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0x00 && i + 1 < size && data[i + 1] == 0xff) {
      if (requests.size() == kMaxRequests) break;
      requests.emplace_back();
      ++i;
    } else {
      requests.back().push_back(static_cast<char>(data[i]));
    }
  }
  return requests;
}

// The registry as the accepted registrations say it must be.
struct Model {
  std::optional<kvrail::layout::Revision> pinned;
  std::optional<bootstrap::ParsedRegistration> first;
  std::map<std::pair<int64_t, int64_t>, bootstrap::RankEndpoint> ranks;  // (group, rank)
};

// An answer body: json.dumps text, printable ASCII, reading back as `value`.
void CheckAnswer(const nlohmann::ordered_json& value) {
  const std::string body = bootstrap::DumpPythonJson(value);
  for (char c : body) {
    Check(c >= 0x20 && c <= 0x7e, "an answer body holds a byte outside printable ASCII");
  }
  Check(nlohmann::ordered_json::parse(body, nullptr, false) == value,
        "an answer body does not read back as the value written");
}

void CheckTable(const bootstrap::PrefillRegistry& registry, const Model& model) {
  size_t filed = 0;
  for (const auto& [group, ranks] : registry.Table()) {
    for (const auto& [rank, endpoint] : ranks) {
      ++filed;
      auto expected = model.ranks.find({group, rank});
      Check(expected != model.ranks.end() && expected->second == endpoint, [g = group, r = rank] {
        return absl::StrCat("the route table files dp group ", g, " rank ", r,
                            " as no accepted registration did");
      });
    }
  }
  Check(filed == model.ranks.size(), "the route table lost an accepted rank");
}

// The placement a registration means: its own, or one stage holding every field.
kvrail::plan::PipelineLayout PlacementOf(const bootstrap::PrefillRegistration& r) {
  return r.pipeline.value_or(kvrail::plan::PipelineLayout::SingleStage(r.contract));
}

void CheckSameRegistration(const bootstrap::PrefillRegistration& a,
                           const bootstrap::PrefillRegistration& b) {
  const kvrail::plan::PipelineLayout pa = PlacementOf(a);
  const kvrail::plan::PipelineLayout pb = PlacementOf(b);
  Check(a.role == b.role && a.world_size == b.world_size && a.dp_size == b.dp_size &&
            a.endpoint == b.endpoint && a.engine_rank == b.engine_rank &&
            a.contract.revision == b.contract.revision && pa.pp_size == pb.pp_size &&
            pa.fields_by_stage == pb.fields_by_stage,
        "a registration does not read back as itself");
}

// The sync answer in the form the server speaks.
nlohmann::ordered_json SyncAnswer(const bootstrap::PrefillRegistry& registry, const Model& model) {
  return registry.Describe().ToJson(model.pinned.value_or(kvrail::layout::kNewestRevision));
}

void Put(bootstrap::PrefillRegistry& registry, Model& model, const std::string& body) {
  absl::StatusOr<bootstrap::ParsedRegistration> parsed =
      bootstrap::ParseRegistration(body, model.pinned);
  if (!parsed.ok()) {
    const int http = bootstrap::HttpStatusOf(parsed.status());
    Check(http == 400 || http == 500,
          [&] { return absl::StrCat("a refused body answers HTTP ", http); });
    Check(!parsed.status().message().empty() &&
              parsed.status().message().find('\n') == absl::string_view::npos,
          [&] { return absl::StrCat("a refusal is not one line: ", parsed.status().ToString()); });
    return;
  }
  absl::StatusOr<std::string> again = bootstrap::SerializeRegistration(parsed->registration);
  Check(again.ok(), "an accepted registration does not serialise");
  absl::StatusOr<bootstrap::ParsedRegistration> reparsed =
      bootstrap::ParseRegistration(*again, model.pinned);
  Check(reparsed.ok() && reparsed->canonical_layout == parsed->canonical_layout &&
            reparsed->comparable_layout == parsed->comparable_layout,
        "an accepted registration does not parse back");
  CheckSameRegistration(parsed->registration, reparsed->registration);
  const kvrail::layout::Revision form = parsed->registration.contract.revision;
  Check(!model.pinned || *model.pinned == form,
        "a pinned server accepts a registration of the other revision");
  Check(form == kvrail::layout::Revision::kSnapshot || parsed->registration.pipeline.has_value(),
        "a 2026-09 registration is accepted without its stage placement");

  const bootstrap::RouteTable table_before = registry.Table();
  const nlohmann::ordered_json node_before = SyncAnswer(registry, model);
  absl::StatusOr<bootstrap::RegistrationOutcome> outcome = registry.Register(*parsed);
  if (!outcome.ok()) {
    const int http = bootstrap::HttpStatusOf(outcome.status());
    Check(http == 409 || http == 500,
          [&] { return absl::StrCat("a refused registration answers HTTP ", http); });
    Check(model.first.has_value(), "the first registration was refused");
    Check(registry.Table() == table_before && SyncAnswer(registry, model) == node_before,
          "a refused registration changed the registry");
    return;
  }
  const bootstrap::PrefillRegistration& r = parsed->registration;
  if (!model.first) model.first = *parsed;
  Check(parsed->comparable_layout == model.first->comparable_layout &&
            PlacementOf(r).pp_size == PlacementOf(model.first->registration).pp_size &&
            r.world_size == model.first->registration.world_size &&
            r.dp_size == model.first->registration.dp_size,
        "the registry accepts a registration that differs from the node's first");
  Check(outcome->recorded == (r.role == bootstrap::kPrefillRole), "filed by the wrong role");
  if (outcome->recorded) {
    Check(outcome->dp_group == r.DpGroup() && outcome->rank_in_group == r.RankInDpGroup(),
          "a rank is filed under the wrong place");
    model.ranks[{outcome->dp_group, outcome->rank_in_group}] = r.endpoint;
    absl::StatusOr<bootstrap::RankEndpoint> found =
        registry.Lookup(outcome->rank_in_group, outcome->dp_group);
    Check(found.ok() && *found == r.endpoint, "Lookup does not answer the rank just filed");
  }
  Check(outcome->registered_ranks == static_cast<int>(model.ranks.size()),
        "registered_ranks is not the number of ranks filed");
  const bootstrap::NodeDescription node = registry.Describe();
  Check(node.world_size == model.first->registration.world_size &&
            node.dp_size == model.first->registration.dp_size &&
            node.cache_layout == model.first->canonical_layout &&
            node.layout_revision == model.first->registration.contract.revision,
        "the node description is not the first registration's");
}

// GET /route?<query>, as server.cc's AnswerGetRoute decides it.
void Get(const bootstrap::PrefillRegistry& registry, const Model& model, const std::string& query) {
  httplib::Request request;
  httplib::detail::parse_query_text(query, request.params);
  const std::string engine_rank = request.get_param_value("engine_rank");
  const std::string dp_group = request.get_param_value("target_dp_group");
  if (engine_rank.empty() || dp_group.empty()) return;  // 400 "Missing inputs ..."
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  absl::StatusOr<int64_t> rank = kvrail::wire::ParsePythonInt(engine_rank, kMin, kMax, "rank");
  absl::StatusOr<int64_t> group = kvrail::wire::ParsePythonInt(dp_group, kMin, kMax, "group");
  if (!rank.ok() || !group.ok()) return;  // 500, as the reference's int() raises
  if (*rank == -1 && *group == -1) {
    const nlohmann::ordered_json answer = SyncAnswer(registry, model);
    CheckAnswer(answer);
    const bool r2026 = model.pinned != kvrail::layout::Revision::kSnapshot;
    Check(answer.contains("cache_fields_by_stage") == r2026 &&
              answer.contains("prefill_pp_size") == r2026,
          "a sync answer's members are not its revision's (CACHEPD §2.2, §12.4)");
    if (r2026 && answer["cache_fields_by_stage"].is_array()) {
      Check(answer["prefill_pp_size"] == answer["cache_fields_by_stage"].size(),
            "prefill_pp_size is not the number of stages");
    }
    return;
  }
  absl::StatusOr<bootstrap::RankEndpoint> endpoint = registry.Lookup(*rank, *group);
  auto expected = model.ranks.find({*group, *rank});
  Check(endpoint.ok() == (expected != model.ranks.end()), [&] {
    return absl::StrCat("Lookup(", *rank, ", ", *group, ") ", endpoint.ok() ? "answers" : "refuses",
                        " against the accepted registrations");
  });
  if (!endpoint.ok()) {
    Check(bootstrap::HttpStatusOf(endpoint.status()) == 500, "an unknown rank does not answer 500");
    return;
  }
  Check(*endpoint == expected->second, "Lookup answers another endpoint than was filed");
  nlohmann::ordered_json body;
  body["rank_ip"] = endpoint->rank_ip;
  body["rank_port"] = endpoint->rank_port;
  CheckAnswer(body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bootstrap::PrefillRegistry registry;
  Model model;
  std::vector<std::string> requests = SplitRequests(data, size);
  if (!requests.empty() && !requests[0].empty() && requests[0][0] == '!') {
    model.pinned = kvrail::layout::RevisionFromName(absl::string_view(requests[0]).substr(1));
    requests.erase(requests.begin());
  }
  for (const std::string& request : requests) {
    if (!request.empty() && request[0] == '?') {
      Get(registry, model, request.substr(1));
    } else {
      Put(registry, model, request);
    }
    CheckTable(registry, model);
  }
  return 0;
}
