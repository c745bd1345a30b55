// `kvrail engine-sim`: a simulated engine rank. It attaches a KV arena to its sidecar through
// the engine API: by default the sidecar allocates it (AttachArena.allocate_bytes) where its
// transport's peers write fastest and the engine-sim maps it from the reply's path; with
// arena_from "engine" the engine-sim creates a POSIX shared-memory arena and shares its name,
// as engines did before. Once attached it says, on stdout,
//
//   arena from=<sidecar|engine> placement=<ucx-shm|memfd|posix-shm> bytes=<n>
//
// and serves rooms named on stdin, one per line:
//
//   room <id> <prompt tokens> <bootstrap token>
//
// Prefill: allocates pages, fills them with the room's pattern (kv_pattern.h), sends Ready.
// Decode: allocates pages, sends Expect, and on Success checks every byte of its slice, runs
// the toy decode step over the received cache and streams the tokens back. Each room ends with
// one stdout line:
//
//   done <id> ok <bytes> <seconds> [<token> ...]     (decode: the generated tokens)
//   done <id> failed <reason>
//   done <id> wrong <reason>     (decode: a Success whose bytes or token are not the room's)
//
// <seconds> are the room's from its engine's start (a prefill's include filling its pages). A
// prefill's Success is preceded by the transfer alone:
//
//   transfer <id> <bytes> <data-plane seconds> <seconds from its Ready to its Success>
//
// and a decode's by `values <id> cached_tokens=<n> first_token_logprob=<x|none>`.
//
// `abort <id>` on stdin gives a room up (engine API Abort; a room still waiting for pages ends
// at once). A decode keeps a room's pages out of use after a Failed event with PAGES_HELD until
// the event that releases them (docs/ENGINE-API.md, "When pages are safe"); a decode that finds
// its sidecar holding an earlier engine's rooms or fences waits until it holds none. A broken
// promise of the engine API is one line, `error <what>`: a second terminal event of a room, a
// release of pages that were not held, and with `audit` a write that landed in a page after its
// room ended. With `audit` a decode also says `checked <id> <bytes>` before each `done <id> ok`.
//
// Rooms wait for free pages; a closed stdin ends the process once every room is done.
#ifndef KVRAIL_TOOLS_ENGINE_SIM_ENGINE_SIM_H_
#define KVRAIL_TOOLS_ENGINE_SIM_ENGINE_SIM_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "control/layout/kv_shape.h"
#include "engine/zmq_auth/curve.h"

namespace kvrail::sim {

struct EngineSimOptions {
  bool prefill = true;
  std::string sidecar;  // the sidecar's engine API endpoint
  // Who allocates the arena: "sidecar" (AttachArena.allocate_bytes) or "engine" (this process
  // creates the shared-memory object `arena` and attaches it by name).
  std::string arena_from = "sidecar";
  std::string arena;      // arena_from "engine": shared-memory name to create ("/kvrail-p0")
  std::string bootstrap;  // decode: the prefill node's bootstrap "host:port"
  int tp_size = 1;
  int tp_rank = 0;
  layout::KvShape shape;
  int decode_tokens = 8;  // tokens the toy decode step generates per room
  // The soak's checks (tools/soak): fill each page given back with a marker pattern and check
  // it is intact when the page is lent again; say how many bytes each Success checked.
  bool audit = false;
  // CURVE to a tcp engine API (docs/SECURITY.md): this engine's keys and its sidecar's key.
  std::optional<zmq_auth::CurveClientKeys> curve;
};

// Runs until stdin closes and every room is done. Errors (arena, attach) are returned.
absl::Status RunEngineSim(const EngineSimOptions& options);

// The tokens a decode rank of TP `tp_size`, rank `tp_rank`, must stream for a room whose cache
// arrived intact: what the demo checks each "done" line against.
std::vector<int32_t> ExpectedTokens(const layout::KvShape& shape, int tp_size, int tp_rank,
                                    uint64_t room, int64_t prompt_tokens, int64_t bootstrap_token,
                                    int count);

// The cached-token count and first-token logprob a prefill engine-sim puts in a room's Ready
// (CACHEPD §12.9): what a decode engine-sim's "values" line shows when its prefill node and it
// speak 2026-09; against a snapshot peer the line shows 0 and none.
int64_t ExpectedCachedTokens(uint64_t room, int64_t prompt_tokens);
double ExpectedLogprob(uint64_t room);  // exact in binary: -(room mod 64) / 16

}  // namespace kvrail::sim

#endif  // KVRAIL_TOOLS_ENGINE_SIM_ENGINE_SIM_H_
