// Expect and Abort on a decode: bootstrap lookups and routes (decode_sidecar.h). The lookups are
// HTTP: they run in the bootstrap address's strand, never on the owner thread.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "control/bootstrap/client.h"
#include "control/plan/dp_group.h"
#include "control/plan/planner.h"
#include "control/sidecar/decode_sidecar.h"
#include "control/wire/registration.h"
#include "engine/base/error.h"

namespace kvrail::sidecar {

absl::Status DecodeSidecar::Expect(const v1::Expect& expect) {
  const std::string context = absl::StrCat("Expect room ", expect.room());
  const bool tables = expect.block_tables_size() > 0;
  if (tables && !expect.destination_manifest().empty()) {
    return absl::InvalidArgumentError(
        context + ": give destination_manifest or block_tables (with the window), not both");
  }
  // Built from the block tables on the owner thread, below: they need the attached contract.
  absl::StatusOr<layout::Manifest> manifest =
      tables ? layout::Manifest() : layout::ParseManifest(expect.destination_manifest());
  if (!manifest.ok()) return AddContext(manifest.status(), context + ": destination manifest");
  KVRAIL_RETURN_IF_ERROR(SplitHostPort(expect.bootstrap_address(), "bootstrap address").status());
  const std::optional<int> dp_group =
      expect.has_dp_group() ? std::optional<int>(expect.dp_group()) : std::nullopt;
  if (dp_group && *dp_group < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        context, ": dp_group ", *dp_group, " is not a DP group (they are numbered from 0)"));
  }
  // True: routed (or failed) here; false: its route needs a lookup in the address's strand.
  absl::StatusOr<bool> done_here = Owned([&]() -> absl::StatusOr<bool> {
    if (!attached) return absl::FailedPreconditionError(context + ": attach an arena first");
    if (tables) {
      KVRAIL_ASSIGN_OR_RETURN(*manifest,
                              ManifestFromTables(expect.block_tables(), expect.prefix_len(),
                                                 expect.prompt_len(), context + ": block_tables"));
    }
    KVRAIL_RETURN_IF_ERROR(AddContext(layout::ValidateManifest(*manifest, contract),
                                      context + ": destination manifest"));
    absl::StatusOr<session::DecodeOutput> out =
        rooms->BeginRoom(expect.room(), expect.bootstrap_address(), RoomNow());
    if (!out.ok()) return AddContext(out.status(), context);
    metrics.RoomSeen(expect.room(), absl::Now());  // its clock starts here, whatever comes next
    // --verify-digest hashes the room's destination ranges when its Successes come, a staged
    // arena copies them back to the GPU, and row staging sizes its slots by them and scatters
    // the rows into them.
    if (options.verify_digest || staging != nullptr || row_slots) {  // gone with the room
      (void)rooms->KeepManifest(expect.room(), std::make_shared<const layout::Manifest>(*manifest));
    }
    ApplyLocked(*std::move(out));
    // A node already looked up needs no HTTP: the room is routed and pre-allocated here, not
    // in the address's strand (a thread hop and a wakeup per room fewer).
    if (std::optional<absl::StatusOr<session::RoomRoute>> route =
            CachedRouteLocked(expect.room(), expect.bootstrap_address(), dp_group)) {
      if (!route->ok()) {
        ApplyLocked(rooms->Fail(expect.room(), DescribeError(route->status()), RoomNow(),
                                session::FailureCause::kBootstrap));
        return true;
      }
      RouteLocked(expect.room(), **std::move(route), *manifest);
      return true;
    }
    return false;
  });
  if (!done_here.ok()) return done_here.status();
  if (*done_here) return absl::OkStatus();
  strands.Post(
      expect.bootstrap_address(),
      [this, room = expect.room(), address = expect.bootstrap_address(),
       manifest = *std::move(manifest), dp_group] { Route(room, address, manifest, dp_group); });
  return absl::OkStatus();
}

// On the owner thread. CachePD has no decode-to-prefill abort (§1.5): DecodeRooms asks the prefill
// ranks that may write the room to fence it, and the pages are held until they answer.
void DecodeSidecar::AbortLocked(uint64_t room, const std::string& reason) {
  ApplyLocked(rooms->Fail(room, reason, RoomNow(), session::FailureCause::kAborted));
}

absl::StatusOr<std::shared_ptr<DecodeSidecar::PrefillNode>> DecodeSidecar::NodeFor(
    const std::string& address) {
  std::shared_ptr<PrefillNode> known = Owned([&]() -> std::shared_ptr<PrefillNode> {
    auto it = nodes.find(address);
    return it != nodes.end() ? it->second : nullptr;
  });
  if (known != nullptr) return known;
  KVRAIL_ASSIGN_OR_RETURN(auto server, SplitHostPort(address, "bootstrap address"));
  bootstrap::BootstrapClient client(server.first, server.second);
  bool kvrail = false;
  KVRAIL_ASSIGN_OR_RETURN(plan::PrefillDescription description, client.Sync(&kvrail));
  auto node = std::make_shared<PrefillNode>();
  node->kvrail = kvrail;
  if (description.pp_size > 1) {
    KVRAIL_ASSIGN_OR_RETURN(
        plan::PipelineRoute route,
        plan::PlanPipelineRoute(description.pipeline, description.stage_tp_size, options.tp_size,
                                options.tp_rank, description.contract, contract));
    node->targets = std::move(route.targets);
  } else {
    KVRAIL_ASSIGN_OR_RETURN(plan::Planner planner,
                            plan::Planner::Create(description.stage_tp_size, options.tp_size,
                                                  description.contract, contract));
    KVRAIL_ASSIGN_OR_RETURN(node->targets, planner.TargetsFor(options.tp_rank));
  }
  // Once per prefill node: the revision its layout speaks, and so the form this decode
  // registers with its ranks in (CACHEPD §12.12).
  spdlog::info(
      "event=prefill_node bootstrap={} cachepd_revision={} registers_as={}", address,
      std::string(layout::RevisionName(description.revision)),
      std::string(layout::RevisionName(options.cachepd_revision.value_or(description.revision))));
  node->description = std::move(description);
  Owned([&] { nodes[address] = node; });
  return node;
}

absl::StatusOr<std::string> DecodeSidecar::EndpointFor(const std::string& address,
                                                       PrefillNode& node, int dp_group, int rank) {
  std::optional<std::string> known = Owned([&]() -> std::optional<std::string> {
    auto it = node.endpoints.find({dp_group, rank});
    if (it == node.endpoints.end()) return std::nullopt;
    return it->second;
  });
  if (known) return *known;
  KVRAIL_ASSIGN_OR_RETURN(auto server, SplitHostPort(address, "bootstrap address"));
  bootstrap::BootstrapClient client(server.first, server.second);
  KVRAIL_ASSIGN_OR_RETURN(bootstrap::RankEndpoint endpoint, client.LookupRank(rank, dp_group));
  const std::string tcp = wire::RankEndpoint(endpoint.rank_ip, endpoint.rank_port);
  if (options.curve) {
    // The node's bootstrap server relays the rank's key; it is taken only when this decode
    // lists it as that very prefill rank's (docs/SECURITY.md, "Authentication (CURVE)").
    const zmq_auth::KeyIdentity* key = options.curve->allowed->Find(endpoint.curve_public_key);
    if (key == nullptr || key->role != zmq_auth::KeyRole::kPrefill || key->rank != rank) {
      return absl::PermissionDeniedError(absl::StrCat(
          "prefill rank ", rank, " of DP group ", dp_group, " at ", tcp, " registered ",
          endpoint.curve_public_key.empty()
              ? std::string("no CURVE key")
              : absl::StrCat("CURVE key ", endpoint.curve_public_key,
                             key == nullptr ? ", which is not in --curve-allowed"
                                            : absl::StrCat(", which is ", UserId(*key))),
          ": CURVE is on and only an allowed prefill key of that rank is taken"));
    }
    outbox->SetServerKey(tcp, endpoint.curve_public_key);
  }
  Owned([&] { node.endpoints[{dp_group, rank}] = tcp; });
  return tcp;
}

void DecodeSidecar::Route(uint64_t room, const std::string& address,
                          const layout::Manifest& manifest, std::optional<int> dp_group) {
  auto routed = [&]() -> absl::StatusOr<session::RoomRoute> {
    KVRAIL_ASSIGN_OR_RETURN(std::shared_ptr<PrefillNode> node, NodeFor(address));
    session::RoomRoute route;
    KVRAIL_ASSIGN_OR_RETURN(route.dp_group,
                            plan::DpGroupOf(room, node->description.dp_size, dp_group));
    route.targets = node->targets;
    route.revision = node->description.revision;
    for (int rank : route.targets.target_tp_ranks) {
      KVRAIL_ASSIGN_OR_RETURN(std::string endpoint,
                              EndpointFor(address, *node, route.dp_group, rank));
      route.endpoints.push_back({rank, endpoint});
    }
    return route;
  }();
  Owned([&] {
    if (!rooms) return;  // the arena went away meanwhile
    if (!routed.ok()) {
      ApplyLocked(rooms->Fail(
          room, absl::StrCat("route to ", address, ": ", DescribeError(routed.status())), RoomNow(),
          session::FailureCause::kBootstrap));
      return;
    }
    RouteLocked(room, *std::move(routed), manifest);
  });
}

std::optional<absl::StatusOr<session::RoomRoute>> DecodeSidecar::CachedRouteLocked(
    uint64_t room, const std::string& address, std::optional<int> dp_group) {
  auto found = nodes.find(address);
  if (found == nodes.end()) return std::nullopt;
  const PrefillNode& node = *found->second;
  session::RoomRoute route;
  absl::StatusOr<int> group = plan::DpGroupOf(room, node.description.dp_size, dp_group);
  if (!group.ok()) return group.status();
  route.dp_group = *group;
  route.targets = node.targets;
  route.revision = node.description.revision;
  for (int rank : route.targets.target_tp_ranks) {
    auto endpoint = node.endpoints.find({route.dp_group, rank});
    if (endpoint == node.endpoints.end()) return std::nullopt;
    // A rank known gone is looked up again, for every room, until it listens: restarted, it
    // registers another port with its bootstrap server, which a cached endpoint would never
    // see (the decode would fail every later room through it). One the server still lists at
    // the gone endpoint fails the room at once (DecodeRooms::OnRoute), naming the rank.
    if (rooms->IsGone(endpoint->second)) {
      found->second->endpoints.erase(endpoint);
      return std::nullopt;
    }
    route.endpoints.push_back({rank, endpoint->second});
  }
  return route;
}

void DecodeSidecar::RouteLocked(uint64_t room, session::RoomRoute route,
                                const layout::Manifest& manifest) {
  AssertOnOwner("RouteLocked");
  const absl::Time now = RoomNow();
  absl::StatusOr<session::DecodeOutput> out = rooms->OnRoute(room, std::move(route), now);
  if (!out.ok()) {
    ApplyLocked(
        rooms->Fail(room, DescribeError(out.status()), now, session::FailureCauseOf(out.status())));
    return;
  }
  ApplyLocked(*std::move(out));
  out = rooms->OnAllocated(room, manifest, now);
  if (!out.ok()) {
    ApplyLocked(
        rooms->Fail(room, DescribeError(out.status()), now, session::FailureCauseOf(out.status())));
    return;
  }
  ApplyLocked(*std::move(out));
}

}  // namespace kvrail::sidecar
