#!/usr/bin/python3
"""What docs/ENGINE-API.md tells an engine to read is what the Python client gives it: every field
of the engine API's RoomEvent and RoomState is a field of the client's, every cause word the
sidecar uses (control/session/failure_cause.cc) is named in the doc and the client's docstring,
the client's own cause (sidecar_lost) too, and a lost sidecar's reason says which way it was lost.
Pure: no sidecar runs (the process-level cases are engine_client_test's SidecarLossTest)."""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))

from kvrail_engine import SIDECAR_LOST, RoomEvent, RoomState  # noqa: E402
from kvrail_engine.client import _why_lost, engine_pb2  # noqa: E402
from kvrail_engine.liveness import RoomLedger  # noqa: E402


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def sidecar_causes():
    """The cause words the sidecar sends: FailureCauseLabel's, but the empty one."""
    labels = re.findall(r'return "(\w*)";', read("control/session/failure_cause.cc"))
    return [label for label in labels if label]


class ClientDocsTest(unittest.TestCase):
    def test_every_room_event_field_of_the_engine_api_is_the_clients(self):
        for message, client_type in ((engine_pb2.RoomEvent, RoomEvent),
                                     (engine_pb2.RoomState, RoomState)):
            for field in message.DESCRIPTOR.fields:
                name = "room" if field.name == "room" else field.name
                if client_type is RoomState and name == "room":
                    continue  # poll_states() keys its states by room
                self.assertIn(name, client_type._fields,
                              "%s.%s is missing from the client's %s"
                              % (message.DESCRIPTOR.name, field.name, client_type.__name__))

    def test_the_fields_when_pages_are_safe_names_are_the_clients(self):
        doc = read("docs/ENGINE-API.md")
        section = doc[doc.index("## When pages are safe"):]
        named = re.search(r"terminal `RoomEvent` \(([^)]*)\)", section).group(1)
        fields = re.findall(r"`(\w+)`", named)
        self.assertEqual(fields, ["pages", "pages_released", "pages_proven", "fence_seconds"])
        for field in fields:
            self.assertIn(field, RoomEvent._fields)

    def test_every_cause_word_is_named_in_the_doc_and_the_client(self):
        doc = read("docs/ENGINE-API.md")
        start = doc.index("also carries `cause`, one word from a fixed list")
        paragraph = doc[start:doc.index("\n\n", start)]
        named = set(re.findall(r"`(\w+)`", paragraph))
        causes = sidecar_causes()
        self.assertGreaterEqual(len(causes), 13)
        for cause in causes + [SIDECAR_LOST]:
            self.assertIn(cause, named, "cause %s is not in ENGINE-API.md's list" % cause)
            self.assertIn(cause, RoomEvent.__doc__, "cause %s is not in RoomEvent's docstring"
                          % cause)
        self.assertNotIn(SIDECAR_LOST, causes, "the client's own word is not the sidecar's")

    def test_a_lost_sidecars_rooms_carry_its_own_cause(self):
        ledger = RoomLedger()
        ledger.begun(1)
        ledger.begun(2)
        told = ledger.lost("lost", gone=True) + ledger.lost("lost", gone=False)
        self.assertTrue(told)
        for event in told:
            self.assertEqual(event.cause, SIDECAR_LOST)

    def test_the_reason_says_which_way_the_sidecar_was_lost(self):
        self.assertIn("process 41 is gone", _why_lost(True, 41, 3.0))
        stopped = _why_lost(False, 41, 3.0)
        self.assertIn("answered no heartbeat for 3.0 s", stopped)
        self.assertIn("process 41 still runs", stopped)
        self.assertIn("connection closed, or it answered no heartbeat", _why_lost(None, 0, 3.0))


if __name__ == "__main__":
    unittest.main()
