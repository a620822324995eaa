#include "core/master_key.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/unique_fd.h"

namespace kvtier {

namespace {

constexpr std::string_view kSalt = "kvtier at-rest v1";
constexpr std::string_view kWhatToDo =
    "; give 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`) in a file of this uid "
    "with mode 0600";

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

MasterKey::MasterKey(const AeadKey& key, std::string source)
    : key_(key), source_(std::move(source)) {
  constexpr std::string_view kIdLabel = "kvtier master key id";
  const AeadKey id_bytes = HkdfSha256(key_, Bytes(kSalt), Bytes(kIdLabel));
  std::memcpy(&id_, id_bytes.data(), sizeof(id_));
}

MasterKey::~MasterKey() { OPENSSL_cleanse(key_.data(), key_.size()); }

Result<MasterKey> MasterKey::FromBytes(std::span<const uint8_t> bytes, const std::string& source) {
  if (bytes.size() != kAeadKeyBytes) {
    return Status::InvalidArgument("at-rest master key from " + source + ": " +
                                   std::to_string(bytes.size()) + " bytes, not 32");
  }
  AeadKey key;
  std::memcpy(key.data(), bytes.data(), key.size());
  MasterKey m(key, source);
  OPENSSL_cleanse(key.data(), key.size());
  return m;
}

Result<MasterKey> MasterKey::FromHex(std::string_view hex, const std::string& source) {
  while (!hex.empty() && std::isspace(static_cast<unsigned char>(hex.front())))
    hex.remove_prefix(1);
  while (!hex.empty() && std::isspace(static_cast<unsigned char>(hex.back()))) hex.remove_suffix(1);
  if (hex.size() != 2 * kAeadKeyBytes) {
    return Status::InvalidArgument("at-rest master key from " + source + ": " +
                                   std::to_string(hex.size()) + " characters, not 64 hex digits" +
                                   std::string(kWhatToDo));
  }
  AeadKey key;
  for (size_t i = 0; i < key.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      OPENSSL_cleanse(key.data(), key.size());
      return Status::InvalidArgument("at-rest master key from " + source + ": not hex digits only" +
                                     std::string(kWhatToDo));
    }
    key[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  auto m = FromBytes(key, source);
  OPENSSL_cleanse(key.data(), key.size());
  return m;
}

Result<MasterKey> MasterKey::FromFile(const std::string& path) {
  const std::string where = "at-rest master key file " + path;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd) {
    if (errno == ELOOP) {
      return Status::InvalidArgument(where + ": a symlink; name the file itself" +
                                     std::string(kWhatToDo));
    }
    return Status::InvalidArgument(where + ": " + std::strerror(errno) + std::string(kWhatToDo));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(where + ": not a regular file" + std::string(kWhatToDo));
  }
  if (st.st_uid != ::geteuid()) {
    return Status::InvalidArgument(where + ": owned by uid " + std::to_string(st.st_uid) +
                                   ", not this process's (" + std::to_string(::geteuid()) +
                                   "); another user could have replaced it");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::InvalidArgument(where + ": mode " + mode +
                                   " lets group or others read or write it; chmod 600 " + path);
  }
  if (st.st_size > 4096) {
    return Status::InvalidArgument(where + ": " + std::to_string(st.st_size) +
                                   " bytes, too long for 64 hex digits" + std::string(kWhatToDo));
  }
  char buf[4097];
  ssize_t n = 0;
  for (ssize_t got; n < static_cast<ssize_t>(sizeof(buf) - 1); n += got) {
    got = ::read(fd.get(), buf + n, sizeof(buf) - 1 - n);
    if (got < 0 && errno == EINTR) {
      got = 0;
      continue;
    }
    if (got < 0) return Status::IOError(where + ": read: " + std::strerror(errno));
    if (got == 0) break;
  }
  auto m = FromHex(std::string_view(buf, static_cast<size_t>(n)), path);
  OPENSSL_cleanse(buf, sizeof(buf));
  return m;
}

AeadKey MasterKey::TenantKey(uint64_t tenant) const {
  uint8_t info[8 + 7] = {'t', 'e', 'n', 'a', 'n', 't', ':'};
  for (int i = 0; i < 8; ++i) info[7 + i] = static_cast<uint8_t>(tenant >> (8 * i));
  return HkdfSha256(key_, Bytes(kSalt), info);
}

}  // namespace kvtier
