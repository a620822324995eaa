"""`kvtier replay` removes the temporary directories it makes (G3 under /tmp, and G4 with
`--g4 fs`) when it ends, and also when SIGINT, SIGTERM or SIGHUP stops it
(tools/cli/temp_dirs.h): a Ctrl-C used to leave the G3 slot files in /tmp for good. With
--keep they stay. Real processes and real signals.

Usage: replay_temp_dirs_test.py KVTIER_BINARY SOURCE_DIR [unittest args]
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

KVTIER = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/kvtier")
SOURCE = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else ".")
TRACE = os.path.join(SOURCE, "tests", "data", "replay_mooncake_small.jsonl")
G3_LINE = re.compile(r"G3: \d+ blocks recovered from (/tmp/kvtier-replay-\S+)")
G4_LINE = re.compile(r"G4: fs:(/tmp/kvtier-replay-g4-\S+)")


class Replay:
    """A replay that holds its endpoint for a while after its requests, so a signal reaches
    it mid-run; its stderr is read on a thread for the directories it names."""

    def __init__(self, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [KVTIER, "replay", "--trace", TRACE, "--requests", "5", "--g3-fraction", "0.3",
             "--g4", "fs", "--hold-s", "60", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.g3 = self.g4 = None
        self.err = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line)
            if m := G3_LINE.search(line):
                self.g3 = m.group(1)
            if m := G4_LINE.search(line):
                self.g4 = m.group(1)

    def wait_for_dirs(self, limit: float = 60) -> None:
        end = time.monotonic() + limit
        while (self.g3 is None or self.g4 is None) and time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError("kvtier replay exited early:\n" + "".join(self.err))
            time.sleep(0.05)
        if self.g3 is None or self.g4 is None:
            self.proc.kill()
            raise AssertionError("kvtier replay never named its G3 and G4 directories:\n" +
                                 "".join(self.err))
        # The G3 slot file exists once G3 has opened (it reported its recovery).
        assert os.listdir(self.g3), f"{self.g3} is empty: G3 should have its slot file there"


class TempDirsTest(unittest.TestCase):
    def stop_with(self, sig: int, *extra: str) -> Replay:
        r = Replay(*extra)
        try:
            r.wait_for_dirs()
            time.sleep(0.5)  # into the replay's requests or its hold
            r.proc.send_signal(sig)
            r.proc.wait(timeout=30)
        finally:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        self.assertEqual(r.proc.returncode, -sig,
                         f"the signal should end the replay as it would without kvtier's handler")
        return r

    def test_each_stop_signal_removes_the_g3_and_g4_directories(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with self.subTest(signal=signal.Signals(sig).name):
                r = self.stop_with(sig)
                self.assertFalse(os.path.exists(r.g3), f"{r.g3} left behind after {sig}")
                self.assertFalse(os.path.exists(r.g4), f"{r.g4} left behind after {sig}")

    def test_keep_leaves_them_after_a_signal(self) -> None:
        r = self.stop_with(signal.SIGTERM, "--keep")
        try:
            self.assertTrue(os.path.isdir(r.g3), "--keep: the G3 directory should stay")
            self.assertTrue(os.path.isdir(r.g4), "--keep: the G4 directory should stay")
        finally:
            shutil.rmtree(r.g3, ignore_errors=True)
            shutil.rmtree(r.g4, ignore_errors=True)

    def test_a_replay_that_ends_removes_them(self) -> None:
        r = Replay("--hold-s", "0")
        r.proc.wait(timeout=120)
        r.reader.join(timeout=10)
        self.assertEqual(r.proc.returncode, 0, "".join(r.err))
        self.assertIsNotNone(r.g3)
        self.assertFalse(os.path.exists(r.g3))
        self.assertFalse(os.path.exists(r.g4))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:])
