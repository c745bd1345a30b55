// Fuzz harness: the bootstrap server's decisions (CACHEPD §2) over a sequence of requests: the
// registration body of PUT /route (bootstrap::ParseRegistration), the registry that files it
// (PrefillRegistry::Register), and the query of GET /route with what it answers.
//
// The input is split into requests at every two-byte separator 0x00 0xFF (as wire_fuzz splits
// frames); a request that starts with '?' is a GET /route query string, any other a PUT /route
// body. All of them go, in order, to one PrefillRegistry.
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
// node's description is the first accepted registration's; every answer body is printable
// ASCII JSON (Python's json.dumps) that reads back as the value written.
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

void CheckSameRegistration(const bootstrap::PrefillRegistration& a,
                           const bootstrap::PrefillRegistration& b) {
  Check(a.role == b.role && a.world_size == b.world_size && a.dp_size == b.dp_size &&
            a.endpoint == b.endpoint && a.engine_rank == b.engine_rank &&
            a.pipeline.has_value() == b.pipeline.has_value() &&
            (!a.pipeline || (a.pipeline->pp_size == b.pipeline->pp_size &&
                             a.pipeline->fields_by_stage == b.pipeline->fields_by_stage)) &&
            a.sharded_groups.size() == b.sharded_groups.size(),
        "a registration does not read back as itself");
  for (size_t i = 0; i < a.sharded_groups.size(); ++i) {
    Check(a.sharded_groups[i].group_id == b.sharded_groups[i].group_id &&
              a.sharded_groups[i].owners == b.sharded_groups[i].owners,
          "a registration's sharded groups do not read back");
  }
}

void Put(bootstrap::PrefillRegistry& registry, Model& model, const std::string& body) {
  absl::StatusOr<bootstrap::ParsedRegistration> parsed = bootstrap::ParseRegistration(body);
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
  absl::StatusOr<bootstrap::ParsedRegistration> reparsed = bootstrap::ParseRegistration(*again);
  Check(reparsed.ok() && reparsed->canonical_layout == parsed->canonical_layout,
        "an accepted registration does not parse back");
  CheckSameRegistration(parsed->registration, reparsed->registration);

  const bootstrap::RouteTable table_before = registry.Table();
  const nlohmann::ordered_json node_before = registry.Describe().ToJson();
  absl::StatusOr<bootstrap::RegistrationOutcome> outcome = registry.Register(*parsed);
  if (!outcome.ok()) {
    const int http = bootstrap::HttpStatusOf(outcome.status());
    Check(http == 409 || http == 500,
          [&] { return absl::StrCat("a refused registration answers HTTP ", http); });
    Check(model.first.has_value(), "the first registration was refused");
    Check(registry.Table() == table_before && registry.Describe().ToJson() == node_before,
          "a refused registration changed the registry");
    return;
  }
  const bootstrap::PrefillRegistration& r = parsed->registration;
  if (!model.first) model.first = *parsed;
  Check(parsed->canonical_layout == model.first->canonical_layout &&
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
            node.cache_layout == model.first->canonical_layout,
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
    CheckAnswer(registry.Describe().ToJson());
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
  for (const std::string& request : SplitRequests(data, size)) {
    if (!request.empty() && request[0] == '?') {
      Get(registry, model, request.substr(1));
    } else {
      Put(registry, model, request);
    }
    CheckTable(registry, model);
  }
  return 0;
}
