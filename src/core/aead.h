// Authenticated encryption for KV at rest (issue 43): AES-256-GCM through OpenSSL's EVP
// interface (AES-NI and CLMUL where the CPU has them), HKDF-SHA256 (RFC 5869) to derive keys,
// and OpenSSL's CSPRNG for nonces. Internal to kvtier; the tiers use it through their at-rest
// format (docs/encryption.md).
//
// GCM's one rule: a (key, nonce) pair seals one message only. A repeat reveals the XOR of the
// two plaintexts and lets anyone forge tags under that key. Callers own that rule (the nonce
// scheme is in docs/encryption.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvtier/status.h"

namespace kvtier {

inline constexpr size_t kAeadKeyBytes = 32;
inline constexpr size_t kAeadNonceBytes = 12;
inline constexpr size_t kAeadTagBytes = 16;
using AeadKey = std::array<uint8_t, kAeadKeyBytes>;
using AeadNonce = std::array<uint8_t, kAeadNonceBytes>;
using AeadTag = std::array<uint8_t, kAeadTagBytes>;

// Encrypts `data` in place with AES-256-GCM under `key` and `nonce`, authenticating `aad` (not
// encrypted) with it, and writes the tag. Any length, 0 included. REQUIRES: this (key, nonce)
// has sealed no other message. Internal only when OpenSSL fails (it does not for valid input).
Status AeadSeal(const AeadKey& key, const AeadNonce& nonce, std::span<const uint8_t> aad,
                std::span<uint8_t> data, AeadTag* tag);

// Decrypts `data` in place and checks `tag` over it and `aad`. Corruption when the tag does
// not match: a wrong key or nonce, or any changed byte of the ciphertext, the aad or the tag.
// `data` is then overwritten with zeros, so unauthenticated plaintext is never left readable.
Status AeadOpen(const AeadKey& key, const AeadNonce& nonce, std::span<const uint8_t> aad,
                std::span<uint8_t> data, const AeadTag& tag);

// HKDF-SHA256 (RFC 5869, extract then expand) of `key_material` with `salt` and `info`: the
// first 32 bytes of its output.
AeadKey HkdfSha256(std::span<const uint8_t> key_material, std::span<const uint8_t> salt,
                   std::span<const uint8_t> info);

// Fills `out` from OpenSSL's CSPRNG. Internal when it cannot (not seeded).
Status RandomBytes(std::span<uint8_t> out);

}  // namespace kvtier
