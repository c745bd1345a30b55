"""The processes a Python test starts (kvrail servers, engines): each says on its first stdout
line that it is ready, and each is stopped at the end, also when the test fails."""

import subprocess


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
