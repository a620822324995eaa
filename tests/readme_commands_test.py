#!/usr/bin/env python3
"""Every command of README.md's command table, run as a user types it, in its quickest real form.

The table under "The `kvtier` command" is parsed, and each row must have an entry in SMOKE below
(a row without one fails the test, and so does an entry whose row is gone), so the list cannot
drift from the README. Each entry runs the build's binary (or, for the policy-bound row, the
source tree's script) in a fresh working directory with small sizes, and any non-zero exit fails
the test, naming the README row, the command line and the end of its output.

  --part fast (default): every row but the vLLM benchmarks' real runs. The long-running
    commands are started, checked to be up and stopped: `kvtier serve` (its socket answers,
    SIGTERM), `kvtier top` on a pty over a replay's /metrics (a frame with figures, then q),
    `kvtier router` in front of a stand-in worker (/health, one completion through it, SIGINT).
    The vLLM benchmarks (bench vllm, --instances 2, --hybrid, bench pd) run through `kvtier` and
    tools/vllm/run_bench*.sh into a stand-in vLLM environment (scripts/setup-vllm.sh's cache
    layout, with a fake Python) that records what it was started with and loads kvtier's
    configuration from the environment it inherited, as each vLLM process with kvtier does.
    That catches a script that exports a KVTIER_* variable kvtier refuses (KVTIER_BENCH_PROGRAM
    once stopped bench pd at its second configuration) in a second. About a minute (50-105 s on
    a shared 2-core machine), most of it `kvtier demo` on the real model (skipped, saying so,
    without the model).
  --part vllm: the vLLM benchmarks' quickest real runs in the vLLM-for-CPU environment
    (scripts/setup-vllm.sh makes it once); exit 77 (skipped) when it cannot be installed here.
    About 21 minutes on a shared 2-core machine (minutes: bench vllm 4, --instances 2 6,
    --hybrid 4, bench pd 7).

Usage: readme_commands_test.py KVTIER_BINARY SOURCE_DIR [--part fast|vllm] [--only TEXT]
"""
import argparse
import hashlib
import http.server
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

SKIP = 77


class Failed(Exception):
    pass


class Skipped(Exception):
    pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tail(text, lines=25, width=400):
    return "\n".join("    | " + ln[:width] + ("..." if len(ln) > width else "")
                     for ln in text.rstrip().splitlines()[-lines:])


def http_get(url, timeout=2.0):
    """(status, body) or (None, error text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as e:
        return None, str(e)


class Smoke:
    """What the entries share: the binary, the source tree, a work directory, a trace."""

    def __init__(self, kvtier, source, work):
        self.kvtier = kvtier
        self.source = source
        self.work = work
        self.model = source / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        self._trace = None
        self._g3 = None
        self.log = []

    def env(self, **extra):
        return dict(os.environ, **extra)

    def run(self, argv, timeout=180, env=None, ok=(0,)):
        """Runs argv in the work directory; returns (rc, output). Fails on an exit not in ok."""
        self.log.append(" ".join(str(a) for a in argv))
        try:
            r = subprocess.run([str(a) for a in argv], cwd=self.work, env=env or self.env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")
            raise Failed(f"`{self.log[-1]}` ran past {timeout} s\n{tail(out)}")
        out = r.stdout.decode(errors="replace")
        if r.returncode not in ok:
            raise Failed(f"`{self.log[-1]}` exited {r.returncode}\n{tail(out)}")
        return r.returncode, out

    def kv(self, *args, **kw):
        return self.run([self.kvtier, *args], **kw)

    def trace(self):
        if self._trace is None:
            self._trace = self.work / "smoke-trace.jsonl"
            self.kv("gen-trace", "--preset", "chat-multiturn", "--requests", "40", "--out",
                    self._trace)
        return self._trace

    def g3_dir(self):
        """A G3 directory that a replay filled (for kvtier inspect)."""
        if self._g3 is None:
            self._g3 = self.work / "smoke-g3"
            self.kv("replay", "--trace", self.trace(), "--g3-fraction", "0.05", "--g3-dir",
                    self._g3)
        return self._g3

    def need_model(self):
        if not self.model.is_file():
            raise Skipped(f"{self.model} is missing (scripts/fetch-model.sh fetches it)")


# ---- long-running commands -------------------------------------------------------------------

class Started:
    """A long-running command in the background; stop() sends SIGTERM and checks its exit."""

    def __init__(self, smoke, argv, env=None):
        self.argv = [str(a) for a in argv]
        self.line = " ".join(self.argv)
        smoke.log.append(self.line)
        self.out_path = smoke.work / f"bg-{len(smoke.log)}.log"
        self.out = open(self.out_path, "wb")
        self.p = subprocess.Popen(self.argv, cwd=smoke.work, env=env or smoke.env(),
                                  stdout=self.out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self):
        self.out.flush()
        return self.out_path.read_text(errors="replace")

    def wait_until(self, what, check, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise Failed(f"`{self.line}` exited {self.p.returncode} before {what}\n"
                             f"{tail(self.output())}")
            if check():
                return
            time.sleep(0.1)
        raise Failed(f"`{self.line}`: not {what} after {timeout:.0f} s\n{tail(self.output())}")

    def stop(self, sig=signal.SIGTERM, ok=(0,)):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
                raise Failed(f"`{self.line}` did not stop within 30 s of {sig.name}\n"
                             f"{tail(self.output())}")
        self.out.close()
        if self.p.returncode not in ok:
            raise Failed(f"`{self.line}` exited {self.p.returncode} on {sig.name}\n"
                         f"{tail(self.output())}")

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        if not self.out.closed:
            self.out.close()


def smoke_serve(smoke):
    """kvtier serve: up when its socket accepts a connection; SIGTERM stops it cleanly."""
    sock_dir = Path(tempfile.mkdtemp(prefix="s", dir=smoke.work))  # 0700, as serve requires
    sock = sock_dir / "serve.sock"
    serve = Started(smoke, [smoke.kvtier, "serve", "--socket", sock])

    def socket_answers():
        if not sock.exists():
            return False
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(str(sock))
            return True
        except OSError:
            return False
        finally:
            s.close()

    try:
        serve.wait_until(f"listening on {sock}", socket_answers)
        serve.stop()
    finally:
        serve.kill()


def smoke_top(smoke):
    """kvtier top on a terminal (a pty) over a running replay's /metrics: a frame, then q."""
    port = free_port()
    # kvtier serve serves /metrics only once an engine has attached (its managers are made
    # per pool), so the target is a replay held open (docs/metrics.md: replay --hold-s).
    target = Started(smoke, [smoke.kvtier, "replay", "--trace", smoke.trace(), "--hold-s", "120"],
                     env=smoke.env(KVTIER_METRICS_PORT=str(port)))
    try:
        target.wait_until(f"serving /metrics on port {port}",
                          lambda: http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200)
        line = f"{smoke.kvtier} top http://127.0.0.1:{port}/metrics --interval-ms 200"
        smoke.log.append(line)
        master, slave = pty.openpty()
        p = subprocess.Popen(line.split(), cwd=smoke.work, stdin=slave, stdout=slave,
                             stderr=slave, start_new_session=True)
        os.close(slave)
        seen = b""
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and p.poll() is None:
                if select.select([master], [], [], 0.2)[0]:
                    try:
                        seen += os.read(master, 65536)
                    except OSError:
                        break
                if b"q to quit" in seen and b"hit ratio" in seen.lower():
                    break
            text = seen.decode(errors="replace")
            if p.poll() is not None:
                raise Failed(f"`{line}` exited {p.returncode} before q\n{tail(text)}")
            if "q to quit" not in text or "hit ratio" not in text.lower():
                raise Failed(f"`{line}` showed no frame with figures in 20 s\n{tail(text)}")
            os.write(master, b"q")
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise Failed(f"`{line}` did not quit on q within 10 s\n{tail(text)}")
            if p.returncode != 0:
                raise Failed(f"`{line}` exited {p.returncode} on q\n{tail(text)}")
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            os.close(master)
    finally:
        target.kill()  # the target, not the command under test


class StandInWorker(http.server.BaseHTTPRequestHandler):
    """The little of `vllm serve` that kvtier router needs: /health, /tokenize, a completion."""

    def _json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "smoke", "object": "model"}]})
        else:
            self._json(404, {"error": self.path})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/tokenize":
            words = str(body.get("prompt", "")).split()
            self._json(200, {"tokens": [1000 + i for i in range(len(words))],
                             "count": len(words)})
        elif self.path == "/v1/completions":
            choice = {"index": 0, "text": " smoke", "finish_reason": "length"}
            self._json(200, {"id": "cmpl-smoke", "object": "text_completion", "model": "smoke",
                             "choices": [choice]})
        else:
            self._json(404, {"error": self.path})

    def log_message(self, *args):
        pass


def smoke_router(smoke):
    worker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInWorker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    port = free_port()
    router = Started(smoke, [smoke.kvtier, "router", "--port", port, "--block-size", "16",
                             "--block-bytes", "65536", "--topic", "kv", "--worker",
                             f"http://127.0.0.1:{worker.server_port},"
                             f"events=tcp://127.0.0.1:{free_port()}"])
    try:
        router.wait_until("healthy (/health 200 with its worker up)",
                          lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200)
        prompt = " ".join(f"word{i}" for i in range(40))
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps({"model": "smoke", "prompt": prompt,
                                                      "max_tokens": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                answer = json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError) as e:
            raise Failed(f"`{router.line}`: a completion through it failed: {e}\n"
                         f"{tail(router.output())}")
        if answer.get("choices", [{}])[0].get("text") != " smoke":
            raise Failed(f"`{router.line}`: the completion came back as {answer}")
        router.stop(signal.SIGINT)
    finally:
        router.kill()
        worker.shutdown()


# ---- the vLLM benchmarks ---------------------------------------------------------------------

class StandInVllmEnv:
    """scripts/setup-vllm.sh's cache (KVTIER_CACHE) holding a finished environment and model
    whose Python is a stand-in: it writes its arguments to $SMOKE_VLLM_ARGV and then loads
    kvtier's configuration (`kvtier config`) from the environment it was given, which is what
    each vLLM process of the benchmark would inherit. KVTIER_BASE_PYTHON names no Python, so
    that if setup-vllm.sh stops recognising this cache it fails at once instead of installing.
    """

    def __init__(self, source, work):
        setup = (source / "scripts" / "setup-vllm.sh").read_text()
        fetch = (source / "scripts" / "fetch-model.sh").read_text()

        def setting(name, text):
            m = re.search(rf"^{name}=\"?([0-9a-f]+)\"?$", text, re.M)
            if not m:
                raise Failed(f"cannot read {name}= from scripts/setup-vllm.sh or fetch-model.sh; "
                             f"update StandInVllmEnv in this test")
            return m.group(1)

        reqs = (source / "scripts" / "vllm-requirements.txt").read_bytes()
        logic = setting("INSTALL_LOGIC_VERSION", setup)
        key = hashlib.sha256(reqs + f"install-logic-version={logic}\n".encode()).hexdigest()[:12]
        self.cache = work / "stand-in-vllm-cache"
        venv = self.cache / f"vllm-{key}"
        (venv / "bin").mkdir(parents=True)
        self.python = venv / "bin" / "python"
        self.python.write_text(
            "#!/usr/bin/env bash\n"
            "# readme_commands_test.py's stand-in for the vLLM environment's Python.\n"
            'printf "%s\\n" "$@" > "$SMOKE_VLLM_ARGV"\n'
            'exec "$BENCH_KVTIER_CLI" config > /dev/null\n')
        self.python.chmod(0o755)
        (venv / ".kvtier-setup-complete").write_text(f"key={key}\n")
        self.model = self.cache / "models" / "smollm2-135m-instruct-fp32"
        self.model.mkdir(parents=True)
        (self.model / ".kvtier-convert-complete").write_text(
            f"gguf-sha256={setting('SHA256', fetch)} "
            f"convert-version={setting('CONVERT_VERSION', setup)} dtype=float32\n")
        self.argv_file = work / "stand-in-vllm-argv"

    def env(self, smoke):
        return smoke.env(KVTIER_CACHE=str(self.cache), KVTIER_BASE_PYTHON="/nonexistent/python3",
                         SMOKE_VLLM_ARGV=str(self.argv_file))


def vllm_row(program, *args, real_timeout):
    """A vLLM benchmark: `kvtier ARGS`, which must start tools/vllm/PROGRAM with ARGS' flags."""

    def fast(smoke):
        stand_in = smoke.stand_in_vllm
        if stand_in.argv_file.exists():
            stand_in.argv_file.unlink()
        smoke.kv(*args, env=stand_in.env(smoke), timeout=60)
        if not stand_in.argv_file.exists():
            raise Failed(f"`{smoke.log[-1]}` exited 0 without starting the vLLM environment's "
                         f"Python")
        got = stand_in.argv_file.read_text().splitlines()
        want_tail = list(args[2:])  # after "bench vllm" / "bench pd"
        if not got or Path(got[0]).name != program:
            raise Failed(f"`{smoke.log[-1]}` started {got[:1]}, not tools/vllm/{program}")
        if got[1:3] != ["--model", str(stand_in.model)] or got[3:] != want_tail:
            raise Failed(f"`{smoke.log[-1]}` passed {got[1:]} to {program}; expected --model "
                         f"{stand_in.model} {' '.join(want_tail)}")
        return "stand-in vLLM environment: script path and inherited configuration checked"

    def real(smoke):
        smoke.kv(*args, timeout=real_timeout)

    return {"fast": fast, "vllm": real}


def run_row(*args, timeout=180, needs_model=False):
    def fast(smoke):
        if needs_model:
            smoke.need_model()
        smoke.kv(*[a(smoke) if callable(a) else a for a in args], timeout=timeout)

    return {"fast": fast}


def model(smoke):
    return smoke.model


def cuda_copy(smoke):
    rc, out = smoke.kv("bench", "copy", "--device", "cuda", "--blocks", "16", "--reps", "1",
                       ok=(0, 3))
    if rc == 3:  # documented: exits 3 without a usable GPU
        reason = next((ln for ln in out.splitlines() if "unavailable" in ln), out.strip())
        raise Skipped(f"no usable GPU (exit 3, as documented): {reason[:160]}")


def policy_bound(smoke):
    smoke.run(["python3", smoke.source / "lab" / "studies" / "policy_bound.py", "--trace",
               smoke.trace()])


def gen_trace(smoke):
    out = smoke.work / "gen-trace.jsonl"
    smoke.kv("gen-trace", "--preset", "chat-multiturn", "--requests", "40", "--out", out)
    if not out.is_file() or out.stat().st_size == 0:
        raise Failed(f"`{smoke.log[-1]}` wrote no trace to {out}")


def inspect(smoke):
    _, out = smoke.kv("inspect", smoke.g3_dir())
    if not re.search(r"blocks\s+[1-9]", out):
        raise Failed(f"`{smoke.log[-1]}` found no blocks in a G3 a replay filled\n{tail(out)}")


TOKENS = ",".join(str(t) for t in range(1, 33))

# README row (the command cell, verbatim) -> its quickest real form. Entries with "vllm" also
# run for real under --part vllm.
SMOKE = {
    # The demo prefills two ~1,100-token prompts on the real model: ~22 s on a quiet machine,
    # 110 s seen beside a sanitizer build; its limit leaves room for a busy ctest -j2.
    "kvtier demo": run_row("demo", "--model", model, "--users", "1", "--turns", "1",
                           "--no-plot", needs_model=True, timeout=420),
    "kvtier demo --workers 2 [--redis HOST:PORT]": run_row(
        "demo", "--workers", "2", "--model", model, "--turns", "1", "--no-plot",
        needs_model=True, timeout=420),
    "kvtier bench copy": run_row("bench", "copy", "--blocks", "16", "--reps", "1"),
    "kvtier bench copy --device cuda": {"fast": cuda_copy},
    "kvtier bench index": run_row("bench", "index", "--tokens", "16384", "--reps", "3"),
    "kvtier bench arena": run_row("bench", "arena", "--bytes", "64MiB", "--reps", "1"),
    "kvtier bench disk": run_row("bench", "disk", "--total-bytes", "64MiB", "--block-bytes",
                                 "1MiB", "--qd", "8", "--rounds", "1"),
    "kvtier bench vllm": vllm_row(
        "bench_vllm.py", "bench", "vllm", "--users", "1", "--rounds", "2", "--reps", "1",
        "--no-reuse-requests", "1", "--no-neighbour", "--configs", "vllm_alone,kvtier_g2",
        "--plot", "", real_timeout=1200),
    "kvtier bench remote": run_row("bench", "remote", "--value-bytes", "64KiB", "--clients",
                                   "1", "--seconds", "0.2", "--rounds", "1"),
    "kvtier bench manager": run_row("bench", "manager", "--prompts", "2", "--prompt-blocks", "4",
                                    "--commit-seconds", "0.2"),
    "kvtier sim --trace F": run_row("sim", "--trace", lambda s: s.trace()),
    "kvtier gen-trace --preset P --out F": {"fast": gen_trace},
    "kvtier replay --trace F": run_row("replay", "--trace", lambda s: s.trace()),
    "kvtier replay --trace F --workers N --router R": run_row(
        "replay", "--trace", lambda s: s.trace(), "--workers", "2", "--router", "all"),
    "python3 lab/studies/policy_bound.py --trace F": {"fast": policy_bound},
    "kvtier router --worker URL,events=EP ...": {"fast": smoke_router},
    "kvtier inspect DIR": {"fast": inspect},
    "kvtier config": run_row("config"),
    "kvtier keys": run_row("keys", "--model", "smoke", "--tokens", TOKENS, "--tokens-per-block",
                           "16"),
    "kvtier bench events": run_row("bench", "events", "--events", "5000"),
    "kvtier serve": {"fast": smoke_serve},
    "kvtier bench vllm --instances 2": vllm_row(
        "bench_vllm.py", "bench", "vllm", "--instances", "2", "--users", "2", "--rounds", "2",
        real_timeout=1200),
    "kvtier bench vllm --hybrid": vllm_row(
        "bench_hybrid.py", "bench", "vllm", "--hybrid", "--model-size", "tiny", "--users", "2",
        "--rounds", "2", real_timeout=1200),
    "kvtier bench pd": vllm_row(
        "bench_pd.py", "bench", "pd", "--quick", "--shorts", "1", "--longs", "1", "--probes",
        "1", real_timeout=1500),
    "kvtier bench handoff": run_row("bench", "handoff", "--tokens", "256", "--reps", "1"),
    "kvtier bench service": run_row("bench", "service", "--tokens", "4096", "--reps", "3"),
    "kvtier bench copy --shared": run_row("bench", "copy", "--shared", "--blocks", "16",
                                          "--reps", "1"),
    "kvtier top URL...": {"fast": smoke_top},
    "kvtier bench manager --metrics-compare": run_row(
        "bench", "manager", "--metrics-compare", "--reps", "1", "--prompts", "2",
        "--prompt-blocks", "4"),
}


def readme_rows(source):
    """The command cells of README.md's table under '## The `kvtier` command'."""
    text = (source / "README.md").read_text()
    m = re.search(r"^## The `kvtier` command\n(.*?)(?=^## )", text, re.M | re.S)
    if not m:
        raise Failed("README.md has no '## The `kvtier` command' section")
    rows = re.findall(r"^\| `([^`]+)` \|", m.group(1), re.M)
    if not rows:
        raise Failed("README.md's command table has no rows")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kvtier")
    ap.add_argument("source")
    ap.add_argument("--part", choices=("fast", "vllm"), default="fast")
    ap.add_argument("--only", default="", help="run only the rows containing this text")
    a = ap.parse_args()
    kvtier = Path(a.kvtier).resolve()
    source = Path(a.source).resolve()
    me = f"readme_commands_test --part {a.part}"

    rows = readme_rows(source)
    missing = [r for r in rows if r not in SMOKE]
    stale = [k for k in SMOKE if k not in rows]
    if missing or stale:
        for r in missing:
            print(f"FAIL: README row `{r}` has no smoke entry: add its quickest real form to "
                  f"SMOKE in tests/readme_commands_test.py")
        for k in stale:
            print(f"FAIL: smoke entry `{k}` matches no README row (renamed or removed?)")
        return 1

    if a.part == "vllm" and os.environ.get("KVTIER_TEST_README_VLLM") != "1":
        # ~21 minutes of vLLM benchmarks on this 2-core machine: more than `make test` may
        # take. The fast part catches the class of bug these rows had (what their vLLM
        # processes inherit) in a fraction of a second each.
        print(f"SKIP: {me}: the vLLM benchmarks' real runs take ~21 min here; run them with "
              f"KVTIER_TEST_README_VLLM=1 ctest -R readme_commands_vllm_test")
        return SKIP
    if a.part == "vllm":
        r = subprocess.run([str(source / "scripts" / "setup-vllm.sh")], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode == 3:
            print(f"SKIP: {me}: the vLLM environment could not be installed here (PyPI "
                  f"unreachable); the vLLM benchmarks' real runs did not run\n{r.stderr}")
            return SKIP
        if r.returncode != 0:
            print(f"FAIL: {me}: scripts/setup-vllm.sh exited {r.returncode}\n{tail(r.stderr)}")
            return 1

    work = Path(tempfile.mkdtemp(prefix="kvtier-readme-smoke-"))
    smoke = Smoke(kvtier, source, work)
    if a.part == "fast":
        try:
            smoke.stand_in_vllm = StandInVllmEnv(source, work)
        except Failed as e:
            shutil.rmtree(work, ignore_errors=True)
            print(f"FAIL: {me}: {e}")
            return 1
    failed, skipped, ran = [], [], 0
    t_all = time.monotonic()
    try:
        for row in rows:
            fn = SMOKE[row].get(a.part)
            if fn is None or (a.only and a.only not in row):
                continue
            first = len(smoke.log)
            t0 = time.monotonic()
            try:
                note = fn(smoke)
                ran += 1
                cmds = "; ".join(smoke.log[first:]).replace(str(kvtier), "kvtier")
                print(f"ok    {time.monotonic() - t0:6.1f} s  {row}  [{cmds}]"
                      + (f" ({note})" if note else ""), flush=True)
            except Skipped as e:
                skipped.append(row)
                print(f"SKIP  {time.monotonic() - t0:6.1f} s  {row}: {e}", flush=True)
            except Failed as e:
                failed.append(row)
                print(f"FAIL  {time.monotonic() - t0:6.1f} s  {row}: {e}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = time.monotonic() - t_all
    print(f"{me}: {ran} ok, {len(skipped)} skipped, {len(failed)} failed of {len(rows)} README "
          f"rows in {total:.0f} s" + (f"; failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
