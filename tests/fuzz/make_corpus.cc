// Writes the generated seeds of the fuzz harnesses' corpus (tests/fuzz/corpus/<harness>/gen_*)
// from the CachePD vectors and kvrail's own builders, so that each seed is an input a real
// peer or engine sends. Deterministic: running it again writes the same files.
//
//   bazel run //tests/fuzz:make_corpus           (into the workspace's tests/fuzz/corpus)
//   make_corpus OUT_DIR                          (into OUT_DIR/<harness>/, from the repo root)
//
// Inputs libFuzzer found are kept beside these under names of their own (found_*).
#include <google/protobuf/stubs/common.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "control/bootstrap/python_json.h"
#include "control/bootstrap/registration.h"
#include "control/layout/contract.h"
#include "control/layout/manifest.h"
#include "control/layout/revision.h"
#include "control/plan/pipeline.h"
#include "control/plan/planner.h"
#include "engine/transport/loopback/loopback_transport.h"
#include "proto/kvrail/v1/engine.pb.h"
#include "proto/kvrail/v1/handshake.pb.h"
#include "tests/fuzz/check.h"
#include "tests/fuzz/planner_cases.h"
#include "tests/support/vectors.h"

namespace {

using kvrail::fuzz::Check;
namespace layout = kvrail::layout;
namespace v1 = kvrail::v1;

using Seeds = std::map<std::string, std::string>;  // file name -> bytes

// A room's manifest over `contract` for the prompt window [prefix, prompt): block ids counted
// up from `first_id` through each group's pages (so that the two sides use different pages).
layout::Manifest RoomManifest(const layout::Contract& contract, int64_t prefix, int64_t prompt,
                              int64_t first_id) {
  std::vector<std::vector<int64_t>> tables;
  for (size_t g = 0; g < contract.group_specs.size(); ++g) {
    const layout::GroupSpec& spec = contract.group_specs[g];
    // Block ids are virtual for a page-sharded group (CACHEPD §12.2); page ids otherwise.
    const int64_t pages = contract.VirtualBlockCount(spec.group_id);
    const int64_t slots = (prompt + spec.block_granularity() - 1) / spec.block_granularity();
    std::vector<int64_t>& table = tables.emplace_back();
    for (int64_t k = 0; k < slots; ++k) {
      table.push_back((first_id + 7 * static_cast<int64_t>(g) + k) % (pages - 1) + 1);
    }
  }
  absl::StatusOr<layout::Manifest> manifest =
      layout::BuildManifest(contract, tables, prefix, prompt);
  Check(manifest.ok(), absl::StrCat("no manifest for [", prefix, ", ", prompt,
                                    "): ", manifest.status().ToString()));
  return *std::move(manifest);
}

std::string Wire(const layout::Manifest& manifest) { return *layout::SerializeManifest(manifest); }

// Two prompt windows: a whole prompt, and one behind a cached prefix.
std::vector<std::pair<int64_t, int64_t>> Windows(const layout::Contract& contract) {
  const int64_t g = contract.plan.prefix_granularity;
  return {{0, 3 * g + 1}, {2 * g, 9 * g}};
}

// plan_fuzz: "<case> <P> <p> <D> <d> <base> <mode>\n<source>\n<destination>". Mode 1 goes
// through the rooms layer too; 3 makes the room ready before its pre-allocations; 5 and 13 put
// the prefill rank in stage 0 or 1 of a two-stage pipeline (CACHEPD §12.6). Cases count
// kPlanCases, then kShardedPlanCases (page-sharded prefill groups, §12.8).
Seeds PlanSeeds() {
  Seeds seeds;
  constexpr uint64_t kBase = 0x7e0000000000;
  std::vector<kvrail::fuzz::PlannerCase> cases;
  for (const char* name : kvrail::fuzz::kPlanCases) {
    cases.push_back(kvrail::fuzz::LoadPlannerCase(name));
  }
  for (const kvrail::fuzz::ShardedPlanCase& sharded : kvrail::fuzz::kShardedPlanCases) {
    cases.push_back(kvrail::fuzz::LoadShardedPlannerCase(sharded));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const kvrail::fuzz::PlannerCase& c = cases[i];
    const auto planner =
        kvrail::plan::Planner::Create(c.prefill_tp_size, c.decode_tp_size, c.prefill, c.decode);
    Check(planner.ok(), absl::StrCat(c.name, " does not plan"));
    auto seed = [&](const std::string& name, int p, int d, uint64_t base, int mode, int64_t prefix,
                    int64_t prompt) {
      seeds[absl::StrCat("gen_", c.name, "_", name)] =
          absl::StrCat(i, " ", c.prefill_tp_size, " ", p, " ", c.decode_tp_size, " ", d, " ", base,
                       " ", mode, "\n", Wire(RoomManifest(c.prefill, prefix, prompt, 1)), "\n",
                       Wire(RoomManifest(c.decode, prefix, prompt, 3)));
    };
    for (int p = 0; p < std::min(c.prefill_tp_size, 4); ++p) {
      const std::vector<int>& served = planner->DecodeRanksServedBy(p);
      const int d = served.empty() ? 0 : served.front();  // idle: decode rank 0, a dummy
      int w = 0;
      for (const auto& [prefix, prompt] : Windows(c.prefill)) {
        seed(absl::StrCat("p", p, "_d", d, "_w", w), p, d, kBase, w, prefix, prompt);
        ++w;
      }
    }
    seed("ready_first", 0, 0, kBase, 3, 0, 5);
    // A decode arena that ends exactly at 2^64.
    seed("arena_at_top", 0, 0, 0 - static_cast<uint64_t>(c.decode.ArenaBytes()), 1, 0, 5);
    seed("stage0", 0, 0, kBase, 5, 0, 5);
    seed("stage1", 0, 0, kBase, 13, 0, 5);
  }
  return seeds;
}

std::string Serialized(uint64_t id, const std::function<void(v1::EngineRequest&)>& fill) {
  v1::EngineRequest request;
  request.set_request_id(id);
  fill(request);
  return request.SerializeAsString();
}

// The fixed contract's fields cut into two stages of whole layers, as a sidecar's default is.
std::vector<std::vector<std::string>> TwoStages(const layout::Contract& contract) {
  std::vector<std::string> layers;
  for (const layout::FieldLayout& f : contract.plan.fields) {
    const std::string layer = f.field_id.substr(0, f.field_id.rfind('.'));
    if (layers.empty() || layers.back() != layer) layers.push_back(layer);
  }
  std::vector<std::vector<std::string>> stages(2);
  for (const layout::FieldLayout& f : contract.plan.fields) {
    const std::string layer = f.field_id.substr(0, f.field_id.rfind('.'));
    const size_t index = std::find(layers.begin(), layers.end(), layer) - layers.begin();
    stages[index * 2 / layers.size()].push_back(f.field_id);
  }
  return stages;
}

// Vector inputs larger than this (the size-limit cases) are left out: seeds stay small.
constexpr size_t kMaxSeedBytes = 16 << 10;

bool IsUtf8(const std::string& text) {
  const google::protobuf::LogSilencer quiet;  // the probe's refusal is the answer, not news
  v1::FieldList probe;
  probe.add_field_ids(text);
  return v1::FieldList().ParseFromString(probe.SerializeAsString());
}

// engine_api_fuzz: one serialised EngineRequest each.
Seeds EngineApiSeeds() {
  Seeds seeds;
  const kvrail::fuzz::PlannerCase c = kvrail::fuzz::LoadPlannerCase(kvrail::fuzz::kEngineApiCase);
  const layout::Contract& contract = c.decode;
  const std::string wire = *layout::SerializeContract(contract);
  const uint64_t arena = static_cast<uint64_t>(contract.ArenaBytes());
  seeds["gen_attach_allocate"] = Serialized(1, [&](v1::EngineRequest& r) {
    r.mutable_attach()->set_contract(wire);
    r.mutable_attach()->set_allocate_bytes(arena);
  });
  seeds["gen_attach_shm"] = Serialized(2, [&](v1::EngineRequest& r) {
    r.mutable_attach()->set_contract(wire);
    r.mutable_attach()->set_shm_name("/kvrail-p0");
  });
  seeds["gen_attach_cuda"] = Serialized(3, [&](v1::EngineRequest& r) {
    r.mutable_attach()->set_contract(wire);
    r.mutable_attach()->set_cuda_ipc_handle(std::string(64, '\x5a'));
    r.mutable_attach()->set_cuda_bytes(arena);
    r.mutable_attach()->set_cuda_device(1);
  });
  seeds["gen_attach_two_stages"] = Serialized(4, [&](v1::EngineRequest& r) {
    r.mutable_attach()->set_contract(wire);
    r.mutable_attach()->set_allocate_bytes(arena);
    for (const std::vector<std::string>& stage : TwoStages(contract)) {
      v1::FieldList* list = r.mutable_attach()->add_fields_by_stage();
      for (const std::string& field : stage) list->add_field_ids(field);
    }
  });
  // The reference's contracts, as engines attach them.
  const nlohmann::json contracts = kvrail::testing::LoadVectors("contracts.json");
  for (const nlohmann::json& entry : contracts.at("valid")) {
    const std::string input = kvrail::testing::VectorInput(entry);
    // A proto3 string holds UTF-8 only: an engine cannot send the others.
    if (input.size() > kMaxSeedBytes || !IsUtf8(input)) continue;
    seeds["gen_attach_" + entry.at("name").get<std::string>()] =
        Serialized(5, [&](v1::EngineRequest& r) {
          r.mutable_attach()->set_contract(input);
          r.mutable_attach()->set_allocate_bytes(1 << 20);
        });
  }
  int w = 0;
  for (const auto& [prefix, prompt] : Windows(contract)) {
    const std::string manifest = Wire(RoomManifest(contract, prefix, prompt, 1));
    seeds[absl::StrCat("gen_ready_w", w)] = Serialized(10, [&](v1::EngineRequest& r) {
      r.mutable_ready()->set_room(1000 + w);
      r.mutable_ready()->set_source_manifest(manifest);
      r.mutable_ready()->set_bootstrap_token(17);
      r.mutable_ready()->add_speculative_ids(3);
      r.mutable_ready()->add_speculative_ids(5);
    });
    seeds[absl::StrCat("gen_expect_w", w)] = Serialized(11, [&](v1::EngineRequest& r) {
      r.mutable_expect()->set_room(1000 + w);
      r.mutable_expect()->set_bootstrap_address("10.0.0.1:8998");
      r.mutable_expect()->set_destination_manifest(manifest);
    });
    ++w;
  }
  seeds["gen_ready_no_token_top_room"] = Serialized(12, [&](v1::EngineRequest& r) {
    r.mutable_ready()->set_room(INT64_MAX);
    r.mutable_ready()->set_source_manifest(Wire(RoomManifest(contract, 0, 1, 5)));
    r.mutable_ready()->set_bootstrap_token(-1);
  });
  seeds["gen_ready_dummy"] = Serialized(13, [](v1::EngineRequest& r) {
    r.mutable_ready()->set_room(0);
    r.mutable_ready()->set_bootstrap_token(-1);
  });
  // The reference's manifests (against another contract: most fail §5.3 here).
  const nlohmann::json manifests = kvrail::testing::LoadVectors("manifests.json");
  for (const nlohmann::json& entry : manifests.at("vectors")) {
    const std::string input = kvrail::testing::VectorInput(entry);
    if (input.size() > kMaxSeedBytes || !IsUtf8(input)) continue;
    seeds["gen_expect_" + entry.at("name").get<std::string>()] =
        Serialized(14, [&](v1::EngineRequest& r) {
          r.mutable_expect()->set_room(7);
          r.mutable_expect()->set_bootstrap_address("10.0.0.1:8998");
          r.mutable_expect()->set_destination_manifest(input);
        });
  }
  seeds["gen_poll"] = Serialized(20, [](v1::EngineRequest& r) {
    for (uint64_t room : {uint64_t{1}, uint64_t{2}, uint64_t{1} << 63}) {
      r.mutable_poll()->add_rooms(room);
    }
  });
  seeds["gen_abort"] = Serialized(21, [](v1::EngineRequest& r) {
    r.mutable_abort()->set_room(7);
    r.mutable_abort()->set_reason("the engine gave the request up");
  });
  seeds["gen_stats"] = Serialized(22, [](v1::EngineRequest& r) { r.mutable_stats(); });
  return seeds;
}

// contract_fuzz: contract wires of both revisions (CACHEPD §4, §12.1): the r2 vectors' (valid,
// invalid, peer pairs, manifest-bound layouts), and the snapshot vectors' canonical contracts
// written in the 2026-09 form. (The snapshot vectors' own wires are the hand-written seeds.)
Seeds ContractSeeds() {
  Seeds seeds;
  const nlohmann::json r2 = kvrail::testing::LoadVectors("r2/contracts_r2.json");
  for (const char* kind : {"valid", "invalid"}) {
    for (const nlohmann::json& entry : r2.at(kind)) {
      seeds[absl::StrCat("gen_r2_", entry.at("name").get<std::string>())] =
          entry.at("wire").get<std::string>();
    }
  }
  for (const nlohmann::json& entry : r2.at("peer_check")) {
    for (const char* side : {"prefill", "decode"}) {
      seeds[absl::StrCat("gen_r2_", entry.at("name").get<std::string>(), "_", side)] =
          entry.at(side).get<std::string>();
    }
  }
  for (const nlohmann::json& entry : r2.at("manifest_bounds")) {
    seeds[absl::StrCat("gen_r2_", entry.at("name").get<std::string>())] =
        entry.at("layout").get<std::string>();
  }
  const nlohmann::json snapshot = kvrail::testing::LoadVectors("contracts.json");
  for (const nlohmann::json& entry : snapshot.at("valid")) {
    const absl::StatusOr<layout::Contract> contract =
        layout::ParseContract(kvrail::testing::VectorInput(entry));
    if (!contract.ok()) continue;  // the vectors kvrail refuses (strict_recommendation reject)
    const absl::StatusOr<std::string> wire =
        layout::SerializeContract(*contract, layout::Revision::k2026_09);
    if (!wire.ok() || wire->size() > kMaxSeedBytes) continue;
    seeds[absl::StrCat("gen_2026_09_", entry.at("name").get<std::string>())] = *wire;
  }
  return seeds;
}

v1::Region* AddRegion(v1::HandshakeDescriptor& d, uint64_t base, uint64_t length, std::string key,
                      v1::MemoryKind kind = v1::MEMORY_KIND_HOST) {
  v1::Region* region = d.add_regions();
  region->set_base(base);
  region->set_length(length);
  region->set_remote_key(std::move(key));
  region->set_memory_kind(kind);
  return region;
}

// Bytes that look like a packed UCX worker address or rkey: deterministic, not all alike.
std::string Packed(size_t size, uint8_t seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(seed + 31 * i);
  return bytes;
}

// descriptor_fuzz: one serialised HandshakeDescriptor each.
Seeds DescriptorSeeds() {
  Seeds seeds;
  // The loopback backend's own (transport 1 of the process, as in the harness), with its
  // region's base fixed so that the file does not depend on where the heap was.
  auto loopback = kvrail::transport::LoopbackTransport::Create({.lanes = 2}).value();
  std::vector<char> memory(1 << 16);
  Check(loopback->Register({memory.data(), memory.size(), false}).ok(), "loopback Register");
  v1::HandshakeDescriptor own = loopback->LocalDescriptor().value();
  own.set_session_id("127.0.0.1:15000");
  own.mutable_regions(0)->set_base(0x7f0000000000);
  seeds["gen_loopback"] = own.SerializeAsString();
  v1::HandshakeDescriptor stale = own;
  stale.mutable_regions(0)->set_remote_key(own.regions(0).remote_key().substr(0, 8) +
                                           std::string("\x09\0\0\0\0\0\0\0", 8));
  seeds["gen_loopback_stale_key"] = stale.SerializeAsString();

  v1::HandshakeDescriptor ucx;
  ucx.set_version(3);
  ucx.set_transport(v1::TRANSPORT_KIND_UCX);
  ucx.set_session_id("10.0.0.2:15001");
  for (uint8_t lane = 0; lane < 2; ++lane) ucx.add_lanes()->set_address(Packed(187, lane));
  AddRegion(ucx, 0x7e0000000000, 1 << 30, Packed(108, 7));
  AddRegion(ucx, 0x7f0000000000, 1 << 20, Packed(108, 9), v1::MEMORY_KIND_CUDA);
  seeds["gen_ucx_two_regions"] = ucx.SerializeAsString();

  v1::HandshakeDescriptor edges;
  edges.set_transport(v1::TRANSPORT_KIND_VERBS);
  edges.set_session_id("[::1]:5000");
  edges.add_lanes()->set_address(Packed(24, 1));
  AddRegion(edges, 0x1000, 0x1000, "\x01\0\0\0");
  AddRegion(edges, 0x2000, 0x1000, "\x02\0\0\0");              // adjacent to the first
  AddRegion(edges, 0xfffffffffffff000, 0x1000, "\x03\0\0\0");  // ends at 2^64
  seeds["gen_verbs_adjacent_and_top"] = edges.SerializeAsString();

  v1::HandshakeDescriptor overlap = edges;
  AddRegion(overlap, 0x1800, 0x1000, "\x04\0\0\0");
  seeds["gen_overlapping_regions"] = overlap.SerializeAsString();
  v1::HandshakeDescriptor wraps = edges;
  wraps.mutable_regions(2)->set_length(0x1001);
  seeds["gen_region_past_2_64"] = wraps.SerializeAsString();
  v1::HandshakeDescriptor empty;
  empty.set_transport(v1::TRANSPORT_KIND_LOOPBACK);
  empty.set_session_id("decode-0.example:1");
  seeds["gen_no_lanes_no_regions"] = empty.SerializeAsString();
  return seeds;
}

std::string Query(const nlohmann::json& query) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : query.items()) {
    parts.push_back(absl::StrCat(name, "=", value.get<std::string>()));
  }
  return absl::StrCat("?", absl::StrJoin(parts, "&"));
}

// bootstrap_fuzz: requests joined by 0x00 0xFF; a query starts with '?'.
Seeds BootstrapSeeds() {
  Seeds seeds;
  const std::string separator("\x00\xff", 2);
  // The snapshot's scenarios (auto, and pinned to the snapshot) and 2026-09's (auto, and
  // pinned to 2026-09): a first request "!<revision>" pins the server (bootstrap_fuzz.cc).
  for (const auto& [file, pin] :
       std::vector<std::pair<std::string, std::string>>{{"bootstrap.json", ""},
                                                        {"bootstrap.json", "snapshot"},
                                                        {"r2/bootstrap_r2.json", ""},
                                                        {"r2/bootstrap_r2.json", "2026-09"}}) {
    const nlohmann::json vectors = kvrail::testing::LoadVectors(file);
    const std::string prefix = pin.empty() ? "gen_" : absl::StrCat("gen_", pin, "_");
    for (const nlohmann::json& scenario : vectors.at("scenarios")) {
      std::vector<std::string> requests;
      if (!pin.empty()) requests.push_back("!" + pin);
      for (const nlohmann::json& exchange : scenario.at("exchanges")) {
        if (exchange.at("path") != "/route") continue;
        if (exchange.at("method") == "GET") {
          requests.push_back(Query(exchange.at("query")));
        } else if (exchange.at("method") == "PUT" && exchange.at("json_body").is_object()) {
          const nlohmann::ordered_json body = exchange.at("json_body");
          requests.push_back(kvrail::bootstrap::DumpPythonJson(body));
          if (pin.empty()) {
            seeds[absl::StrCat(prefix, scenario.at("name").get<std::string>(), "_put_",
                               requests.size())] = requests.back();
          }
        }
      }
      seeds[prefix + scenario.at("name").get<std::string>()] = absl::StrJoin(requests, separator);
    }
  }
  // A pipelined node (§12.3) whose contract shards a group over two owners (§12.8).
  const kvrail::fuzz::PlannerCase c = kvrail::fuzz::LoadPlannerCase(kvrail::fuzz::kEngineApiCase);
  std::vector<std::string> requests;
  for (int rank = 0; rank < 4; ++rank) {
    kvrail::bootstrap::PrefillRegistration r;
    r.world_size = 4;
    r.dp_size = 1;
    r.endpoint = {"10.2.0.1", 18000 + rank};
    r.engine_rank = rank;
    r.contract = c.decode;
    r.contract.revision = kvrail::layout::Revision::k2026_09;  // the form that says shard_count
    r.contract.group_specs.back().shard_count = 2;
    r.pipeline = kvrail::plan::PipelineLayout{2, TwoStages(c.decode)};
    requests.push_back(*kvrail::bootstrap::SerializeRegistration(r));
  }
  requests.push_back("?engine_rank=-1&target_dp_group=-1");
  requests.push_back("?engine_rank=1&target_dp_group=0");
  requests.push_back("?engine_rank=%2B3&target_dp_group=0&engine_rank=9");
  seeds["gen_pipelined_sharded_node"] = absl::StrJoin(requests, separator);
  return seeds;
}

void Write(const std::filesystem::path& dir, const Seeds& seeds) {
  std::filesystem::create_directories(dir);
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out << bytes;
    Check(static_cast<bool>(out), absl::StrCat("cannot write ", (dir / name).string()));
  }
  std::printf("make_corpus: %zu seeds in %s\n", seeds.size(), dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path root;
  if (argc > 1) {
    root = argv[1];
  } else if (const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY")) {
    root = std::filesystem::path(workspace) / "tests/fuzz/corpus";
  } else {
    std::fprintf(stderr, "usage: make_corpus OUT_DIR (or bazel run //tests/fuzz:make_corpus)\n");
    return 2;
  }
  Write(root / "plan", PlanSeeds());
  Write(root / "engine_api", EngineApiSeeds());
  Write(root / "descriptor", DescriptorSeeds());
  Write(root / "bootstrap", BootstrapSeeds());
  Write(root / "contract", ContractSeeds());
  return 0;
}
