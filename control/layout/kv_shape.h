// Contracts for a model's KV cache from its shape, the way a recipe lays out an arena
// (CACHEPD §4.6): one plane per field, back to back in plane_id order, one null page first.
// For the demo, tests and benchmarks, which need a realistic contract without an engine.
#ifndef KVRAIL_CONTROL_LAYOUT_KV_SHAPE_H_
#define KVRAIL_CONTROL_LAYOUT_KV_SHAPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "control/layout/contract.h"
#include "control/layout/dtype.h"

namespace kvrail::layout {

struct KvShape {
  int layers = 32;
  // Attention (GQA/MHA): per layer a "k" and a "v" field of shape [page_tokens, heads, head_dim],
  // heads partitioned on axis 1 across TP ranks.
  int kv_heads = 8;
  int head_dim = 128;
  // MLA-style: per layer one "latent" field of shape [page_tokens, latent_dim], replicated on
  // every rank (not in the transfer schema), instead of k and v.
  bool latent = false;
  int latent_dim = 576;
  DType dtype = DType::kBfloat16;
  int page_tokens = 16;
  int64_t prefix_granularity = 16;
  // Usable pages per rank (num_lcm_blocks); the arena holds one more, the null page.
  int64_t pages = 64;
  // Hybrid layouts (CACHEPD §5.2 retention and transfer policies; 0 = off, not with latent).
  // sliding_window_tokens > 0: the attention layers' k and v live in group "sliding_window",
  // which keeps that many tokens. state_dim > 0: every odd layer holds one recurrent state
  // instead of k and v: field "layer.<N>.state" of shape [kv_heads, state_dim, head_dim] in
  // group "state" (latest snapshot, a checkpoint every page_tokens tokens), heads partitioned
  // on axis 0 across TP ranks.
  int sliding_window_tokens = 0;
  int state_dim = 0;
};

// The contract of one rank of a deployment with attention TP `tp_size`: group "full_attention"
// (full history, rows_per_page = page_tokens), or for a hybrid "sliding_window" and "state" (in
// that order, those it uses), planes "unit.<layer>.<suffix>", fields "layer.<layer>.<suffix>".
// InvalidArgument naming the member when a count is not positive, kv_heads is not a multiple
// of tp_size, a hybrid is asked of a latent, or the arena would pass 2^52 bytes.
absl::StatusOr<Contract> BuildKvContract(const KvShape& shape, int tp_size);

// Bytes of one page of one field on a rank of TP `tp_size` (the shape's per-page payload).
int64_t FieldPageBytes(const KvShape& shape, int tp_size);

}  // namespace kvrail::layout

#endif  // KVRAIL_CONTROL_LAYOUT_KV_SHAPE_H_
