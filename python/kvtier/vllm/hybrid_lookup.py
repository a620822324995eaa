"""How the scheduler side of KvtierConnector looks up a hybrid model (kvtier/vllm/groups.py):
every KV cache group is a kvtier request of its own, and a hit must hold in every group.

A state (mamba) group holds a state only at the boundaries vLLM kept one, and a sliding-window
group needs only the window's blocks before the hit's end; so besides every group's lookup of
the whole prompt, those groups are probed at the prompt's last block boundaries (probe_plan),
and the hit is the longest boundary every group holds on every rank (hit). docs/hybrid.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from kvtier.vllm.groups import FULL, SLIDING, GroupPlan, group_key

# A state-space hybrid's lookup probes at most this many block boundaries per state group (the
# prompt's last ones): a state further back is not offered (docs/hybrid.md).
_MAX_STATE_PROBES = 32
# A sliding-window group is probed for the window's blocks alone at the prompt's last this many
# boundaries (below them it must hold every block from the engine's own hit).
_MAX_WINDOW_PROBES = 4


class HybridLookup:
    """The probes and the reading of their answers for one model's groups (pure: no I/O)."""

    def __init__(self, groups: GroupPlan, block_size: int) -> None:
        self._groups = groups
        self._block_size = block_size

    def probe_plan(self, num_tokens: int, num_computed: int) -> List[Tuple[int, int, int]]:
        """The hybrid lookup's probes, in submission order: (group index, end, start). Each is
        the prompt cut after `end` + 1 tokens looked up from `start`, and says whether kvtier
        holds every block of [start, end) of that group:
        - a state group, at the prompt's last _MAX_STATE_PROBES boundaries past num_computed:
          the block before the boundary (the state at `end`);
        - a sliding-window group, at the last _MAX_WINDOW_PROBES: the blocks vLLM's own prefix
          cache needs for a hit at `end` (cdiv(window - 1, block) of them, its
          _contiguous_blocks_for_hit), so that a group that lost earlier blocks still hits
          there. Below those, a sliding group must hold every block from num_computed."""
        bs = self._block_size
        ends = self.probe_ends(num_tokens, num_computed)
        out = [(g.index, e, e - bs) for g in self._groups.state_groups for e in ends]
        for g in self._groups.groups:
            if g.kind == SLIDING:
                need = -(-(g.window - 1) // bs) * bs
                out += [(g.index, e, max(num_computed, e - need))
                        for e in ends[:_MAX_WINDOW_PROBES]]
        return out

    def probe_ends(self, num_tokens: int, num_computed: int) -> List[int]:
        bs = self._block_size
        top = (num_tokens - 1) // bs * bs
        return list(range(top, num_computed, -bs))[:_MAX_STATE_PROBES]

    def queries(self, key: str, tokens: List[int], num_computed: int, salt: str,
                lora: str, extras: List[bytes], load_tiers: str,
                store_tiers: str) -> List[Tuple[Any, ...]]:
        """The probes (probe_plan) first, then every group's whole-prompt lookup: a group's
        last lookup is the one its saves follow."""
        probes = [(group_key(key, g), tokens[:e + 1], start,
                   salt + self._groups.groups[g].salt_tag, lora, extras, load_tiers,
                   store_tiers)
                  for g, e, start in self.probe_plan(len(tokens), num_computed)]
        return probes + [(group_key(key, g.index), tokens, num_computed, salt + g.salt_tag,
                          lora, extras, load_tiers, store_tiers) for g in self._groups.groups]

    def hit(self, answers: List[Any], per_client: int, num_tokens: int,
            num_computed: int,
            cap: Optional[int]) -> Tuple[int, Tuple[int, int, int, int]]:
        """The hit of a hybrid model from every rank's answers to queries: the longest
        boundary n within the full-attention groups' shortest answer (capped) at which, on
        every rank, every state group holds its state and every sliding group holds either
        every block from num_computed or (a probed n) the window's blocks. By tier: the
        primary group's on rank 0."""
        bs = self._block_size
        groups = self._groups.groups
        plan = self.probe_plan(num_tokens, num_computed)
        assert per_client == len(plan) + len(groups), (per_client, len(plan), len(groups))
        ranks = len(answers) // per_client
        whole = [answers[r * per_client + len(plan):(r + 1) * per_client] for r in range(ranks)]
        bound = min(a[g.index][0] for a in whole for g in groups if g.kind == FULL)
        if cap is not None:
            bound = min(bound, cap)
        by_tier = whole[0][self._groups.primary][1]
        held: Dict[Tuple[int, int], bool] = {}
        for i, (g, e, start) in enumerate(plan):
            held[(g, e)] = all(answers[r * per_client + i][0] >= e - start for r in range(ranks))
        sliding = [g for g in groups if g.kind == SLIDING]
        states = self._groups.state_groups
        contiguous = {g.index: min(a[g.index][0] for a in whole) for g in sliding}
        for n in range(num_computed + bound - bound % bs, num_computed, -bs):
            if not all(held.get((g.index, n), False) for g in states):
                continue
            if all(n - num_computed <= contiguous[g.index] or held.get((g.index, n), False)
                   for g in sliding):
                return n - num_computed, by_tier
        return 0, by_tier
