// PieceCursor: a position inside a scatter destination (RemoteGet::pieces), the pieces taken
// as one run of bytes in order. The stores receive an object into the pieces in several reads
// (readv from a socket, preadv from a file), each of which may end anywhere, mid-piece too; the
// cursor says where the next byte goes, and turns the room after it into iovecs for the next
// read. Shared by the Redis wire (redis_wire.cc) and the filesystem store (fs_store.cc).
//
// Invariant (kept by Advance): index <= pieces.size(), and offset is 0 or inside the piece at
// `index`: a piece that fills up, or an empty one that bytes move past, is left behind.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier {

struct PieceCursor {
  size_t index = 0;     // the piece the next byte goes to
  uint64_t offset = 0;  // within it

  // Moves past `n` bytes stored from here. REQUIRES: n <= the room left in the pieces.
  void Advance(std::span<const std::span<uint8_t>> pieces, uint64_t n) {
    while (n > 0) {
      const uint64_t room = pieces[index].size() - offset;
      if (n < room) {
        offset += n;
        return;
      }
      n -= room;
      ++index;
      offset = 0;
    }
  }

  // Fills `iov` with the room from here on, in order, for a vectored read of at most `want`
  // bytes: empty pieces take no iovec, and at most iov.size() are used. Returns how many
  // iovecs it filled (0 when want is 0 or no room is left).
  int ToIovecs(std::span<const std::span<uint8_t>> pieces, uint64_t want,
               std::span<iovec> iov) const {
    int n = 0;
    for (size_t i = index; i < pieces.size() && static_cast<size_t>(n) < iov.size() && want > 0;
         ++i) {
      const uint64_t skip = i == index ? offset : 0;
      const uint64_t len = std::min<uint64_t>(pieces[i].size() - skip, want);
      if (len == 0) continue;
      iov[n].iov_base = pieces[i].data() + skip;
      iov[n].iov_len = len;
      want -= len;
      ++n;
    }
    return n;
  }
};

}  // namespace kvtier
