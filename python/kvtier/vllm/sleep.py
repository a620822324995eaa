"""vLLM's sleep mode on the worker side: kvtier lets go of G1 while vLLM's KV cache is away.

vLLM 0.33+ calls the worker connector's ``unregister_kv_caches`` before the KV cache's memory
is freed or remapped (sleep at level >= 1, ``discard(("kv_cache",))``,
``release_kv_cache_memory``, a weight update that borrows the extensible KV cache's memory) and
``restore_kv_caches`` once it is mapped again, at the same addresses (cumem and the extensible
KV cache keep the virtual addresses; the contents are gone). vLLM says the transfers are
drained by then, but that is its own view: a running request that the pause preempted (mode
"keep") never reaches the worker's ``handle_preemptions``, so the saves its last step started
may still be reading G1. So kvtier drains itself first (``G1Sleep.suspend``) and relies on no
order of vLLM's.

Invariants while suspended (from ``suspend`` to ``resume``; KvtierConnector keeps them):

- no save reads G1: every save committed before ended (the manager's WaitForSaves: deferred
  ones started or dropped, counted as dropped_saves), and ``wait_for_save`` commits nothing
  (counted: sleep_skipped_saves);
- no load writes G1: every load started before ended (LoadedTokens), and ``start_load_kv``
  starts none (its blocks are reported as load errors, so vLLM recomputes them; counted:
  sleep_refused_loads);
- ``get_finished`` asks the manager nothing (Finished() may start deferred saves);
- the worker's lookups answer 0 (a hit could only plan a load that must be refused).

Attached mode (kvtier serve) keeps them too: the daemon copies into or out of this engine's G1
only for loads and saves this engine started, so once those have ended nothing more comes. A
WaitForSaves or LoadedTokens call the daemon does not answer in time detaches the engine, which
fences its copies (AttachedManager::FenceCopies) until it attaches again, and only a later call
attaches.

``resume`` checks that every registered tensor is still alive at the address kvtier
registered. If one moved or is gone, kvtier stays off G1 for good (the invariants above hold
until the process ends) and raises ``KvtierSleepError``: the CUDA backend and kvtier serve take
one G1 registration per engine, so kvtier cannot follow a move.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Any, Iterable, List, Mapping, Tuple

import torch


class KvtierSleepError(RuntimeError):
    """The KV cache came back from sleep somewhere else than where kvtier registered it."""


@dataclasses.dataclass
class _Registered:
    name: str
    tensor: "weakref.ReferenceType[torch.Tensor]"  # weak: vLLM alone decides its lifetime
    data_ptr: int


class G1Sleep:
    """Where the G1 tensors were registered, and whether kvtier may touch them now. Called on
    the worker's thread; ``off`` is also read by the lookup server's thread."""

    def __init__(self) -> None:
        self._registered: List[_Registered] = []
        self.suspended = False
        self.broken = ""  # why kvtier stays off G1 for good ("" while it may come back)

    @property
    def off(self) -> bool:
        """True while kvtier must not touch G1 (suspended, or for good)."""
        return self.suspended or bool(self.broken)

    def record(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        """The tensors register_kv_caches registered (their addresses are G1's regions)."""
        self._registered = [_Registered(name, weakref.ref(t), t.data_ptr())
                            for name, t in kv_caches.items()]

    def suspend(self, manager: Any, load_keys: Iterable[str]) -> Tuple[int, float]:
        """Stops kvtier's G1 accesses and waits until none is left: every save committed and
        every load in `load_keys` (all those started) has ended when it returns. Returns (loads
        waited for, seconds taken). Idempotent."""
        if self.suspended:
            return 0, 0.0
        # First, so that a lookup arriving meanwhile already misses.
        self.suspended = True
        t0 = time.perf_counter()
        manager.wait_for_saves()
        waited = 0
        for key in load_keys:
            manager.loaded_tokens(key)  # waits for the key's loads to end
            waited += 1
        return waited, time.perf_counter() - t0

    def moved(self) -> List[str]:
        """The registered tensors that are gone or no longer at their registered address."""
        out = []
        for r in self._registered:
            t = r.tensor()
            if t is None:
                out.append(f"{r.name} (freed)")
            elif t.data_ptr() != r.data_ptr:
                out.append(f"{r.name} (0x{r.data_ptr:x} -> 0x{t.data_ptr():x})")
        return out

    def resume(self) -> None:
        """Lets kvtier touch G1 again. Raises KvtierSleepError, staying off G1 for good, when
        a registered tensor moved or was freed. Idempotent."""
        if self.broken:
            raise KvtierSleepError(self.broken)
        moved = self.moved()
        if moved:
            self.broken = (
                f"vLLM's KV cache is not where kvtier registered it after the wake-up: "
                f"{', '.join(moved[:4])}{' ...' if len(moved) > 4 else ''}. kvtier cannot "
                f"register G1 again, so it stays off the KV cache (every lookup a miss, "
                f"nothing loaded or saved) until the engine restarts")
            raise KvtierSleepError(self.broken)
        self.suspended = False
