#include "tools/engine_sim/engine_sim.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cluster/kv_pattern.h"
#include "control/engine_api/engine_api.h"
#include "control/engine_api/sidecar_arena.h"
#include "control/layout/manifest.h"
#include "engine/base/error.h"
#include "engine/memory/arena.h"

namespace kvrail::sim {
namespace {

struct Room {
  uint64_t id = 0;
  int64_t prompt = 0;
  int64_t token = -1;
  std::vector<int64_t> blocks;
  layout::Manifest manifest;
  absl::Time started;
};

int64_t PagesFor(const layout::KvShape& shape, int64_t prompt) {
  return (prompt + shape.page_tokens - 1) / shape.page_tokens;
}

// A decode Success polled right after its event must say what the event said: Poll carries the
// token and speculative ids too (docs/ENGINE-API.md). Empty when it does; otherwise why not.
std::string PolledAsEvent(engine_api::EngineApiClient& sidecar, const v1::RoomEvent& event) {
  v1::EngineRequest request;
  request.mutable_poll()->add_rooms(event.room());
  absl::StatusOr<v1::EngineReply> reply = sidecar.Call(request);
  if (!reply.ok()) return absl::StrCat("Poll after Success: ", reply.status().message());
  if (reply->states_size() != 1) return "Poll after Success: not one state";
  const v1::RoomState& state = reply->states(0);
  if (state.status() != v1::TRANSFER_POLL_SUCCESS ||
      state.bootstrap_token() != event.bootstrap_token() ||
      !std::equal(state.speculative_ids().begin(), state.speculative_ids().end(),
                  event.speculative_ids().begin(), event.speculative_ids().end())) {
    return absl::StrCat("Poll after Success says ", v1::TransferPoll_Name(state.status()),
                        " token ", state.bootstrap_token(), " speculative ids [",
                        absl::StrJoin(state.speculative_ids(), ","), "], the event token ",
                        event.bootstrap_token(), " ids [",
                        absl::StrJoin(event.speculative_ids(), ","), "]");
  }
  return "";
}

absl::StatusOr<layout::Manifest> ManifestFor(const layout::Contract& contract,
                                             std::vector<int64_t> blocks, int64_t prompt) {
  const std::vector<std::vector<int64_t>> table = {std::move(blocks)};
  return layout::BuildManifest(contract, table, 0, prompt);
}

void Say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

int64_t ExpectedCachedTokens(uint64_t room, int64_t prompt_tokens) {
  return std::min<int64_t>(static_cast<int64_t>(room % 7), prompt_tokens);
}

double ExpectedLogprob(uint64_t room) { return -static_cast<double>(room % 64) / 16; }

std::vector<int32_t> ExpectedTokens(const layout::KvShape& shape, int tp_size, int tp_rank,
                                    uint64_t room, int64_t prompt_tokens, int64_t bootstrap_token,
                                    int count) {
  absl::StatusOr<layout::Contract> contract = layout::BuildKvContract(shape, tp_size);
  if (!contract.ok()) return {};
  std::vector<int64_t> blocks;
  for (int64_t i = 0; i < PagesFor(shape, prompt_tokens); ++i) blocks.push_back(1 + i);
  absl::StatusOr<layout::Manifest> manifest = ManifestFor(*contract, blocks, prompt_tokens);
  absl::StatusOr<RankLayout> rank = RankLayout::Create(*contract, tp_size, tp_rank);
  if (!manifest.ok() || !rank.ok()) return {};
  const uint64_t digest = rank->Digest(*manifest, room, {});
  return ToyDecode(digest ^ static_cast<uint64_t>(bootstrap_token), count);
}

absl::Status RunEngineSim(const EngineSimOptions& options) {
  const std::string who = absl::StrCat("engine-sim ", options.prefill ? "prefill" : "decode",
                                       " rank ", options.tp_rank);
  KVRAIL_ASSIGN_OR_RETURN(const layout::Contract contract,
                          layout::BuildKvContract(options.shape, options.tp_size));
  KVRAIL_ASSIGN_OR_RETURN(const RankLayout rank,
                          RankLayout::Create(contract, options.tp_size, options.tp_rank));
  KVRAIL_ASSIGN_OR_RETURN(std::string wire, layout::SerializeContract(contract));
  const uint64_t arena_bytes = static_cast<uint64_t>(contract.ArenaBytes());
  const bool engine_arena = options.arena_from == "engine";
  if (!engine_arena && options.arena_from != "sidecar") {
    return absl::InvalidArgumentError(
        absl::StrCat("--arena-from \"", options.arena_from, "\": expected engine or sidecar"));
  }
  if (engine_arena && options.arena.empty()) {
    return absl::InvalidArgumentError(
        "--arena-from engine needs --arena, the shared-memory name to create");
  }
  // The arena: one this engine creates in named shared memory, or the sidecar's own, allocated
  // where its peers write fastest and mapped here from the path in its reply.
  std::optional<Arena> own_arena;
  if (engine_arena) {
    (void)Arena::UnlinkShared(options.arena);  // a name left by a crashed run
    KVRAIL_ASSIGN_OR_RETURN(own_arena, Arena::CreateShared(options.arena, arena_bytes));
  }
  KVRAIL_ASSIGN_OR_RETURN(auto sidecar,
                          engine_api::EngineApiClient::Connect(
                              options.sidecar, options.curve ? &*options.curve : nullptr));
  v1::EngineRequest attach;
  if (engine_arena) {
    attach.mutable_attach()->set_shm_name(options.arena);
  } else {
    attach.mutable_attach()->set_allocate_bytes(arena_bytes);
  }
  attach.mutable_attach()->set_contract(wire);
  absl::StatusOr<v1::EngineReply> attached = sidecar->Call(attach, absl::Seconds(30));
  if (!attached.ok()) return AddContext(attached.status(), who + ": attach");
  std::optional<engine_api::SidecarArena> sidecar_arena;
  absl::Span<uint8_t> arena;
  std::string placement = "posix-shm";
  if (engine_arena) {
    arena = absl::MakeSpan(own_arena->data(), own_arena->size());
  } else {
    absl::StatusOr<engine_api::SidecarArena> mapped =
        engine_api::MapSidecarArena(*attached, arena_bytes);
    if (!mapped.ok()) return AddContext(mapped.status(), who);
    sidecar_arena = *std::move(mapped);
    arena = sidecar_arena->bytes();
    placement = sidecar_arena->placement;
  }
  Say(absl::StrCat("arena from=", options.arena_from, " placement=", placement,
                   " bytes=", arena.size()));

  std::vector<int64_t> free_pages;
  for (int64_t page = options.shape.pages; page >= 1; --page) free_pages.push_back(page);
  std::deque<Room> waiting;  // for pages
  std::map<uint64_t, Room> active;
  bool input_open = true;
  std::string buffer;

  auto start_room = [&](Room room) -> absl::Status {
    for (int64_t i = 0; i < PagesFor(options.shape, room.prompt); ++i) {
      room.blocks.push_back(free_pages.back());
      free_pages.pop_back();
    }
    KVRAIL_ASSIGN_OR_RETURN(room.manifest, ManifestFor(contract, room.blocks, room.prompt));
    KVRAIL_ASSIGN_OR_RETURN(std::string manifest_wire, layout::SerializeManifest(room.manifest));
    room.started = absl::Now();
    v1::EngineRequest request;
    if (options.prefill) {
      KVRAIL_RETURN_IF_ERROR(rank.Fill(room.manifest, room.id, arena));
      request.mutable_ready()->set_room(room.id);
      request.mutable_ready()->set_source_manifest(manifest_wire);
      request.mutable_ready()->set_bootstrap_token(room.token);
      request.mutable_ready()->add_speculative_ids(static_cast<int32_t>(room.id % 1000));
      // The 2026-09 status values (CACHEPD §12.9), which a decode of that revision gets back:
      // ExpectedCachedTokens and ExpectedLogprob.
      request.mutable_ready()->set_cached_tokens(ExpectedCachedTokens(room.id, room.prompt));
      request.mutable_ready()->set_first_token_logprob(ExpectedLogprob(room.id));
    } else {
      request.mutable_expect()->set_room(room.id);
      request.mutable_expect()->set_bootstrap_address(options.bootstrap);
      request.mutable_expect()->set_destination_manifest(manifest_wire);
    }
    absl::StatusOr<v1::EngineReply> reply = sidecar->Call(request);
    const uint64_t id = room.id;
    const std::vector<int64_t> blocks = room.blocks;
    if (!reply.ok()) {
      free_pages.insert(free_pages.end(), blocks.begin(), blocks.end());
      Say(absl::StrCat("done ", id, " failed ", reply.status().message()));
      return absl::OkStatus();
    }
    active.emplace(id, std::move(room));
    return absl::OkStatus();
  };

  auto finish = [&](const v1::RoomEvent& event) {
    auto it = active.find(event.room());
    if (it == active.end()) return;
    Room& room = it->second;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - room.started);
    if (event.status() != v1::TRANSFER_POLL_SUCCESS) {
      Say(absl::StrCat("done ", room.id, " failed ", event.reason()));
    } else if (options.prefill) {
      Say(absl::StrCat("done ", room.id, " ok ", event.bytes(), " ", seconds));
    } else {
      const absl::Status checked = rank.Check(room.manifest, room.id, arena);
      if (!checked.ok()) {
        Say(absl::StrCat("done ", room.id, " failed ", checked.message()));
      } else if (event.bootstrap_token() != room.token) {
        Say(absl::StrCat("done ", room.id, " failed bootstrap token ", event.bootstrap_token(),
                         ", expected ", room.token));
      } else if (const std::string polled = PolledAsEvent(*sidecar, event); !polled.empty()) {
        Say(absl::StrCat("done ", room.id, " failed ", polled));
      } else {
        // What the prefill sent beside the token: a 2026-09 status carries the Ready's values,
        // a snapshot one none (0 and none).
        Say(absl::StrCat("values ", room.id, " cached_tokens=", event.cached_tokens(),
                         " first_token_logprob=",
                         event.has_first_token_logprob() ? absl::StrCat(event.first_token_logprob())
                                                         : std::string("none")));
        const uint64_t digest = rank.Digest(room.manifest, room.id, arena);
        const std::vector<int32_t> tokens = ToyDecode(
            digest ^ static_cast<uint64_t>(event.bootstrap_token()), options.decode_tokens);
        Say(absl::StrCat("done ", room.id, " ok ", event.bytes(), " ", seconds, " ",
                         absl::StrJoin(tokens, " ")));
      }
    }
    free_pages.insert(free_pages.end(), room.blocks.begin(), room.blocks.end());
    active.erase(it);
  };

  while (input_open || !waiting.empty() || !active.empty()) {
    // Rooms from stdin.
    if (input_open) {
      pollfd in{0, POLLIN, 0};
      if (poll(&in, 1, active.empty() && waiting.empty() ? 100 : 0) > 0) {
        char chunk[4096];
        const ssize_t n = read(0, chunk, sizeof(chunk));
        if (n <= 0) {
          input_open = false;
        } else {
          buffer.append(chunk, static_cast<size_t>(n));
        }
      }
      size_t newline;
      while ((newline = buffer.find('\n')) != std::string::npos) {
        const std::string line = buffer.substr(0, newline);
        buffer.erase(0, newline + 1);
        const std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
        Room room;
        if (words.size() != 4 || words[0] != "room" || !absl::SimpleAtoi(words[1], &room.id) ||
            !absl::SimpleAtoi(words[2], &room.prompt) || !absl::SimpleAtoi(words[3], &room.token) ||
            room.prompt < 1) {
          Say(absl::StrCat("error bad command \"", line,
                           "\": expected room <id> <prompt tokens> <bootstrap token>"));
          continue;
        }
        if (PagesFor(options.shape, room.prompt) > options.shape.pages) {
          Say(absl::StrCat("done ", room.id, " failed the prompt needs ",
                           PagesFor(options.shape, room.prompt), " pages, the arena has ",
                           options.shape.pages));
          continue;
        }
        waiting.push_back(std::move(room));
      }
    }
    while (!waiting.empty() && PagesFor(options.shape, waiting.front().prompt) <=
                                   static_cast<int64_t>(free_pages.size())) {
      Room room = std::move(waiting.front());
      waiting.pop_front();
      KVRAIL_RETURN_IF_ERROR(start_room(std::move(room)));
    }
    if (!active.empty()) {
      std::optional<v1::RoomEvent> event = sidecar->NextEvent(absl::Milliseconds(20));
      if (event) finish(*event);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail::sim
