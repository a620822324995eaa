"""What a kvtier key must cover for a vLLM request, beyond its token ids.

A block's KV depends on more than the token ids vLLM hands a connector:

- **Multimodal inputs and prompt embeddings.** A ``prompt_embeds`` request has
  ``all_token_ids`` of zeros, and the same text with another image has the same token ids.
  vLLM's own block hash mixes in, per block, the multimodal feature hashes of the block's range
  and a hash of the block's prompt embeddings (``generate_block_hash_extra_keys`` in
  ``vllm/v1/core/kv_cache_utils.py``). :func:`block_extras` takes exactly those (vLLM's own
  function, so kvtier keys what vLLM keys), as one digest per block, and kvtier mixes them into
  the block's key (``RequestSpec.block_extra``). The LoRA adapter and the cache salt are in the
  key namespace instead (with the adapter's path, as vLLM keys it).
- **The weights.** G3 and G4 outlive restarts: new weights under the same model path must not
  be served the old weights' KV. :func:`weights_fingerprint` goes into the key namespace: the
  model's configuration, its dtype and quantization, the KV cache dtype, and the identity of
  each weight file, read cheaply (never the whole weights): its name and size, the safetensors
  header (every tensor's name, dtype, shape and offsets), and samples of its bytes (the first
  and last 64 bytes of every tensor, and 16 strided 4 KiB pieces of the file). A change that
  alters none of the sampled bytes goes unseen: deployments that rewrite weights in place
  should also set ``model_id`` (or ``weights_id``) to the new version.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any, Dict, Iterable, List, Optional

from kvtier.vllm import compat

# Extra-key tags kvtier leaves to the namespace (vLLM also mixes them into every block).
_NAMESPACE_TAGS = ("lora", "cache_salt")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz", ".msgpack",
                    ".h5")
_MAX_SAFETENSORS_HEADER = 256 << 20  # refuse to read a header claiming more than this
_SAMPLE = 64
_CHUNKS = 16
_CHUNK = 4096

try:  # vLLM >= 0.9; without it, requests that need extras are refused (never mis-keyed)
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys as _vllm_extra_keys
except ImportError:  # pragma: no cover - depends on the vLLM version
    _vllm_extra_keys = None


class UnkeyableRequest(Exception):
    """kvtier cannot key this request's input; it must be neither loaded nor saved."""


def needs_extras(request: Any) -> bool:
    return bool(compat.mm_features(request)) or compat.prompt_embeds(request) is not None


def block_extras(request: Any, block_size: int) -> List[bytes]:
    """One digest per block that holds prompt tokens (empty bytes: nothing beyond the tokens),
    from vLLM's own per-block extra keys minus the LoRA and the salt. [] for a plain text
    request. Raises UnkeyableRequest when vLLM gives no way to key the request's inputs."""
    if not needs_extras(request):
        return []
    if _vllm_extra_keys is None:
        raise UnkeyableRequest("this vLLM has no generate_block_hash_extra_keys; kvtier "
                               "cannot key multimodal or prompt-embeds requests")
    for f in compat.mm_features(request):
        if compat.mm_identifier(f) is None:
            raise UnkeyableRequest("a multimodal input without an identifier (hash)")
    num_prompt = int(request.num_prompt_tokens)
    out: List[bytes] = []
    mm_idx = 0
    for i in range((num_prompt + block_size - 1) // block_size):
        start, end = i * block_size, (i + 1) * block_size
        keys, mm_idx = _vllm_extra_keys(request, start, end, mm_idx)
        kept = [k for k in keys or () if not (isinstance(k, tuple) and k and
                                               k[0] in _NAMESPACE_TAGS)]
        out.append(hashlib.sha256(repr(tuple(kept)).encode()).digest()[:16] if kept else b"")
    while out and not out[-1]:
        out.pop()
    return out


def adapter_id(request: Any) -> str:
    """The LoRA part of the key namespace: the adapter's name and path (vLLM keys both, so
    re-pointing a name at another adapter does not reuse the old one's KV)."""
    lora = compat.lora(request)
    if lora is None:
        return ""
    path = compat.lora_path(lora)
    return f"{lora.lora_name}\x00{path}" if path else str(lora.lora_name)


def published_lora_name(adapter: str) -> str:
    """The adapter's name as events publish it (adapter_id() without the path)."""
    return adapter.split("\x00", 1)[0]


# ---------------------------------------------------------------------------------------------
# The weights' fingerprint
# ---------------------------------------------------------------------------------------------


def _read_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    return data


def _safetensors_identity(fd: int, size: int, h: "hashlib._Hash") -> None:
    head = _read_exact(fd, 8, 0)
    if len(head) != 8:
        raise ValueError("shorter than a safetensors header length")
    (n,) = struct.unpack("<Q", head)
    if n == 0 or n > _MAX_SAFETENSORS_HEADER or 8 + n > size:
        raise ValueError(f"safetensors header length {n} does not fit the file ({size} bytes)")
    header = _read_exact(fd, n, 8)
    if len(header) != n:
        raise ValueError("truncated safetensors header")
    h.update(header)
    meta = json.loads(header)
    if not isinstance(meta, dict):
        raise ValueError("safetensors header is not a JSON object")
    base = 8 + n
    for name in sorted(k for k in meta if k != "__metadata__"):
        entry = meta[name]
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(x, int) for x in offsets)):
            raise ValueError(f"tensor {name!r} has no valid data_offsets")
        begin, end = base + offsets[0], base + offsets[1]
        if not base <= begin <= end <= size:
            raise ValueError(f"tensor {name!r} lies outside the file")
        h.update(_read_exact(fd, min(_SAMPLE, end - begin), begin))
        h.update(_read_exact(fd, min(_SAMPLE, end - begin), max(begin, end - _SAMPLE)))


def _file_identity(path: str, h: "hashlib._Hash") -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        h.update(f"{os.path.basename(path)}\0{size}\0".encode())
        if path.endswith(".safetensors"):
            try:
                _safetensors_identity(fd, size, h)
            except (ValueError, json.JSONDecodeError) as e:
                h.update(f"unparsed:{e}".encode())
        for k in range(_CHUNKS):
            off = (size - _CHUNK) * k // max(1, _CHUNKS - 1) if size > _CHUNK else 0
            h.update(_read_exact(fd, _CHUNK, max(0, off)))
    finally:
        os.close(fd)


def _weight_files(model_dir: str) -> List[str]:
    out = []
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(_WEIGHT_SUFFIXES):
                out.append(os.path.join(root, f))
    return out


def _local_model_dir(model: str, revision: Optional[str]) -> Optional[str]:
    if os.path.isdir(model):
        return model
    try:  # a hub id: the local snapshot, when vLLM downloaded one
        from huggingface_hub import snapshot_download

        return str(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:
        return None


def weights_fingerprint(model: str, *, revision: Optional[str], config: Dict[str, Any],
                        dtype: str, quantization: Optional[str], kv_cache_dtype: str,
                        weights_id: str = "") -> str:
    """A short hex digest naming the weights and everything else that shapes the KV, for the
    key namespace. `weights_id`, when set, stands for the weight files (the user says which
    weights these are; no file is read)."""
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    h.update(f"\0dtype={dtype}\0quant={quantization}\0kv={kv_cache_dtype}\0".encode())
    if weights_id:
        h.update(f"weights_id={weights_id}".encode())
        return h.hexdigest()[:16]
    local = _local_model_dir(model, revision)
    files = _weight_files(local) if local else []
    if not files:
        # Nothing local to read (a remote loader, say): the name and revision are all there is.
        h.update(f"model={model}\0revision={revision}".encode())
    for path in files:
        _file_identity(path, h)
    return h.hexdigest()[:16]


def model_fingerprint(vllm_config: Any, weights_id: str = "") -> str:
    """weights_fingerprint() of vLLM's model configuration."""
    mc = vllm_config.model_config
    try:
        config = mc.hf_config.to_dict()
    except Exception:
        config = {"repr": repr(mc.hf_config)}
    return weights_fingerprint(
        str(mc.model), revision=getattr(mc, "revision", None), config=config,
        dtype=str(mc.dtype), quantization=str(getattr(mc, "quantization", None)),
        kv_cache_dtype=str(vllm_config.cache_config.cache_dtype), weights_id=weights_id)


def iter_weight_files(model_dir: str) -> Iterable[str]:
    """The files weights_fingerprint() reads (for tests and `kvtier` diagnostics)."""
    return iter(_weight_files(model_dir))
