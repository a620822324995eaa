// Scatter-destination tests of the G4 stores (RemoteGet::pieces and on_landed), shared by
// fs_store_test.cc and redis_store_test.cc: piece buffers that show stray writes, the layouts an
// engine and the edge cases use, one store call that gets objects into them while recording what
// on_landed is told, and the checks on what landed and what was told. Store-neutral: the store
// is a RemoteStore* and the objects are named by the caller.
//
// Usage:
//   ScatterResult g = GetScattered(store, {"a", "b"}, {KvBlockLayout(), UnevenLayout(n)},
//                                  Receive::kPiecesLanded);
//   ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, 0, value_a));
//   ExpectToldOnce(g, 0, value_a);
//   ExpectNothingLanded(g, 1, StatusCode::kNotFound);
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tier/remote_store.h"

namespace kvtier::testing {

// A scatter destination: each piece a buffer of its own (so no two are contiguous), filled
// with 0xAB.
struct Pieces {
  explicit Pieces(const std::vector<size_t>& sizes) {
    for (size_t n : sizes) bufs.emplace_back(n, 0xAB);
    for (auto& b : bufs) spans.emplace_back(b.data(), b.size());
    for (size_t n : sizes) ends.push_back((ends.empty() ? 0 : ends.back()) + n);
  }
  // The first `n` bytes held by the pieces, in order.
  std::vector<uint8_t> Joined(size_t n) const {
    std::vector<uint8_t> out;
    for (const auto& b : bufs) out.insert(out.end(), b.begin(), b.end());
    out.resize(std::min(n, out.size()));
    return out;
  }
  // Whether every byte from byte `from` of the joined pieces on is still 0xAB.
  bool UntouchedFrom(size_t from) const {
    size_t at = 0;
    for (const auto& b : bufs) {
      for (uint8_t x : b) {
        if (at++ >= from && x != 0xAB) return false;
      }
    }
    return true;
  }
  // Where byte `offset` of the joined pieces is kept, when it and the n - 1 after it are all
  // in one piece; nullptr otherwise.
  const uint8_t* At(uint64_t offset, uint64_t n) const {
    const size_t k = PieceOf(offset);
    if (k == bufs.size() || offset + n > ends[k]) return nullptr;
    return bufs[k].data() + (offset - (ends[k] - bufs[k].size()));
  }
  // Whether byte `offset` of the joined pieces is the first of its piece.
  bool StartsAPiece(uint64_t offset) const {
    const size_t k = PieceOf(offset);
    return k < bufs.size() && offset == ends[k] - bufs[k].size();
  }
  // The piece that holds byte `offset` (bufs.size() past the end). Empty pieces hold none.
  size_t PieceOf(uint64_t offset) const {
    return static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), offset) - ends.begin());
  }
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<std::span<uint8_t>> spans;
  std::vector<uint64_t> ends;  // ends[k]: where piece k ends in the joined pieces
};

// The bytes of a KV block as an engine holds it (KvBlockLayout): 2 MiB + 4 KiB.
inline constexpr size_t kKvBlock = (size_t{2} << 20) + 4096;

// A KV block as an engine holds it: a 4096-byte header, then 64 chunks of 32 KiB (kKvBlock).
inline std::vector<size_t> KvBlockLayout() {
  std::vector<size_t> sizes = {4096};
  sizes.insert(sizes.end(), 64, 32 << 10);
  return sizes;
}

// Uneven pieces (empty ones too) adding up to `total`; a test failure if `total` is too small.
inline std::vector<size_t> UnevenLayout(size_t total) {
  const std::vector<size_t> head = {4096, 0, 32 << 10, 1, 17, 0};
  size_t used = 0;
  for (size_t n : head) used += n;
  EXPECT_GE(total, used) << "UnevenLayout: too small a total";
  std::vector<size_t> sizes = head;
  sizes.push_back(total - used);
  return sizes;
}

// Pieces of `sizes` in turn, a little more than `total` in all (`sizes` not all empty).
inline std::vector<size_t> CyclingLayout(size_t total, const std::vector<size_t>& sizes) {
  std::vector<size_t> l;
  for (size_t sum = 0; sum < total + 3; sum += l.back()) {
    l.push_back(sizes[l.size() % sizes.size()]);
  }
  return l;
}

// One call of on_landed: where in the object, a copy of the bytes taken during the call, where
// they were, and on which thread.
struct LandedRange {
  uint64_t offset;
  std::vector<uint8_t> bytes;
  const uint8_t* at;
  std::thread::id thread;
};

// How GetScattered receives each object: into its pieces, the same with on_landed recorded, or
// into a contiguous dest (the one piece of a one-piece layout) with on_landed recorded.
enum class Receive { kPieces, kPiecesLanded, kDestLanded };

// Gets of names[i] into pieces of layouts[i], and what they got.
struct ScatterResult {
  std::vector<Pieces> pieces;
  std::vector<std::vector<LandedRange>> landed;  // landed[i]: item i's on_landed calls
  std::vector<RemoteGet> gets;
  std::vector<Status> results;
};

// The gets GetScattered makes (names[i] into layouts[i], as `how` says), results not yet set;
// without calling a store. names and layouts are the same length.
inline ScatterResult PrepareScattered(const std::vector<std::string>& names,
                                      const std::vector<std::vector<size_t>>& layouts,
                                      Receive how) {
  EXPECT_EQ(names.size(), layouts.size()) << "a layout a name";
  ScatterResult r;
  r.landed.resize(layouts.size());  // never resized again: the recorders point into it
  for (const auto& l : layouts) r.pieces.emplace_back(l);
  for (size_t i = 0; i < layouts.size() && i < names.size(); ++i) {
    RemoteGet g{names[i], {}, 0};
    if (how == Receive::kDestLanded) {
      EXPECT_EQ(layouts[i].size(), 1u) << "a contiguous dest is a one-piece layout";
      g.dest = r.pieces[i].spans[0];
    } else {
      g.pieces = r.pieces[i].spans;
    }
    if (how != Receive::kPieces) {
      g.on_landed = [log = &r.landed[i]](uint64_t offset, std::span<const uint8_t> bytes) {
        log->push_back(
            {offset, {bytes.begin(), bytes.end()}, bytes.data(), std::this_thread::get_id()});
      };
    }
    r.gets.push_back(std::move(g));
  }
  r.results.resize(r.gets.size());
  return r;
}

// Gets names[i] into pieces of layouts[i] (or as `how` says) in one call of `store` by
// `deadline` (5 s from now by default); checks nothing.
inline ScatterResult GetScattered(RemoteStore* store, const std::vector<std::string>& names,
                                  const std::vector<std::vector<size_t>>& layouts,
                                  Receive how = Receive::kPieces,
                                  RemoteDeadline deadline = RemoteClock::now() +
                                                            std::chrono::seconds(5)) {
  ScatterResult r = PrepareScattered(names, layouts, how);
  store->Get(r.gets, deadline, r.results);
  return r;
}

// Item i of `g` is Ok, and landed byte-exact in its pieces with nothing written after it.
inline void ExpectLanded(const ScatterResult& g, size_t i, const std::vector<uint8_t>& value) {
  ASSERT_TRUE(g.results[i].ok()) << i << ": " << g.results[i].ToString();
  ASSERT_EQ(g.gets[i].bytes_read, value.size()) << i;
  EXPECT_TRUE(g.pieces[i].Joined(value.size()) == value) << i;
  EXPECT_TRUE(g.pieces[i].UntouchedFrom(value.size())) << i;
}

// Item i of `g` failed with `code`, and nothing was written or told.
inline void ExpectNothingLanded(const ScatterResult& g, size_t i, StatusCode code) {
  EXPECT_TRUE(g.results[i].Is(code)) << i << ": " << g.results[i].ToString();
  EXPECT_EQ(g.gets[i].bytes_read, 0u) << i;
  EXPECT_TRUE(g.pieces[i].UntouchedFrom(0)) << i;
  EXPECT_TRUE(g.landed[i].empty())
      << i << ": on_landed told of " << g.landed[i].size() << " ranges";
}

// Checks `ranges` as one pass over `value` received into `room`: in order and contiguous from
// offset 0, each holding value's bytes at its offset, each being room's own memory at that
// offset (where the bytes landed, not a copy), each told on this thread. Returns where the pass
// ends (past value's end after a failure for a range beyond it).
inline uint64_t ExpectPass(std::span<const LandedRange> ranges, const Pieces& room,
                           const std::vector<uint8_t>& value) {
  uint64_t next = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const LandedRange& r = ranges[k];
    EXPECT_EQ(r.offset, next) << "range " << k << " of " << ranges.size();
    if (r.offset + r.bytes.size() > value.size()) {
      ADD_FAILURE() << "range " << k << " [" << r.offset << ", +" << r.bytes.size()
                    << ") is past the object's " << value.size() << " bytes";
      return r.offset + r.bytes.size();
    }
    EXPECT_TRUE(std::equal(r.bytes.begin(), r.bytes.end(), value.begin() + r.offset))
        << "range " << k << " at " << r.offset;
    EXPECT_EQ(r.at, room.At(r.offset, r.bytes.size())) << "range " << k << " at " << r.offset;
    EXPECT_EQ(r.thread, std::this_thread::get_id()) << "range " << k;
    next = r.offset + r.bytes.size();
  }
  return next;
}

// Item i of `g` was told of [0, value.size()) once: one pass (ExpectPass) that covers it exactly.
inline void ExpectToldOnce(const ScatterResult& g, size_t i, const std::vector<uint8_t>& value) {
  SCOPED_TRACE("item " + std::to_string(i));
  EXPECT_EQ(ExpectPass(g.landed[i], g.pieces[i], value), value.size()) << "the ranges end there";
}

// Each item i of `g` landed holding values[i] (ExpectLanded; fatal) and was told once
// (ExpectToldOnce).
inline void ExpectEachLandedAndToldOnce(const ScatterResult& g,
                                        const std::vector<std::vector<uint8_t>>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectLanded(g, i, values[i]));
    ExpectToldOnce(g, i, values[i]);
  }
}

}  // namespace kvtier::testing
