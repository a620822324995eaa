#include "kvtier/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(s.message().empty());
}

TEST(StatusTest, NamedFactoriesCarryCodeAndMessage) {
  Status s = Status::Corruption("bad checksum in slot 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "bad checksum in slot 7");
  EXPECT_EQ(s.ToString(), "Corruption: bad checksum in slot 7");
  Status copy = s;
  EXPECT_EQ(copy.ToString(), s.ToString());
}

TEST(StatusTest, FromErrnoMapsFullDiskToNoSpace) {
  EXPECT_EQ(Status::FromErrno(ENOSPC, "write").code(), StatusCode::kNoSpace);
  Status eio = Status::FromErrno(EIO, "read slot 3");
  EXPECT_EQ(eio.code(), StatusCode::kIOError);
  EXPECT_NE(eio.message().find("read slot 3: "), std::string::npos);
}

Result<int> Half(int v) {
  if (v % 2 != 0) return Status::InvalidArgument("odd");
  return v / 2;
}

Status UseHalf(int v, int* out) {
  KVTIER_ASSIGN_OR_RETURN(*out, Half(v));
  return Status::Ok();
}

TEST(StatusTest, ResultAndMacros) {
  Result<int> r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 4);
  EXPECT_EQ(Half(3).status().code(), StatusCode::kInvalidArgument);
  int out = 0;
  EXPECT_TRUE(UseHalf(10, &out).ok());
  EXPECT_EQ(out, 5);
  EXPECT_EQ(UseHalf(7, &out).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
