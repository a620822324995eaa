#!/usr/bin/env python3
"""The /metrics endpoint of a running kvtier process, end to end (docs/metrics.md).

Real processes, real sockets, real clients: `kvtier replay` with KVTIER_METRICS_PORT set,
scraped over HTTP by urllib while it runs; the text parsed by prometheus_client's own parser;
counters rise between scrapes; every histogram's _count equals the operations the replay
reports in its final --json; bad clients (huge head, silent) do not stall the server; a port in
use is a clear error; `kvtier top` under tmux shows a running demo's figures and exits on q;
progress appears on a pty and never on a pipe; every metric the Grafana dashboard queries
exists in a real scrape.

Usage: metrics_scrape_test.py KVTIER_BINARY SOURCE_DIR [unittest args]
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # the Debian package is for the system interpreter
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

KVTIER = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/kvtier")
SOURCE = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else ".")
TRACE = os.path.join(SOURCE, "tests", "data", "replay_mooncake_small.jsonl")
MODEL = os.path.join(SOURCE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(port, timeout=5):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def samples(text):
    """{(sample name, frozenset(labels)): value}, parsed by prometheus_client."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(smp, name, **labels):
    return smp[(name, frozenset(labels.items()))]


def wait_up(port, proc, limit=60):
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError(f"kvtier exited ({proc.returncode}) before serving /metrics")
        try:
            return scrape(port, timeout=1)
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"/metrics on port {port} never answered")


class ReplayScrape(unittest.TestCase):
    REQUESTS = 40

    def start_replay(self, port, extra=()):
        env = dict(os.environ, KVTIER_METRICS_PORT=str(port))
        cmd = [KVTIER, "replay", "--trace", TRACE, 
               "--requests", str(self.REQUESTS), "--capacity-fraction", "0.05",
               "--g3-fraction", "0.3", "--json", *extra]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def test_scrapes_during_a_replay_parse_rise_and_match_its_report(self):
        port = free_port()
        proc = self.start_replay(port, ["--pace-ms", "60", "--hold-s", "3"])
        try:
            first = samples(wait_up(port, proc))
            time.sleep(0.5)
            second = samples(scrape(port))
            # The counters rise while it runs.
            self.assertGreater(value(second, "kvtier_lookups_total"),
                               value(first, "kvtier_lookups_total"))
            self.assertGreater(value(second, "kvtier_transfer_bytes_total", path="g1_to_g2"),
                               value(first, "kvtier_transfer_bytes_total", path="g1_to_g2"))
            # Hold phase: every request done; the last scrape before the process reports.
            end = time.time() + 60
            last = second
            while value(last, "kvtier_lookups_total") < self.REQUESTS:
                self.assertLess(time.time(), end, "the replay never reached its last request")
                time.sleep(0.1)
                last = samples(scrape(port))
            time.sleep(0.3)
            last = samples(scrape(port))
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.terminate()  # SIGTERM: the replay removes its temporary G3 directory
                proc.wait()
        self.assertEqual(proc.returncode, 0, err)
        report = json.loads(out)
        # The histograms count exactly the operations the replay did.
        self.assertEqual(value(last, "kvtier_lookup_seconds_count"), report["requests"])
        self.assertEqual(value(last, "kvtier_commit_seconds_count"), report["requests"])
        for tier in ("g2", "g3"):
            self.assertEqual(value(last, "kvtier_load_seconds_count", tier=tier),
                             report[f"hit_blocks_{tier}"], tier)
            self.assertEqual(value(last, "kvtier_hit_blocks_total", tier=tier),
                             report[f"hit_blocks_{tier}"], tier)
        self.assertGreater(report["hit_blocks_g2"], 0)
        self.assertGreater(report["hit_blocks_g3"], 0, "the replay should load some blocks from G3")
        self.assertEqual(value(last, "kvtier_save_seconds_count"), report["saved_blocks"])
        self.assertEqual(value(last, "kvtier_saved_blocks_total"), report["saved_blocks"])
        self.assertEqual(value(last, "kvtier_io_seconds_count", tier="g3", op="write"),
                         report["demoted_blocks"])
        # A histogram's +Inf bucket is its count; buckets never decrease.
        buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in last.items()
                          if k[0] == "kvtier_lookup_seconds_bucket"))
        self.assertEqual(buckets[-1][1], report["requests"])
        self.assertEqual([v for _, v in buckets], sorted(v for _, v in buckets))

    def test_bad_clients_do_not_stall_the_server(self):
        port = free_port()
        proc = self.start_replay(port, ["--pace-ms", "50", "--hold-s", "2"])
        try:
            wait_up(port, proc)
            # A huge request head: refused with 431, not buffered without bound.
            big = socket.create_connection(("127.0.0.1", port), timeout=5)
            try:
                big.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 65536)
            except OSError:
                pass  # the server may close before reading it all
            answer = big.recv(100)
            big.close()
            self.assertTrue(answer.startswith(b"HTTP/1.1 431"), answer)
            # Silent clients hold connections; others are still served at once.
            silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
            for s in silent:
                s.sendall(b"GET /metr")
            t0 = time.time()
            scrape(port)
            self.assertLess(time.time() - t0, 1.0)
            # A wrong path is a 404, not a hang.
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
            self.assertEqual(e.exception.code, 404)
            for s in silent:
                s.close()
        finally:
            proc.terminate()  # SIGTERM: the replay removes its temporary G3 directory
            proc.communicate()

    def test_port_in_use_is_a_clear_error(self):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        try:
            proc = self.start_replay(port)
            out, err = proc.communicate(timeout=60)
        finally:
            holder.close()
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"127.0.0.1:{port}", err)
        self.assertIn("in use", err)
        self.assertIn("KVTIER_METRICS_PORT", err)

    def test_bad_port_value_is_refused(self):
        proc = subprocess.run([KVTIER, "replay", "--trace", TRACE, 
                               "--requests", "2"],
                              env=dict(os.environ, KVTIER_METRICS_PORT="70000"),
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("metrics.port", proc.stderr)


class Progress(unittest.TestCase):
    def replay_cmd(self):
        return [KVTIER, "replay", "--trace", TRACE, "--requests",
                "30", "--json"]

    def test_progress_on_a_pty_only(self):
        if shutil.which("script") is None:
            self.skipTest("script(1) is not installed")
        # Under a pty (script): progress lines on the terminal.
        cmd = " ".join(self.replay_cmd()) + " >/dev/null"
        pty = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, TERM="xterm"))
        self.assertEqual(pty.returncode, 0, pty.stdout + pty.stderr)
        self.assertRegex(pty.stdout, r"replay  30/30 requests  [0-9.]+/s  done in")
        # Piped: stderr has no progress, stdout is one clean JSON object.
        piped = subprocess.run(self.replay_cmd(), capture_output=True, text=True, timeout=120)
        self.assertEqual(piped.returncode, 0, piped.stderr)
        self.assertNotIn("requests  ", piped.stderr)
        self.assertNotIn("\r", piped.stderr)
        json.loads(piped.stdout)


@unittest.skipIf(shutil.which("tmux") is None, "tmux is not installed")
class TopUnderTmux(unittest.TestCase):
    def tmux(self, *args, check=True):
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True,
                              check=check, timeout=30)

    def capture(self):
        return self.tmux("capture-pane", "-p", "-t", "top").stdout

    def wait_for(self, pattern, limit=20):
        end = time.time() + limit
        screen = ""
        while time.time() < end:
            screen = self.capture()
            if re.search(pattern, screen):
                return screen
            time.sleep(0.2)
        self.fail(f"'{pattern}' never appeared; the pane shows:\n{screen}")

    def setUp(self):
        self.sock = f"kvtier-top-test-{os.getpid()}"
        self.dir = tempfile.mkdtemp(prefix="kvtier-top-test-")

    def tearDown(self):
        self.tmux("kill-server", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_top(self, *urls):
        # After top exits, stty shows whether the terminal was restored (icanon, echo).
        cmd = (f"{KVTIER} top {' '.join(urls)}; echo TOP-EXITED rc=$?; stty -a | tr ' ' '\\n' | "
               f"grep -E '^-?(icanon|echo)$' | tr '\\n' ' '; echo; sleep 60")
        self.tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "50", cmd)

    def test_top_shows_a_running_demo_and_quits_on_q(self):
        if not os.path.exists(MODEL):
            self.skipTest(f"{MODEL} is missing (scripts/fetch-model.sh)")
        port = free_port()
        down = free_port()  # nothing listens there
        env = dict(os.environ, KVTIER_METRICS_PORT=str(port))
        demo = subprocess.Popen([KVTIER, "demo", "--model", MODEL, "--users", "1", "--turns",
                                 "1", "--no-plot", "--json"], cwd=self.dir, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_up(port, demo, limit=120)
            self.start_top(f"http://127.0.0.1:{port}/metrics", f"127.0.0.1:{down}")
            # The demo's own figures: its tiers as it configured them (its first Lookup comes only
            # after the model prefilled a prompt without kvtier: tens of seconds here; the live
            # counters are checked on a replay below).
            screen = self.wait_for(r"occupancy g2 +\[ *\] +0\.0%  0/[1-9][0-9]* blocks")
            self.assertRegex(screen, r"occupancy g3 +\[ *\] +0\.0%  0/[1-9][0-9]* blocks")
            self.assertIn(f"http://127.0.0.1:{port}/metrics  up", screen)
            self.assertRegex(screen, r"hit ratio +g2 +[0-9.]+%")
            self.assertRegex(screen, r"lookups +[0-9]+")
            self.assertRegex(screen, r"errors +load_failures 0 +dropped_saves 0 +corrupt 0 +g3 ok +g4 off")
            # The unreachable target is shown as down, and top keeps running.
            self.assertRegex(screen, rf"127.0.0.1:{down}  DOWN: .*refused")
            self.tmux("send-keys", "-t", "top", "q")
            screen = self.wait_for(r"TOP-EXITED rc=\d+", limit=10)
            self.assertIn("TOP-EXITED rc=0", screen)
            self.assertRegex(self.wait_for(r"icanon"), r"(?<!-)icanon (?<!-)echo")
        finally:
            demo.kill()
            demo.wait()

    def test_top_shows_a_replays_live_figures(self):
        port = free_port()
        replay = subprocess.Popen([KVTIER, "replay", "--trace", TRACE, "--requests", "60",
                                   "--capacity-fraction", "0.05", "--g3-fraction", "0.3",
                                   "--pace-ms", "100", "--hold-s", "20"],
                                  env=dict(os.environ, KVTIER_METRICS_PORT=str(port)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_up(port, replay)
            self.start_top(f"http://127.0.0.1:{port}/metrics")
            screen = self.wait_for(r"GB/s +.*g2_to_g1 [0-9.]+")
            self.assertRegex(screen, r"lookups +[1-9][0-9]* +\([0-9.]+/s\)")
            self.assertRegex(screen, r"hit ratio +g2 +[1-9][0-9.]*%")
            self.assertRegex(screen, r"load p50/p99 +g2 [0-9.]+(us|ms)/[0-9.]+(us|ms)")
            self.assertRegex(screen, r"occupancy g2 +\[#+ *\]")
            self.tmux("send-keys", "-t", "top", "q")
            self.assertIn("TOP-EXITED rc=0", self.wait_for(r"TOP-EXITED rc=\d+", limit=10))
        finally:
            replay.terminate()  # SIGTERM: the replay removes its temporary G3 directory
            replay.wait()

    def test_unreachable_target_is_shown_down_and_ctrl_c_exits(self):
        down = free_port()
        self.start_top(f"http://127.0.0.1:{down}/metrics")
        screen = self.wait_for(r"DOWN: ")
        self.assertIn("Connection refused", screen)
        self.assertIn("retrying", screen)
        self.tmux("send-keys", "-t", "top", "C-c")
        screen = self.wait_for(r"TOP-EXITED rc=\d+", limit=10)
        self.assertIn("TOP-EXITED rc=0", screen)
        # The terminal is back to line mode with echo (stty shows -icanon -echo while raw).
        self.assertRegex(self.wait_for(r"icanon"), r"(?<!-)icanon (?<!-)echo")

    def test_bad_arguments_are_clear(self):
        r = subprocess.run([KVTIER, "top"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("give at least one URL", r.stderr)
        r = subprocess.run([KVTIER, "top", "localhost"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("HOST:PORT", r.stderr)
        down = free_port()
        r = subprocess.run([KVTIER, "top", "--once", "--interval-ms", "100",
                            f"127.0.0.1:{down}"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("DOWN: Connection refused", r.stdout)


class GrafanaDashboard(unittest.TestCase):
    def test_every_dashboard_metric_exists_in_a_real_scrape(self):
        with open(os.path.join(SOURCE, "deploy", "grafana", "kvtier.json")) as f:
            dashboard = json.load(f)
        exprs = []

        def walk(node):
            if isinstance(node, dict):
                if isinstance(node.get("expr"), str):
                    exprs.append(node["expr"])
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(dashboard)
        self.assertGreater(len(exprs), 10, "the dashboard should have panels")
        names = set()
        for e in exprs:
            names.update(re.findall(r"\b(kvtier_[a-zA-Z0-9_]+)", e))
        port = free_port()
        proc = subprocess.Popen([KVTIER, "replay", "--trace", TRACE, 
                                 "--requests", "5", "--g3-fraction", "0.3", "--hold-s", "5"],
                                env=dict(os.environ, KVTIER_METRICS_PORT=str(port)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            scraped = {name for name, _ in samples(wait_up(port, proc))}
        finally:
            proc.terminate()  # SIGTERM: the replay removes its temporary G3 directory
            proc.wait()
        missing = sorted(n for n in names if n not in scraped)
        self.assertEqual(missing, [], "the dashboard queries metrics that do not exist")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:])
