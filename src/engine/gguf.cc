#include "engine/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/regular_file.h"

namespace kvtier::engine {
namespace {

constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kMaxArrayDepth = 4;
constexpr uint64_t kDefaultAlignment = 32;

// Reads little-endian values from the mapping; every read is checked against the end first.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return Status::Corruption("GGUF truncated: " + std::string(what) + " needs " +
                                std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                                ", file has " + std::to_string(remaining()) + " left");
    }
    return Status::Ok();
  }

  template <typename T>
  Status Read(T* out, std::string_view what) {
    KVTIER_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, data_ + pos_, sizeof(T));  // x86-64 and aarch64 are little-endian
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string* out, std::string_view what) {
    uint64_t len = 0;
    KVTIER_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return Status::Corruption("GGUF " + std::string(what) + " at offset " +
                                std::to_string(pos_ - 8) + " claims " + std::to_string(len) +
                                " bytes; only " + std::to_string(remaining()) + " remain");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// The fewest bytes one value of `type` takes in the file (for plausibility checks of counts).
uint64_t MinEncodedBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kString:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 1;
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

Status ReadValue(Cursor& c, GgufValueType type, uint32_t depth, GgufValue* v) {
  v->type = type;
  switch (type) {
    case GgufValueType::kUint8: {
      uint8_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "uint8 value"));
      v->u = x;
      return Status::Ok();
    }
    case GgufValueType::kInt8: {
      int8_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "int8 value"));
      v->i = x;
      return Status::Ok();
    }
    case GgufValueType::kUint16: {
      uint16_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "uint16 value"));
      v->u = x;
      return Status::Ok();
    }
    case GgufValueType::kInt16: {
      int16_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "int16 value"));
      v->i = x;
      return Status::Ok();
    }
    case GgufValueType::kUint32: {
      uint32_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "uint32 value"));
      v->u = x;
      return Status::Ok();
    }
    case GgufValueType::kInt32: {
      int32_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "int32 value"));
      v->i = x;
      return Status::Ok();
    }
    case GgufValueType::kFloat32: {
      float x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "float32 value"));
      v->f = x;
      return Status::Ok();
    }
    case GgufValueType::kBool: {
      uint8_t x;
      KVTIER_RETURN_IF_ERROR(c.Read(&x, "bool value"));
      if (x > 1) {
        return Status::Corruption("GGUF bool at offset " + std::to_string(c.pos() - 1) + " is " +
                                  std::to_string(x) + ", not 0 or 1");
      }
      v->u = x;
      return Status::Ok();
    }
    case GgufValueType::kString:
      return c.ReadString(&v->str, "string value");
    case GgufValueType::kUint64:
      return c.Read(&v->u, "uint64 value");
    case GgufValueType::kInt64:
      return c.Read(&v->i, "int64 value");
    case GgufValueType::kFloat64:
      return c.Read(&v->f, "float64 value");
    case GgufValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return Status::Corruption("GGUF arrays nest deeper than " + std::to_string(kMaxArrayDepth) +
                                  " at offset " + std::to_string(c.pos()));
      }
      uint32_t elem = 0;
      uint64_t count = 0;
      KVTIER_RETURN_IF_ERROR(c.Read(&elem, "array element type"));
      if (!KnownValueType(elem)) {
        return Status::Corruption("GGUF array at offset " + std::to_string(c.pos() - 4) +
                                  " has unknown element type " + std::to_string(elem));
      }
      KVTIER_RETURN_IF_ERROR(c.Read(&count, "array count"));
      const auto et = static_cast<GgufValueType>(elem);
      if (count > c.remaining() / MinEncodedBytes(et)) {
        return Status::Corruption("GGUF array at offset " + std::to_string(c.pos() - 8) +
                                  " claims " + std::to_string(count) + " elements of type " +
                                  GgufValueTypeName(et) + "; the file has only " +
                                  std::to_string(c.remaining()) + " bytes left");
      }
      v->elem_type = et;
      v->array.resize(count);
      for (uint64_t k = 0; k < count; ++k) {
        KVTIER_RETURN_IF_ERROR(ReadValue(c, et, depth + 1, &v->array[k]));
      }
      return Status::Ok();
    }
  }
  return Status::Internal("unreachable GGUF value type");
}

std::string KeyError(std::string_view key, std::string_view what) {
  return "GGUF metadata '" + std::string(key) + "' " + std::string(what);
}

}  // namespace

const char* GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

bool GgufValue::IsInteger() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::AsInt64(int64_t* out) const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kUint16:
    case GgufValueType::kUint32:
    case GgufValueType::kUint64:
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *out = static_cast<int64_t>(u);
      return true;
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64:
      *out = i;
      return true;
    default:
      return false;
  }
}

const GgmlTypeTraits* GetGgmlTypeTraits(uint32_t type) {
  static const GgmlTypeTraits kF32{"F32", 1, 4, true}, kF16{"F16", 1, 2, true},
      kQ4_0{"Q4_0", 32, 18, true}, kQ4_1{"Q4_1", 32, 20, true}, kQ5_0{"Q5_0", 32, 22, false},
      kQ5_1{"Q5_1", 32, 24, false}, kQ8_0{"Q8_0", 32, 34, true}, kQ8_1{"Q8_1", 32, 36, false},
      kQ2_K{"Q2_K", 256, 84, false}, kQ3_K{"Q3_K", 256, 110, false}, kQ4_K{"Q4_K", 256, 144, false},
      kQ5_K{"Q5_K", 256, 176, false}, kQ6_K{"Q6_K", 256, 210, false},
      kQ8_K{"Q8_K", 256, 292, false}, kI8{"I8", 1, 1, false}, kI16{"I16", 1, 2, false},
      kI32{"I32", 1, 4, false}, kI64{"I64", 1, 8, false}, kF64{"F64", 1, 8, false},
      kBF16{"BF16", 1, 2, true};
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return &kF32;
    case GgmlType::kF16:
      return &kF16;
    case GgmlType::kQ4_0:
      return &kQ4_0;
    case GgmlType::kQ4_1:
      return &kQ4_1;
    case GgmlType::kQ5_0:
      return &kQ5_0;
    case GgmlType::kQ5_1:
      return &kQ5_1;
    case GgmlType::kQ8_0:
      return &kQ8_0;
    case GgmlType::kQ8_1:
      return &kQ8_1;
    case GgmlType::kQ2_K:
      return &kQ2_K;
    case GgmlType::kQ3_K:
      return &kQ3_K;
    case GgmlType::kQ4_K:
      return &kQ4_K;
    case GgmlType::kQ5_K:
      return &kQ5_K;
    case GgmlType::kQ6_K:
      return &kQ6_K;
    case GgmlType::kQ8_K:
      return &kQ8_K;
    case GgmlType::kI8:
      return &kI8;
    case GgmlType::kI16:
      return &kI16;
    case GgmlType::kI32:
      return &kI32;
    case GgmlType::kI64:
      return &kI64;
    case GgmlType::kF64:
      return &kF64;
    case GgmlType::kBF16:
      return &kBF16;
  }
  return nullptr;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  // A regular file only: open(2) of a FIFO blocks until a writer comes, and a directory or a
  // device has no bytes to map (a directory failed in mmap as "No such device"; /dev/zero
  // passed as "empty").
  Result<int> opened = OpenRegularFile(path, O_RDONLY);
  if (!opened.ok()) {
    if (opened.status().Is(StatusCode::kNotFound)) {
      return Status::IOError("open " + path + ": it does not exist");
    }
    return opened.status();
  }
  const int fd = *opened;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, "fstat " + path);
    ::close(fd);
    return s;
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ == 0) {
    ::close(fd);
    return Status::Corruption("GGUF file " + path + " is empty");
  }
  void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return Status::FromErrno(err, "mmap " + path);
  file->base_ = static_cast<const uint8_t*>(p);
  Status s = file->Parse();
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return file;
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

Status GgufFile::Parse() {
  Cursor c(base_, size_);
  uint32_t magic = 0;
  KVTIER_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    return Status::Corruption("not a GGUF file: bad magic (expected \"GGUF\")");
  }
  KVTIER_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return Status::Corruption("unsupported GGUF version " + std::to_string(version_) +
                              " (supported: 2, 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  KVTIER_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  KVTIER_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13) {
    return Status::Corruption("GGUF metadata count " + std::to_string(n_kv) +
                              " cannot fit in the file (" + std::to_string(size_) + " bytes)");
  }
  if (n_tensors > c.remaining() / 32) {
    return Status::Corruption("GGUF tensor count " + std::to_string(n_tensors) +
                              " cannot fit in the file (" + std::to_string(size_) + " bytes)");
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    KVTIER_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    uint32_t type = 0;
    KVTIER_RETURN_IF_ERROR(c.Read(&type, "metadata value type"));
    if (!KnownValueType(type)) {
      return Status::Corruption("GGUF metadata '" + key + "' has unknown value type " +
                                std::to_string(type));
    }
    GgufValue v;
    KVTIER_RETURN_IF_ERROR(ReadValue(c, static_cast<GgufValueType>(type), 0, &v));
    if (!metadata_.emplace(key, std::move(v)).second) {
      return Status::Corruption("GGUF metadata key '" + key + "' appears twice");
    }
  }

  if (const GgufValue* a = Find("general.alignment"); a != nullptr) {
    if (a->type != GgufValueType::kUint32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
      return Status::Corruption("GGUF general.alignment must be a uint32 power of two");
    }
    alignment_ = a->u;
  } else {
    alignment_ = kDefaultAlignment;
  }

  tensors_.resize(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo& info = tensors_[t];
    KVTIER_RETURN_IF_ERROR(c.ReadString(&info.name, "tensor name"));
    uint32_t n_dims = 0;
    KVTIER_RETURN_IF_ERROR(c.Read(&n_dims, "tensor dimension count"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return Status::Corruption("GGUF tensor '" + info.name + "' has " + std::to_string(n_dims) +
                                " dimensions (1 to 4 allowed)");
    }
    info.ne.resize(n_dims);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      KVTIER_RETURN_IF_ERROR(c.Read(&info.ne[d], "tensor dimension"));
      if (info.ne[d] == 0 || info.ne[d] > (uint64_t{1} << 62) / elems) {
        return Status::Corruption("GGUF tensor '" + info.name + "' has an absurd dimension " +
                                  std::to_string(info.ne[d]));
      }
      elems *= info.ne[d];
    }
    uint32_t type = 0;
    KVTIER_RETURN_IF_ERROR(c.Read(&type, "tensor type"));
    const GgmlTypeTraits* traits = GetGgmlTypeTraits(type);
    if (traits == nullptr) {
      return Status::Corruption("GGUF tensor '" + info.name + "' has unknown ggml type " +
                                std::to_string(type));
    }
    info.type = static_cast<GgmlType>(type);
    if (info.ne[0] % traits->block_elems != 0) {
      return Status::Corruption("GGUF tensor '" + info.name + "': row length " +
                                std::to_string(info.ne[0]) + " is not a multiple of the " +
                                traits->name + " block size " +
                                std::to_string(traits->block_elems));
    }
    KVTIER_RETURN_IF_ERROR(c.Read(&info.offset, "tensor offset"));
    if (info.offset % alignment_ != 0) {
      return Status::Corruption(
          "GGUF tensor '" + info.name + "' offset " + std::to_string(info.offset) +
          " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    info.num_elements = elems;
    info.num_bytes = elems / traits->block_elems * traits->block_bytes;
    if (!tensor_index_.emplace(info.name, t).second) {
      return Status::Corruption("GGUF tensor name '" + info.name + "' appears twice");
    }
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (GgufTensorInfo& info : tensors_) {
    if (info.offset > data_size || info.num_bytes > data_size - info.offset) {
      return Status::Corruption("GGUF tensor '" + info.name + "' (" +
                                std::to_string(info.num_bytes) + " bytes at data offset " +
                                std::to_string(info.offset) + ") lies past the end of the file (" +
                                std::to_string(data_size) + " data bytes)");
    }
    info.data = base_ + data_offset_ + info.offset;
  }
  return Status::Ok();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

Result<uint32_t> GgufFile::GetUint32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound(KeyError(key, "is missing"));
  int64_t x = 0;
  if (!v->AsInt64(&x)) {
    return Status::InvalidArgument(
        KeyError(key, std::string("is a ") + GgufValueTypeName(v->type) + ", not an integer"));
  }
  if (x < 0 || x > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument(
        KeyError(key, "= " + std::to_string(x) + " does not fit a uint32"));
  }
  return static_cast<uint32_t>(x);
}

Result<float> GgufFile::GetFloat32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound(KeyError(key, "is missing"));
  if (v->type != GgufValueType::kFloat32 && v->type != GgufValueType::kFloat64) {
    return Status::InvalidArgument(
        KeyError(key, std::string("is a ") + GgufValueTypeName(v->type) + ", not a float"));
  }
  return static_cast<float>(v->f);
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound(KeyError(key, "is missing"));
  if (v->type != GgufValueType::kBool) {
    return Status::InvalidArgument(
        KeyError(key, std::string("is a ") + GgufValueTypeName(v->type) + ", not a bool"));
  }
  return v->u != 0;
}

Result<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound(KeyError(key, "is missing"));
  if (v->type != GgufValueType::kString) {
    return Status::InvalidArgument(
        KeyError(key, std::string("is a ") + GgufValueTypeName(v->type) + ", not a string"));
  }
  return v->str;
}

Result<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound(KeyError(key, "is missing"));
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString) {
    return Status::InvalidArgument(KeyError(key, "is not an array of strings"));
  }
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const GgufValue& e : v->array) out.push_back(e.str);
  return out;
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Status::NotFound(KeyError(key, "is missing"));
  if (v->type != GgufValueType::kArray) {
    return Status::InvalidArgument(KeyError(key, "is not an array"));
  }
  std::vector<int64_t> out(v->array.size());
  for (size_t k = 0; k < v->array.size(); ++k) {
    if (!v->array[k].AsInt64(&out[k])) {
      return Status::InvalidArgument(KeyError(key, "is not an array of integers that fit int64"));
    }
  }
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::vector<float>> GgufFile::Dequantize(const GgufTensorInfo& tensor) {
  std::vector<float> out(tensor.num_elements);
  Status s = DequantizeRow(tensor.type, tensor.data, tensor.num_elements, out.data());
  if (!s.ok()) return Status(s.code(), "tensor '" + tensor.name + "': " + s.message());
  return out;
}

}  // namespace kvtier::engine
