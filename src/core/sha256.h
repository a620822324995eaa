// SHA-256 through OpenSSL's one-shot digest (the low-level interface: it runs the SHA-NI or
// AVX2 code directly, about 3x faster than the EVP interface for the 80-byte messages that
// block keys hash). Internal to kvtier.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

// Writes the 32-byte SHA-256 digest of data[0, len) to out.
void Sha256(const void* data, size_t len, uint8_t out[32]);

}  // namespace kvtier
