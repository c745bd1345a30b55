#!/usr/bin/python3
"""A reference engine rank: drives its kvrail sidecar the way a disaggregated scheduler does
(docs/INTEGRATING.md), with a fake forward pass. One process per engine rank.

Prefill rank: each request is admitted with begin(); the one BOOTSTRAPPED event says the
decodes' window; the rank allocates pages for it, runs its "forward pass" (writes the room's
pages), and calls ready() with its block tables and the first token. Decode rank: each request
is admitted by allocating pages and calling expect() with the block tables; Success carries the
first token. Both: one non-blocking drain_events() per scheduler iteration, pages freed when the
sidecar says they may be (a decode Failed with pages HELD waits for its release), abort on a
deadline, and a clean shutdown.

    reference_engine.py --role prefill --sidecar ipc:///tmp/kvrail-p0.sock \\
        --contract prefill.json --arena-bytes N --rooms 8 [--dp-size G --dp-rank g]
    reference_engine.py --role decode --sidecar ipc:///tmp/kvrail-d0.sock \\
        --contract decode.json --arena-bytes N --rooms 8 --bootstrap host:port

Every rank of a deployment is given the same --rooms and --seed: the same requests, as a
router would send them to every TP rank. Prints one "done <room> ok|failed <reason>" line per
room and exits 0 only if every room it served succeeded.
"""

import argparse
import json
import os
import random
import sys
import time
from typing import Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kvrail_engine import Pages, SidecarClient, SidecarError, TransferPoll  # noqa: E402


def first_token(room):
    """What the fake forward pass samples for a room (the decode checks it)."""
    return (room * 7919) % 32000


class PageAllocator:
    """The engine's page allocator: block ids 1..count-1 (0 is never handed out, CACHEPD §5)."""

    def __init__(self, count):
        self._free = list(range(count - 1, 0, -1))

    def take(self, n):
        if n > len(self._free):
            return None
        taken, self._free = self._free[-n:], self._free[:-n]
        return taken

    def give(self, pages):
        self._free.extend(pages)


class Rank:
    def __init__(self, args):
        self.args = args
        self.contract = json.loads(open(args.contract).read())
        plan = self.contract["plan"]
        self.page_tokens = plan["prefix_granularity"]
        self.planes = [(p["arena_offset_bytes"], p["bytes_per_lcm_block"]) for p in plan["planes"]]
        self.pages = PageAllocator(plan["groups"][0]["page_count"])
        self.client = SidecarClient(args.sidecar, timeout=30.0)
        self.arena = self.client.attach_allocated(args.arena_bytes, open(args.contract).read())
        rng = random.Random(args.seed)
        self.requests = [(room, rng.randint(args.min_prompt, args.max_prompt))
                         for room in range(1, args.rooms + 1)]
        self.held = {}  # room -> pages, while the sidecar may still write them
        self.outcomes = {}  # room -> "ok" or "failed <reason>"
        print("attached %s" % args.sidecar, flush=True)

    def slots(self, prompt_len):
        return -(-prompt_len // self.page_tokens)

    def finish(self, room, outcome):
        if room not in self.outcomes:
            self.outcomes[room] = outcome
            print("done %d %s" % (room, outcome), flush=True)

    def run(self):
        deadline = time.monotonic() + self.args.timeout
        pending = [r for r in self.requests if self.serves(r[0])]
        # room -> pages (and, on a prefill, None until Bootstrapped)
        in_flight: Dict[int, Optional[List[int]]] = {}
        while (pending or in_flight or self.held) and time.monotonic() < deadline:
            # Admission: as many rooms as the concurrency and the free pages allow.
            while pending and len(in_flight) < self.args.concurrency:
                room, prompt_len = pending[0]
                try:
                    if not self.admit(room, prompt_len, in_flight):
                        break
                except SidecarError as error:  # e.g. the sidecar is lost: nothing to admit to
                    self.finish(room, "failed %s" % error)
                pending.pop(0)
            # One non-blocking drain per iteration: the scheduler's call.
            for event in self.client.drain_events():
                self.on_event(event, in_flight)
            time.sleep(0.001)  # the forward passes of other requests, here
        if self.client.sidecar_lost is not None:
            print("sidecar lost: %s" % self.client.sidecar_lost, flush=True)
        for room in list(in_flight):  # past the deadline: give up, fenced
            try:
                self.client.abort(room, "the reference engine's deadline passed")
            except SidecarError:
                pass
            self.finish(room, "failed deadline")
        self.client.close()
        served = [r for r, _ in self.requests if self.serves(r)]
        failed = [r for r in served if self.outcomes.get(r) != "ok"]
        print("summary: %d ok, %d failed" % (len(served) - len(failed), len(failed)), flush=True)
        return 0 if not failed else 1

    def serves(self, room):
        return True

    def admit(self, room, prompt_len, in_flight):
        """Admits a request: False when it must wait (no free pages)."""
        raise NotImplementedError

    def on_event(self, event, in_flight):
        raise NotImplementedError

    def free(self, room, pages, event):
        """Pages go back once no write of the room can land (docs/ENGINE-API.md)."""
        if event.status == TransferPoll.FAILED and event.pages == Pages.HELD:
            self.held[room] = pages
        else:
            self.pages.give(pages)


class PrefillRank(Rank):
    def serves(self, room):
        return room % self.args.dp_size == self.args.dp_rank  # CACHEPD §1.3: room mod dp

    def admit(self, room, prompt_len, in_flight):
        self.client.begin(room)
        in_flight[room] = None  # no pages until the decodes' window is known
        return True

    def forward(self, room, pages):
        """The fake forward pass: the room's KV written into its pages, every plane."""
        view = self.arena.view
        for slot, page in enumerate(pages):
            fill = bytes([(room * 31 + slot) % 251 + 1])
            for offset, size in self.planes:
                begin = offset + page * size
                view[begin:begin + size] = fill * size

    def on_event(self, event, in_flight):
        room = event.room
        if event.status == TransferPoll.BOOTSTRAPPED and room in in_flight:
            windows = {(w.prefix_len, w.prompt_len) for w in event.windows}
            if len(windows) != 1:
                self.client.abort(room, "decode ranks disagree on the window: %s" % windows)
                return
            prefix_len, prompt_len = windows.pop()
            pages = self.pages.take(self.slots(prompt_len))
            if pages is None:
                self.client.abort(room, "no free pages")
                return
            in_flight[room] = pages
            self.forward(room, pages)
            self.client.ready(room, bootstrap_token=first_token(room),
                              speculative_ids=[room % 97], block_tables=[pages],
                              window=(prefix_len, prompt_len))
            return
        if event.status not in (TransferPoll.SUCCESS, TransferPoll.FAILED):
            return
        pages = in_flight.pop(room, None)
        if pages:
            self.pages.give(pages)  # a prefill room ends fenced: its pages are free
        self.finish(room, "ok" if event.status == TransferPoll.SUCCESS
                    else "failed %s" % event.reason)


class DecodeRank(Rank):
    def admit(self, room, prompt_len, in_flight):
        pages = self.pages.take(self.slots(prompt_len))
        if pages is None:
            return False  # wait for pages to come back
        in_flight[room] = pages
        self.client.expect(room, self.args.bootstrap, block_tables=[pages],
                           window=(0, prompt_len))
        return True

    def on_event(self, event, in_flight):
        room = event.room
        if event.pages_released:
            pages = self.held.pop(room, None)
            if pages:
                self.pages.give(pages)
            return
        if event.status not in (TransferPoll.SUCCESS, TransferPoll.FAILED):
            return
        pages = in_flight.pop(room, None)
        if event.status == TransferPoll.SUCCESS:
            self.pages.give(pages)
            if event.bootstrap_token != first_token(room) or event.speculative_ids != [room % 97]:
                self.finish(room, "failed token %d ids %s" % (event.bootstrap_token,
                                                             event.speculative_ids))
            else:
                self.finish(room, "ok")
            return
        if pages:
            self.free(room, pages, event)
        self.finish(room, "failed %s" % event.reason)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=["prefill", "decode"], required=True)
    parser.add_argument("--sidecar", required=True, help="the sidecar's engine API endpoint")
    parser.add_argument("--contract", required=True, help="this rank's contract (JSON file)")
    parser.add_argument("--arena-bytes", type=int, required=True)
    parser.add_argument("--bootstrap", help="decode: the prefill node's bootstrap host:port")
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--dp-rank", type=int, default=0)
    parser.add_argument("--rooms", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-prompt", type=int, default=16)
    parser.add_argument("--max-prompt", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.role == "decode" and not args.bootstrap:
        parser.error("--bootstrap is required for a decode rank")
    rank = PrefillRank(args) if args.role == "prefill" else DecodeRank(args)
    sys.exit(rank.run())


if __name__ == "__main__":
    main()
