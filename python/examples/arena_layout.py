#!/usr/bin/python3
"""One room's KV written with numpy into prefill arenas and checked in the decode's: the arena
layout an engine writes (docs/INTEGRATING.md, "Arena layout for engine authors").

    python3 -m kvrail_engine.examples.arena_layout --bootstrap 127.0.0.1:8998 \
        --prefill ipc:///tmp/kvrail-prefill0.sock --prefill ipc:///tmp/kvrail-prefill1.sock \
        --prefill-contract p.json --prefill-arena-bytes N \
        --decode ipc:///tmp/kvrail-decode0.sock --decode-contract d.json --decode-arena-bytes M

The contracts and arena sizes come from `kvrail contract --tp P ...` and `... --arena-bytes`
(the decode's with its own TP). Every prefill rank writes its heads of a 40-token prompt whose
first 16 tokens the decode already holds (prefix_len 16); the decode checks that every page of
the window holds every head of the pattern, whole pages (the last page's rows past the prompt
too), and that its prefix page was not written.
"""

import argparse
import json
import sys

import numpy as np

from kvrail_engine import SidecarClient, TransferPoll

PREFIX_LEN, PROMPT_LEN, ROOM = 16, 40, 7


def pages_of(arena, contract, field):
    """Every page of `field` as one array [block, tokens, heads, dim] of 16-bit elements (bf16
    bits): block b starts at the plane's arena_offset_bytes + the field's field_offset_bytes +
    b x page_stride_bytes (the extra term is 0 in contracts of one cache block per LCM block)."""
    plan = contract["plan"]
    plane = next(p for p in plan["planes"] if p["plane_id"] == field["plane_id"])
    group = next(g for g in plan["groups"] if g["group_id"] == field["group_id"])
    tokens, heads, dim = field["shape"]
    assert field["dtype"] in ("bfloat16", "float16"), field["dtype"]
    first = (plane["arena_offset_bytes"] + plane["bytes_per_lcm_block"]
             - field["page_stride_bytes"] + field["field_offset_bytes"])
    return np.ndarray((group["page_count"], tokens, heads, dim), dtype=np.uint16,
                      buffer=arena, offset=first,
                      strides=(field["page_stride_bytes"], heads * dim * 2, dim * 2, 2))


def pattern(field_index, tokens, heads, dim):
    """What the model computed: a value per (field, token, global head, dim)."""
    t, h, d = np.meshgrid(tokens, heads, np.arange(dim), indexing="ij")
    return ((field_index * 7919 + t * 131 + h * 17 + d) % 65521).astype(np.uint16)


def wait_for(client, status, what):
    event = client.next_event(timeout=60.0)
    while event is not None and event.status != status and event.status != TransferPoll.FAILED:
        event = client.next_event(timeout=60.0)
    if event is None or event.status != status:
        sys.exit("%s: %s" % (what, event.reason if event else "no event within 60 s"))
    return event


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="the prefill node's host:port")
    parser.add_argument("--prefill", action="append", required=True,
                        help="a prefill rank's engine API endpoint, in rank order")
    parser.add_argument("--prefill-contract", required=True)
    parser.add_argument("--prefill-arena-bytes", type=int, required=True)
    parser.add_argument("--decode", required=True, help="the decode rank's (TP 1) endpoint")
    parser.add_argument("--decode-contract", required=True)
    parser.add_argument("--decode-arena-bytes", type=int, required=True)
    args = parser.parse_args()
    prefill_contract = json.load(open(args.prefill_contract))
    decode_contract = json.load(open(args.decode_contract))
    page_tokens = decode_contract["plan"]["fields"][0]["shape"][0]
    slots = -(-PROMPT_LEN // page_tokens)  # every slot from token 0: 3 pages of 16 tokens
    prefill_table = list(range(1, slots + 1))  # block 0 is never a room's
    decode_table = list(range(slots + 1, 2 * slots + 1))

    decode = SidecarClient(args.decode)
    decode_arena = decode.attach_allocated(args.decode_arena_bytes,
                                           open(args.decode_contract).read())
    prefills = [SidecarClient(endpoint) for endpoint in args.prefill]
    arenas = [p.attach_allocated(args.prefill_arena_bytes, open(args.prefill_contract).read())
              for p in prefills]
    decode.expect(ROOM, args.bootstrap, block_tables=[decode_table],
                  window=(PREFIX_LEN, PROMPT_LEN))
    for rank, (prefill, arena) in enumerate(zip(prefills, arenas)):
        prefill.begin(ROOM)
        wait_for(prefill, TransferPoll.BOOTSTRAPPED, "prefill %d" % rank)
        # The forward pass: rank r holds heads [r*h, (r+1)*h) of every layer's k and v.
        for index, field in enumerate(prefill_contract["plan"]["fields"]):
            tokens, heads, dim = field["shape"]
            pages = pages_of(arena.view, prefill_contract, field)
            for slot, block in enumerate(prefill_table):
                rows = np.arange(slot * tokens, (slot + 1) * tokens)
                pages[block] = pattern(index, rows, np.arange(rank * heads, (rank + 1) * heads),
                                       dim)
            del pages  # a view of the arena: dropped before the arena is closed
        prefill.ready(ROOM, bootstrap_token=42, block_tables=[prefill_table],
                      window=(PREFIX_LEN, PROMPT_LEN))
    for rank, prefill in enumerate(prefills):
        wait_for(prefill, TransferPoll.SUCCESS, "prefill %d" % rank)
    landed = wait_for(decode, TransferPoll.SUCCESS, "decode")

    for index, field in enumerate(decode_contract["plan"]["fields"]):
        tokens, heads, dim = field["shape"]
        pages = pages_of(decode_arena.view, decode_contract, field)
        for slot, block in enumerate(decode_table):
            if slot < PREFIX_LEN // tokens:  # the decode's own prefix: never written
                assert not pages[block].any(), (field["field_id"], slot)
                continue
            rows = np.arange(slot * tokens, (slot + 1) * tokens)  # whole pages
            expected = pattern(index, rows, np.arange(heads), dim)
            assert np.array_equal(pages[block], expected), (field["field_id"], slot)
        del pages
    print("room %d: %d bytes landed; every head of every page of the window checked"
          % (ROOM, landed.bytes))
    for arena in arenas + [decode_arena]:
        arena.close()
    for client in prefills + [decode]:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
