#include "tools/engine_sim/engine_sim.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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
  absl::Time started;   // the engine began it (before a prefill fills its pages)
  absl::Time ready_at;  // a prefill's Ready was sent
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

// A marker no room id takes: --audit fills each freed page with this "room"'s pattern.
constexpr uint64_t kFreedPattern = ~uint64_t{0};

// The one-page manifest of `page`, at manifest position 0: how --audit fills and checks a freed
// page (the pattern depends on the position, so each page is its own manifest).
absl::StatusOr<layout::Manifest> PageManifest(const layout::Contract& contract,
                                              const layout::KvShape& shape, int64_t page) {
  return ManifestFor(contract, {page}, shape.page_tokens);
}

// A decode engine that restarted cannot know which pages its predecessor lent to rooms that a
// prefill may still write: it takes no room until its sidecar holds none and waits on no fence
// (docs/ENGINE-API.md, "When pages are safe"). OK at once for a sidecar that never had an engine.
absl::Status AwaitIdleSidecar(engine_api::EngineApiClient& sidecar, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::EngineRequest request;
  request.mutable_stats();
  while (true) {
    KVRAIL_ASSIGN_OR_RETURN(const v1::EngineReply reply, sidecar.Call(request));
    if (reply.stats().rooms() == 0 && reply.stats().fences() == 0) return absl::OkStatus();
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the sidecar still holds ", reply.stats().rooms(), " rooms and ", reply.stats().fences(),
          " fences of the engine before this one after ", absl::FormatDuration(timeout)));
    }
    (void)sidecar.NextEvent(absl::Milliseconds(50));  // the predecessor's rooms: not ours
  }
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
  // An engine that restarted without its predecessor's engine token is refused until the
  // sidecar has seen the old connection close (milliseconds after a crash): try again meanwhile.
  absl::StatusOr<v1::EngineReply> attached = sidecar->Call(attach, absl::Seconds(30));
  for (int attempt = 0; attempt < 100 && !attached.ok() &&
                        absl::StrContains(attached.status().message(), "another engine drives");
       ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    attached = sidecar->Call(attach, absl::Seconds(30));
  }
  if (!attached.ok()) return AddContext(attached.status(), who + ": attach");
  if (!options.prefill) {
    const absl::Status idle = AwaitIdleSidecar(*sidecar, absl::Seconds(60));
    if (!idle.ok()) return AddContext(idle, who);
  }
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
  // Decode: rooms reported Failed with PAGES_HELD, whose pages wait for the event that releases
  // them; a page is the engine's again only then.
  std::map<uint64_t, std::vector<int64_t>> held;
  // Rooms whose terminal event came (or whose request was refused): a second terminal event of
  // one of them breaks the engine API's promise (one per room), and is reported.
  std::set<uint64_t> ended;
  // Rooms this engine ended without the sidecar's word: its request was refused, or it aborted
  // the room while it waited for pages, before the sidecar heard of it from this engine. One
  // Failed event of such a room may still follow (the sidecar had the room from its peer: a
  // decode's pre-allocation), a second may not.
  std::set<uint64_t> ended_here;
  // --audit: pages given back and filled with kFreedPattern, to check when next lent.
  std::set<int64_t> filled;
  bool input_open = true;
  std::string buffer;

  // Gives pages back to the free list; --audit fills each with the freed pattern, which must
  // still be there when the page is lent again (no write of an ended room landed meanwhile).
  auto give_back = [&](const std::vector<int64_t>& blocks) -> absl::Status {
    for (int64_t page : blocks) {
      if (options.audit) {
        KVRAIL_ASSIGN_OR_RETURN(const layout::Manifest one,
                                PageManifest(contract, options.shape, page));
        KVRAIL_RETURN_IF_ERROR(rank.Fill(one, kFreedPattern, arena));
        filled.insert(page);
      }
      free_pages.push_back(page);
    }
    return absl::OkStatus();
  };
  // --audit: says "error late write ..." for each page of `room` that changed since it was freed.
  auto check_freed = [&](const Room& room) -> absl::Status {
    for (int64_t page : room.blocks) {
      if (filled.erase(page) == 0) continue;
      KVRAIL_ASSIGN_OR_RETURN(const layout::Manifest one,
                              PageManifest(contract, options.shape, page));
      const absl::Status intact = rank.Check(one, kFreedPattern, arena);
      if (!intact.ok()) {
        Say(absl::StrCat("error late write: page ", page,
                         ", free since an earlier room ended, "
                         "changed before room ",
                         room.id, " took it: ", intact.message()));
      }
    }
    return absl::OkStatus();
  };

  auto start_room = [&](Room room) -> absl::Status {
    for (int64_t i = 0; i < PagesFor(options.shape, room.prompt); ++i) {
      room.blocks.push_back(free_pages.back());
      free_pages.pop_back();
    }
    KVRAIL_RETURN_IF_ERROR(check_freed(room));
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
    room.ready_at = absl::Now();
    absl::StatusOr<v1::EngineReply> reply = sidecar->Call(request);
    const uint64_t id = room.id;
    if (!reply.ok()) {
      // Refused: the pages were never lent (docs/ENGINE-API.md), so they are this engine's.
      KVRAIL_RETURN_IF_ERROR(give_back(room.blocks));
      ended_here.insert(id);
      Say(absl::StrCat("done ", id, " failed ", reply.status().message()));
      return absl::OkStatus();
    }
    active.emplace(id, std::move(room));
    return absl::OkStatus();
  };

  // A room's terminal event, or a release of a failed room's held pages.
  auto finish = [&](const v1::RoomEvent& event) -> absl::Status {
    if (event.pages_released()) {
      auto it = held.find(event.room());
      if (it == held.end()) {
        if (ended.count(event.room()) != 0) {
          Say(absl::StrCat("error room ", event.room(),
                           ": an event released pages that were not held"));
        }
        return absl::OkStatus();
      }
      KVRAIL_RETURN_IF_ERROR(give_back(it->second));
      held.erase(it);
      return absl::OkStatus();
    }
    auto it = active.find(event.room());
    if (it == active.end()) {
      if (ended_here.erase(event.room()) != 0) {
        ended.insert(event.room());
        return absl::OkStatus();
      }
      // Not a room of this engine (its predecessor's, failed when this one attached), or a
      // second terminal event of one that ended.
      if (ended.count(event.room()) != 0) {
        Say(absl::StrCat("error room ", event.room(), ": a second terminal event (",
                         v1::TransferPoll_Name(event.status()), ": ", event.reason(),
                         ") after the room had ended"));
      }
      return absl::OkStatus();
    }
    Room& room = it->second;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - room.started);
    if (event.status() != v1::TRANSFER_POLL_SUCCESS) {
      Say(absl::StrCat("done ", room.id, " failed ", event.reason()));
    } else if (options.prefill) {
      // The transfer apart from the engine's own work: bytes, the data plane's seconds for them
      // (the event's), and seconds from the Ready to its Success.
      Say(absl::StrCat("transfer ", room.id, " ", event.bytes(), " ", event.seconds(), " ",
                       absl::ToDoubleSeconds(absl::Now() - room.ready_at)));
      Say(absl::StrCat("done ", room.id, " ok ", event.bytes(), " ", seconds));
    } else {
      // A Success whose bytes or token are wrong is the one outcome an engine cannot survive:
      // "wrong", not "failed".
      const absl::Status checked = rank.Check(room.manifest, room.id, arena);
      if (!checked.ok()) {
        Say(absl::StrCat("done ", room.id, " wrong ", checked.message()));
      } else if (event.bootstrap_token() != room.token) {
        Say(absl::StrCat("done ", room.id, " wrong bootstrap token ", event.bootstrap_token(),
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
        if (options.audit) {
          Say(absl::StrCat("checked ", room.id, " ", rank.Bytes(room.manifest)));
        }
        const uint64_t digest = rank.Digest(room.manifest, room.id, arena);
        const std::vector<int32_t> tokens = ToyDecode(
            digest ^ static_cast<uint64_t>(event.bootstrap_token()), options.decode_tokens);
        Say(absl::StrCat("done ", room.id, " ok ", event.bytes(), " ", seconds, " ",
                         absl::StrJoin(tokens, " ")));
      }
    }
    ended.insert(room.id);
    if (!options.prefill && event.status() != v1::TRANSFER_POLL_SUCCESS &&
        event.pages() == v1::PAGES_HELD) {
      held.emplace(room.id, room.blocks);
    } else {
      KVRAIL_RETURN_IF_ERROR(give_back(room.blocks));
    }
    active.erase(it);
    return absl::OkStatus();
  };

  // "abort <id>": the engine gives the room up. A room still waiting for pages ends here; an
  // active one is aborted through the sidecar, whose event ends it; any other is ignored.
  auto abort_room = [&](uint64_t id) {
    for (auto it = waiting.begin(); it != waiting.end(); ++it) {
      if (it->id != id) continue;
      waiting.erase(it);
      // Not `ended`: the sidecar may have the room from its peer, and its one Failed event of
      // it is no second end (the soak's "second terminal event" of issue 29 was this).
      ended_here.insert(id);
      Say(absl::StrCat("done ", id, " failed aborted by its engine before it started"));
      return;
    }
    if (active.count(id) == 0) return;
    v1::EngineRequest request;
    request.mutable_abort()->set_room(id);
    request.mutable_abort()->set_reason("aborted by the engine-sim (stdin)");
    absl::StatusOr<v1::EngineReply> reply = sidecar->Call(request);
    if (!reply.ok()) {
      Say(absl::StrCat("error abort ", id, " refused: ", reply.status().message()));
    }
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
        uint64_t abort_id = 0;
        if (words.size() == 2 && words[0] == "abort" && absl::SimpleAtoi(words[1], &abort_id)) {
          abort_room(abort_id);
          continue;
        }
        Room room;
        if (words.size() != 4 || words[0] != "room" || !absl::SimpleAtoi(words[1], &room.id) ||
            !absl::SimpleAtoi(words[2], &room.prompt) || !absl::SimpleAtoi(words[3], &room.token) ||
            room.prompt < 1) {
          Say(absl::StrCat("error bad command \"", line,
                           "\": expected room <id> <prompt tokens> <bootstrap token>, or "
                           "abort <id>"));
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
    if (!active.empty() || !held.empty()) {
      std::optional<v1::RoomEvent> event = sidecar->NextEvent(absl::Milliseconds(20));
      if (event) KVRAIL_RETURN_IF_ERROR(finish(*event));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvrail::sim
