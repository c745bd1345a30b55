"""The processes a Python test starts (kvrail servers, engines): each says on its first stdout
line that it is ready, and each is stopped at the end, also when the test fails."""

import subprocess
import time


def started(argv, ready):
    """argv started, once its first stdout line begins with `ready`: (process, that line)."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.startswith(ready), (argv[:3], line)
    return process, line


def stop(processes):
    """Terminates what still runs, the last started first; kills what does not stop in 10 s."""
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def field(line, key):
    """The value of `key=value` among a ready line's words ("sidecar ready ... session=..."); ""
    when no word has it."""
    for word in line.split():
        if word.startswith(key + "="):
            return word[len(key) + 1:]
    return ""


def await_event(client, room, statuses, seconds=20):
    """The first RoomEvent of `room` whose status is one of `statuses` that `client` (a
    kvrail_engine.SidecarClient) receives within `seconds`; AssertionError naming them if none."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        event = client.next_event(timeout=deadline - time.time())
        if event is not None and event.room == room and event.status in statuses:
            return event
    raise AssertionError("no %s event for room %d within %d s" % (statuses, room, seconds))
