#!/usr/bin/python3
"""RoomLedger (python/kvrail_engine/liveness.py): what an engine is told of its rooms when its
sidecar is lost and when it comes back. Pure: the process-level cases are engine_client_test's
SidecarLossTest."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))

from kvrail_engine.liveness import ORPHANED, RoomLedger, sidecar_process_gone  # noqa: E402
from kvrail_engine.room_event import Pages, RoomEvent, TransferPoll  # noqa: E402


def event(room, status, pages=Pages.UNSPECIFIED, released=False, proven=False):
    return RoomEvent(room, status, "", -1, [], 0, 0, 0.0, pages, released, proven)


class RoomLedgerTest(unittest.TestCase):
    def test_rooms_end_with_their_outcome_and_held_pages_with_their_release(self):
        ledger = RoomLedger()
        for room in (1, 2, 3):
            ledger.begun(room)
        self.assertEqual(ledger.outcome(event(1, TransferPoll.SUCCESS)).room, 1)
        ledger.outcome(event(2, TransferPoll.FAILED, Pages.REUSABLE))
        held = ledger.outcome(event(3, TransferPoll.FAILED, Pages.HELD))
        self.assertEqual(held.pages, Pages.HELD)
        self.assertEqual(len(ledger), 1)  # room 3 waits for its release
        ledger.outcome(event(3, TransferPoll.FAILED, Pages.REUSABLE, released=True, proven=True))
        self.assertEqual(len(ledger), 0)
        # Rooms the engine did not begin here pass through untouched.
        self.assertEqual(ledger.outcome(event(9, TransferPoll.SUCCESS)).room, 9)

    def test_a_sidecar_process_gone_frees_every_page_at_once(self):
        ledger = RoomLedger()
        ledger.begun(1)
        ledger.begun(2)
        ledger.outcome(event(2, TransferPoll.FAILED, Pages.HELD))
        told = ledger.lost("lost", gone=True)
        self.assertEqual([(e.room, e.status, e.pages, e.pages_released) for e in told],
                         [(1, TransferPoll.FAILED, Pages.REUSABLE, False),
                          (2, TransferPoll.PAGES_RELEASED, Pages.REUSABLE, True)])
        self.assertIn("the sidecar process is gone", told[0].reason)
        self.assertEqual(len(ledger), 0)

    def test_a_sidecar_that_may_still_write_holds_the_pages_until_it_ends_the_room(self):
        ledger = RoomLedger()
        ledger.begun(1)
        told = ledger.lost("lost", gone=False)
        self.assertEqual([(e.room, e.pages) for e in told], [(1, Pages.HELD)])
        self.assertIn("may still land", told[0].reason)
        self.assertEqual(ledger.state(1), ORPHANED)
        self.assertEqual(ledger.lost("lost again", gone=False), [])  # told once
        events, to_void = ledger.back(gone=False)
        self.assertEqual((events, to_void), ([], [1]))
        # The same sidecar's own outcome: Failed with pages held is news to nobody...
        self.assertIsNone(ledger.outcome(event(1, TransferPoll.FAILED, Pages.HELD)))
        # ...its release frees them.
        freed = ledger.outcome(event(1, TransferPoll.FAILED, Pages.REUSABLE, released=True,
                                     proven=True))
        self.assertTrue(freed.pages_released)
        self.assertTrue(freed.pages_proven)
        self.assertEqual(len(ledger), 0)

    def test_a_room_that_landed_while_the_sidecar_was_lost_frees_its_pages(self):
        ledger = RoomLedger()
        ledger.begun(4)
        ledger.lost("lost", gone=None)
        freed = ledger.outcome(event(4, TransferPoll.SUCCESS))
        # The engine was told Failed (held) already: this is the release notice.
        self.assertEqual(freed.status, TransferPoll.PAGES_RELEASED)
        self.assertTrue(freed.pages_released)

    def test_a_restarted_sidecar_releases_what_the_old_one_held(self):
        ledger = RoomLedger()
        ledger.begun(5)
        ledger.lost("lost", gone=False)
        events, to_void = ledger.back(gone=True)
        self.assertEqual(to_void, [])
        self.assertEqual([(e.room, e.pages_released, e.pages_proven) for e in events],
                         [(5, True, True)])


class SidecarProcessGoneTest(unittest.TestCase):
    def test_this_process_is_not_a_sidecar_and_an_unknown_pid_is_unknown(self):
        self.assertTrue(sidecar_process_gone(os.getpid()))  # alive, but not a kvrail sidecar
        self.assertIsNone(sidecar_process_gone(0))
        self.assertTrue(sidecar_process_gone(2 ** 22 + 12345))  # above pid_max: no such process


if __name__ == "__main__":
    unittest.main(verbosity=2)
