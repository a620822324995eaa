#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "engine/gguf.h"
#include "engine_test_util.h"

namespace kvtier::engine {
namespace {

using testing::GgufWriter;
using testing::TempDir;

std::vector<uint8_t> U16(uint16_t v) {
  return {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8)};
}

Result<std::unique_ptr<GgufFile>> OpenBytes(const TempDir& dir, const std::vector<uint8_t>& b) {
  const std::string path = dir.File("t.gguf");
  EXPECT_TRUE(GgufWriter::WriteFile(path, b));
  return GgufFile::Open(path);
}

// A small valid file exercising every value type, an array of strings, a nested array and two
// tensors.
GgufWriter SampleWriter() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddU32("llama.block_count", 2);
  w.AddI32("neg", -5);
  w.AddU64("big", uint64_t{1} << 40);
  w.AddF32("eps", 1e-5f);
  w.AddBool("flag", true);
  w.AddRaw("u8", 0, {7});
  w.AddRaw("i8", 1, {0xfe});
  w.AddRaw("u16", 2, U16(60000));
  w.AddRaw("i16", 3, U16(0xfffd));
  std::vector<uint8_t> f64;
  GgufWriter::Put<double>(f64, 0.25);
  w.AddRaw("f64", 12, f64);
  std::vector<uint8_t> i64;
  GgufWriter::Put<int64_t>(i64, -7);
  w.AddRaw("i64", 11, i64);
  w.AddStringArray("tokens", {"a", "", "hello"});
  w.AddI32Array("types", {1, 3, -2});
  // array of 2 arrays of uint8
  std::vector<uint8_t> nested;
  GgufWriter::Put<uint32_t>(nested, 9);
  GgufWriter::Put<uint64_t>(nested, 2);
  for (int k = 0; k < 2; ++k) {
    GgufWriter::Put<uint32_t>(nested, 0);
    GgufWriter::Put<uint64_t>(nested, 1);
    nested.push_back(static_cast<uint8_t>(k + 1));
  }
  w.AddRaw("nested", 9, nested);
  w.AddF32Tensor("a", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  w.AddTensor("h", {3}, 1, {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00});  // 1, -2, 2^-24
  return w;
}

TEST(GgufTest, ParsesHeaderMetadataAndTensors) {
  TempDir dir;
  for (uint32_t version : {2u, 3u}) {
    auto bytes = SampleWriter().Bytes();
    bytes[4] = static_cast<uint8_t>(version);
    auto f = OpenBytes(dir, bytes);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const GgufFile& g = **f;
    EXPECT_EQ(g.version(), version);
    EXPECT_EQ(g.alignment(), 32u);
    EXPECT_EQ(g.data_offset() % 32, 0u);
    EXPECT_EQ(*g.GetString("general.architecture"), "llama");
    EXPECT_EQ(*g.GetUint32("llama.block_count"), 2u);
    EXPECT_EQ(g.Find("neg")->i, -5);
    EXPECT_EQ(g.Find("big")->u, uint64_t{1} << 40);
    EXPECT_FLOAT_EQ(*g.GetFloat32("eps"), 1e-5f);
    EXPECT_TRUE(*g.GetBool("flag"));
    EXPECT_EQ(*g.GetUint32("u8"), 7u);
    EXPECT_EQ(g.Find("i8")->i, -2);
    EXPECT_EQ(*g.GetUint32("u16"), 60000u);
    EXPECT_EQ(g.Find("i16")->i, -3);
    EXPECT_DOUBLE_EQ(*g.GetFloat32("f64"), 0.25);
    EXPECT_EQ(g.Find("i64")->i, -7);
    EXPECT_EQ(*g.GetStringArray("tokens"), (std::vector<std::string>{"a", "", "hello"}));
    EXPECT_EQ(*g.GetIntArray("types"), (std::vector<int64_t>{1, 3, -2}));
    const GgufValue* n = g.Find("nested");
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->array.size(), 2u);
    EXPECT_EQ(n->array[1].array[0].u, 2u);

    ASSERT_EQ(g.tensors().size(), 2u);
    const GgufTensorInfo* a = g.FindTensor("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->ne, (std::vector<uint64_t>{4, 2}));
    EXPECT_EQ(a->num_elements, 8u);
    EXPECT_EQ(a->num_bytes, 32u);
    auto av = GgufFile::Dequantize(*a);
    ASSERT_TRUE(av.ok());
    EXPECT_EQ(*av, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
    auto hv = GgufFile::Dequantize(*g.FindTensor("h"));
    ASSERT_TRUE(hv.ok());
    EXPECT_EQ(*hv, (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24)}));
    EXPECT_EQ(g.FindTensor("missing"), nullptr);
  }
}

TEST(GgufTest, TypedGettersReportMissingAndMistypedKeys) {
  TempDir dir;
  auto f = OpenBytes(dir, SampleWriter().Bytes());
  ASSERT_TRUE(f.ok());
  const GgufFile& g = **f;
  EXPECT_TRUE(g.GetUint32("nope").status().Is(StatusCode::kNotFound));
  EXPECT_TRUE(g.GetFloat32("nope").status().Is(StatusCode::kNotFound));
  EXPECT_TRUE(g.GetString("nope").status().Is(StatusCode::kNotFound));
  EXPECT_TRUE(g.GetBool("nope").status().Is(StatusCode::kNotFound));
  EXPECT_TRUE(g.GetStringArray("nope").status().Is(StatusCode::kNotFound));
  EXPECT_TRUE(g.GetIntArray("nope").status().Is(StatusCode::kNotFound));
  EXPECT_TRUE(g.GetUint32("general.architecture").status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(g.GetUint32("neg").status().Is(StatusCode::kInvalidArgument));  // < 0
  EXPECT_TRUE(g.GetUint32("big").status().Is(StatusCode::kInvalidArgument));  // > 2^32
  EXPECT_TRUE(g.GetFloat32("flag").status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(g.GetBool("eps").status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(g.GetString("eps").status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(g.GetStringArray("types").status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(g.GetIntArray("tokens").status().Is(StatusCode::kInvalidArgument));
  EXPECT_TRUE(g.GetIntArray("eps").status().Is(StatusCode::kInvalidArgument));
}

TEST(GgufTest, HalfConversions) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(HalfToFloat(0xfc00)) && HalfToFloat(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(Bf16ToFloat(0x3fc0), 1.5f);
  // FloatToHalf rounds to nearest even and round-trips every finite half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
}

TEST(GgufTest, DequantizesQ8_0Q4_0Q4_1AgainstHandComputedValues) {
  // Q8_0: d = 0.5, q[j] = j - 16.
  std::vector<uint8_t> q8 = U16(0x3800);
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  // Q4_0: d = 2, qs[j] = 0x9f for j = 0 and (j | (15 - j) << 4) otherwise.
  std::vector<uint8_t> q40 = U16(0x4000);
  for (int j = 0; j < 16; ++j)
    q40.push_back(j == 0 ? 0x9f : static_cast<uint8_t>(j | (15 - j) << 4));
  // Q4_1: d = 0.25, m = -1, same nibbles.
  std::vector<uint8_t> q41 = U16(0x3400);
  auto m = U16(0xbc00);
  q41.insert(q41.end(), m.begin(), m.end());
  q41.insert(q41.end(), q40.begin() + 2, q40.end());

  GgufWriter w;
  w.AddTensor("q8", {32}, 8, q8);
  w.AddTensor("q40", {32}, 2, q40);
  w.AddTensor("q41", {32}, 3, q41);
  TempDir dir;
  auto f = OpenBytes(dir, w.Bytes());
  ASSERT_TRUE(f.ok()) << f.status().ToString();

  auto v8 = *GgufFile::Dequantize(*(*f)->FindTensor("q8"));
  EXPECT_EQ(v8[0], -8.0f);
  EXPECT_EQ(v8[16], 0.0f);
  EXPECT_EQ(v8[31], 7.5f);

  auto v40 = *GgufFile::Dequantize(*(*f)->FindTensor("q40"));
  EXPECT_EQ(v40[0], 14.0f);   // low nibble 15: 2 * (15 - 8)
  EXPECT_EQ(v40[16], 2.0f);   // high nibble 9: 2 * (9 - 8)
  EXPECT_EQ(v40[1], -14.0f);  // low 1
  EXPECT_EQ(v40[17], 12.0f);  // high 14
  EXPECT_EQ(v40[8], 0.0f);    // low 8
  EXPECT_EQ(v40[24], -2.0f);  // high 7

  auto v41 = *GgufFile::Dequantize(*(*f)->FindTensor("q41"));
  EXPECT_EQ(v41[0], 2.75f);   // 0.25 * 15 - 1
  EXPECT_EQ(v41[16], 1.25f);  // 0.25 * 9 - 1
  EXPECT_EQ(v41[1], -0.75f);  // 0.25 * 1 - 1
  EXPECT_EQ(v41[17], 2.5f);   // 0.25 * 14 - 1
  EXPECT_EQ(v41[15], 2.75f);  // low 15
  EXPECT_EQ(v41[31], -1.0f);  // high 0
}

TEST(GgufTest, UnsupportedTypeFailsDequantizeWithClearMessage) {
  GgufWriter w;
  w.AddTensor("k", {256}, 14, std::vector<uint8_t>(210, 0));  // Q6_K: parses, no dequant
  TempDir dir;
  auto f = OpenBytes(dir, w.Bytes());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto d = GgufFile::Dequantize(*(*f)->FindTensor("k"));
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.status().Is(StatusCode::kInvalidArgument));
  EXPECT_NE(d.status().message().find("Q6_K"), std::string::npos) << d.status().ToString();
}

TEST(GgufTest, CustomAlignment) {
  GgufWriter w(3, 64);
  w.AddU32("general.alignment", 64);
  w.AddF32Tensor("x", {3}, {1, 2, 3});
  w.AddF32Tensor("y", {1}, {9});
  TempDir dir;
  auto f = OpenBytes(dir, w.Bytes());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->FindTensor("y")->offset, 64u);
  EXPECT_EQ((*GgufFile::Dequantize(*(*f)->FindTensor("y")))[0], 9.0f);
}

void ExpectCorrupt(const std::vector<uint8_t>& bytes, const std::string& needle) {
  TempDir dir;
  auto f = OpenBytes(dir, bytes);
  ASSERT_FALSE(f.ok()) << "expected failure mentioning '" << needle << "'";
  EXPECT_TRUE(f.status().Is(StatusCode::kCorruption)) << f.status().ToString();
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().ToString();
}

// Offsets inside a header built by GgufWriter: magic 0, version 4, n_tensors 8, n_kv 16.
void PatchU64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); }
void PatchU32(std::vector<uint8_t>& b, size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); }

TEST(GgufTest, RejectsBadMagicVersionAndAbsurdCounts) {
  auto good = SampleWriter().Bytes();
  auto b = good;
  b[0] = 'X';
  ExpectCorrupt(b, "bad magic");
  b = good;
  PatchU32(b, 4, 1);
  ExpectCorrupt(b, "unsupported GGUF version 1");
  b = good;
  PatchU32(b, 4, 4);
  ExpectCorrupt(b, "unsupported GGUF version 4");
  b = good;
  PatchU64(b, 8, uint64_t{1} << 60);
  ExpectCorrupt(b, "tensor count");
  b = good;
  PatchU64(b, 16, ~uint64_t{0});
  ExpectCorrupt(b, "metadata count");
  ExpectCorrupt({'G', 'G'}, "truncated");
}

TEST(GgufTest, RejectsAbsurdStringAndArrayLengths) {
  {
    GgufWriter w;
    std::vector<uint8_t> v;
    GgufWriter::Put<uint64_t>(v, uint64_t{1} << 62);  // string length
    w.AddRaw("s", 8, v);
    ExpectCorrupt(w.Bytes(), "claims");
  }
  {
    GgufWriter w;
    std::vector<uint8_t> v;
    GgufWriter::Put<uint32_t>(v, 4);
    GgufWriter::Put<uint64_t>(v, uint64_t{1} << 61);  // array count
    w.AddRaw("a", 9, v);
    ExpectCorrupt(w.Bytes(), "elements");
  }
  {
    GgufWriter w;
    std::vector<uint8_t> v;
    GgufWriter::Put<uint32_t>(v, 77);  // element type
    GgufWriter::Put<uint64_t>(v, 1);
    w.AddRaw("a", 9, v);
    ExpectCorrupt(w.Bytes(), "unknown element type 77");
  }
  {
    // Arrays nested five deep.
    std::vector<uint8_t> v;
    for (int k = 0; k < 5; ++k) {
      GgufWriter::Put<uint32_t>(v, 9);
      GgufWriter::Put<uint64_t>(v, 1);
    }
    GgufWriter::Put<uint32_t>(v, 0);
    GgufWriter::Put<uint64_t>(v, 0);
    GgufWriter w;
    w.AddRaw("deep", 9, std::vector<uint8_t>(v.begin() + 12, v.end()));
    ExpectCorrupt(w.Bytes(), "nest deeper");
  }
  {
    GgufWriter w;
    w.AddRaw("t", 13, {});
    ExpectCorrupt(w.Bytes(), "unknown value type 13");
  }
  {
    GgufWriter w;
    w.AddRaw("b", 7, {2});
    ExpectCorrupt(w.Bytes(), "not 0 or 1");
  }
  {
    GgufWriter w;
    w.AddU32("k", 1);
    w.AddU32("k", 2);
    ExpectCorrupt(w.Bytes(), "appears twice");
  }
}

TEST(GgufTest, RejectsBadTensorInfos) {
  {
    GgufWriter w;
    w.AddTensor("t", {}, 0, {});
    ExpectCorrupt(w.Bytes(), "0 dimensions");
  }
  {
    GgufWriter w;
    w.AddTensor("t", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4));
    ExpectCorrupt(w.Bytes(), "5 dimensions");
  }
  {
    GgufWriter w;
    w.AddTensor("t", {0}, 0, {});
    ExpectCorrupt(w.Bytes(), "absurd dimension");
  }
  {
    GgufWriter w;
    w.AddTensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, std::vector<uint8_t>(4));
    ExpectCorrupt(w.Bytes(), "absurd dimension");
  }
  {
    GgufWriter w;
    w.AddTensor("t", {1}, 99, std::vector<uint8_t>(4));
    ExpectCorrupt(w.Bytes(), "unknown ggml type 99");
  }
  {
    GgufWriter w;
    w.AddTensor("t", {16}, 8, std::vector<uint8_t>(34));
    ExpectCorrupt(w.Bytes(), "not a multiple of the Q8_0 block size 32");
  }
  {
    GgufWriter w;
    w.AddF32Tensor("t", {1}, {1});
    w.AddF32Tensor("t", {1}, {1});
    ExpectCorrupt(w.Bytes(), "appears twice");
  }
  {
    // Tensor larger than the data section.
    GgufWriter w;
    w.AddTensor("t", {1024}, 0, std::vector<uint8_t>(16));
    ExpectCorrupt(w.Bytes(), "past the end");
  }
  {
    GgufWriter w;
    w.AddU32("general.alignment", 24);
    ExpectCorrupt(w.Bytes(), "power of two");
  }
  {
    GgufWriter w;
    w.AddString("general.alignment", "32");
    ExpectCorrupt(w.Bytes(), "power of two");
  }
}

TEST(GgufTest, RejectsMisalignedAndOutOfRangeOffsets) {
  GgufWriter w;
  w.AddF32Tensor("t", {2}, {1, 2});
  auto good = w.Bytes();
  // The tensor's offset is the last 8 bytes of the header (before padding): find it.
  // Header: 24 bytes, then name (8 + 1), n_dims 4, ne 8, type 4, offset 8.
  const size_t offset_at = 24 + 9 + 4 + 8 + 4;
  auto b = good;
  PatchU64(b, offset_at, 4);
  ExpectCorrupt(b, "not a multiple of the alignment");
  b = good;
  PatchU64(b, offset_at, uint64_t{1} << 63);
  ExpectCorrupt(b, "past the end");
  b = good;
  PatchU64(b, offset_at, ~uint64_t{0} - 31);
  ExpectCorrupt(b, "past the end");
}

TEST(GgufTest, EveryTruncationIsACleanError) {
  auto good = SampleWriter().Bytes();
  TempDir dir;
  for (size_t len = 0; len < good.size(); ++len) {
    std::vector<uint8_t> b(good.begin(), good.begin() + len);
    auto f = OpenBytes(dir, b);
    ASSERT_FALSE(f.ok()) << "truncated to " << len << " bytes parsed";
    ASSERT_TRUE(f.status().Is(StatusCode::kCorruption)) << len << ": " << f.status().ToString();
  }
}

TEST(GgufTest, RandomByteCorruptionNeverCrashes) {
  auto good = SampleWriter().Bytes();
  TempDir dir;
  std::mt19937 rng(12345);
  int failures = 0;
  for (int iter = 0; iter < 400; ++iter) {
    auto b = good;
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    auto f = OpenBytes(dir, b);
    if (!f.ok()) {
      ++failures;
      continue;
    }
    for (const GgufTensorInfo& t : (*f)->tensors()) {
      auto d = GgufFile::Dequantize(t);  // must stay inside the mapping (ASan checks)
      (void)d;
    }
  }
  EXPECT_GT(failures, 0);
}

TEST(GgufTest, OpenReportsIoErrorsAndEmptyFiles) {
  TempDir dir;
  auto f = GgufFile::Open(dir.File("does-not-exist.gguf"));
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(f.status().Is(StatusCode::kIOError)) << f.status().ToString();
  ExpectCorrupt({}, "empty");
}

}  // namespace
}  // namespace kvtier::engine
