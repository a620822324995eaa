// kvtier serve's settings (src/proto/service_config_keys.cc, service_options.h): a program that
// links kvtier_proto alone knows the service.* keys (the registration's link anchor); each
// side's typed options take the keys' defaults and values, parse the keys that hold numbers as
// text, refuse only the keys their side reads, and Validate holds a struct made in code to the
// keys' ranges.
#include "proto/service_options.h"

#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/config.h"

namespace kvtier::proto {
namespace {

Config With(const std::string& key, const std::string& value) {
  Config c;
  Status s = c.Set(key, value);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return c;
}

// This binary links kvtier_proto and not the manager, and nothing in it names the keys' table:
// only the --undefined anchor keeps the registering object, in the order `kvtier config` lists.
TEST(ServiceConfigKeysTest, AProgramLinkingProtoAloneKnowsTheServiceKeys) {
  std::vector<std::string> got;
  for (const ConfigFieldSpec& spec : Config::Schema()) got.push_back(spec.name);
  const std::vector<std::string> want = {
      "service.socket",          "service.instance",    "service.lease_ms",
      "service.call_timeout_ms", "service.reattach_ms", "service.max_pools",
      "service.allowed_gids",    "service.daemon_uid",  "service.max_connections"};
  EXPECT_EQ(got, want);
}

TEST(ServiceOptionsTest, DefaultsAreTheKeys) {
  Result<ServiceClientOptions> client = ServiceClientOptions::FromConfig(Config());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(client->socket, "");
  EXPECT_EQ(client->instance, "");
  EXPECT_EQ(client->daemon_uid, ::geteuid()) << "empty: the engine's own uid";
  EXPECT_EQ(client->call_timeout_ms, 5000u);
  EXPECT_EQ(client->reattach_ms, 1000u);
  Result<ServiceDaemonOptions> daemon = ServiceDaemonOptions::FromConfig(Config());
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  EXPECT_EQ(daemon->socket, "");
  EXPECT_TRUE(daemon->allowed_gids.empty());
  EXPECT_EQ(daemon->lease_ms, 5000u);
  EXPECT_EQ(daemon->max_pools, 1u);
  EXPECT_EQ(daemon->max_connections, 256u);
  EXPECT_FALSE(ServiceSocketSet(Config()));
}

TEST(ServiceOptionsTest, TakeEachKeysValue) {
  Config c;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"service.socket", "/run/kvtier/kvtier.sock"},
           {"service.instance", "engine-a"},
           {"service.daemon_uid", "1234"},
           {"service.call_timeout_ms", "250"},
           {"service.reattach_ms", "20"},
           {"service.allowed_gids", "10,4294967295,20"},
           {"service.lease_ms", "700"},
           {"service.max_pools", "8"},
           {"service.max_connections", "4"}}) {
    ASSERT_TRUE(c.Set(key, value).ok()) << key;
  }
  EXPECT_TRUE(ServiceSocketSet(c));
  Result<ServiceClientOptions> client = ServiceClientOptions::FromConfig(c);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(client->socket, "/run/kvtier/kvtier.sock");
  EXPECT_EQ(client->instance, "engine-a");
  EXPECT_EQ(client->daemon_uid, 1234u);
  EXPECT_EQ(client->call_timeout_ms, 250u);
  EXPECT_EQ(client->reattach_ms, 20u);
  Result<ServiceDaemonOptions> daemon = ServiceDaemonOptions::FromConfig(c);
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  EXPECT_EQ(daemon->socket, "/run/kvtier/kvtier.sock");
  // A group id of all ones was always taken as given (only a daemon uid of -1 is refused).
  EXPECT_EQ(daemon->allowed_gids, (std::vector<gid_t>{10, 4294967295u, 20}));
  EXPECT_EQ(daemon->lease_ms, 700u);
  EXPECT_EQ(daemon->max_pools, 8u);
  EXPECT_EQ(daemon->max_connections, 4u);
}

// Config takes any text for the two keys that hold numbers; the side that reads one refuses
// it, naming the key and the item, and the other side does not care.
TEST(ServiceOptionsTest, EachSideRefusesTheTextKeysItReadsAndOnlyThose) {
  for (const char* bad : {"root", "-1", "12x", "4294967295", "99999999999999999999"}) {
    const Config c = With("service.daemon_uid", bad);
    Result<ServiceClientOptions> client = ServiceClientOptions::FromConfig(c);
    ASSERT_FALSE(client.ok()) << bad;
    EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(client.status().message(),
              std::string("service.daemon_uid: '") + bad +
                  "' is not a uid; give the number kvtier serve runs as");
    EXPECT_TRUE(ServiceDaemonOptions::FromConfig(c).ok()) << "the daemon reads no daemon_uid";
  }
  for (const auto& [text, item] : std::vector<std::pair<std::string, std::string>>{
           {"wheel", "wheel"}, {"10,,20", ""}, {"-5", "-5"}, {"10,4294967296", "4294967296"}}) {
    const Config c = With("service.allowed_gids", text);
    Result<ServiceDaemonOptions> daemon = ServiceDaemonOptions::FromConfig(c);
    ASSERT_FALSE(daemon.ok()) << text;
    EXPECT_EQ(daemon.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(daemon.status().message(), "service.allowed_gids: '" + item +
                                             "' is not a group id; give comma-separated numbers")
        << text;
    EXPECT_TRUE(ServiceClientOptions::FromConfig(c).ok()) << "an engine reads no allowed_gids";
  }
}

// A struct made in code is held to the keys' ranges (CheckConfigValue), with Config::Set's
// words.
TEST(ServiceOptionsTest, ValidateRefusesEachFieldOutOfItsKeysRange) {
  const ServiceClientOptions client = *ServiceClientOptions::FromConfig(Config());
  ASSERT_TRUE(client.Validate().ok());
  auto client_refusal = [&](void (*change)(ServiceClientOptions*)) {
    ServiceClientOptions o = client;
    change(&o);
    return o.Validate();
  };
  Status timeout = client_refusal([](ServiceClientOptions* o) { o->call_timeout_ms = 5; });
  EXPECT_EQ(timeout.message(), Config().Set("service.call_timeout_ms", "5").message());
  EXPECT_NE(timeout.message().find("service.call_timeout_ms = '5' is out of range"),
            std::string::npos)
      << timeout.message();
  Status reattach = client_refusal([](ServiceClientOptions* o) { o->reattach_ms = 0; });
  EXPECT_NE(reattach.message().find("service.reattach_ms = '0'"), std::string::npos)
      << reattach.message();
  Status uid = client_refusal([](ServiceClientOptions* o) { o->daemon_uid = uid_t(-1); });
  EXPECT_NE(uid.message().find("service.daemon_uid: '4294967295' is not a uid"), std::string::npos)
      << uid.message();

  const ServiceDaemonOptions daemon = *ServiceDaemonOptions::FromConfig(Config());
  ASSERT_TRUE(daemon.Validate().ok());
  auto daemon_refusal = [&](void (*change)(ServiceDaemonOptions*)) {
    ServiceDaemonOptions o = daemon;
    change(&o);
    return o.Validate();
  };
  Status lease = daemon_refusal([](ServiceDaemonOptions* o) { o->lease_ms = 9; });
  EXPECT_EQ(lease.message(), Config().Set("service.lease_ms", "9").message());
  Status pools = daemon_refusal([](ServiceDaemonOptions* o) { o->max_pools = 65; });
  EXPECT_NE(pools.message().find("service.max_pools = '65' is out of range"), std::string::npos)
      << pools.message();
  Status none = daemon_refusal([](ServiceDaemonOptions* o) { o->max_pools = 0; });
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  Status conns = daemon_refusal([](ServiceDaemonOptions* o) { o->max_connections = 3; });
  EXPECT_NE(conns.message().find("service.max_connections = '3' is out of range"),
            std::string::npos)
      << conns.message();
}

}  // namespace
}  // namespace kvtier::proto
