// src/core/aead.h and master_key.h (issue 43, encryption at rest): AES-256-GCM and HKDF-SHA256
// against published vectors (the GCM paper's test case 16, RFC 5869 case 1; the same figures
// come from Python's `cryptography`), every kind of tampering refused with nothing readable
// left, and the master key's sources, each bad one refused with what is wrong.
#include "core/aead.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/master_key.h"

namespace kvtier {
namespace {

std::vector<uint8_t> Hex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(h.substr(i, 2), nullptr, 16)));
  }
  return out;
}

template <size_t N>
std::array<uint8_t, N> Arr(const std::string& h) {
  std::array<uint8_t, N> a{};
  const std::vector<uint8_t> v = Hex(h);
  EXPECT_EQ(v.size(), N);
  std::copy(v.begin(), v.end(), a.begin());
  return a;
}

// McGrew and Viega, "The Galois/Counter Mode of Operation", test case 16 (AES-256, 60 bytes of
// plaintext, 20 of associated data).
const AeadKey kKey = Arr<32>("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
const AeadNonce kNonce = Arr<12>("cafebabefacedbaddecaf888");
const std::vector<uint8_t> kPlain = Hex(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6"
    "b525b16aedf5aa0de657ba637b39");
const std::vector<uint8_t> kAad = Hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
const std::vector<uint8_t> kCipher = Hex(
    "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b105682"
    "8838c5f61e6393ba7a0abcc9f662");
const AeadTag kTag = Arr<16>("76fc6ece0f4e1768cddf8853bb2d551b");

TEST(AeadTest, SealGivesThePublishedCiphertextAndTagAndOpenGivesThePlaintextBack) {
  std::vector<uint8_t> data = kPlain;
  AeadTag tag{};
  ASSERT_TRUE(AeadSeal(kKey, kNonce, kAad, data, &tag).ok());
  EXPECT_EQ(data, kCipher);
  EXPECT_EQ(tag, kTag);
  ASSERT_TRUE(AeadOpen(kKey, kNonce, kAad, data, tag).ok());
  EXPECT_EQ(data, kPlain);
}

TEST(AeadTest, EveryKindOfTamperingIsCorruptionAndLeavesNothingReadable) {
  struct Case {
    const char* what;
    std::function<void(AeadKey&, AeadNonce&, std::vector<uint8_t>&, std::vector<uint8_t>&,
                       AeadTag&)>
        change;
  };
  const std::vector<Case> cases = {
      {"a ciphertext byte", [](auto&, auto&, auto&, auto& c, auto&) { c[17] ^= 0x01; }},
      {"the last ciphertext byte", [](auto&, auto&, auto&, auto& c, auto&) { c.back() ^= 0x80; }},
      {"an aad byte", [](auto&, auto&, auto& a, auto&, auto&) { a[0] ^= 0x01; }},
      {"a tag byte", [](auto&, auto&, auto&, auto&, auto& t) { t[15] ^= 0x01; }},
      {"the nonce", [](auto&, auto& n, auto&, auto&, auto&) { n[11] ^= 0x01; }},
      {"the key", [](auto& k, auto&, auto&, auto&, auto&) { k[0] ^= 0x01; }},
      {"a truncated ciphertext", [](auto&, auto&, auto&, auto& c, auto&) { c.pop_back(); }},
      {"an empty aad", [](auto&, auto&, auto& a, auto&, auto&) { a.clear(); }},
  };
  for (const Case& c : cases) {
    AeadKey key = kKey;
    AeadNonce nonce = kNonce;
    std::vector<uint8_t> aad = kAad, data = kCipher;
    AeadTag tag = kTag;
    c.change(key, nonce, aad, data, tag);
    const Status s = AeadOpen(key, nonce, aad, data, tag);
    EXPECT_TRUE(s.Is(StatusCode::kCorruption)) << c.what << ": " << s.ToString();
    EXPECT_EQ(data, std::vector<uint8_t>(data.size(), 0))
        << c.what << ": unauthenticated plaintext was left readable";
  }
}

TEST(AeadTest, EmptyMessagesAndLargeOnesRoundTrip) {
  std::vector<uint8_t> empty;
  AeadTag tag{};
  ASSERT_TRUE(AeadSeal(kKey, kNonce, kAad, empty, &tag).ok());
  EXPECT_TRUE(AeadOpen(kKey, kNonce, kAad, empty, tag).ok());
  AeadTag other = tag;
  other[0] ^= 1;
  EXPECT_TRUE(AeadOpen(kKey, kNonce, kAad, empty, other).Is(StatusCode::kCorruption))
      << "an empty message is authenticated too";

  std::vector<uint8_t> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::vector<uint8_t> original = big;
  ASSERT_TRUE(AeadSeal(kKey, kNonce, {}, big, &tag).ok());
  EXPECT_NE(big, original);
  ASSERT_TRUE(AeadOpen(kKey, kNonce, {}, big, tag).ok());
  EXPECT_EQ(big, original);
}

TEST(AeadTest, HkdfGivesRfc5869CaseOne) {
  const std::vector<uint8_t> ikm(22, 0x0b);
  const std::vector<uint8_t> salt = Hex("000102030405060708090a0b0c");
  const std::vector<uint8_t> info = Hex("f0f1f2f3f4f5f6f7f8f9");
  EXPECT_EQ(HkdfSha256(ikm, salt, info),
            Arr<32>("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"));
}

TEST(AeadTest, RandomBytesDiffer) {
  std::array<uint8_t, 16> a{}, b{};
  ASSERT_TRUE(RandomBytes(a).ok());
  ASSERT_TRUE(RandomBytes(b).ok());
  EXPECT_NE(a, b);
}

// ---- MasterKey ----

const std::string kMasterHex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

class MasterKeyFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvtier-master-key-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(MasterKeyFile, AGoodFileGivesTheSameKeysAsTheSameHex) {
  auto from_file = MasterKey::FromFile(Write("key", kMasterHex + "\n", 0600));
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  auto from_env = MasterKey::FromHex(kMasterHex, "KVTIER_AT_REST_KEY");
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(from_file->id(), from_env->id());
  EXPECT_EQ(from_file->TenantKey(7), from_env->TenantKey(7));
  EXPECT_TRUE(MasterKey::FromFile(Write("key400", kMasterHex, 0400)).ok()) << "0400 is stricter";
}

TEST_F(MasterKeyFile, EachBadFileIsRefusedSayingWhatIsWrong) {
  const std::string good = Write("good", kMasterHex, 0600);
  const std::string link = (dir_ / "link").string();
  ASSERT_EQ(::symlink(good.c_str(), link.c_str()), 0);
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string other = Write("other", kMasterHex, 0600);
  ASSERT_EQ(::chown(other.c_str(), 65534, 65534), 0) << "the tests run as root";
  struct Bad {
    std::string path, says;
  };
  const std::vector<Bad> bad = {
      {(dir_ / "missing").string(), "No such file"},
      {link, "a symlink"},
      {dir_.string(), "not a regular file"},
      {fifo, "not a regular file"},  // opened without blocking, never read
      {other, "owned by uid 65534"},
      {Write("group", kMasterHex, 0640), "mode 0640"},
      {Write("world", kMasterHex, 0604), "mode 0604"},
      {Write("short", kMasterHex.substr(2), 0600), "62 characters, not 64 hex digits"},
      {Write("nothex", "zz" + kMasterHex.substr(2), 0600), "not hex digits only"},
      {Write("empty", "", 0600), "0 characters"},
      {Write("long", std::string(5000, 'a'), 0600), "too long"},
  };
  for (const Bad& b : bad) {
    auto k = MasterKey::FromFile(b.path);
    ASSERT_FALSE(k.ok()) << b.path << " should be refused";
    EXPECT_TRUE(k.status().Is(StatusCode::kInvalidArgument)) << k.status().ToString();
    EXPECT_NE(k.status().message().find(b.says), std::string::npos)
        << "expected \"" << b.says << "\" in: " << k.status().message();
    EXPECT_EQ(k.status().message().find(kMasterHex.substr(8, 16)), std::string::npos)
        << "an error must never echo the key";
  }
}

TEST(MasterKeyTest, TenantKeysAreApartAcrossTenantsAndMasterKeys) {
  auto a = MasterKey::FromHex(kMasterHex, "a");
  std::string other_hex = kMasterHex;
  other_hex[63] = '0';
  auto b = MasterKey::FromHex(other_hex, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->TenantKey(1), a->TenantKey(1)) << "derivation is deterministic";
  EXPECT_NE(a->TenantKey(1), a->TenantKey(2)) << "one tenant's key must not be another's";
  for (const int shift : {8, 32, 56}) {
    EXPECT_NE(a->TenantKey(0), a->TenantKey(uint64_t{1} << shift))
        << "every byte of the tenant id counts (bit " << shift << ")";
  }
  EXPECT_NE(a->TenantKey(1), b->TenantKey(1)) << "another master key, other tenant keys";
  EXPECT_NE(a->id(), b->id());
  // A block sealed for tenant 1 does not open under tenant 2's key.
  std::vector<uint8_t> data = kPlain;
  AeadTag tag{};
  ASSERT_TRUE(AeadSeal(a->TenantKey(1), kNonce, {}, data, &tag).ok());
  EXPECT_TRUE(AeadOpen(a->TenantKey(2), kNonce, {}, data, tag).Is(StatusCode::kCorruption));
}

TEST(MasterKeyTest, KmsBytesOfAnotherLengthAreRefused) {
  std::vector<uint8_t> bytes(31, 1);
  EXPECT_TRUE(MasterKey::FromBytes(bytes, "kms").status().Is(StatusCode::kInvalidArgument));
  bytes.push_back(1);
  EXPECT_TRUE(MasterKey::FromBytes(bytes, "kms").ok());
}

}  // namespace
}  // namespace kvtier
