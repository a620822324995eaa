"""Coverage-guided fuzzing of the lookup channel's decoder (python/kvtier/vllm/lookup_wire.py)
with atheris; not run by ctest (the seeded fuzz in test_vllm_lookup.py is). By hand:

    pip install atheris
    PYTHONPATH=build/python python3 tests/python/fuzz_lookup_wire.py -max_total_time=60

Any bytes, read as a stream of frames by either end, must decode or raise WireError, and
whatever decodes must re-encode to the same bytes.
"""

import sys

import atheris

with atheris.instrument_imports(include=["kvtier.vllm.lookup_wire"]):
    from kvtier.vllm import lookup_wire as wire

_ENDS = ((wire.MAX_LOOKUP_BODY, (wire.AUTH, wire.LOOKUP)),
         (wire.AUTH_BODY, (wire.AUTH,)),
         (wire.MAX_SERVER_BODY, (wire.HELLO, wire.REPLY, wire.REFUSED)))


def _reencode(msg: "wire.Message") -> bytes:
    if isinstance(msg, wire.Hello):
        return wire.encode_hello(msg.nonce)
    if isinstance(msg, wire.Auth):
        return wire.encode_auth(msg.mac)
    if isinstance(msg, wire.Lookup):
        return wire.encode_lookup(msg.seq, msg.key, msg.tokens, msg.num_computed, msg.salt,
                                  msg.adapter, msg.extras, msg.load_tiers, msg.store_tiers)
    if isinstance(msg, wire.Reply):
        return (wire.encode_reply_ok(msg.seq, msg.num_tokens, msg.blocks_by_tier) if msg.ok
                else wire.encode_reply_error(msg.seq, msg.error))
    return wire.encode_refused(msg.reason)


def test_one_input(data: bytes) -> None:
    for limit, types in _ENDS:
        buf = bytearray(data)
        try:
            while (body := wire.take_frame(buf, limit)) is not None:
                msg = wire.decode(body, types)
                assert _reencode(msg) == len(body).to_bytes(4, "little") + body, msg
        except wire.WireError:
            pass
    try:
        wire.decode(data, tuple(wire.TYPE_NAMES))
    except wire.WireError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
