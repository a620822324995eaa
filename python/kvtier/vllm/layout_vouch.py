"""vLLM's KV layout, vouched for at registration and named by a fingerprint (docs/vllm.md,
"KV layout: vouching and fingerprint").

kvtier copies a block as opaque bytes (kvtier/vllm/layouts.py finds where they lie); only an
engine that writes and reads them in the same order may load them. Two jobs follow:

1. **Vouching.** Every attention layer's backend (vLLM's ``get_name()``), KV tensor dtype,
   cache dtype, shape, stride order and (CPU) kernel ISA must be in ``VOUCHED``, the layouts
   kvtier has seen. Outside it, registration is refused (``KvLayoutNotVouched``) with what was
   seen, what kvtier knows and the last tested vLLM, unless the user opts in
   (``allow_unvouched_layout``): it then runs with a warning. On a vLLM outside the tested
   range kvtier runs only if every check passes, and logs what it checked.
2. **The fingerprint** in the key namespace. A *byte probe* writes a known K/V pattern (every
   element distinct, K != V) into a scratch two-block KV tensor of the layer's own block shape,
   stride order, dtype and device, through the layer's own ``impl.do_kv_cache_update``, and
   hashes the bytes of the block it wrote: the in-block byte order as the engine really lays
   it out. So the same layout gives the same fingerprint under any vLLM version (G3/G4
   survive an upgrade), and any change of the in-block order gives another namespace. The
   probe also proves what whole-block copies rely on: the other block's bytes stay untouched.
   When the probe cannot run (no attention module, a compiled op missing, a quantized cache
   whose bytes depend on its scales) the fingerprint is *static*: backend, dtypes, shape,
   stride order, ISA and the vLLM release line (a static descriptor cannot see an in-block
   order that changed under the same names, so it is not shared across vLLM releases). The
   kind is part of the fingerprint: a probe and a static fingerprint never collide.

Invariant: the fingerprint depends only on what the stored bytes depend on (and the probe's
own format version): no process id, address, time or vLLM version (probe kind).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, cast

import torch

from kvtier.vllm import compat

_log = logging.getLogger("kvtier.vllm")

# Bumped with any change to the probe's pattern, its descriptor or the static descriptor: a new
# version is a new namespace (the old blocks are never read again).
PROBE_FORMAT = 1
STATIC_FORMAT = 1


class KvLayoutNotVouched(compat.VllmNotVouched):
    """vLLM's KV cache layout differs from every layout kvtier has seen."""


# vLLM's KVCacheLayout (0.32-0.34): stride permutation of the logical [L, B, H, N, C].
# Compared with the installed vLLM's enum at every registration.
KV_CACHE_LAYOUTS: Dict[str, Tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4),
}
# The ones whose block of one layer is one dense range (what kvtier copies).
_COPYABLE = ("LBHNC", "LBNHC", "BLHNC", "BLNHC")
_FP8_DTYPES = (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)
_FP8_CACHE = ("fp8", "fp8_e4m3", "fp8_e5m2")
# Cache dtype strings under which vLLM stores the model's own values, unscaled.
_UNQUANTIZED = ("auto", "bfloat16", "float16", "half", "float32", "float")


@dataclasses.dataclass(frozen=True)
class VouchedBackend:
    layouts: Tuple[str, ...]  # KVCacheLayout names kvtier copies for this backend
    dtypes: Tuple[torch.dtype, ...]  # KV tensor dtypes
    cache_dtypes: Tuple[str, ...] = ("auto",)  # vLLM cache dtype strings ("auto": unquantized)
    mla: bool = False  # one latent per token: [B, 1, N, head_size]
    isas: Tuple[str, ...] = ()  # CPU backends: the kernel ISAs seen (they order a block's bytes)
    seen: str = "read"  # "run": end to end under kvtier; "read": in vLLM's source and on CPU
    #                     tensors of its shapes (tests/vllm/test_layouts.py), not on its device

    def describe(self, name: str) -> str:
        isas = f", ISAs {'/'.join(self.isas)}" if self.isas else ""
        return (f"{name} ({self.seen}): layouts {'/'.join(self.layouts)}, dtypes "
                f"{'/'.join(_dtype_name(d) for d in self.dtypes)}, cache dtypes "
                f"{'/'.join(self.cache_dtypes)}{isas}")


_HALF = (torch.float16, torch.bfloat16)
_GPU = _HALF + (torch.float32,) + _FP8_DTYPES
# What kvtier has seen, per attention backend (vLLM 0.32-0.34 all hand the connector the
# logical [B, H, N, C] view: K and V side by side in C, one plane).
VOUCHED: Dict[str, VouchedBackend] = {
    # Run: vLLM 0.32's and 0.33's CPU engines, fp32 and bf16 (vec, vec16 on AVX-512; amx on an
    # AMX machine, ../shared/notes/vllm-on-cpu.md).
    "CPU_ATTN": VouchedBackend(("LBHNC",), (torch.float32, torch.bfloat16, torch.float16),
                               isas=("vec", "vec16", "amx"), seen="run"),
    "FLASH_ATTN": VouchedBackend(_COPYABLE, _GPU, ("auto",) + _FP8_CACHE),
    "TRITON_ATTN": VouchedBackend(_COPYABLE, _GPU, ("auto",) + _FP8_CACHE),
    "FLASHINFER": VouchedBackend(("LBHNC", "BLHNC"), _HALF + _FP8_DTYPES,
                                 ("auto",) + _FP8_CACHE),
    "FLEX_ATTENTION": VouchedBackend(("LBNHC",), _HALF + (torch.float32,)),
    **{name: VouchedBackend(_COPYABLE, _HALF + _FP8_DTYPES, ("auto", "fp8", "fp8_e4m3"),
                            mla=True)
       for name in ("FLASHMLA", "FLASH_ATTN_MLA", "TRITON_MLA", "CUTLASS_MLA",
                    "FLASHINFER_MLA")},
}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _cache_dtype(kv_cache_dtype: str) -> str:
    return "auto" if kv_cache_dtype in _UNQUANTIZED else kv_cache_dtype


def physical_order(shape: Sequence[int], stride: Sequence[int]) -> Tuple[int, ...]:
    """The dimensions of size > 1, outermost first (by stride)."""
    dims = [i for i in range(len(shape)) if shape[i] != 1]
    return tuple(sorted(dims, key=lambda i: (-stride[i], i)))


def view_order(layout: str) -> Tuple[int, ...]:
    """The physical order of the per-layer [B, H, N, C] view of a KVCacheLayout."""
    return tuple(i - 1 for i in KV_CACHE_LAYOUTS[layout] if i != 0)


# ---------------------------------------------------------------------------------------------
# The byte probe
# ---------------------------------------------------------------------------------------------


class ProbeFailed(Exception):
    """The probe could not run; the fingerprint falls back to the static descriptor."""


class NotBlockLocal(Exception):
    """Writing one block's tokens changed another block's bytes: whole-block copies would move
    parts of other blocks. Refused even with allow_unvouched_layout."""


def probe_pattern(count: int, start: int, dtype: torch.dtype) -> torch.Tensor:
    """`count` values, element i distinct from every other element of [0, start + count) where
    the dtype allows (fp32: the integers start+1..; 16-bit floats: distinct finite normal bit
    patterns, 65,024 of them in bf16 and 61,440 in fp16, then repeating)."""
    idx = torch.arange(start, start + count, dtype=torch.int64)
    if dtype in (torch.float32, torch.float64):
        return (idx % (1 << 24) + 1).to(dtype)
    if dtype in _HALF:
        exp_bits, man_bits = (8, 7) if dtype == torch.bfloat16 else (5, 10)
        per_sign = ((1 << exp_bits) - 2) << man_bits  # exponents 1..max-1: normal, finite
        j = idx % (2 * per_sign)
        sign, r = j // per_sign, j % per_sign
        bits = (sign << 15) | ((1 + (r >> man_bits)) << man_bits) | (r & ((1 << man_bits) - 1))
        bits = torch.where(bits >= (1 << 15), bits - (1 << 16), bits).to(torch.int16)
        return bits.view(dtype)
    raise ProbeFailed(f"no probe pattern for input dtype {_dtype_name(dtype)}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    return flat.view({4: torch.int32, 2: torch.int16, 1: torch.uint8, 8: torch.int64}[
        t.element_size()])


def _bytes(t: torch.Tensor, order: Sequence[int]) -> bytes:
    """t's bytes in memory order (t: a dense chunk whose dimensions, outermost first, are
    `order` followed by its size-1 dimensions)."""
    full = list(order) + [i for i in range(t.dim()) if i not in order]
    return cast(bytes,
                t.permute(full).contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())


@dataclasses.dataclass
class ProbeResult:
    digest: str  # SHA-256 of the written block's bytes
    rearranged: bool  # the block holds exactly the K and V values written, reordered


def byte_probe(update: compat.KvCacheUpdate, layer: Any, like: torch.Tensor, ratio: int,
               num_kv_heads: int, head_size: int, head_size_v: int,
               input_dtype: torch.dtype) -> ProbeResult:
    """Writes one manager block's tokens (block 1 of a zeroed scratch of two blocks, each
    `ratio` kernel blocks of like's [_, H, N, C] shape, stride order, dtype and device) through
    `update` (vLLM's do_kv_cache_update), twice, and hashes block 1's bytes. Raises
    ProbeFailed (the probe says nothing) or NotBlockLocal (block 0 changed)."""
    if like.dim() != 4:
        raise ProbeFailed(f"a {like.dim()}-d KV tensor (the probe writes [B, H, N, C])")
    order = physical_order(like.shape, like.stride())
    if not order or order[0] != 0:
        raise ProbeFailed(f"the block dimension is not outermost (order {order})")
    shape = (2 * ratio,) + tuple(like.shape[1:])
    full = list(order) + [i for i in range(4) if i not in order]
    inverse = [full.index(i) for i in range(4)]
    tokens = ratio * int(like.shape[2])
    key = probe_pattern(tokens * num_kv_heads * head_size, 0, input_dtype)
    value = probe_pattern(tokens * num_kv_heads * head_size_v, key.numel(), input_dtype)
    key = key.reshape(tokens, num_kv_heads, head_size).to(like.device)
    value = value.reshape(tokens, num_kv_heads, head_size_v).to(like.device)
    slots = torch.arange(tokens, 2 * tokens, dtype=torch.int64, device=like.device)
    digests = []
    rearranged = False
    for _ in range(2):  # the same bytes twice, or the probe is not evidence
        scratch = torch.zeros([shape[i] for i in full], dtype=like.dtype,
                              device=like.device).permute(inverse)
        try:
            update(layer, key, value, scratch, slots)
        except Exception as e:  # a missing kernel, a layer not set up: no probe, no harm
            raise ProbeFailed(f"do_kv_cache_update raised {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from e
        if bool(scratch[:ratio].ne(0).any()):
            raise NotBlockLocal(
                "writing the tokens of block 1 changed the bytes of block 0 (a block's KV is "
                "not its own byte range)")
        written = scratch[ratio:]
        if not bool(written.ne(0).any()):
            raise ProbeFailed("do_kv_cache_update wrote nothing into the scratch block")
        if like.dtype == input_dtype:
            mine = torch.sort(_bits(torch.cat([key.reshape(-1), value.reshape(-1)]))).values
            rearranged = bool(torch.equal(torch.sort(_bits(written)).values.cpu(), mine.cpu()))
        digests.append(hashlib.sha256(_bytes(written, order)).hexdigest())
    if digests[0] != digests[1]:
        raise ProbeFailed("two probes of the same pattern gave different bytes")
    return ProbeResult(digests[0], rearranged)


# ---------------------------------------------------------------------------------------------
# Vouching
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Group:
    """Layers that the same checks and the same probe cover."""
    key: Tuple[Any, ...]
    layers: List[str]
    info: Optional[compat.AttentionLayerInfo]
    module: Any
    tensor: torch.Tensor
    backend: str = "unknown"
    descriptor: str = ""
    probe: Optional[ProbeResult] = None
    shape_ok: bool = False  # the tensor is the [B, H, N, C] its layer declares (probe-safe)


@dataclasses.dataclass
class LayoutVouch:
    """What registration found: the fingerprint and what it checked."""
    version: str
    tested: bool
    checked: List[str]
    problems: List[str]  # empty unless allow_unvouched_layout let them run
    kind: str  # "probe" or "static"
    fingerprint: str  # 16 hex digits
    backends: List[str]
    namespace_tag: str  # base tag (device, order) + backend + kind + fingerprint
    probe_ms: float
    notes: List[str]  # why a probe did not run, rearrangement results

    def summary(self) -> str:
        unvouched = f", {len(self.problems)} NOT VOUCHED" if self.problems else ""
        return (f"KV layout {self.namespace_tag} ({self.kind} fingerprint, probe "
                f"{self.probe_ms:.1f} ms; vLLM {self.version}"
                f"{'' if self.tested else ', not a tested version'}; "
                f"{len(self.checked)} checks{unvouched})")


def _shape_problems(name: str, info: compat.AttentionLayerInfo, t: torch.Tensor,
                    block_size: int, num_blocks: int, vb: Optional[VouchedBackend]) -> List[str]:
    if t.dim() != 4:
        return [f"{name}: a {t.dim()}-d KV tensor {tuple(t.shape)}; kvtier knows vLLM's "
                f"[blocks, kv heads, block, K+V] (4-d)"]
    out = []
    b, h, n, c = (int(x) for x in t.shape)
    mla = vb.mla if vb else compat.backend_is_mla(info.backend)
    want_h = 1 if mla else info.num_kv_heads
    if want_h is None or info.head_size is None:
        return [f"{name}: the attention module does not say its KV heads and head size "
                f"(num_kv_heads, head_size), so its tensor's shape cannot be checked"]
    if h != want_h:
        out.append(f"{name}: {h} heads in dim 1, the layer has {want_h} KV heads")
    if c != info.head_size + (info.head_size_v or 0):
        out.append(f"{name}: dim 3 holds {c} values, the layer's K+V is "
                   f"{info.head_size}+{info.head_size_v or 0}")
    if n < 1 or block_size % n or b != num_blocks * (block_size // n):
        out.append(f"{name}: {b} blocks of {n} tokens in a {tuple(t.shape)} tensor do not "
                   f"make {num_blocks} blocks of {block_size} tokens")
    return out


def _check_group(g: _Group, block_size: int, num_blocks: int, resolved: Optional[str],
                 checked: List[str], problems: List[str]) -> None:
    t, info, first = g.tensor, g.info, g.layers[0]
    where = f"{first}" + (f" (+{len(g.layers) - 1} like it)" if len(g.layers) > 1 else "")
    if info is None:
        problems.append(f"{where}: no attention module in vLLM's static_forward_context "
                        f"(kvtier cannot tell which backend wrote its KV)")
        return
    vb = VOUCHED.get(g.backend)
    checked.append(f"{where}: backend {g.backend}")
    if vb is None:
        problems.append(f"{where}: attention backend {g.backend}, which kvtier has not seen")
    checked.append(f"{where}: dtype {_dtype_name(t.dtype)}, cache dtype {info.kv_cache_dtype}")
    if vb is not None and t.dtype not in vb.dtypes:
        problems.append(f"{where}: KV dtype {_dtype_name(t.dtype)} under {g.backend}")
    if vb is not None and _cache_dtype(info.kv_cache_dtype) not in vb.cache_dtypes:
        problems.append(f"{where}: cache dtype {info.kv_cache_dtype} under {g.backend}")
    checked.append(f"{where}: shape {tuple(t.shape)} against the layer's heads and head size")
    shape_problems = _shape_problems(where, info, t, block_size, num_blocks, vb)
    problems += shape_problems
    g.shape_ok = not shape_problems
    order = physical_order(t.shape, t.stride())
    checked.append(f"{where}: stride order {order}" + (f", vLLM's layout {resolved}"
                                                       if resolved else ""))
    matching = [n for n in KV_CACHE_LAYOUTS
                if tuple(i for i in view_order(n) if t.shape[i] != 1) == order]
    if vb is not None and not set(matching) & set(vb.layouts):
        problems.append(f"{where}: stride order {order} (layout {'/'.join(matching) or 'none'}) "
                        f"under {g.backend}")
    if resolved is not None:
        if resolved not in KV_CACHE_LAYOUTS:
            problems.append(f"vLLM resolved the KV cache layout {resolved}, unknown to kvtier")
        elif resolved not in matching:
            problems.append(f"{where}: stride order {order} is not vLLM's resolved layout "
                            f"{resolved} ({view_order(resolved)})")
        supported = compat.backend_layouts(info.backend)
        if supported is not None and resolved not in supported:
            problems.append(f"{where}: {g.backend} declares layouts {supported}, not {resolved}")
    if vb is not None and vb.isas:
        checked.append(f"{where}: ISA {info.isa}")
        if info.isa not in vb.isas:
            problems.append(f"{where}: {g.backend} ISA {info.isa}")


def _descriptor(g: _Group, ratio: int, input_dtype: Any, version: str) -> str:
    t, info = g.tensor, g.info
    cache = _cache_dtype(info.kv_cache_dtype) if info else "?"
    common = (f"{g.backend}|{_dtype_name(t.dtype)}|cache={cache}|shape="
              f"{'x'.join(str(int(x)) for x in t.shape[1:])}|k{ratio}|order="
              f"{''.join(map(str, physical_order(t.shape, t.stride())))}")
    if g.probe is not None:
        return f"probe{PROBE_FORMAT}|{common}|in={_dtype_name(input_dtype)}|{g.probe.digest}"
    major, minor, _ = compat.parse_version(version)
    return (f"static{STATIC_FORMAT}|{common}|isa={info.isa if info else '?'}|"
            f"vllm={major}.{minor}")


def vouch_kv_layout(*, layers: Mapping[str, Any], kv_caches: Mapping[str, torch.Tensor],
                    layer_names: Sequence[str], block_size: int, num_blocks: int,
                    resolved_layout: Optional[str], model_dtype: Any, base_tag: str,
                    allow_unvouched: bool, version: Optional[str] = None) -> LayoutVouch:
    """Checks every layer's KV against VOUCHED, probes each distinct layout once, and returns
    the fingerprint. `layers`: layer name -> vLLM's attention module; `layer_names`: the KV
    tensors kvtier moves, in layer order; `base_tag`: layouts.py's device and order tag.
    Raises KvLayoutNotVouched naming what differs (or, whatever allow_unvouched says, when the
    probe shows that a block's KV is not its own byte range)."""
    version = version or compat.vllm_version()
    tested = compat.is_tested(version)
    checked = [f"vLLM {version} ({'tested' if tested else 'not tested'})",
               "vLLM's KVCacheLayout members"]
    problems: List[str] = []
    notes: List[str] = []
    theirs = compat.kv_cache_layout_orders()
    if theirs != KV_CACHE_LAYOUTS:
        problems.append(f"vLLM's KVCacheLayout is {theirs or 'absent'}; kvtier knows "
                        f"{KV_CACHE_LAYOUTS}")
    groups: Dict[Tuple[Any, ...], _Group] = {}
    per_layer: List[_Group] = []
    for name in layer_names:
        t, module = kv_caches[name], layers.get(name)
        info, backend = None, "unknown"
        if module is not None:
            try:
                info = compat.attention_layer_info(module)
                backend = compat.backend_name(info.backend)
            except Exception as e:  # an unreadable module is a difference like any other
                problems.append(f"{name}: cannot read its attention module "
                                f"({type(e).__name__}: {e})")
                info = None
        key = (backend, type(info.impl).__qualname__ if info else None,
               info.kv_cache_dtype if info else None, info.isa if info else None,
               info.num_kv_heads if info else None, info.head_size if info else None,
               info.head_size_v if info else None, t.dtype, tuple(t.shape), tuple(t.stride()))
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(key, [], info, module, t, backend)
        g.layers.append(name)
        per_layer.append(g)
    for g in groups.values():
        _check_group(g, block_size, num_blocks, resolved_layout, checked, problems)
    if problems and not allow_unvouched:  # refused before any of vLLM's kernels runs
        raise KvLayoutNotVouched(_refusal(version, tested, problems,
                                          list(dict.fromkeys(g.backend for g in per_layer))))
    input_dtype = model_dtype if isinstance(model_dtype, torch.dtype) else None
    t0 = time.perf_counter()
    for g in groups.values():
        ratio = max(1, int(g.tensor.shape[0]) // max(1, num_blocks))
        _run_probe(g, ratio, input_dtype, checked, notes)
        g.descriptor = _descriptor(g, ratio, input_dtype or g.tensor.dtype, version)
    probe_ms = (time.perf_counter() - t0) * 1e3
    kind = "probe" if all(g.probe is not None for g in groups.values()) else "static"
    fingerprint = hashlib.sha256("\n".join(g.descriptor for g in per_layer).encode()
                                 ).hexdigest()[:16]
    backends = list(dict.fromkeys(g.backend for g in per_layer))
    tag = f"{base_tag}-{'+'.join(backends)}-{kind[0]}{fingerprint}"
    report = LayoutVouch(version, tested, checked, [], kind, fingerprint, backends, tag,
                         probe_ms, notes)
    report.problems = problems  # only here when allow_unvouched let them run
    return report


def _run_probe(g: _Group, ratio: int, input_dtype: Optional[torch.dtype], checked: List[str],
               notes: List[str]) -> None:
    info = g.info
    where = g.layers[0]
    why = ""
    update = compat.kv_cache_update(info.impl) if info else None
    if info is None:
        why = "no attention module"
    elif _cache_dtype(info.kv_cache_dtype) != "auto":
        why = f"cache dtype {info.kv_cache_dtype}: its bytes depend on the layer's scales"
    elif update is None:
        why = f"{type(info.impl).__name__} has no do_kv_cache_update(layer, key, value, ...)"
    elif not g.shape_ok:  # a kernel handed a tensor of another shape may crash the device
        why = "the tensor's shape is not the layer's"
    if not why:
        # Else `why` says why not; shape_ok means _shape_problems found both sizes declared.
        assert info is not None and update is not None
        assert info.num_kv_heads is not None and info.head_size is not None
        try:
            g.probe = byte_probe(update, g.module, g.tensor, ratio, info.num_kv_heads,
                                 info.head_size, info.head_size_v or 0,
                                 input_dtype or g.tensor.dtype)
        except ProbeFailed as e:
            why = str(e)
        except NotBlockLocal as e:
            raise KvLayoutNotVouched(
                f"kvtier refuses vLLM's KV cache layout: {where} ({g.backend}): {e}. kvtier "
                f"copies whole blocks, so it would load parts of other blocks' KV. This is "
                f"refused even with allow_unvouched_layout; run without kvtier.") from e
    if why:
        notes.append(f"{where} ({g.backend}): no byte probe ({why}); static fingerprint")
    else:
        assert g.probe is not None  # the probe ran and returned
        checked.append(f"{where}: byte probe (block-local"
                       f"{', a rearrangement of K and V' if g.probe.rearranged else ''})")


def _refusal(version: str, tested: bool, problems: List[str], backends: List[str]) -> str:
    known = [VOUCHED[b].describe(b) for b in backends if b in VOUCHED]
    knows = ("; ".join(known) + "; other backends: " if known else "backends ") + \
        ", ".join(sorted(set(VOUCHED) - set(backends)))
    where = "a tested version" if tested else \
        f"not a tested version (last tested: {compat.LAST_TESTED})"
    return (f"kvtier refuses vLLM's KV cache layout (vLLM {version}, {where}): "
            + "; ".join(problems)
            + f". kvtier knows: {knows}. Stored under a layout kvtier has not seen, blocks could "
              f"be read back in another byte order (wrong KV, wrong answers). Use a backend, "
              f"dtype and layout kvtier knows (docs/vllm.md, \"KV layout: vouching and "
              f"fingerprint\"; last tested vLLM {compat.LAST_TESTED}), or set "
              f"\"allow_unvouched_layout\": true in kv_connector_extra_config to run anyway "
              f"(the layout fingerprint keeps these blocks apart from every other layout's).")


def vouch_registered_caches(vllm_config: Any, kv_cache_config: Any,
                            kv_caches: Mapping[str, torch.Tensor], layer_names: Sequence[str],
                            block_size: int, num_blocks: int, base_tag: str,
                            allow_unvouched: bool) -> LayoutVouch:
    """vouch_kv_layout on what vLLM handed register_kv_caches, with the outcome logged: the
    checks (a vLLM outside the tested range), the loud warning (allow_unvouched_layout), why
    no probe ran."""
    report = vouch_kv_layout(
        layers=compat.attention_layers(vllm_config), kv_caches=kv_caches,
        layer_names=layer_names, block_size=block_size, num_blocks=num_blocks,
        resolved_layout=compat.resolved_kv_cache_layout(vllm_config, kv_cache_config),
        model_dtype=compat.model_dtype(vllm_config), base_tag=base_tag,
        allow_unvouched=allow_unvouched)
    _log.debug("kvtier: KV layout checks: %s", "; ".join(report.checked))
    for note in report.notes:
        _log.info("kvtier: %s", note)
    if report.problems:
        _log.warning(
            "kvtier: RUNNING ON A KV LAYOUT KVTIER HAS NOT VOUCHED FOR (allow_unvouched_layout "
            "is set): %s. Its blocks are kept under their own fingerprint (%s); kvtier has not "
            "checked that they load right.", "; ".join(report.problems), report.namespace_tag)
    elif not report.tested:
        _log.warning("kvtier: vLLM %s is not a tested version (last tested: %s); its KV layout "
                     "passed every check: %s", report.version, compat.LAST_TESTED,
                     "; ".join(report.checked))
    return report
