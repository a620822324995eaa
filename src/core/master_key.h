// The master key of encryption at rest (issue 43), kept outside the stores: a file of this
// uid, mode 0600 or stricter, holding 64 hex digits (a trailing newline allowed); or the same
// 64 hex digits in an environment variable; or 32 bytes a KMS hook hands over (FromBytes).
// Each tenant's key is derived from it (HKDF-SHA256, its namespace id as the info), so one
// master key serves every tenant and no tenant's key opens another's blocks. The master key
// never reaches a store or a log; errors name where it came from, never its value.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/aead.h"
#include "kvtier/status.h"

namespace kvtier {

class MasterKey {
 public:
  // InvalidArgument naming the path and what is wrong, and what to do: not there, a symlink,
  // not a regular file, owned by another uid, readable or writable by group or others, or not
  // 64 hex digits.
  static Result<MasterKey> FromFile(const std::string& path);
  // `hex`: 64 hex digits (surrounding whitespace ignored). `source` names where they came
  // from in errors (for example "KVTIER_AT_REST_KEY").
  static Result<MasterKey> FromHex(std::string_view hex, const std::string& source);
  // The hook for a KMS: the 32 bytes it unwrapped. InvalidArgument for another length.
  static Result<MasterKey> FromBytes(std::span<const uint8_t> bytes, const std::string& source);

  MasterKey(const MasterKey&) = default;
  MasterKey& operator=(const MasterKey&) = default;
  ~MasterKey();  // the key bytes are wiped (OPENSSL_cleanse)

  // The key that seals tenant `tenant`'s blocks (its namespace id). The same master key and
  // tenant always give the same key; another tenant or another master key, an unrelated one.
  AeadKey TenantKey(uint64_t tenant) const;
  // A public name of this master key (64 bits of HKDF output under its own label): a block
  // names the key that sealed it, so a block under a rotated-out key is known as such without
  // trying it. Revealing it reveals nothing of the key.
  uint64_t id() const { return id_; }
  // Where it came from (the path, the variable's name, the KMS's).
  const std::string& source() const { return source_; }

 private:
  MasterKey(const AeadKey& key, std::string source);
  AeadKey key_;
  uint64_t id_ = 0;
  std::string source_;
};

}  // namespace kvtier
