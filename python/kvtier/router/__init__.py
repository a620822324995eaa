"""kvtier's KV-aware router: an OpenAI-compatible HTTP proxy that sends each request to the
worker with the lowest estimated time to first token, from every worker's KV events (vLLM's own
G1 events and kvtier's G2/G3/G4 events). Run it with ``kvtier router`` or ``python -m
kvtier.router``; docs/router.md has the design."""
from kvtier.router.events import EventTranslator, decode_batch, tier_of
from kvtier.router.proxy import POLICIES, Router, RouterSettings, WorkerSpec, make_app

__all__ = ["EventTranslator", "decode_batch", "tier_of", "POLICIES", "Router", "RouterSettings",
           "WorkerSpec", "make_app"]
