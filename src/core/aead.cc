#include "core/aead.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace kvtier {

namespace {

// The cipher and the KDF, fetched once: OpenSSL 3 would look them up again on every
// EVP_aes_256_gcm() init (an implicit fetch).
EVP_CIPHER* Gcm() {
  static EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return cipher;
}

EVP_KDF* Hkdf() {
  static EVP_KDF* const kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  return kdf;
}

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

Status OpenSslError(const char* what) {
  const unsigned long e = ERR_get_error();
  char buf[256] = "no OpenSSL error queued";
  if (e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return Status::Internal(std::string(what) + ": " + buf);
}

// EVP's lengths are ints: feeds `data` in pieces of at most 1 GiB.
constexpr size_t kPiece = size_t{1} << 30;

Ctx Start(const AeadKey& key, const AeadNonce& nonce, bool encrypt) {
  Ctx ctx(EVP_CIPHER_CTX_new());
  if (!ctx || Gcm() == nullptr) return nullptr;
  // The default GCM IV length is 12 bytes, ours.
  const int ok = encrypt ? EVP_EncryptInit_ex2(ctx.get(), Gcm(), key.data(), nonce.data(), nullptr)
                         : EVP_DecryptInit_ex2(ctx.get(), Gcm(), key.data(), nonce.data(), nullptr);
  return ok == 1 ? std::move(ctx) : nullptr;
}

bool Feed(EVP_CIPHER_CTX* ctx, bool encrypt, std::span<const uint8_t> aad,
          std::span<uint8_t> data) {
  int out = 0;
  for (size_t at = 0; at < aad.size(); at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, aad.size() - at));
    if ((encrypt ? EVP_EncryptUpdate(ctx, nullptr, &out, aad.data() + at, n)
                 : EVP_DecryptUpdate(ctx, nullptr, &out, aad.data() + at, n)) != 1) {
      return false;
    }
  }
  for (size_t at = 0; at < data.size(); at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, data.size() - at));
    uint8_t* p = data.data() + at;
    if ((encrypt ? EVP_EncryptUpdate(ctx, p, &out, p, n) : EVP_DecryptUpdate(ctx, p, &out, p, n)) !=
            1 ||
        out != n) {
      return false;
    }
  }
  return true;
}

}  // namespace

Status AeadSeal(const AeadKey& key, const AeadNonce& nonce, std::span<const uint8_t> aad,
                std::span<uint8_t> data, AeadTag* tag) {
  Ctx ctx = Start(key, nonce, /*encrypt=*/true);
  if (!ctx) return OpenSslError("AES-256-GCM: cannot start encryption");
  int out = 0;
  if (!Feed(ctx.get(), true, aad, data) || EVP_EncryptFinal_ex(ctx.get(), nullptr, &out) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag->size()),
                          tag->data()) != 1) {
    return OpenSslError("AES-256-GCM: encryption failed");
  }
  return Status::Ok();
}

Status AeadOpen(const AeadKey& key, const AeadNonce& nonce, std::span<const uint8_t> aad,
                std::span<uint8_t> data, const AeadTag& tag) {
  Ctx ctx = Start(key, nonce, /*encrypt=*/false);
  if (!ctx) return OpenSslError("AES-256-GCM: cannot start decryption");
  AeadTag expected = tag;
  int out = 0;
  const bool fed = Feed(ctx.get(), false, aad, data);
  const bool authentic =
      fed &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(expected.size()),
                          expected.data()) == 1 &&
      EVP_DecryptFinal_ex(ctx.get(), nullptr, &out) == 1;
  if (!authentic) {
    ERR_clear_error();
    OPENSSL_cleanse(data.data(), data.size());
    return Status::Corruption(
        "AES-256-GCM: the tag does not match (a wrong key, or changed bytes)");
  }
  return Status::Ok();
}

AeadKey HkdfSha256(std::span<const uint8_t> key_material, std::span<const uint8_t> salt,
                   std::span<const uint8_t> info) {
  AeadKey out{};
  EVP_KDF_CTX* ctx = Hkdf() != nullptr ? EVP_KDF_CTX_new(Hkdf()) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(
          OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(key_material.data()), key_material.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<uint8_t*>(salt.data()),
                                        salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<uint8_t*>(info.data()),
                                        info.size()),
      OSSL_PARAM_construct_end()};
  const bool ok = ctx != nullptr && EVP_KDF_derive(ctx, out.data(), out.size(), params) == 1;
  EVP_KDF_CTX_free(ctx);
  // HKDF-SHA256 with a 32-byte output cannot fail for any input; a broken OpenSSL would be
  // no place to go on from (a key of zeros would seal with a known key).
  if (!ok) {
    const Status s = OpenSslError("HKDF-SHA256");
    std::fprintf(stderr, "kvtier: fatal: %s\n", s.ToString().c_str());
    std::abort();
  }
  return out;
}

Status RandomBytes(std::span<uint8_t> out) {
  for (size_t at = 0; at < out.size(); at += kPiece) {
    const int n = static_cast<int>(std::min(kPiece, out.size() - at));
    if (RAND_bytes(out.data() + at, n) != 1) return OpenSslError("the CSPRNG (RAND_bytes)");
  }
  return Status::Ok();
}

}  // namespace kvtier
