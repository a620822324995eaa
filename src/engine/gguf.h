// GgufFile: a read-only view of a GGUF (version 2 or 3) model file, memory-mapped.
//
// Layout of a GGUF file (all integers little-endian):
//   magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x (string key | u32 value type | value)
//   tensor_count x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset)
//   padding to `general.alignment` (default 32) | tensor data
// A string is a u64 byte length followed by the bytes (no terminator); an array is a u32 element
// type, a u64 count and the elements. ne[0] is the innermost (contiguous) dimension, so a
// weight matrix with ne = [in, out] is stored row-major as out rows of in elements.
//
// Invariant: after Open succeeds, every tensor's bytes lie inside the mapping, every string and
// array of the metadata was read within the file, and every tensor's ne[0] is a multiple of
// its type's block size. Nothing read from the file is trusted before it is checked against
// the file size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::engine {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", "string", "array", ...; "unknown" for a value outside the enum.
const char* GgufValueTypeName(GgufValueType type);

// One metadata value. Exactly the members that belong to `type` are meaningful: `u` for
// unsigned integers and bool, `i` for signed integers, `f` for floats, `str` for strings,
// `elem_type` and `array` for arrays (arrays may nest).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  GgufValueType elem_type = GgufValueType::kUint8;
  std::vector<GgufValue> array;

  bool IsInteger() const;
  // The value as an int64 when it is an integer type that fits; false otherwise.
  bool AsInt64(int64_t* out) const;
};

// ggml tensor types (the ids the GGUF spec assigns). Open accepts every type listed here (it
// knows their block sizes); Dequantize supports F32, F16, BF16, Q4_0, Q4_1 and Q8_0.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  const char* name;      // "F32", "Q4_1", ...
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool dequantizable;    // Dequantize supports it
};
// Traits of a known type; nullptr for an id this reader does not know.
const GgmlTypeTraits* GetGgmlTypeTraits(uint32_t type);

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // dimensions, innermost first; 1 to 4 of them, each >= 1
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t num_elements = 0;
  uint64_t num_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping; valid while the GgufFile lives
};

class GgufFile {
 public:
  // Maps and parses `path`. IOError when it cannot be opened or mapped; InvalidArgument when it
  // is not a regular file (a directory, a FIFO, a device: named); Corruption (naming the
  // offending field and offset) for a bad magic, an unsupported version, a count, length or
  // offset that does not fit the file, an unknown value or tensor type, duplicate keys or
  // tensor names, a misaligned tensor or a bad `general.alignment`.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return size_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  // The value under `key`, or nullptr.
  const GgufValue* Find(std::string_view key) const;

  // Typed getters. NotFound when the key is absent; InvalidArgument when the value has another
  // type or (integers) does not fit the result.
  Result<uint32_t> GetUint32(std::string_view key) const;  // any integer type
  Result<float> GetFloat32(std::string_view key) const;    // float32 or float64
  Result<bool> GetBool(std::string_view key) const;
  Result<std::string> GetString(std::string_view key) const;
  Result<std::vector<std::string>> GetStringArray(std::string_view key) const;
  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;  // integer elements

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // The tensor named `name`, or nullptr.
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // The tensor's elements as f32, in storage order. InvalidArgument when its type is not
  // dequantizable (the message names the type and the supported ones).
  static Result<std::vector<float>> Dequantize(const GgufTensorInfo& tensor);

 private:
  GgufFile() = default;
  Status Parse();

  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Converts IEEE half and bfloat16 bit patterns to float (subnormals, infinities and NaN
// included).
float HalfToFloat(uint16_t h);
float Bf16ToFloat(uint16_t h);
// Rounds to nearest even; used by tests and writers.
uint16_t FloatToHalf(float f);

// Dequantizes `num_elements` elements of type `type` starting at `src` into `dst`.
// REQUIRES: num_elements is a multiple of the type's block size; src holds the matching bytes.
// InvalidArgument when the type is not dequantizable.
Status DequantizeRow(GgmlType type, const uint8_t* src, uint64_t num_elements, float* dst);

}  // namespace kvtier::engine
