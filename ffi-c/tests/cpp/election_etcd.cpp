// One election through include/dlock.hpp on the real etcd test cluster
// (scripts/etcd-cluster.sh; DLOCK_TEST_MEMBERS): two candidates on two
// clients, one leads; an observer on a third sees that leader; its resign
// passes the leadership to the other, and the observer sees the new one.
// Built and run by scripts/test-cpp.sh (-std=c++17, strict, ASan/UBSan).
// Prints `cpp election etcd: N passed, N failed`; exits non-zero on a failure.
#include <dlock.hpp>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "check.hpp"

using namespace std::chrono_literals;

// The fault tests' short timings on etcd (ttl 4 s, keepalive 1 s).
static dlock::client connect(const char *members) {
  dlock::options o;
  o.endpoints = members;
  o.ttl = 4s;
  o.keepalive_interval = 1s;
  return dlock::client(o);
}

// The next event other than a reconnect and a moment with nobody leading,
// within 15 s.
static std::optional<dlock::observed> next_leader(dlock::observer &o) {
  const auto until = std::chrono::steady_clock::now() + 15s;
  while (std::chrono::steady_clock::now() < until) {
    auto e = o.next(1s);
    if (e && e->kind != dlock::observed_kind::reconnecting && e->kind != dlock::observed_kind::no_leader) return e;
  }
  return std::nullopt;
}

int main() {
  const char *members = std::getenv("DLOCK_TEST_MEMBERS");
  if (!members || !*members) {
    std::printf("FAIL: DLOCK_TEST_MEMBERS is not set (source the env of scripts/etcd-cluster.sh)\n");
    return 1;
  }
  // A name of this run's own: a key left by an earlier run is no leader here.
  const std::string name = "cpp/election-etcd/" + std::to_string(getpid()) + "-" +
                           std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  // The outcome of b's campaign; declared before the handles, so a `done`
  // that runs late (at the election's free) still finds it.
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  dlock::errc status = dlock::errc::panic;
  std::uint64_t tb = 0;
  try {
    dlock::client a = connect(members);
    dlock::client b = connect(members);
    dlock::client w = connect(members);
    dlock::observer watch = w.observe(name);
    auto first = watch.next(15s);  // the current state first: nobody
    CHECK(first && first->kind == dlock::observed_kind::no_leader);

    dlock::election ea = a.election(name);
    dlock::election eb = b.election(name);
    const std::uint64_t ta = ea.campaign("alpha", 10s);
    CHECK(ta >= 1);
    auto seen = next_leader(watch);
    CHECK(seen && seen->kind == dlock::observed_kind::leader && seen->leader &&
          seen->leader->value == "alpha" && seen->leader->token == ta);

    // b waits behind a; a's resign hands the leadership over.
    dlock::acquisition pending = eb.campaign_start("beta", 20s, [&](dlock::errc s, std::uint64_t t) {
      std::lock_guard<std::mutex> g(m);
      done = true;
      status = s;
      tb = t;
      cv.notify_all();
    });
    {
      dlock::permit p = eb.permit();  // waiting: not the leader
      CHECK(!p);
    }
    const auto read = eb.leader();
    CHECK(read && read->value == "alpha" && read->token == ta);
    ea.resign(1s);
    {
      std::unique_lock<std::mutex> g(m);
      CHECK(cv.wait_for(g, 15s, [&] { return done; }));
      CHECK(status == dlock::errc::ok && tb > ta);
    }
    CHECK(!ea.permit());
    seen = next_leader(watch);
    CHECK(seen && seen->kind == dlock::observed_kind::leader && seen->leader &&
          seen->leader->value == "beta" && seen->leader->token == tb);
    CHECK(static_cast<bool>(eb.permit()));
    eb.resign(1s);
  } catch (const dlock::error &e) {
    CHECK(!"dlock::error");
    std::printf("error: %s (%s)\n", e.what(), e.code().message().c_str());
  }
  std::printf("cpp election etcd: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
