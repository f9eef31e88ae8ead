// examples/c/worker.c in C++ (include/dlock.hpp): units of work under
// permits, a clean stop when the lock is fenced.
//
// Embedded backend by default: the worker's network is cut after 1.5 s, so
// it drains, fences at its deadline and stops.
//
// With DLOCK_ENDPOINTS set it uses etcd (client::from_env, with the other
// DLOCK_* variables for TLS and auth) and commits every unit with a guarded
// put of RESULT_KEY, which etcd accepts only while the worker's token still
// holds the lock. It works 40 units, or until fenced: try
//   etcdctl del --prefix examples/worker/
// (the lock key, as an operator might): the worker fences at once
// (lock_lost), stops, and shows etcd refusing a write with its old token.
//
// With DLOCK_STORY=json every event is also printed as one JSON line, the
// same story as the C worker's (core/tests/c_worker*.rs check it).
//
// Build: pkg-config (see the Makefile beside this file) or CMake
// (find_package(dlock), CMakeLists.txt beside this file).
#include <dlock.hpp>

#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

using namespace std::chrono_literals;
using boot_clock = std::chrono::steady_clock;

namespace {

constexpr const char *result_key = "examples/worker-result";  // not under the lock's prefix
const auto start = boot_clock::now();
std::mutex out;
std::atomic<bool> fenced{false};  // set by on_fence: stop taking work
bool story_json = false;          // DLOCK_STORY=json: also print events as JSON

double seconds() { return std::chrono::duration<double>(boot_clock::now() - start).count(); }
long long elapsed_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(boot_clock::now() - start).count();
}

void say(const std::string &line) {
  std::lock_guard<std::mutex> g(out);
  std::printf("%7.3fs  %s\n", seconds(), line.c_str());
  std::fflush(stdout);
}

// One event of the story: {"who":"worker","event":NAME,"t_ms":N,FIELDS}.
// The values are numbers and dlock's names: nothing to escape.
void event(const char *name, const std::string &fields = {}) {
  if (!story_json) return;
  std::lock_guard<std::mutex> g(out);
  std::printf("{\"who\":\"worker\",\"event\":\"%s\",\"t_ms\":%lld%s%s}\n", name, elapsed_ms(),
              fields.empty() ? "" : ",", fields.c_str());
  std::fflush(stdout);
}

std::string quoted(const char *s) { return std::string("\"") + s + "\""; }
std::string num(std::uint64_t n) { return std::to_string(n); }

}  // namespace

int main() try {
  const char *story = std::getenv("DLOCK_STORY");
  story_json = story && std::strcmp(story, "json") == 0;
  const char *endpoints = std::getenv("DLOCK_ENDPOINTS");
  const bool embedded = !endpoints || !*endpoints;

  // Short settings so the story takes seconds: keepalive every second,
  // deadline = send time of the last confirmed keepalive + 3 s - 1 s.
  dlock::options opts;
  opts.ttl = 3s;
  opts.keepalive_interval = 1s;
  opts.keepalive_timeout = 300ms;
  opts.retry_interval = 250ms;
  opts.margin = 1s;
  opts.reacquire = false;  // this worker stops at the fence

  dlock::client client = embedded ? dlock::client::memory(opts) : dlock::client::from_env(opts);
  dlock::lock lock = client.lock("examples/worker");
  // Callbacks run on dlock's callback thread: keep them short, share by atomics.
  lock.on_fence([](std::uint64_t token, std::uint64_t in_flight) {
    say("FENCED token " + num(token) + " with " + num(in_flight) + " unit(s) in flight: stopping");
    event("fence", "\"token\":" + num(token) + ",\"in_flight\":" + num(in_flight));
    fenced = true;
  });
  lock.on_state_change([](lk_state from, lk_state to, lk_reason why) {
    const char *f = lk_state_name(from), *t = lk_state_name(to), *r = lk_reason_name(why);
    say(std::string(f) + " -> " + t + " (" + r + ")");
    event("state", "\"from\":" + quoted(f) + ",\"to\":" + quoted(t) + ",\"reason\":" + quoted(r));
  });

  const std::uint64_t token = lock.acquire(10s);
  const char *backend = embedded ? "embedded" : "etcd";
  say("holds the lock, token " + num(token) + " (" + backend + " backend)");
  event("holds", "\"token\":" + num(token) + ",\"backend\":" + quoted(backend));

  int units = 0;
  bool cut = false;
  dlock::errc last_refusal = dlock::errc::ok;
  auto commit = [&](std::uint64_t t, int unit) {
    return lock.guarded_put(t, result_key, "unit " + std::to_string(unit) + " token " + num(t));
  };
  while (!fenced && units < 40) {
    if (embedded && !cut && boot_clock::now() - start > 1500ms) {
      say("fault: the worker's network is cut; keepalives get no reply");
      event("cut");
      client.partition();
      cut = true;
    }
    dlock::permit permit = lock.permit();  // never throws: a refusal is the answer
    if (!permit) {
      const char *why = lk_status_name(static_cast<int>(permit.status()));
      if (permit.status() != last_refusal) {
        say(std::string("permit refused: ") + why);
        event("permit_refused", "\"status\":" + quoted(why));
      }
      last_refusal = permit.status();
      std::this_thread::sleep_for(50ms);
      continue;
    }
    last_refusal = dlock::errc::ok;
    const std::uint64_t t = permit.token();
    units++;
    std::this_thread::sleep_for(200ms);  // one unit of work; its writes carry token t
    const std::string u = std::to_string(units);
    if (!permit.valid()) {
      say("unit " + u + " is discarded: its permit is no longer valid");
      event("discard", "\"unit\":" + u + ",\"token\":" + num(t));
    } else if (embedded) {
      say("unit " + u + " commits under token " + num(t));
      event("commit", "\"unit\":" + u + ",\"token\":" + num(t) + ",\"guarded\":false");
    } else if (commit(t, units)) {
      say("unit " + u + " commits under token " + num(t) + " (guarded put to etcd)");
      event("commit", "\"unit\":" + u + ",\"token\":" + num(t) + ",\"guarded\":true");
    } else {
      say("unit " + u + " is refused by etcd: fenced");
      event("unit_refused", "\"unit\":" + u + ",\"token\":" + num(t) + ",\"status\":\"fenced\"");
    }
  }  // the permit ends here, in its destructor
  if (!embedded && fenced) {
    // What a straggler with the old token would get: etcd refuses it.
    const bool refused = !commit(token, units + 1);
    say("a late write under the old token " + num(token) + ": " + (refused ? "refused by etcd (fenced)" : "ok"));
    event("late_write", "\"token\":" + num(token) + ",\"status\":" + quoted(refused ? "fenced" : "ok") +
                            ",\"refused\":" + (refused ? "true" : "false"));
  }

  const std::uint64_t in_flight = lock.in_flight();
  say("worker stopped cleanly after " + std::to_string(units) + " unit(s); " + num(in_flight) + " in flight");
  event("stopped", "\"units\":" + std::to_string(units) + ",\"in_flight\":" + num(in_flight));
  if (cut) client.heal();
  lock.release();
  return 0;  // the lock, then the client, are freed by their destructors
} catch (const dlock::error &e) {
  std::cerr << "worker: " << e.code().message() << ": " << e.what() << "\n";
  return 1;
}
