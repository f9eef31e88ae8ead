// include/dlock.hpp on the embedded backend: the error category, RAII and
// moves, permits (no throw, ended by destructors), callbacks, options left
// out (the core derives them), sessions, the fence gate, acquire_start and
// cancel, elections and observers, metrics, health and shutdown.
// Built by scripts/test-cpp.sh with -std=c++17 and c++20,
// -Wall -Wextra -Werror -pedantic, under ASan/UBSan. Prints
// `cpp api: N passed, N failed`; exits non-zero on a failure (or killed by
// SIGALRM after 120 s).
#include <dlock.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "check.hpp"

using namespace std::chrono_literals;

// The handles are move-only; the permit is a value of C storage.
static_assert(!std::is_copy_constructible_v<dlock::client>);
static_assert(!std::is_copy_constructible_v<dlock::session>);
static_assert(!std::is_copy_constructible_v<dlock::lock>);
static_assert(!std::is_copy_constructible_v<dlock::fence_gate>);
static_assert(!std::is_copy_constructible_v<dlock::permit>);
static_assert(std::is_nothrow_move_constructible_v<dlock::client>);
static_assert(std::is_nothrow_move_constructible_v<dlock::lock>);
static_assert(std::is_nothrow_move_assignable_v<dlock::lock>);
static_assert(std::is_nothrow_move_constructible_v<dlock::permit>);
static_assert(sizeof(dlock::permit) <= sizeof(struct lk_permit) + sizeof(void *),
              "a permit is the C struct and a status, nothing on the heap");
static_assert(noexcept(std::declval<const dlock::lock &>().permit()));
static_assert(!std::is_copy_constructible_v<dlock::election>);
static_assert(!std::is_copy_constructible_v<dlock::observer>);
static_assert(std::is_nothrow_move_constructible_v<dlock::election>);
static_assert(std::is_nothrow_move_assignable_v<dlock::election>);
static_assert(std::is_nothrow_move_constructible_v<dlock::observer>);
static_assert(std::is_nothrow_move_assignable_v<dlock::observer>);
// An election is not a dlock::lock to the outside: moving its lock out
// would leave a handle that the election frees.
static_assert(!std::is_convertible_v<dlock::election *, dlock::lock *>);
static_assert(noexcept(std::declval<const dlock::election &>().permit()));

// The shared short timings, without reacquire.
static dlock::options quick() {
  dlock::options o = dlock_test::quick();
  o.reacquire = false;
  return o;
}

// Waits up to 10 s for a flag a callback sets.
struct signal {
  std::mutex m;
  std::condition_variable cv;
  bool set = false;
  std::uint64_t value = 0;
  void raise(std::uint64_t v) {
    std::lock_guard<std::mutex> g(m);
    set = true;
    value = v;
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> g(m);
    return cv.wait_for(g, 10s, [this] { return set; });
  }
};

static void codes() {
  std::error_code ec = dlock::errc::timeout;
  CHECK(ec.category() == dlock::category());
  CHECK(std::string(dlock::category().name()) == "dlock");
  CHECK(ec.message() == "timeout");
  CHECK(dlock::make_error_code(dlock::errc::fenced).value() == LK_FENCED);
  CHECK(ec != std::make_error_code(std::errc::timed_out));  // its own category
  CHECK(dlock::version() == lk_version());
}

static void acquire_permit_release() {
  dlock::client a = dlock::client::memory();
  dlock::client b = dlock::client::memory();  // the same process-wide service
  dlock::lock la = a.lock("cpp/api");
  dlock::lock lb = b.lock("cpp/api");
  CHECK(la.name() == "cpp/api");
  CHECK(!la.token());
  {
    dlock::permit p = la.permit();  // not held yet: a refusal, no throw
    CHECK(!p);
    CHECK(p.status() == dlock::errc::not_held);
    CHECK(p.token() == 0);
  }
  const std::uint64_t token = la.acquire(5s);
  CHECK(token >= 1);
  CHECK(la.token() == token);
  CHECK(la.state() == LK_STATE_HOLDING);
  CHECK(la.time_left().value_or(0ms) > 0ms);
  CHECK(!lb.try_acquire());  // held by la: nullopt, no throw
  try {
    lb.acquire(100ms);
    CHECK(!"acquire of a held lock returned");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::timeout);
    CHECK(e.code() == dlock::errc::timeout);
    CHECK(std::string(e.what()).find("lk_lock_acquire") != std::string::npos);
  }
  {
    dlock::permit p = la.permit();
    CHECK(static_cast<bool>(p));
    CHECK(p.token() == token);
    CHECK(p.valid());
    CHECK(la.in_flight() == 1);
    dlock::permit q = std::move(p);  // moved: q ends it, p is empty
    CHECK(!p);
    CHECK(static_cast<bool>(q));
    CHECK(q.token() == token);
    CHECK(la.in_flight() == 1);
    p.end();  // an empty permit: nothing
    CHECK(la.in_flight() == 1);
    dlock::permit r = la.permit();
    CHECK(la.in_flight() == 2);
    r = std::move(q);  // r's own permit ends, q's moves in
    CHECK(la.in_flight() == 1);
    r.end();
    r.end();  // again: nothing
    CHECK(la.in_flight() == 0);
    CHECK(!r && r.status() == dlock::errc::not_held);
    dlock::permit s = la.permit();
    CHECK(la.in_flight() == 1);
  }  // s ends in its destructor
  CHECK(la.in_flight() == 0);
  la.release();
  {
    dlock::permit p = la.permit();
    CHECK(!p && p.status() == dlock::errc::released);
  }
  CHECK(lb.try_acquire().value_or(0) > token);  // free now, a higher token
  dlock::lock moved = std::move(lb);             // still holds; lb is empty
  CHECK(!lb && static_cast<bool>(moved));
  CHECK(moved.token().has_value());
}  // moved is freed here: released

static void callbacks_and_fence() {
  dlock::client c = dlock::client::memory(quick());
  dlock::lock lock = c.lock("cpp/fence");
  signal acquired, fenced, drained;
  std::atomic<int> changes{0};
  lock.on_acquired([&](std::uint64_t t) { acquired.raise(t); });
  lock.on_state_change([&](lk_state, lk_state, lk_reason) { ++changes; });
  lock.on_fence([&](std::uint64_t t, std::uint64_t in_flight) { fenced.raise(t + 1000 * in_flight); });
  lock.on_drained([&] { drained.raise(1); });
  dlock::lock held = std::move(lock);  // the callbacks move with the lock
  const std::uint64_t token = held.acquire(5s);
  CHECK(acquired.wait() && acquired.value == token);
  c.partition();
  CHECK(fenced.wait());
  CHECK(fenced.value == token);  // token, 0 in flight
  CHECK(drained.wait());
  CHECK(changes >= 3);  // acquiring, holding, draining, fenced
  dlock::permit p = held.permit();
  CHECK(!p && p.status() == dlock::errc::fenced);
  c.heal();
  held.on_fence(nullptr);  // removing a callback
  held.close();
}

static void options_and_sessions() {
  dlock::options bad = quick();
  bad.ttl = 1s;  // below 2 s
  try {
    dlock::client c(bad);
    CHECK(!"a bad ttl was accepted");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::invalid_option);
  }
  dlock::client c = dlock::client::memory();
  dlock::session s = c.session(quick());
  CHECK(!s.lease());  // granted on the first acquisition
  dlock::lock l = s.lock("cpp/session");
  l.acquire(5s);
  CHECK(s.lease().has_value());
  dlock::session d = c.default_session();
  CHECK(s.lease() != d.lease());
  s.close();
  try {
    l.acquire(1s);
    CHECK(!"acquire on a closed session");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::released);
  }
}

// Settings left out stay unset and the core derives them (design §14),
// read back through options(): as in Rust, Python and Node.
static void options_left_out() {
  {
    dlock::client c = dlock::client::memory();  // none given: the defaults
    const dlock::timing t = c.options();
    CHECK(t.ttl == std::chrono::milliseconds(LK_DEFAULT_TTL_MS));
    CHECK(t.keepalive_interval == std::chrono::milliseconds(LK_DEFAULT_KEEPALIVE_INTERVAL_MS));
    CHECK(t.keepalive_timeout == std::chrono::milliseconds(LK_DEFAULT_KEEPALIVE_TIMEOUT_MS));
    CHECK(t.retry_interval == std::chrono::milliseconds(LK_DEFAULT_RETRY_INTERVAL_MS));
    CHECK(t.margin == std::chrono::milliseconds(LK_DEFAULT_MARGIN_MS));
    CHECK(t.reacquire);
  }
  {
    // ttl = 3s alone: accepted (a filled-in 5 s interval + 1 s margin was
    // refused), the rest derived from it, and it holds.
    dlock::options o;
    o.ttl = 3s;
    dlock::client c = dlock::client::memory(o);
    const dlock::timing t = c.options();
    CHECK(t.ttl == 3s);
    CHECK(t.keepalive_interval == 1s);  // ttl / 3
    CHECK(t.keepalive_timeout > 0ms && t.keepalive_timeout < t.keepalive_interval);
    CHECK(t.keepalive_interval + t.margin < t.ttl);
    dlock::lock l = c.lock("cpp/ttl-3s");
    CHECK(l.acquire(5s) >= 1);
    CHECK(static_cast<bool>(l.permit()));
  }
  {
    // ttl = 60s alone: the derived keepalive interval, not 5 s.
    dlock::options o;
    o.ttl = 60s;
    dlock::client c = dlock::client::memory(o);
    CHECK(c.options().ttl == 60s);
    CHECK(c.options().keepalive_interval == 20s);
    CHECK(c.default_session().options().keepalive_interval == 20s);
    dlock::session s = c.session(o);
    CHECK(s.options().keepalive_interval == 20s);
    // A session given only an interval derives over the client's TTL.
    dlock::options i;
    i.keepalive_interval = 10s;
    const dlock::timing t = c.session(i).options();
    CHECK(t.ttl == 60s && t.keepalive_interval == 10s);
  }
  {
    dlock::options o;
    o.margin = -1ms;  // refused, not clamped to 0
    try {
      dlock::client c = dlock::client::memory(o);
      CHECK(!"a negative margin was accepted");
    } catch (const dlock::error &e) {
      CHECK(e.status() == dlock::errc::invalid_option);
      CHECK(std::string(e.what()).find("margin") != std::string::npos);
    }
    dlock::options p;
    p.keepalive_interval = 0ms;  // given as 0: the core's rule, not "unset"
    try {
      dlock::client c = dlock::client::memory(p);
      CHECK(!"a zero keepalive_interval was accepted");
    } catch (const dlock::error &e) {
      CHECK(e.status() == dlock::errc::invalid_option);
      CHECK(std::string(e.what()).find("keepalive_interval") != std::string::npos);
    }
  }
}

static void fence_gate() {
  dlock::fence_gate g;
  CHECK(g.highest("r") == 0);
  CHECK(g.admit("r", 5));
  CHECK(g.admit("r", 5));
  CHECK(!g.admit("r", 4));  // stale: false, no throw
  CHECK(g.highest("r") == 5);
  dlock::fence_gate h = std::move(g);
  CHECK(h.highest("r") == 5);
}

// The outcome of one acquire_start, handed to the test thread.
struct outcome {
  std::mutex m;
  std::condition_variable cv;
  int calls = 0;
  dlock::errc status = dlock::errc::ok;
  std::uint64_t token = 0;
  dlock::lock::acquire_done_fn fn() {
    return [this](dlock::errc s, std::uint64_t t) {
      std::lock_guard<std::mutex> g(m);
      ++calls;
      status = s;
      token = t;
      cv.notify_all();
    };
  }
  bool wait() {
    std::unique_lock<std::mutex> g(m);
    return cv.wait_for(g, 10s, [this] { return calls > 0; });
  }
};

// acquire_start: done runs once with the outcome; cancel() ends a wait in
// the queue with errc::released; the handle frees without cancelling.
static void acquire_start_and_cancel() {
  dlock::client c = dlock::client::memory();
  dlock::lock holder = c.lock("cpp/start");
  dlock::lock waiter = c.lock("cpp/start");
  const std::uint64_t first = holder.acquire(5s);
  outcome cancelled;
  dlock::acquisition a = waiter.acquire_start(10s, cancelled.fn());
  CHECK(static_cast<bool>(a));
  dlock::acquisition moved = std::move(a);  // a is empty now
  CHECK(!a && static_cast<bool>(moved));
  moved.cancel();
  moved.cancel();  // again: nothing
  CHECK(cancelled.wait());
  CHECK(cancelled.status == dlock::errc::released && cancelled.token == 0);
  CHECK(holder.token() == first);  // the holder is untouched
  holder.release();
  outcome won;
  {
    dlock::acquisition b = waiter.acquire_start(5s, won.fn());
  }  // freed, not cancelled: the acquisition goes on
  CHECK(won.wait());
  CHECK(won.status == dlock::errc::ok && won.token > first);
  CHECK(waiter.token() == won.token);
  outcome busy;
  dlock::acquisition d = holder.acquire_start(0ms, busy.fn());  // 0: try once
  CHECK(busy.wait() && busy.status == dlock::errc::would_block);
  {
    std::lock_guard<std::mutex> g(cancelled.m);
    CHECK(cancelled.calls == 1);  // exactly once
  }
}

// The events a callback observer got, handed to the test thread.
struct events {
  std::mutex m;
  std::condition_variable cv;
  std::vector<dlock::observed> got;
  dlock::observer::observed_fn fn() {
    return [this](const dlock::observed &e) {
      std::lock_guard<std::mutex> g(m);
      got.push_back(e);
      cv.notify_all();
    };
  }
  // Waits up to 10 s for `n` events of the story: reconnects left out, and
  // the moment nobody leads between two leaders.
  std::vector<dlock::observed> wait(std::size_t n) {
    std::unique_lock<std::mutex> g(m);
    std::vector<dlock::observed> story;
    cv.wait_for(g, 10s, [&] {
      story.clear();
      for (std::size_t i = 0; i < got.size(); i++) {
        const auto &e = got[i];
        if (e.kind == dlock::observed_kind::reconnecting) continue;
        const bool between = e.kind == dlock::observed_kind::no_leader && !story.empty() &&
                             i + 1 < got.size() && got[i + 1].kind == dlock::observed_kind::leader;
        if (!between) story.push_back(e);
      }
      return story.size() >= n;
    });
    return story;
  }
};

// The next event of `o` other than a reconnect and `skip`, within 10 s.
static std::optional<dlock::observed> next_but(dlock::observer &o, dlock::observed_kind skip) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    auto e = o.next(1s);
    if (e && e->kind != dlock::observed_kind::reconnecting && e->kind != skip) return e;
  }
  return std::nullopt;
}

// Elections and observers: two candidates, one leads; an observer (pull
// and callback) sees the leader, a proclaim, the hand-over on resign and
// nobody once the last one resigns; errors are dlock::error with the one
// status.
static void elections() {
  using kind = dlock::observed_kind;
  dlock::client a = dlock::client::memory(quick());
  dlock::client b = dlock::client::memory(quick());
  const std::string name = "cpp/election";
  dlock::observer watch = a.observe(name);
  auto first = watch.next(10s);  // the current state first
  CHECK(first && first->kind == kind::no_leader && !first->leader);
  events pushed;
  dlock::observer callback = b.observe(name, pushed.fn());
  CHECK(pushed.wait(1).size() == 1);  // its watch is open: it will see every change
  try {
    callback.next(0ms);
    CHECK(!"next on a callback observer");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::invalid_argument);
  }

  dlock::election ea = a.election(name);
  dlock::election eb = b.election(name);
  CHECK(ea.name() == name);
  CHECK(!ea.leader());  // nobody leads
  const std::uint64_t ta = ea.campaign("alpha", 5s);
  CHECK(ta >= 1);
  CHECK(ea.token() == ta);
  CHECK(ea.state() == LK_STATE_HOLDING);
  {
    dlock::permit p = ea.permit();  // the election's lock grants leader work
    CHECK(p && p.token() == ta);
  }
  auto seen = watch.next(10s);
  CHECK(seen && seen->kind == kind::leader && seen->leader && seen->leader->value == "alpha" &&
        seen->leader->token == ta && seen->leader->lease != 0 &&
        seen->leader->key.rfind(name + "/", 0) == 0);
  try {
    eb.campaign("beta", 0ms);  // one try: a leader holds
    CHECK(!"a second candidate led at once");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::would_block);
  }
  try {
    eb.campaign("beta", 50ms);
    CHECK(!"a second candidate led within 50 ms");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::timeout);
  }
  try {
    eb.proclaim("beta");
    CHECK(!"a candidate that does not lead proclaimed");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::not_held);
  }
  outcome won;
  dlock::acquisition pending = eb.campaign_start("beta", 10s, won.fn());
  ea.proclaim(std::string("alpha\0two", 9));  // any bytes
  seen = watch.next(10s);
  CHECK(seen && seen->kind == kind::proclaimed && seen->leader &&
        seen->leader->value == std::string("alpha\0two", 9) && seen->leader->token == ta);
  const auto read = eb.leader();
  CHECK(read && read->token == ta && read->value == std::string("alpha\0two", 9));
  CHECK(read == seen->leader);

  ea.resign();  // hands over: b was waiting
  CHECK(won.wait() && won.status == dlock::errc::ok && won.token > ta);
  CHECK(!ea.permit());
  try {
    ea.proclaim("late");
    CHECK(!"a resigned leader proclaimed");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::not_held);
  }
  seen = next_but(watch, kind::no_leader);  // nobody may lead for a moment
  CHECK(seen && seen->kind == kind::leader && seen->leader && seen->leader->value == "beta" &&
        seen->leader->token == won.token);
  dlock::election moved = std::move(eb);  // the lock and its storage move with it
  CHECK(!eb && static_cast<bool>(moved));
  CHECK(moved.token() == won.token);
  dlock::election spare = a.election(name);
  spare = std::move(moved);  // spare's own handle is freed, moved's taken over
  CHECK(!moved && spare.token() == won.token);
  spare.resign(100ms);
  const dlock::observed gone = watch.next();  // no limit: the change is due
  CHECK(gone.kind == kind::no_leader && !gone.leader);
  CHECK(!ea.leader());

  // The callback observer saw the same story, in order.
  const std::vector<dlock::observed> story = pushed.wait(5);
  CHECK(story.size() == 5);
  if (story.size() == 5) {
    CHECK(story[0].kind == kind::no_leader);
    CHECK(story[1].kind == kind::leader && story[1].leader->token == ta);
    CHECK(story[2].kind == kind::proclaimed && story[2].leader->token == ta);
    CHECK(story[3].kind == kind::leader && story[3].leader->value == "beta");
    CHECK(story[4].kind == kind::no_leader);
  }
  callback.close();
  callback.close();  // again: nothing

  // A waiting pull ends with errc::released at a close.
  watch.close();
  try {
    watch.next(1s);
    CHECK(!"next on a closed observer");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::released);
  }
  // A session's candidate leads under that session's lease.
  dlock::session s = a.session(quick());
  dlock::election es = s.election(name);
  CHECK(es.campaign("gamma", 5s) > won.token);
  const auto l = es.leader();
  CHECK(l && l->value == "gamma" && s.lease() && l->lease == *s.lease());
  es.resign(100ms);
  try {
    a.election("");
    CHECK(!"an empty election name");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::invalid_argument);
  }
}

// metrics_text (the Prometheus text of the client's locks), healthy(), and
// shutdown(): this client's sessions end, another client is untouched.
static void metrics_health_shutdown() {
  dlock::client c = dlock::client::memory();
  dlock::client other = dlock::client::memory();
  dlock::lock l = c.lock("cpp/metrics");
  dlock::lock o = other.lock("cpp/other");
  CHECK(l.healthy(0ms));  // not held: healthy
  const std::uint64_t token = l.acquire(5s);
  o.acquire(5s);
  CHECK(l.healthy(0ms));
  const std::string text = c.metrics_text();
  CHECK(text.find("dlock_lock_token{") != std::string::npos);
  CHECK(text.find("lock=\"cpp/metrics\"") != std::string::npos);
  CHECK(text.find(std::to_string(token)) != std::string::npos);
  CHECK(text.find("cpp/other") == std::string::npos);  // another client's lock
  c.shutdown();
  {
    dlock::permit p = l.permit();
    CHECK(!p && p.status() == dlock::errc::released);
  }
  try {
    l.acquire(1s);
    CHECK(!"acquire after shutdown");
  } catch (const dlock::error &e) {
    CHECK(e.status() == dlock::errc::shutdown);
  }
  CHECK(static_cast<bool>(o.permit()));  // the other client still holds
  dlock::shutdown();                     // every client of the process
  CHECK(o.permit().status() == dlock::errc::released);
  dlock::shutdown();  // idempotent
  dlock::client after = dlock::client::memory();  // made afterwards: works
  dlock::lock a = after.lock("cpp/after");
  CHECK(a.acquire(5s) >= 1);
}

// Holder identity (issue 31): another client's lock names its holder,
// face "cpp", with the description given.
static void holder_identity() {
  dlock::options o;
  o.description = "cpp batch";
  dlock::client a = dlock::client::memory(o);
  dlock::client b = dlock::client::memory();
  dlock::lock held = a.lock("cpp/holder");
  dlock::lock seen = b.lock("cpp/holder");
  CHECK(!seen.holder());
  const std::uint64_t token = held.acquire(5s);
  std::optional<dlock::holder> h = seen.holder();
  CHECK(h && h->token == token && h->key.rfind("cpp/holder/", 0) == 0);
  CHECK(h && h->who && h->who->face == "cpp" && h->who->description == "cpp batch");
  CHECK(h && h->who && h->who->pid == static_cast<std::uint32_t>(getpid()) && h->who->started > 0);
  held.release();
  CHECK(!seen.holder());
  o.description = std::string(257, 'x');
  try {
    dlock::client::memory(o);
    CHECK(!"a 257-byte description was accepted");
  } catch (const dlock::error &e) {
    CHECK(e.code() == dlock::errc::invalid_option);
  }
}

int main() {
  alarm(120);  // a wait without limit that never ends fails the run (SIGALRM)
  codes();
  acquire_permit_release();
  callbacks_and_fence();
  options_and_sessions();
  options_left_out();
  fence_gate();
  acquire_start_and_cancel();
  elections();
  holder_identity();
  metrics_health_shutdown();  // last: it shuts down every client
  std::printf("cpp api (C++%ld): %d passed, %d failed\n", __cplusplus / 100 % 100, passed, failed);
  return failed ? 1 : 0;
}
