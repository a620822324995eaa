"""A model runner made of arithmetic, driving vLLM's real Scheduler (or AsyncScheduler) and
KvtierConnector's real worker side in one process, on the CPU.

vLLM's CPU backend turns async scheduling off and has no speculative decoding, so the paths a
GPU takes through the connector cannot run end to end here. This harness builds vLLM's own
scheduler classes with KvtierConnector as the scheduler's connector, gives the connector's
worker side real KV tensors (vLLM's CPU layout, [blocks, kv_heads, block_size, 2 x head_size]
per layer), and plays the model runner itself, step by step, in the order vLLM's
GPUModelRunner calls the connector.

The "model" is arithmetic that makes every wrong answer visible:

- The KV of position p is a fingerprint of tokens[0..p] (a chained 64-bit hash, stored as exact
  float32 integers in every layer). A block holds the right KV iff it holds those fingerprints.
- Before computing a request's new positions, the runner checks the KV of every earlier
  position (the tokens vLLM says are computed, by vLLM's prefix cache or by kvtier). One wrong
  value poisons the token sampled in that step, exactly as attention over a wrong KV would.
- The next token is a hash of the prefix's fingerprint, so the expected output of any prompt is
  known without running anything (reference_output).

Speculative decoding: drafts are proposed from the true next tokens with seeded mistakes, so
some are rejected and their positions hold a rejected draft's KV until recomputed.

Checks recorded for the tests: every block kvtier commits is keyed with the request's real
tokens (the runner's truth) and never includes a block that failed to load in that step; no
request is reported finished (sending or receiving) twice.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, SpeculativeConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from kvtier.vllm.connector import KvtierConnector

import standin_attention

VOCAB = 40000
POISON = 1  # the token a step samples when it attended to a wrong KV
MASK = (1 << 64) - 1
CHECK_LAYERS = (0, -1)  # layers whose values are checked (all are written)


def _mix(h: int, token: int) -> int:
    x = (h ^ (token * 0x9E3779B97F4A7C15)) & MASK
    x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9 & MASK
    x = (x ^ (x >> 29)) * 0x94D049BB133111EB & MASK
    return x ^ (x >> 32)


def _next_token(h: int) -> int:
    return 2 + (h >> 7) % (VOCAB - 2)


def fingerprints(tokens: List[int]) -> List[int]:
    out, h = [], 0x243F6A8885A308D3
    for t in tokens:
        h = _mix(h, t)
        out.append(h)
    return out


def reference_output(prompt: List[int], max_tokens: int) -> List[int]:
    """What every correct run samples for `prompt` (greedy, no EOS)."""
    h = fingerprints(prompt)[-1]
    out = []
    for _ in range(max_tokens):
        t = _next_token(h)
        out.append(t)
        h = _mix(h, t)
    return out


def _values(h: int, layer: int) -> Tuple[float, float]:
    # Two exact float32 integers (< 2^24) per position and layer.
    return float((h >> 40) ^ layer), float((h >> 16) & 0xFFFFFF)


@dataclasses.dataclass
class Commit:
    step: int
    key: str
    tokens: List[int]
    block_ids: List[int]


class _RecordingManager:
    """The worker's BlockManager, with every commit recorded (a thin proxy, not a mock: every
    call goes to the real manager)."""

    def __init__(self, inner: Any, log: List[Commit], step: Callable[[], int]) -> None:
        self._inner = inner
        self._log = log
        self._step = step

    def commit(self, key: str, tokens: List[int], block_ids: List[int]) -> Any:
        self._log.append(Commit(self._step(), key, list(tokens), list(block_ids)))
        return self._inner.commit(key, tokens, block_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclasses.dataclass
class _RunnerReq:
    # The request's real tokens: the prompt, then the reference output (the runner feeds the
    # right token at every position; when vLLM keeps a wrong one, the output shows it).
    tokens: List[int]
    prompt_len: int
    block_ids: List[int]
    drafts: List[int] = dataclasses.field(default_factory=list)


class Harness:
    def __init__(self, model_dir: str, kvtier_extra: Dict[str, Any], *,
                 async_scheduling: bool = False, num_spec_tokens: int = 0,
                 num_blocks: int = 48, block_size: int = 16, max_num_batched_tokens: int = 96,
                 max_num_seqs: int = 4, max_model_len: int = 1024, engine_id: str = "",
                 draft_accuracy: float = 0.6, seed: int = 0,
                 kv_transfer_overrides: Optional[Dict[str, Any]] = None) -> None:
        self.block_size = block_size
        self.num_spec_tokens = num_spec_tokens
        self.rng = random.Random(seed)
        self.draft_accuracy = draft_accuracy
        model_config = ModelConfig(model=model_dir, dtype="float32", max_model_len=max_model_len,
                                   skip_tokenizer_init=True, seed=0)
        kv_transfer = dict(kv_connector="KvtierConnector",
                           kv_connector_module_path="kvtier.vllm", kv_role="kv_both",
                           kv_connector_extra_config=dict(kvtier_extra),
                           engine_id=engine_id or f"harness-{uuid.uuid4().hex[:8]}")
        kv_transfer.update(kv_transfer_overrides or {})
        spec = None
        if num_spec_tokens:
            spec = SpeculativeConfig(method="ngram", num_speculative_tokens=num_spec_tokens,
                                     prompt_lookup_max=3, prompt_lookup_min=1)
        self.vllm_config = VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True,
                                     cache_dtype="auto"),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len, enable_chunked_prefill=True,
                async_scheduling=async_scheduling, is_encoder_decoder=False),
            device_config=DeviceConfig("cpu"),
            kv_transfer_config=KVTransferConfig(**kv_transfer),
            speculative_config=spec,
        )
        hf = model_config.hf_config
        self.num_layers = hf.num_hidden_layers
        num_kv_heads = model_config.get_num_kv_heads(self.vllm_config.parallel_config)
        head_size = model_config.get_head_size()
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(self.num_layers)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(self.layer_names, FullAttentionSpec(
                block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
                dtype=torch.float32))])
        # One allocation, one layer after another, as vLLM's CPU backend gives them.
        self.kv_storage = torch.zeros(self.num_layers, num_blocks, num_kv_heads, block_size,
                                      2 * head_size)
        self.kv = {name: self.kv_storage[i] for i, name in enumerate(self.layer_names)}
        self.commits: List[Commit] = []
        self.step_no = 0
        # Stand-in attention layers where a model would register them (kvtier reads their
        # backend and probes their byte layout at registration): standin_attention.py.
        standin_attention.install(self.vllm_config, self.layer_names, num_kv_heads, head_size)
        self.worker = KvtierConnector(self.vllm_config, KVConnectorRole.WORKER,
                                      self.kv_cache_config)
        self.worker.register_kv_caches(self.kv)
        worker_side = self.worker.connector_worker
        worker_side._manager = _RecordingManager(worker_side._manager, self.commits,
                                                 lambda: self.step_no)
        self.vllm_config.cache_config.num_gpu_blocks = num_blocks
        cls = AsyncScheduler if async_scheduling else Scheduler
        self.scheduler = cls(vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
                             structured_output_manager=StructuredOutputManager(self.vllm_config),
                             block_size=block_size, log_stats=True)
        self.connector: KvtierConnector = self.scheduler.connector  # type: ignore[assignment]
        # The scheduler side's counters (get_kv_connector_stats resets them each report).
        self.scheduler_counters: collections.Counter = collections.Counter()
        report = self.connector.get_kv_connector_stats

        def recording_report() -> Any:
            stats = report()
            if stats is not None:
                self.scheduler_counters.update(
                    {k: v for k, v in stats.data.items() if isinstance(v, int)})
            return stats

        self.connector.get_kv_connector_stats = recording_report  # type: ignore[method-assign]
        hash_fn = get_hash_fn_by_name(self.vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(block_size, hash_fn)
        self.reqs: Dict[str, _RunnerReq] = {}
        self.prompts: Dict[str, List[int]] = {}
        self.max_tokens: Dict[str, int] = {}
        self.outputs: Dict[str, List[int]] = {}
        self.finished: Set[str] = set()
        self.kv_transfer_params: Dict[str, Any] = {}  # what each finished request returned
        self.reported_sending: List[str] = []
        self.reported_recving: List[str] = []
        self.invalid_blocks_by_step: Dict[int, Set[int]] = {}
        # The worker's get_kv_connector_stats counters, summed over the steps (gauges left out).
        self.worker_counters: collections.Counter = collections.Counter()
        self.kv_mismatches: List[Tuple[int, str, int]] = []  # (step, request, position)
        self._in_flight: Optional[Tuple[Any, ModelRunnerOutput]] = None
        self.async_scheduling = async_scheduling
        self.hooks_before_execute: List[Callable[["Harness", Any], None]] = []

    # ---- requests ----

    def add(self, req_id: str, prompt: List[int], max_tokens: int = 8,
            cache_salt: Optional[str] = None,
            kv_transfer_params: Optional[Dict[str, Any]] = None, **sampling: Any) -> None:
        """`sampling`: more SamplingParams fields (skip_reading_prefix_cache, ...)."""
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            extra_args=extra, **sampling)
        sp.update_from_generation_config({}, None)
        req = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp,
                      pooling_params=None, cache_salt=cache_salt,
                      block_hasher=self.block_hasher)
        self.prompts[req_id] = list(prompt)
        self.max_tokens[req_id] = max_tokens
        self.outputs[req_id] = []
        self.scheduler.add_request(req)

    def abort(self, req_ids: List[str]) -> None:
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    # ---- the loop ----

    def step(self, idle_sleep: bool = True) -> None:
        """One engine step. In async mode the next step is scheduled before the previous
        step's output is processed, as vLLM's engine core does with a batch queue of 2.
        idle_sleep=False: a step that scheduled nothing does not sleep, as vLLM's engine core,
        which runs its loop as fast as it can while requests wait."""
        so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens == 0 and idle_sleep:
            time.sleep(0.001)  # waiting for transfers: let them run (a bound on idle spins)
        if self.async_scheduling:
            if self._in_flight is not None:
                self._process(*self._in_flight)
            self._in_flight = (so, self._execute(so))
            if self.idle():
                self._process(*self._in_flight)
                self._in_flight = None
            return
        self._process(so, self._execute(so))

    def idle(self) -> bool:
        return not self.scheduler.has_requests() and not self.scheduler.requests

    def run(self, max_steps: int = 2000, until: Optional[Callable[[], bool]] = None) -> None:
        """Steps until every request is done and freed (or `until()` holds)."""
        for _ in range(max_steps):
            if (until() if until is not None else (self.idle() and self._in_flight is None)):
                return
            self.step()
        raise AssertionError(f"not done after {max_steps} steps: "
                             f"{list(self.scheduler.requests)}")

    def _process(self, so: Any, out: ModelRunnerOutput) -> None:
        engine_outputs = self.scheduler.update_from_output(so, out)
        for eco in engine_outputs.values():
            for o in eco.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished.add(o.request_id)
                    self.kv_transfer_params[o.request_id] = o.kv_transfer_params
        if self.num_spec_tokens and not self.async_scheduling:
            ids, drafts = [], []
            for rid, r in self.reqs.items():
                if r.drafts:
                    ids.append(rid)
                    drafts.append(r.drafts)
            if ids:
                self.scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))

    # ---- the model runner ----

    def _poison(self, block_ids: List[int], start_pos: int, end_pos: int) -> None:
        """Positions [start_pos, end_pos) of a block table get values no fingerprint has: a
        freshly allocated block holds anything."""
        for p in range(start_pos, end_pos):
            b = block_ids[p // self.block_size]
            self.kv_storage[:, b, 0, p % self.block_size, 0:2] = -1.0

    def _check(self, rid: str, r: _RunnerReq, upto: int) -> bool:
        fps = fingerprints(r.tokens[:upto])
        ok = True
        for p in range(upto):
            b = r.block_ids[p // self.block_size]
            t = p % self.block_size
            for layer in CHECK_LAYERS:
                li = layer % self.num_layers
                want = _values(fps[p], li)
                got = self.kv_storage[li, b, 0, t, 0:2].tolist()
                if got[0] != want[0] or got[1] != want[1]:
                    self.kv_mismatches.append((self.step_no, rid, p))
                    return False
        return ok

    def _write(self, r: _RunnerReq, tokens: List[int], start: int) -> None:
        fps = fingerprints(tokens)
        for p in range(start, len(tokens)):
            b = r.block_ids[p // self.block_size]
            t = p % self.block_size
            for li in range(self.num_layers):
                v = _values(fps[p], li)
                self.kv_storage[li, b, 0, t, 0] = v[0]
                self.kv_storage[li, b, 0, t, 1] = v[1]

    def _execute(self, so: Any) -> ModelRunnerOutput:
        self.step_no += 1
        w = self.worker
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
        # The runner's view of each scheduled request (block tables, computed counts).
        for nr in so.scheduled_new_reqs:
            self.reqs[nr.req_id] = self._runner_req(nr.req_id, list(nr.block_ids[0]))
        cached = so.scheduled_cached_reqs
        # vLLM 0.32/0.33 list resumed requests here; 0.34 sends them again as new requests.
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        computed: Dict[str, int] = {nr.req_id: nr.num_computed_tokens
                                    for nr in so.scheduled_new_reqs}
        for i, rid in enumerate(cached.req_ids):
            r = self.reqs.get(rid)
            new_ids = cached.new_block_ids[i]
            if rid in resumed:
                # Resumed after preemption: a new block table.
                r = self.reqs[rid] = self._runner_req(rid, list(new_ids[0]) if new_ids else [])
            elif new_ids is not None and r is not None:
                r.block_ids.extend(new_ids[0])
            computed[rid] = cached.num_computed_tokens[i]
        meta = so.kv_connector_metadata
        # Fresh blocks hold garbage: everything past what vLLM's own prefix cache supplied.
        local = {spec.key.rsplit("#", 1)[0]: spec.num_computed_tokens
                 for spec in getattr(meta, "loads", [])}
        for spec in getattr(meta, "loads", []):
            if spec.is_async:
                end = spec.num_computed_tokens + spec.num_tokens
                self._poison(spec.block_ids, spec.num_computed_tokens, end)
        for rid, n in so.num_scheduled_tokens.items():
            r = self.reqs[rid]
            first = local.get(rid, computed[rid])
            end = min(computed[rid] + n, len(r.block_ids) * self.block_size)
            if rid in local or rid in {x.req_id for x in so.scheduled_new_reqs} \
                    or rid in resumed:
                self._poison(r.block_ids, first, end)
        for hook in self.hooks_before_execute:
            hook(self, so)

        w.bind_connector_metadata(meta)
        w.handle_preemptions(meta)
        w.start_load_kv(None)  # type: ignore[arg-type]
        for name in self.layer_names:
            w.wait_for_layer_load(name)
        sampled: Dict[str, List[int]] = {}
        for rid, n in so.num_scheduled_tokens.items():
            r = self.reqs[rid]
            start = computed[rid]
            drafts = list(so.scheduled_spec_decode_tokens.get(rid, ()))
            if any(d < 0 for d in drafts):  # async placeholders: the runner's own drafts
                drafts = r.drafts[:len(drafts)]
            real_end = start + n - len(drafts)
            kv_ok = self._check(rid, r, start)
            # Positions [start, real_end) hold real tokens; the drafts follow them.
            seq = r.tokens[:real_end] + drafts
            self._write(r, seq, start)
            out: List[int] = []
            if real_end >= r.prompt_len:
                # The step reached the end of the prompt: sample, and verify the drafts.
                pos = real_end - 1
                while True:
                    t = r.tokens[pos + 1] if kv_ok else POISON
                    out.append(t)
                    k = pos + 1 - real_end
                    if k < len(drafts) and drafts[k] == t:
                        pos += 1
                        continue
                    break
                r.drafts = self._propose(r, pos + 1) if self.num_spec_tokens else []
            sampled[rid] = out
        w.save_kv_layer  # saves are taken in wait_for_save, as vLLM's runner calls it
        w.wait_for_save()
        sending, recving = w.get_finished(so.finished_req_ids)
        invalid = w.get_block_ids_with_load_errors()
        if invalid:
            self.invalid_blocks_by_step[self.step_no] = set(invalid)
        self.reported_sending.extend(sending or ())
        self.reported_recving.extend(recving or ())
        worker_stats = w.get_kv_connector_stats()
        if worker_stats is not None:
            self.worker_counters.update({k: v for k, v in worker_stats.data.items()
                                         if not k.startswith("gauge:")})
        kv_out = KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                   invalid_block_ids=invalid,
                                   kv_connector_stats=worker_stats,
                                   kv_cache_events=w.get_kv_connector_kv_cache_events())
        w.clear_connector_metadata()
        req_ids = list(so.num_scheduled_tokens)
        fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
        index = ({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
                 if "req_id_to_index" in fields else {})  # vLLM 0.32/0.33; 0.34 dropped it
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=[sampled[r] for r in req_ids],
                                 kv_connector_output=kv_out, **index)

    def _runner_req(self, rid: str, block_ids: List[int]) -> _RunnerReq:
        p = self.prompts[rid]
        return _RunnerReq(p + reference_output(p, self.max_tokens[rid] + 16), len(p), block_ids)

    def _propose(self, r: _RunnerReq, next_pos: int) -> List[int]:
        """Drafts for the positions after next_pos: right with draft_accuracy, else random."""
        drafts = []
        for k in range(self.num_spec_tokens):
            right = r.tokens[next_pos + 1 + k]
            t = right if self.rng.random() < self.draft_accuracy else 2 + self.rng.randrange(
                VOCAB - 2)
            drafts.append(t)
        return drafts

    # ---- what the tests assert ----

    def wrong_commits(self) -> List[str]:
        """Commits whose tokens are not the request's real tokens (a prefix of prompt +
        reference output)."""
        bad = []
        for c in self.commits:
            rid = c.key.rsplit("#", 1)[0]
            truth = self.prompts[rid] + reference_output(self.prompts[rid],
                                                         self.max_tokens[rid])
            if c.tokens != truth[:len(c.tokens)]:
                first = next(i for i, (a, b) in enumerate(zip(c.tokens, truth)) if a != b) \
                    if any(a != b for a, b in zip(c.tokens, truth)) else min(len(c.tokens),
                                                                            len(truth))
                bad.append(f"step {c.step} {c.key}: {len(c.tokens)} tokens, first wrong at "
                           f"{first}")
        return bad

    def double_reports(self) -> List[str]:
        """Requests the worker listed as finished sending more than once (vLLM frees a
        request's blocks at the first)."""
        seen: Dict[str, int] = {}
        for rid in self.reported_sending:
            seen[rid] = seen.get(rid, 0) + 1
        return [rid for rid, n in seen.items() if n > 1]

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.connector.shutdown()


# What the scheduler-level tests share (test_scheduler_paths.py, test_vllm_hooks.py): the
# configurations they run kvtier with and what every run must show at its end.


def config(tmp: Path, **extra: Any) -> Dict[str, Any]:
    """A G2-only kvtier (96 MiB, not locked), with `extra` settings on top."""
    c: Dict[str, Any] = {"g2.capacity_bytes": "96MiB", "g2.lock_memory": False,
                         "g3.enabled": False}
    c.update(extra)
    return c


def g3_config(tmp: Path, **extra: Any) -> Dict[str, Any]:
    """config() with a G3 in tmp/g3 that admits first sightings."""
    return config(tmp, **{"g3.enabled": True, "g3.dir": str(tmp / "g3"),
                          "g3.capacity_bytes": "192MiB", "g3.admit_min_seen": 1, **extra})


def check(h: Harness, expect_done: List[str]) -> None:
    """What every test asserts about a finished harness run."""
    for rid in expect_done:
        assert h.outputs[rid] == reference_output(h.prompts[rid], h.max_tokens[rid]), \
            f"{rid}: wrong output (kv mismatches {h.kv_mismatches[:5]})"
    assert h.wrong_commits() == []
    assert h.double_reports() == []
    assert not h.scheduler.requests, f"requests never freed: {list(h.scheduler.requests)}"
    h.worker.connector_worker._manager.wait_for_saves()
    assert h.worker.connector_worker._manager.stats()["pinned_blocks"] == 0


def hits(h: Harness) -> Dict[str, int]:
    """The harness's kvtier hit blocks by tier."""
    return h.worker.connector_worker._manager.stats()["hit_blocks"]
