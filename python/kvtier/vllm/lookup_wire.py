"""The lookup channel's wire format (the channel itself: python/kvtier/vllm/lookup.py).

Fixed binary frames, little-endian, versioned. No pickle, no eval, no nesting: every field has
a fixed place or a length that is checked against its bound before it is used.

A frame is a u32 body length followed by the body. Every body starts with the same 8 bytes,

    magic b"KVTL" | version u16 (VERSION) | type u16

and the type fixes the rest (docs/vllm.md, "The lookup channel", has the table):

    HELLO    server -> client  nonce[32]
    AUTH     client -> server  mac[32] = HMAC-SHA256(secret, AUTH_CONTEXT || nonce)
    LOOKUP   client -> server  seq u64, num_computed u32, key_len u16, salt_len u16,
                               adapter_len u16, reserved u16 (0), num_tokens u32,
                               load_tiers_len u8, store_tiers_len u8, reserved u16 (0),
                               num_extras u32,
                               key, salt, adapter, load_tiers, store_tiers (UTF-8),
                               tokens (u32 each), then num_extras block extras, each a u8
                               length and that many bytes (RequestSpec::block_extra)
    REPLY    server -> client  seq u64, status u16, text_len u16, num_tokens u32,
                               blocks_by_tier 4 x u32, text (UTF-8; only when status is ERROR)
    REFUSED  server -> client  text_len u16, reserved u16 (0), text (UTF-8): why the server
                               is about to close the connection

Invariants a decoded message satisfies (anything else raises WireError, and nothing else is
ever raised by body_length, take_frame and decode, whatever the bytes): the body length is
within the limit the reader gave; the magic, version and type are known and the type is one
the reader expects; the body's length is exactly what its fixed part says it holds; every
string is valid UTF-8 within its bound; reserved fields are zero; an OK reply has no text and an
ERROR reply has zero counts.
"""

from __future__ import annotations

import array
import struct
import sys
from typing import Collection, List, Literal, NamedTuple, Optional, Sequence, Tuple, Union

MAGIC = b"KVTL"
VERSION = 1

HELLO = 1
AUTH = 2
LOOKUP = 3
REPLY = 4
REFUSED = 5
TYPE_NAMES = {HELLO: "HELLO", AUTH: "AUTH", LOOKUP: "LOOKUP", REPLY: "REPLY", REFUSED: "REFUSED"}

STATUS_OK = 0
STATUS_ERROR = 1

NONCE_BYTES = 32
MAC_BYTES = 32
AUTH_CONTEXT = b"kvtier-lookup-v1 client auth:"

MAX_KEY_BYTES = 1024
MAX_SALT_BYTES = 4096
MAX_ADAPTER_BYTES = 1024
MAX_TOKENS = 1 << 22  # 4 Mi tokens: a 16 MiB frame
MAX_TEXT_BYTES = 1024
MAX_TIERS_BYTES = 32  # "G2,G3,G4", "none" or ""
MAX_EXTRAS = 1 << 18  # per-block extras: one per block of a prompt of MAX_TOKENS at 16 a block
MAX_EXTRA_BYTES = 32  # each (kvtier's are 16-byte digests, or empty)
_U32_MAX = 0xFFFFFFFF

_PREFIX = struct.Struct("<I")
_HEADER = struct.Struct("<4sHH")
_HELLO = struct.Struct("<4sHH32s")
_AUTH = struct.Struct("<4sHH32s")
_LOOKUP = struct.Struct("<4sHHQIHHHHIBBHI")
_REPLY = struct.Struct("<4sHHQHHI4I")
_REFUSED = struct.Struct("<4sHHHH")

PREFIX_BYTES = _PREFIX.size
HELLO_BODY = _HELLO.size
AUTH_BODY = _AUTH.size
MAX_LOOKUP_BODY = (_LOOKUP.size + MAX_KEY_BYTES + MAX_SALT_BYTES + MAX_ADAPTER_BYTES
                   + 2 * MAX_TIERS_BYTES + 4 * MAX_TOKENS + MAX_EXTRAS * (1 + MAX_EXTRA_BYTES))
MAX_SERVER_BODY = max(_HELLO.size, _REPLY.size + MAX_TEXT_BYTES, _REFUSED.size + MAX_TEXT_BYTES)

# Tokens travel as an array of 4-byte unsigned ints; array's own typecode of that size, swapped
# on a big-endian host so that the wire stays little-endian.
_U32_CODE: Literal["I", "L"] = "I" if array.array("I").itemsize == 4 else "L"
assert array.array(_U32_CODE).itemsize == 4, "no 4-byte typecode in array"
_SWAP = sys.byteorder != "little"


class WireError(ValueError):
    """A frame that is not exactly a frame of this format, or a value that cannot be sent."""


class Hello(NamedTuple):
    nonce: bytes


class Auth(NamedTuple):
    mac: bytes


class Lookup(NamedTuple):
    seq: int
    key: str
    tokens: List[int]
    num_computed: int
    salt: str
    adapter: str
    extras: List[bytes] = []
    load_tiers: str = ""
    store_tiers: str = ""


class Reply(NamedTuple):
    seq: int
    ok: bool
    num_tokens: int
    blocks_by_tier: Tuple[int, int, int, int]
    error: str


class Refused(NamedTuple):
    reason: str


Message = Union[Hello, Auth, Lookup, Reply, Refused]
Buffer = Union[bytes, bytearray, memoryview]


# ---- encoding: each returns a whole frame (length prefix + body) -------------------------------

def _utf8(what: str, text: str, limit: int) -> bytes:
    if not isinstance(text, str):
        raise WireError(f"{what} must be a str, not {type(text).__name__}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise WireError(f"{what} is not encodable as UTF-8: {e}") from None
    if len(data) > limit:
        raise WireError(f"{what} is {len(data)} bytes of UTF-8, more than the {limit} allowed")
    return data


def _clipped_utf8(text: str) -> bytes:
    data = str(text).encode("utf-8", "replace")
    if len(data) > MAX_TEXT_BYTES:
        data = data[:MAX_TEXT_BYTES].decode("utf-8", "ignore").encode("utf-8")
    return data


def _u32(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U32_MAX:
        raise WireError(f"{what} must be an int in [0, 2^32), not {value!r}")
    return value


def _frame(*parts: bytes) -> bytes:
    n = sum(len(p) for p in parts)
    return b"".join((_PREFIX.pack(n),) + parts)


def encode_hello(nonce: bytes) -> bytes:
    if len(nonce) != NONCE_BYTES:
        raise WireError(f"a nonce is {NONCE_BYTES} bytes, not {len(nonce)}")
    return _frame(_HELLO.pack(MAGIC, VERSION, HELLO, nonce))


def encode_auth(mac: bytes) -> bytes:
    if len(mac) != MAC_BYTES:
        raise WireError(f"a MAC is {MAC_BYTES} bytes, not {len(mac)}")
    return _frame(_AUTH.pack(MAGIC, VERSION, AUTH, mac))


def encode_lookup(seq: int, key: str, tokens: Sequence[int], num_computed: int, salt: str,
                  adapter: str, extras: Sequence[bytes] = (), load_tiers: str = "",
                  store_tiers: str = "") -> bytes:
    """REQUIRES nothing: a value that does not fit the format raises WireError."""
    if not isinstance(seq, int) or not 0 <= seq < (1 << 64):
        raise WireError(f"seq must be a u64, not {seq!r}")
    k = _utf8("the request key", key, MAX_KEY_BYTES)
    s = _utf8("the cache salt", salt, MAX_SALT_BYTES)
    a = _utf8("the adapter name", adapter, MAX_ADAPTER_BYTES)
    lt = _utf8("load_tiers", load_tiers, MAX_TIERS_BYTES)
    st = _utf8("store_tiers", store_tiers, MAX_TIERS_BYTES)
    _u32("num_computed_tokens", num_computed)
    if len(extras) > MAX_EXTRAS:
        raise WireError(f"{len(extras)} block extras, more than the {MAX_EXTRAS} allowed")
    ex = []
    for e in extras:
        if not isinstance(e, (bytes, bytearray)) or len(e) > MAX_EXTRA_BYTES:
            raise WireError(f"a block extra must be at most {MAX_EXTRA_BYTES} bytes, not "
                            f"{e!r:.60}")
        ex.append(bytes((len(e),)) + bytes(e))
    if len(tokens) > MAX_TOKENS:
        raise WireError(f"{len(tokens)} tokens, more than the {MAX_TOKENS} allowed")
    try:
        toks = array.array(_U32_CODE, tokens)
    except (OverflowError, TypeError) as e:
        raise WireError(f"a token id is not a u32: {e}") from None
    if _SWAP:
        toks.byteswap()
    head = _LOOKUP.pack(MAGIC, VERSION, LOOKUP, seq, num_computed, len(k), len(s), len(a), 0,
                        len(toks), len(lt), len(st), 0, len(ex))
    return _frame(head, k, s, a, lt, st, toks.tobytes(), *ex)


def encode_reply_ok(seq: int, num_tokens: int, blocks_by_tier: Sequence[int]) -> bytes:
    """An OK reply. A count that is not a u32, or not 4 tiers, raises WireError."""
    blocks = tuple(blocks_by_tier)
    if len(blocks) != 4:
        raise WireError(f"blocks_by_tier has {len(blocks)} tiers, not 4")
    values = [_u32("num_tokens", num_tokens)] + [_u32("a tier's block count", b) for b in blocks]
    return _frame(_REPLY.pack(MAGIC, VERSION, REPLY, seq, STATUS_OK, 0, *values))


def encode_reply_error(seq: int, text: str) -> bytes:
    """An ERROR reply; `text` is cut to MAX_TEXT_BYTES (at a character boundary)."""
    data = _clipped_utf8(text)
    return _frame(_REPLY.pack(MAGIC, VERSION, REPLY, seq, STATUS_ERROR, len(data), 0, 0, 0, 0, 0),
                  data)


def encode_refused(text: str) -> bytes:
    data = _clipped_utf8(text)
    return _frame(_REFUSED.pack(MAGIC, VERSION, REFUSED, len(data), 0), data)


# ---- decoding ------------------------------------------------------------------------------------

def body_length(prefix: Buffer, limit: int) -> int:
    """The body length a 4-byte prefix announces. WireError if it is under a header or over
    `limit` (checked before any byte of the body is read or allocated)."""
    if len(prefix) != PREFIX_BYTES:
        raise WireError(f"a length prefix is {PREFIX_BYTES} bytes, not {len(prefix)}")
    n: int = _PREFIX.unpack(prefix)[0]
    if n < _HEADER.size:
        raise WireError(f"a frame of {n} bytes is shorter than the {_HEADER.size}-byte header")
    if n > limit:
        raise WireError(f"a frame of {n} bytes is longer than the {limit} allowed here")
    return n


def take_frame(buffer: bytearray, limit: int) -> Optional[bytes]:
    """Removes and returns the first whole frame's body from `buffer`; None while the frame is
    incomplete. WireError when the prefix announces a body outside [header, limit]."""
    if len(buffer) < PREFIX_BYTES:
        return None
    n = body_length(bytes(buffer[:PREFIX_BYTES]), limit)
    if len(buffer) < PREFIX_BYTES + n:
        return None
    body = bytes(buffer[PREFIX_BYTES:PREFIX_BYTES + n])
    del buffer[:PREFIX_BYTES + n]
    return body


def _text(body: Buffer, start: int, n: int, what: str) -> str:
    try:
        return bytes(body[start:start + n]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"{what} is not valid UTF-8: {e.reason} at byte {e.start}") from None


def _exact(name: str, body: Buffer, size: int) -> None:
    if len(body) != size:
        raise WireError(f"a {name} body is {size} bytes, not {len(body)}")


def decode(body: Buffer, expected: Collection[int]) -> Message:
    """The message in one frame body (without its length prefix), which must be of one of the
    `expected` types. Raises WireError, and nothing else, for any other bytes."""
    if len(body) < _HEADER.size:
        raise WireError(f"a frame of {len(body)} bytes is shorter than the header")
    magic, version, kind = _HEADER.unpack_from(body)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r} (not a kvtier lookup frame)")
    if version != VERSION:
        raise WireError(f"unsupported version {version} (this side speaks {VERSION})")
    if kind not in expected:
        want = ", ".join(TYPE_NAMES.get(t, str(t)) for t in sorted(expected))
        raise WireError(f"unexpected message type {TYPE_NAMES.get(kind, kind)} (expected {want})")
    if kind == HELLO:
        _exact("HELLO", body, _HELLO.size)
        return Hello(_HELLO.unpack_from(body)[3])
    if kind == AUTH:
        _exact("AUTH", body, _AUTH.size)
        return Auth(_AUTH.unpack_from(body)[3])
    if kind == LOOKUP:
        return _decode_lookup(body)
    if kind == REPLY:
        return _decode_reply(body)
    if kind == REFUSED:
        return _decode_refused(body)
    raise WireError(f"unknown message type {kind}")


def _decode_lookup(body: Buffer) -> Lookup:
    if len(body) < _LOOKUP.size:
        raise WireError(f"a LOOKUP body is at least {_LOOKUP.size} bytes, not {len(body)}")
    (_, _, _, seq, num_computed, key_len, salt_len, adapter_len, reserved, num_tokens,
     load_len, store_len, reserved2, num_extras) = _LOOKUP.unpack_from(body)
    if reserved != 0 or reserved2 != 0:
        raise WireError(f"a reserved field is {reserved or reserved2}, not 0")
    for what, n, limit in (("key", key_len, MAX_KEY_BYTES), ("salt", salt_len, MAX_SALT_BYTES),
                           ("adapter", adapter_len, MAX_ADAPTER_BYTES),
                           ("load_tiers", load_len, MAX_TIERS_BYTES),
                           ("store_tiers", store_len, MAX_TIERS_BYTES),
                           ("token count", num_tokens, MAX_TOKENS),
                           ("block extra count", num_extras, MAX_EXTRAS)):
        if n > limit:
            raise WireError(f"the {what} is {n}, more than the {limit} allowed")
    fixed = (_LOOKUP.size + key_len + salt_len + adapter_len + load_len + store_len
             + 4 * num_tokens)
    # Each extra takes at least its length byte and at most 1 + MAX_EXTRA_BYTES.
    if not fixed + num_extras <= len(body) <= fixed + num_extras * (1 + MAX_EXTRA_BYTES):
        raise WireError(f"a LOOKUP body of {len(body)} bytes does not hold its {num_tokens} "
                        f"tokens and {num_extras} block extras")
    off = _LOOKUP.size
    fields = []
    for n, what in ((key_len, "the key"), (salt_len, "the salt"), (adapter_len, "the adapter"),
                    (load_len, "load_tiers"), (store_len, "store_tiers")):
        fields.append(_text(body, off, n, what))
        off += n
    key, salt, adapter, load_tiers, store_tiers = fields
    raw = memoryview(body)[off:off + 4 * num_tokens]
    off += 4 * num_tokens
    if _SWAP:
        swapped = array.array(_U32_CODE, raw.tobytes())
        swapped.byteswap()
        tokens = swapped.tolist()
    else:
        tokens = raw.cast(_U32_CODE).tolist()  # no copy: half the time of array.frombytes
    extras: List[bytes] = []
    for _ in range(num_extras):
        if off >= len(body):
            raise WireError("a LOOKUP body ends inside its block extras")
        n = body[off]
        if n > MAX_EXTRA_BYTES or off + 1 + n > len(body):
            raise WireError(f"a block extra of {n} bytes does not fit (at most "
                            f"{MAX_EXTRA_BYTES}, within the body)")
        extras.append(bytes(body[off + 1:off + 1 + n]))
        off += 1 + n
    if off != len(body):
        raise WireError(f"a LOOKUP body has {len(body) - off} bytes past its block extras")
    return Lookup(seq, key, tokens, num_computed, salt, adapter, extras, load_tiers,
                  store_tiers)


def _decode_reply(body: Buffer) -> Reply:
    if len(body) < _REPLY.size:
        raise WireError(f"a REPLY body is at least {_REPLY.size} bytes, not {len(body)}")
    _, _, _, seq, status, text_len, num_tokens, b0, b1, b2, b3 = _REPLY.unpack_from(body)
    if status not in (STATUS_OK, STATUS_ERROR):
        raise WireError(f"unknown reply status {status}")
    if text_len > MAX_TEXT_BYTES:
        raise WireError(f"an error text of {text_len} bytes, more than the {MAX_TEXT_BYTES}")
    _exact("REPLY", body, _REPLY.size + text_len)
    if status == STATUS_OK:
        if text_len:
            raise WireError("an OK reply carries an error text")
        return Reply(seq, True, num_tokens, (b0, b1, b2, b3), "")
    if num_tokens or b0 or b1 or b2 or b3:
        raise WireError("an ERROR reply carries counts")
    return Reply(seq, False, 0, (0, 0, 0, 0), _text(body, _REPLY.size, text_len, "the error"))


def _decode_refused(body: Buffer) -> Refused:
    if len(body) < _REFUSED.size:
        raise WireError(f"a REFUSED body is at least {_REFUSED.size} bytes, not {len(body)}")
    _, _, _, text_len, reserved = _REFUSED.unpack_from(body)
    if reserved != 0:
        raise WireError(f"a reserved field is {reserved}, not 0")
    if text_len > MAX_TEXT_BYTES:
        raise WireError(f"a reason of {text_len} bytes, more than the {MAX_TEXT_BYTES}")
    _exact("REFUSED", body, _REFUSED.size + text_len)
    return Refused(_text(body, _REFUSED.size, text_len, "the reason"))
