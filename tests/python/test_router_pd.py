"""`kvtier router --pd` over real processes: the router as `python -m kvtier.router --pd`,
workers as tests/python/fake_vllm_worker.py (a P/D producer answers with kv_transfer_params as a
vLLM with kvtier and kv_role kv_producer does). The same handoff between real vLLM processes,
played by the test itself, is tests/vllm/test_pd_vllm.py."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any, List

from test_router import Fake, RouterProc, http, procs  # noqa: F401  (procs: a fixture)


def served(w: Fake) -> List[Any]:
    return w.served()


def test_every_request_is_prefilled_then_decoded_with_the_producers_params(procs) -> None:
    p = Fake("p", role="prefill")
    d = Fake("d", role="decode")
    procs += [p, d]
    r = RouterProc([p, d], extra=["--pd"])
    procs.append(r)
    text = "a question that spans more than two blocks of sixteen bytes each"
    st, _, body = http(r.url + "/v1/completions",
                       {"model": "fake", "prompt": text, "max_tokens": 7, "stream": False,
                        "kv_transfer_params": {"kvtier": {"load_tiers": ["G2"]}}})
    assert st == 200, body
    assert json.loads(body)["worker"] == "d"
    (pre,) = served(p)
    assert pre["max_tokens"] == 1 and not pre["stream"]
    assert pre["kv_transfer_params"] == {"kvtier": {"load_tiers": ["G2"]},
                                         "do_remote_decode": True}
    (dec,) = served(d)
    assert dec["max_tokens"] == 7
    expect = len(text.encode()) // 16 * 16
    # The client's own kvtier controls survive, merged with the producer's.
    assert dec["kv_transfer_params"] == {
        "do_remote_prefill": True, "kvtier": {"load_tiers": ["G2"], "expect_tokens": expect}}
    # A streamed chat request: the decode worker's stream is what the client reads.
    req = urllib.request.Request(
        r.url + "/v1/chat/completions",
        data=json.dumps({"model": "fake", "stream": True, "max_tokens": 5,
                         "messages": [{"role": "user", "content": "hello there"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        chunks = resp.read().decode()
    assert '"worker": "d"' in chunks and chunks.rstrip().endswith("data: [DONE]")
    assert served(p)[-1]["max_tokens"] == 1 and not served(p)[-1]["stream"]
    assert served(d)[-1]["kv_transfer_params"]["do_remote_prefill"] is True
    state = r.state()
    assert state["counters"]["pd_prefills"] == 2 and state["counters"]["pd_fallbacks"] == 0
    decisions = json.loads(http(r.url + "/router/decisions")[2])
    assert [x["pd"]["prefill_worker"] for x in decisions] == [0, 0]
    assert [x["worker"] for x in decisions] == [1, 1]


def test_a_dead_or_slow_prefill_worker_falls_back_to_colocated_and_a_dead_decode_is_retried(
        procs) -> None:
    slow = Fake("slow", role="prefill", ms_per_token=40.0)  # 64 tokens: 2.6 s
    d1 = Fake("d1", role="decode")
    d2 = Fake("d2", role="decode")
    procs += [slow, d1, d2]
    r = RouterProc([slow, d1, d2], extra=["--pd", "--pd-prefill-timeout", "0.5"])
    procs.append(r)
    text = "x" * 64
    t0 = time.monotonic()
    st, _, body = http(r.url + "/v1/completions", {"model": "fake", "prompt": text,
                                                    "max_tokens": 3})
    assert st == 200, body
    assert time.monotonic() - t0 < 2.5, "the router waited for the slow prefill"
    got = json.loads(body)["worker"]
    dec = served(d1 if got == "d1" else d2)[-1]
    assert dec["kv_transfer_params"] is None, "a colocated request carries no producer params"
    assert dec["hit"] == 0 and dec["tokens"] == 64
    # The prefill worker dies: requests are served colocated, never failed.
    slow.kill()
    for i in range(3):
        st, _, body = http(r.url + "/v1/completions", {"model": "fake", "prompt": f"{i}" * 40,
                                                        "max_tokens": 2})
        assert st == 200, body
    counters = r.state()["counters"]
    assert counters["pd_fallbacks"] == 4, counters
    # A decode worker that is gone: the request goes to the other one.
    d1.kill()
    for i in range(3):
        st, _, body = http(r.url + "/v1/completions", {"model": "fake", "prompt": f"y{i}" * 20,
                                                        "max_tokens": 2})
        assert st == 200 and json.loads(body)["worker"] == "d2", body


def test_pd_needs_both_roles() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kvtier.router", "--pd", "--block-bytes", "1024",
                          "--worker", "http://127.0.0.1:9,role=decode"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "role=prefill" in out.stderr
    out = subprocess.run([sys.executable, "-m", "kvtier.router", "--block-bytes", "1024",
                          "--worker", "http://127.0.0.1:9,role=sideways"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "role=sideways" in out.stderr
