// dlock.hpp: the C++17 face of dlock, header-only, over the C ABI of
// dlock.h (link libdlock as for C: pkg-config --cflags --libs dlock, or
// CMake's find_package(dlock) and the target dlock::dlock).
//
// It converts types and decides nothing: the Rust core behind libdlock
// keeps the leases, deadlines and tokens (docs/design.md §19).
//
// - Handles (client, session, lock, semaphore, rwlock, fence_gate) are move-only
//   and free their C handle in the destructor; a moved-from handle is
//   empty.
// - Setup and acquire failures throw dlock::error, a std::system_error
//   whose code is in dlock::category() (the lk_ status words).
// - lock::permit() never throws: a refusal (draining, fenced, released,
//   not_held) is the normal way work stops. The permit holds struct
//   lk_permit by value (no allocation) and ends in its destructor.
// - Names and durations are checked as in every face: a name holding a NUL
//   is refused by the core (lk_check_name), not cut short by c_str(); a
//   negative duration is refused (invalid_option for a setting,
//   invalid_argument for a timeout or grace), never clamped to 0.
// - Durations are std::chrono; callbacks are std::function, run on
//   dlock's callback thread (see "Callbacks" in dlock.h; an observer's on
//   a thread of its own). A callback must not throw: the trampolines are
//   noexcept, so a throw ends the process.
// - options: a timing setting left empty stays unset, and the core derives
//   it from the ones given (docs/design.md §14), as in every other face.
// - Elections (client::election, session::election) and observers
//   (client::observe) wrap lk_election_* and lk_observer_*.
// - Semaphores (client::semaphore, session::semaphore) wrap
//   lk_semaphore_*: acquire() gives a held dlock::lock with slot().
// - Read/write locks (client::rwlock, session::rwlock) wrap lk_rwlock_*:
//   reader() and writer() give a dlock::lock with mode() and downgrade().
//
// Guide: docs/cpp.md; example: examples/cpp/worker.cpp.

#ifndef DLOCK_HPP
#define DLOCK_HPP

#include "dlock.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace dlock {

/// The lk_ status codes as a std::error_code enum (values equal enum lk_status).
enum class errc : int {
  ok = LK_OK,
  draining = LK_DRAINING,
  fenced = LK_FENCED,
  released = LK_RELEASED,
  not_held = LK_NOT_HELD,
  timeout = LK_TIMEOUT,
  would_block = LK_WOULD_BLOCK,
  already_held = LK_ALREADY_HELD,
  invalid_option = LK_INVALID_OPTION,
  invalid_argument = LK_INVALID_ARGUMENT,
  null_parameter = LK_NULL_PARAMETER,
  backend = LK_BACKEND,
  shutdown = LK_SHUTDOWN,
  forked = LK_FORKED,
  stale = LK_STALE,
  panic = LK_PANIC,
};

namespace detail {
class category_impl final : public std::error_category {
 public:
  const char *name() const noexcept override { return "dlock"; }
  std::string message(int code) const override { return lk_status_name(code); }
};
}  // namespace detail

/// The one category of dlock's codes. An inline function's static is one
/// object in the whole program, so codes compare equal across translation
/// units and shared objects built from this header.
inline const std::error_category &category() noexcept {
  static const detail::category_impl instance;
  return instance;
}

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), category()};
}

/// A failed setup or acquire: code() is the status, what() adds the call
/// and the library's message (lk_last_error).
class error : public std::system_error {
 public:
  error(enum lk_status status, const char *call)
      : std::system_error(static_cast<int>(status), category(), message_of(call)) {}
  /// A failure this header finds before any call (no lk_last_error).
  static error refused(enum lk_status status, const std::string &message) { return error(status, message, 0); }
  errc status() const noexcept { return static_cast<errc>(code().value()); }

 private:
  error(enum lk_status status, const std::string &message, int)
      : std::system_error(static_cast<int>(status), category(), message) {}
  static std::string message_of(const char *call) {
    std::string m = call;
    const char *last = lk_last_error();
    if (last && *last) m.append(": ").append(last);
    return m;
  }
};

namespace detail {
inline void check(enum lk_status s, const char *call) {
  if (s != LK_OK) throw error(s, call);
}
/// A duration argument (a timeout, a grace) in ms. C takes no negative
/// one, so a negative one is refused here (invalid_argument) rather than
/// clamped to 0, which would turn a wait into a single try.
inline std::uint64_t to_ms(std::chrono::milliseconds d, const char *what) {
  if (d.count() < 0)
    throw error::refused(LK_INVALID_ARGUMENT,
                         std::string(what) + " must be >= 0 milliseconds, got " + std::to_string(d.count()));
  return static_cast<std::uint64_t>(d.count());
}
/// A lock or election name as the C string the C API takes: checked by
/// the core's rule first (lk_check_name), so a name holding a NUL is
/// refused (invalid_argument) instead of being cut short by c_str().
inline const char *name(const std::string &n) {
  check(lk_check_name(reinterpret_cast<const std::uint8_t *>(n.data()), n.size()), "lk_check_name");
  return n.c_str();
}
inline std::chrono::milliseconds from_ms(std::uint64_t ms) {
  return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(ms));
}
/// A setting given, in ms; LK_UNSET_MS when left out, so the core derives
/// it. A negative one is refused here: clamping it would hide the mistake.
inline void set_ms(std::uint64_t &field, const std::optional<std::chrono::milliseconds> &d, const char *setting) {
  if (!d) return;
  if (d->count() < 0)
    throw error::refused(LK_INVALID_OPTION, std::string("dlock::options: ") + setting + " must not be negative, got " +
                                                std::to_string(d->count()) + " ms");
  field = static_cast<std::uint64_t>(d->count());
}
inline const std::uint8_t *bytes(std::string_view s) noexcept {
  return reinterpret_cast<const std::uint8_t *>(s.data());
}
}  // namespace detail

/// Settings of a client or a session. A timing setting left empty stays
/// unset: the core derives it from the ones given (docs/design.md §14),
/// so `o.ttl = 60s` alone also gets a longer keepalive interval, and with
/// none given the core's defaults (LK_DEFAULT_*_MS). options() on a client
/// or session reads what they became. Empty strings mean "not set"; empty
/// endpoints: the embedded backend. The other fields start at the C
/// defaults (LK_CLIENT_OPTIONS_INIT).
struct options {
  std::optional<std::chrono::milliseconds> ttl;
  std::optional<std::chrono::milliseconds> keepalive_interval;
  std::optional<std::chrono::milliseconds> keepalive_timeout;
  std::optional<std::chrono::milliseconds> retry_interval;
  std::optional<std::chrono::milliseconds> margin;
  bool reacquire = true;
  std::string endpoints, ca_file, cert_file, key_file, user, password;
  bool allow_plaintext_password = false;
  std::optional<std::chrono::milliseconds> connect_timeout;
  std::optional<std::chrono::milliseconds> request_timeout;
  /// Who this client is, recorded beside each of its sessions' leases with
  /// the host, pid and process start (lock::holder() and `dlock show` in
  /// other processes read it); empty: none.
  std::string description;

  /// The C struct; its strings point into this object, so keep it alive
  /// for the call that reads them. Throws dlock::error (invalid_option)
  /// for a negative duration.
  lk_client_options c_options() const {
    lk_client_options o = LK_CLIENT_OPTIONS_INIT;
    detail::set_ms(o.ttl_ms, ttl, "ttl");
    detail::set_ms(o.keepalive_interval_ms, keepalive_interval, "keepalive_interval");
    detail::set_ms(o.keepalive_timeout_ms, keepalive_timeout, "keepalive_timeout");
    detail::set_ms(o.retry_interval_ms, retry_interval, "retry_interval");
    detail::set_ms(o.margin_ms, margin, "margin");
    o.reacquire = reacquire;
    auto str = [](const std::string &s) { return s.empty() ? nullptr : s.c_str(); };
    o.endpoints = str(endpoints);
    o.ca_file = str(ca_file);
    o.cert_file = str(cert_file);
    o.key_file = str(key_file);
    o.user = str(user);
    o.password = str(password);
    o.allow_plaintext_password = allow_plaintext_password;
    detail::set_ms(o.connect_timeout_ms, connect_timeout, "connect_timeout");
    detail::set_ms(o.request_timeout_ms, request_timeout, "request_timeout");
    o.description = str(description);
    o.face = "cpp";
    return o;
  }
};

/// The timing a client or session runs with: the settings given and the
/// ones the core derived from them (client::options, session::options).
struct timing {
  std::chrono::milliseconds ttl;
  std::chrono::milliseconds keepalive_interval;
  std::chrono::milliseconds keepalive_timeout;
  std::chrono::milliseconds retry_interval;
  std::chrono::milliseconds margin;
  bool reacquire;
};

/// Permission for one unit of work, or the reason it was refused.
/// Holds struct lk_permit by value: no allocation. Ends (counted out of
/// flight) in its destructor or at end(). Move-only.
class permit {
 public:
  permit() noexcept = default;
  permit(const permit &) = delete;
  permit &operator=(const permit &) = delete;
  permit(permit &&o) noexcept : raw_(o.raw_), status_(o.status_) { o.reset(); }
  permit &operator=(permit &&o) noexcept {
    if (this != &o) {
      end();
      raw_ = o.raw_;
      status_ = o.status_;
      o.reset();
    }
    return *this;
  }
  ~permit() { end(); }

  /// Granted and not yet ended.
  explicit operator bool() const noexcept { return status_ == LK_OK; }
  /// errc::ok while granted; the refusal (draining, fenced, released,
  /// not_held) otherwise; errc::not_held once ended.
  errc status() const noexcept { return static_cast<errc>(status_); }
  /// The token every write of this unit of work carries; 0 if not granted.
  std::uint64_t token() const noexcept {
    std::uint64_t t = 0;
    return lk_permit_token(&raw_, &t) == LK_OK ? t : 0;
  }
  /// Whether the work may still commit (re-reads the clock).
  bool valid() const noexcept { return lk_permit_valid(&raw_); }
  /// Ends the unit of work; again: nothing.
  void end() noexcept {
    lk_permit_end(&raw_);
    if (status_ == LK_OK) status_ = LK_NOT_HELD;
  }
  const struct lk_permit &native() const noexcept { return raw_; }

 private:
  friend class lock;
  void reset() noexcept {
    raw_ = LK_PERMIT_INIT;
    status_ = LK_NOT_HELD;
  }
  struct lk_permit raw_ = LK_PERMIT_INIT;
  enum lk_status status_ = LK_NOT_HELD;
};

/// A pending acquisition (lock::acquire_start): cancel() leaves nothing
/// held by it, whenever it is called. Move-only; the destructor frees the
/// handle without cancelling (as lk_acquisition_free: `done` still runs).
class acquisition {
 public:
  acquisition() noexcept = default;
  explicit acquisition(struct lk_acquisition *raw) noexcept : raw_(raw) {}
  acquisition(const acquisition &) = delete;
  acquisition &operator=(const acquisition &) = delete;
  acquisition(acquisition &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  acquisition &operator=(acquisition &&o) noexcept {
    if (this != &o) {
      lk_acquisition_free(raw_);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~acquisition() { lk_acquisition_free(raw_); }

  /// Ends a wait in the queue (`done` gets errc::released if it has not
  /// run), deletes a key its request put, releases the lock if it already
  /// won it (while it still holds that token). Never blocks; again: nothing.
  void cancel() { detail::check(lk_acquisition_cancel(raw_), "lk_acquisition_cancel"); }
  struct lk_acquisition *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  struct lk_acquisition *raw_ = nullptr;
};

/// One named lock; the destructor releases it (lk_lock_free).
/// Who holds a lease, as its session recorded it (lock::holder()).
struct identity {
  std::string host;
  std::uint32_t pid = 0;
  std::uint64_t started = 0;  ///< process start, Unix seconds (0: unknown)
  std::string face, version;  ///< "c", "cpp", "python", … and its version
  std::string description;    ///< empty: none given
};

/// A lock's holder as the service sees it (lock::holder()).
struct holder {
  std::string key;            ///< `<name>/<lease hex>`
  std::uint64_t token = 0;    ///< its fencing token
  std::int64_t lease = 0;     ///< the lease it is held under
  std::optional<dlock::identity> who;  ///< none for `etcdctl lock`
};

class lock {
 public:
  using fence_fn = std::function<void(std::uint64_t token, std::uint64_t in_flight)>;
  using state_change_fn = std::function<void(lk_state from, lk_state to, lk_reason why)>;
  using acquired_fn = std::function<void(std::uint64_t token)>;
  using drained_fn = std::function<void()>;
  /// The outcome of acquire_start: errc::ok with the token, or the status
  /// acquire() would have thrown (errc::released after cancel()).
  using acquire_done_fn = std::function<void(errc status, std::uint64_t token)>;

  lock() noexcept = default;
  /// Takes ownership of a C handle.
  explicit lock(struct lk_lock *raw) : raw_(raw), kept_(std::make_unique<kept>()) {}
  lock(const lock &) = delete;
  lock &operator=(const lock &) = delete;
  lock(lock &&o) noexcept
      : raw_(std::exchange(o.raw_, nullptr)), kept_(std::move(o.kept_)), owned_(std::exchange(o.owned_, true)) {}
  lock &operator=(lock &&o) noexcept {
    if (this != &o) {
      free();
      raw_ = std::exchange(o.raw_, nullptr);
      kept_ = std::move(o.kept_);
      owned_ = std::exchange(o.owned_, true);
    }
    return *this;
  }
  /// Releases without waiting for the delete, and waits for its callbacks.
  ~lock() { free(); }

  /// Waits up to `timeout` for the lock; returns the fencing token.
  /// Throws dlock::error (timeout, already_held, released, backend, ...).
  std::uint64_t acquire(std::chrono::milliseconds timeout) {
    std::uint64_t token = 0;
    detail::check(lk_lock_acquire(raw_, detail::to_ms(timeout, "timeout"), &token), "lk_lock_acquire");
    return token;
  }
  /// The token if nobody held the lock; std::nullopt if someone does.
  std::optional<std::uint64_t> try_acquire() {
    std::uint64_t token = 0;
    enum lk_status s = lk_lock_try_acquire(raw_, &token);
    if (s == LK_WOULD_BLOCK) return std::nullopt;
    detail::check(s, "lk_lock_try_acquire");
    return token;
  }
  /// Starts acquiring and returns at once; `done` runs exactly once on
  /// dlock's callback thread, in order with the lock's callbacks, with
  /// the outcome (every failure of the acquisition comes through it).
  /// Throws only when nothing started (then `done` never runs).
  acquisition acquire_start(std::chrono::milliseconds timeout, acquire_done_fn done) {
    auto held = std::make_unique<acquire_done_fn>(std::move(done));
    struct lk_acquisition *a = nullptr;
    detail::check(lk_lock_acquire_start(raw_, detail::to_ms(timeout, "timeout"), &done_call, held.get(), &a),
                  "lk_lock_acquire_start");
    held.release();  // done_call owns it now: it runs exactly once
    return acquisition(a);
  }
  void release() { detail::check(lk_lock_release(raw_), "lk_lock_release"); }
  /// Releases and ends the callbacks; the handle stays (and frees later).
  void close() { detail::check(lk_lock_close(raw_), "lk_lock_close"); }

  /// Never throws: a refusal is the answer, not an error.
  class permit permit() const noexcept {
    class permit p;
    p.status_ = lk_permit(raw_, &p.raw_);
    return p;
  }

  lk_state state() const {
    enum lk_state s = LK_STATE_IDLE;
    detail::check(lk_lock_state(raw_, &s), "lk_lock_state");
    return s;
  }
  /// The token held (Holding or Draining), else std::nullopt.
  std::optional<std::uint64_t> token() const noexcept {
    std::uint64_t t = 0;
    if (lk_lock_token(raw_, &t) != LK_OK) return std::nullopt;
    return t;
  }
  /// Time left before the deadline (Holding or Draining), else std::nullopt.
  std::optional<std::chrono::milliseconds> time_left() const noexcept {
    std::uint64_t ms = 0;
    if (lk_lock_time_left(raw_, &ms) != LK_OK) return std::nullopt;
    return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(ms));
  }
  std::uint64_t in_flight() const {
    std::uint64_t n = 0;
    detail::check(lk_lock_in_flight(raw_, &n), "lk_lock_in_flight");
    return n;
  }
  /// For a health endpoint: false once the lock is still holding or
  /// draining more than `max_overdue` past its deadline (a fence that was
  /// due did not happen); a lock not held is healthy.
  bool healthy(std::chrono::milliseconds max_overdue = std::chrono::milliseconds(LK_DEFAULT_MAX_OVERDUE_MS)) const {
    bool h = true;
    detail::check(lk_lock_healthy(raw_, detail::to_ms(max_overdue, "max_overdue"), &h), "lk_lock_healthy");
    return h;
  }
  std::string_view name() const noexcept {
    const char *n = lk_lock_name(raw_);
    return n ? std::string_view(n) : std::string_view();
  }
  /// The semaphore slot this lock is (semaphore::acquire's locks);
  /// std::nullopt for a lock that is not a semaphore's.
  std::optional<std::uint32_t> slot() const noexcept {
    std::uint32_t s = 0;
    if (lk_lock_slot(raw_, &s) != LK_OK) return std::nullopt;
    return s;
  }
  /// LK_MODE_READ / LK_MODE_WRITE for a read/write lock's holder (a
  /// downgraded writer reads), LK_MODE_NONE for a plain lock.
  lk_mode mode() const {
    lk_mode m = LK_MODE_NONE;
    detail::check(lk_lock_mode(raw_, &m), "lk_lock_mode");
    return m;
  }
  /// A held writer becomes a reader, keeping its key and token (a
  /// reader's does nothing). Throws dlock::error: invalid_argument (a
  /// plain lock), not_held, fenced, backend.
  void downgrade() { detail::check(lk_lock_downgrade(raw_), "lk_lock_downgrade"); }

  /// Writes `key` = `value` only while `token` holds the lock; false when
  /// it no longer does (fenced). Throws for other failures.
  bool guarded_put(std::uint64_t token, std::string_view key, std::string_view value) {
    enum lk_status s =
        lk_lock_guarded_put(raw_, token, detail::bytes(key), key.size(), detail::bytes(value), value.size());
    if (s == LK_FENCED) return false;
    detail::check(s, "lk_lock_guarded_put");
    return true;
  }
  bool guarded_delete(std::uint64_t token, std::string_view key) {
    enum lk_status s = lk_lock_guarded_delete(raw_, token, detail::bytes(key), key.size());
    if (s == LK_FENCED) return false;
    detail::check(s, "lk_lock_guarded_delete");
    return true;
  }
  /// Who holds the lock now (any process; one read of the service),
  /// std::nullopt when nothing holds it.
  std::optional<dlock::holder> holder() const {
    struct guard {
      struct lk_holder h = LK_HOLDER_INIT;
      ~guard() { lk_holder_clear(&h); }
    } g;
    detail::check(lk_lock_holder(raw_, &g.h), "lk_lock_holder");
    if (!g.h.held) return std::nullopt;
    auto str = [](const char *p) { return p ? std::string(p) : std::string(); };
    dlock::holder out{str(g.h.key), g.h.token, g.h.lease, std::nullopt};
    if (g.h.has_identity)
      out.who = dlock::identity{str(g.h.host), g.h.pid,          g.h.started,
                                str(g.h.face), str(g.h.face_version), str(g.h.description)};
    return out;
  }

  /// Callbacks (an empty function removes one). Each function is kept
  /// until the lock is freed, as a call of a replaced one may be queued.
  void on_fence(fence_fn f) { set(std::move(f), lk_set_on_fence, &fence_call, "lk_set_on_fence"); }
  void on_state_change(state_change_fn f) {
    set(std::move(f), lk_set_on_state_change, &state_call, "lk_set_on_state_change");
  }
  void on_acquired(acquired_fn f) { set(std::move(f), lk_set_on_acquired, &acquired_call, "lk_set_on_acquired"); }
  void on_drained(drained_fn f) { set(std::move(f), lk_set_on_drained, &drained_call, "lk_set_on_drained"); }

  struct lk_lock *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 protected:
  /// The lock of an election: lk_election_free frees it, never this.
  struct borrowed {};
  lock(const struct lk_lock *raw, borrowed)
      : raw_(const_cast<struct lk_lock *>(raw)), kept_(std::make_unique<kept>()), owned_(false) {}
  static void done_call(void *f, enum lk_status status, std::uint64_t token) noexcept {
    std::unique_ptr<acquire_done_fn> done(static_cast<acquire_done_fn *>(f));
    if (*done) (*done)(static_cast<errc>(status), token);
  }

 private:
  // The callbacks' storage, on the heap so a moved lock keeps the
  // addresses the C side holds.
  struct kept {
    std::vector<std::shared_ptr<void>> functions;
  };

  static void fence_call(void *f, std::uint64_t token, std::uint64_t in_flight) noexcept {
    (*static_cast<fence_fn *>(f))(token, in_flight);
  }
  static void state_call(void *f, enum lk_state from, enum lk_state to, enum lk_reason why) noexcept {
    (*static_cast<state_change_fn *>(f))(from, to, why);
  }
  static void acquired_call(void *f, std::uint64_t token) noexcept { (*static_cast<acquired_fn *>(f))(token); }
  static void drained_call(void *f) noexcept { (*static_cast<drained_fn *>(f))(); }

  template <class F, class Setter, class Tramp>
  void set(F f, Setter setter, Tramp tramp, const char *call) {
    if (!f) {
      detail::check(setter(raw_, nullptr, nullptr), call);
      return;
    }
    auto held = std::make_shared<F>(std::move(f));
    detail::check(setter(raw_, tramp, held.get()), call);
    kept_->functions.push_back(std::move(held));
  }
  void free() noexcept {
    if (owned_) lk_lock_free(raw_);  // waits for a running callback; none runs after
    raw_ = nullptr;
    kept_.reset();
  }

  struct lk_lock *raw_ = nullptr;
  std::unique_ptr<kept> kept_;
  bool owned_ = true;  // false: an election's lock (freed with it)
};

/// A leader as the service sees it (election::leader, observer events).
struct leader {
  std::string key;    ///< `<name>/<lease hex>`
  std::string value;  ///< what it campaigned with or last proclaimed (bytes)
  std::uint64_t token = 0;  ///< the leader key's create revision: its fencing token
  std::int64_t lease = 0;   ///< the lease the key is held under

  friend bool operator==(const leader &a, const leader &b) {
    return a.token == b.token && a.lease == b.lease && a.key == b.key && a.value == b.value;
  }
  friend bool operator!=(const leader &a, const leader &b) { return !(a == b); }
};

/// What an observer reports (values equal enum lk_observed).
enum class observed_kind : int {
  leader = LK_OBSERVED_LEADER,          ///< a new leader (or the current one, first)
  proclaimed = LK_OBSERVED_PROCLAIMED,  ///< the same leader, a new value
  no_leader = LK_OBSERVED_NO_LEADER,    ///< nobody leads
  reconnecting = LK_OBSERVED_RECONNECTING,  ///< the watch reopens; the state follows
};

/// One event of an observer: its kind, and the leader for `leader` and
/// `proclaimed` (empty for the others).
struct observed {
  observed_kind kind = observed_kind::no_leader;
  std::optional<dlock::leader> leader;
};

namespace detail {
/// A copy of a filled lk_leader, std::nullopt when nobody leads.
inline std::optional<dlock::leader> copy_leader(const struct lk_leader &l) {
  if (!l.has_leader) return std::nullopt;
  dlock::leader out;
  if (l.key) out.key = l.key;
  if (l.value) out.value.assign(reinterpret_cast<const char *>(l.value), l.value_len);
  out.token = l.token;
  out.lease = l.lease;
  return out;
}
/// Clears a filled lk_leader on every path (lk_leader_clear).
struct leader_guard {
  struct lk_leader l = LK_LEADER_INIT;
  leader_guard() = default;
  leader_guard(const leader_guard &) = delete;
  leader_guard &operator=(const leader_guard &) = delete;
  ~leader_guard() { lk_leader_clear(&l); }
};
}  // namespace detail

/// One candidate in the election `name` (docs/elections.md), made by
/// client::election or session::election: a lock that carries a value.
/// The lock's API works on it (permit() for each unit of leader work,
/// on_fence and the other callbacks, token(), state(), close()); with the
/// session's reacquire (the default) a fenced leader campaigns again with
/// its last value. Move-only; the destructor releases (resigns without
/// waiting: resign() first to let the work in flight end).
class election : private lock {
 public:
  using lock::acquire_done_fn;
  using lock::acquired_fn;
  using lock::drained_fn;
  using lock::fence_fn;
  using lock::state_change_fn;

  election() noexcept = default;
  /// Takes ownership of a C handle.
  explicit election(struct lk_election *raw) : lock(lk_election_lock(raw), borrowed{}), raw_(raw) {}
  election(const election &) = delete;
  election &operator=(const election &) = delete;
  election(election &&o) noexcept : lock(std::move(o)), raw_(std::exchange(o.raw_, nullptr)) {}
  election &operator=(election &&o) noexcept {
    if (this != &o) {
      lk_election_free(raw_);  // waits for its callbacks, then the lock's storage goes
      raw_ = std::exchange(o.raw_, nullptr);
      lock::operator=(std::move(o));
    }
    return *this;
  }
  ~election() { lk_election_free(raw_); }

  /// Campaigns with `value` (any bytes) and waits up to `timeout` to lead
  /// (0: one try); returns the leader's token. Throws dlock::error:
  /// timeout (nothing held; would_block for one try), released (the
  /// session is closed), invalid_argument (a value over the limit), backend.
  std::uint64_t campaign(std::string_view value, std::chrono::milliseconds timeout) {
    std::uint64_t token = 0;
    detail::check(
        lk_election_campaign(raw_, detail::bytes(value), value.size(), detail::to_ms(timeout, "timeout"), &token),
        "lk_election_campaign");
    return token;
  }
  /// campaign without blocking, as lock::acquire_start: `done` runs once
  /// on dlock's callback thread with errc::ok and the token or the status
  /// campaign() would have thrown; acquisition::cancel() leaves nothing held.
  acquisition campaign_start(std::string_view value, std::chrono::milliseconds timeout, acquire_done_fn done) {
    auto held = std::make_unique<acquire_done_fn>(std::move(done));
    struct lk_acquisition *a = nullptr;
    detail::check(lk_election_campaign_start(raw_, detail::bytes(value), value.size(), detail::to_ms(timeout, "timeout"),
                                             &done_call, held.get(), &a),
                  "lk_election_campaign_start");
    held.release();  // done_call owns it now: it runs exactly once
    return acquisition(a);
  }
  /// Puts a new value in the leader's key (same token). Throws
  /// dlock::error: fenced (the leadership was lost), not_held (not leading).
  void proclaim(std::string_view value) {
    detail::check(lk_election_proclaim(raw_, detail::bytes(value), value.size()), "lk_election_proclaim");
  }
  /// Steps down: no permit from now on; the key goes once the permits in
  /// flight end, or after `grace` with some still running, so the next
  /// leader starts only after this one's work. Campaigning again is allowed.
  void resign(std::chrono::milliseconds grace = std::chrono::milliseconds(LK_RESIGN_GRACE_MS)) {
    detail::check(lk_election_resign(raw_, detail::to_ms(grace, "grace")), "lk_election_resign");
  }
  /// The current leader (one read of the service), std::nullopt when
  /// nobody leads.
  std::optional<dlock::leader> leader() const {
    detail::leader_guard g;
    detail::check(lk_election_leader(raw_, &g.l), "lk_election_leader");
    return detail::copy_leader(g.l);
  }

  // The lock's API on the election's lock.
  using lock::close;
  using lock::guarded_delete;
  using lock::guarded_put;
  using lock::healthy;
  using lock::in_flight;
  using lock::name;
  using lock::on_acquired;
  using lock::on_drained;
  using lock::on_fence;
  using lock::on_state_change;
  using lock::permit;
  using lock::state;
  using lock::time_left;
  using lock::token;

  struct lk_election *native() const noexcept { return raw_; }
  /// The election's lock for the lk_lock_* functions (never lk_lock_free).
  struct lk_lock *native_lock() const noexcept { return lock::native(); }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  struct lk_election *raw_ = nullptr;
};

/// An observer of one election (client::observe): no lease, no key. The
/// first event is the current state; then one per change. Pull them with
/// next(), or get them in the callback given to client::observe (then
/// next() is refused). Move-only; the destructor closes and frees.
class observer {
 public:
  /// Runs for each event, in order, on a thread of this observer's own.
  using observed_fn = std::function<void(const observed &)>;

  observer() noexcept = default;
  /// Takes ownership of a C handle (lk_observer_new).
  explicit observer(struct lk_observer *raw) noexcept : raw_(raw) {}
  observer(const observer &) = delete;
  observer &operator=(const observer &) = delete;
  observer(observer &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)), fn_(std::move(o.fn_)) {}
  observer &operator=(observer &&o) noexcept {
    if (this != &o) {
      lk_observer_free(raw_);  // the callback runs no more once it returns
      raw_ = std::exchange(o.raw_, nullptr);
      fn_ = std::move(o.fn_);
    }
    return *this;
  }
  ~observer() { lk_observer_free(raw_); }

  /// The next event, waiting up to `timeout` (0: one already waiting);
  /// std::nullopt when none came. Throws dlock::error: released once the
  /// observer is closed (also while waiting), invalid_argument on a
  /// callback observer.
  std::optional<observed> next(std::chrono::milliseconds timeout) { return next_ms(detail::to_ms(timeout, "timeout")); }
  /// The next event, waiting as long as it takes (or until close()).
  observed next() {
    for (;;)
      if (auto e = next_ms(UINT64_MAX)) return *e;
  }
  /// Ends the observation: a waiting next() throws errc::released, and
  /// once it returns the callback runs no more. Again: nothing.
  void close() { detail::check(lk_observer_close(raw_), "lk_observer_close"); }

  struct lk_observer *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  friend class client;
  observer(struct lk_observer *raw, std::unique_ptr<observed_fn> fn) noexcept : raw_(raw), fn_(std::move(fn)) {}

  std::optional<observed> next_ms(std::uint64_t ms) {
    enum lk_observed what = LK_OBSERVED_NO_LEADER;
    detail::leader_guard g;
    enum lk_status s = lk_observer_next(raw_, ms, &what, &g.l);
    if (s == LK_TIMEOUT) return std::nullopt;
    detail::check(s, "lk_observer_next");
    return observed{static_cast<observed_kind>(what), detail::copy_leader(g.l)};
  }
  static void observed_call(void *f, enum lk_observed what, const struct lk_leader *l) noexcept {
    observed e{static_cast<observed_kind>(what), l ? detail::copy_leader(*l) : std::nullopt};
    auto &fn = *static_cast<observed_fn *>(f);
    if (fn) fn(e);
  }

  struct lk_observer *raw_ = nullptr;
  // On the heap, so a moved observer keeps the address the C side holds.
  std::unique_ptr<observed_fn> fn_;
};

/// A counting semaphore (docs/design.md §26), made by client::semaphore or
/// session::semaphore: at most limit() holders at once, each holding one
/// slot, an ordinary lock named `<name>/slot/<i>`. acquire() gives that
/// held lock (permit(), callbacks, token(), slot(); its destructor
/// releases the slot). Holds nothing itself. Move-only.
class semaphore {
 public:
  semaphore() noexcept = default;
  /// Takes ownership of a C handle.
  explicit semaphore(struct lk_semaphore *raw) noexcept : raw_(raw) {}
  semaphore(const semaphore &) = delete;
  semaphore &operator=(const semaphore &) = delete;
  semaphore(semaphore &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  semaphore &operator=(semaphore &&o) noexcept {
    if (this != &o) {
      lk_semaphore_free(raw_);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  /// Frees the handle; the locks acquired from it stay held.
  ~semaphore() { lk_semaphore_free(raw_); }

  /// Waits up to `timeout` for any free slot (0: one try); returns that
  /// slot's held lock. Throws dlock::error: timeout (nothing held;
  /// would_block for one try), released, backend.
  class lock acquire(std::chrono::milliseconds timeout) {
    struct lk_lock *l = nullptr;
    detail::check(lk_semaphore_acquire(raw_, detail::to_ms(timeout, "timeout"), &l), "lk_semaphore_acquire");
    return dlock::lock(l);
  }
  /// A free slot's held lock, or std::nullopt when every slot is held.
  std::optional<class lock> try_acquire() {
    struct lk_lock *l = nullptr;
    enum lk_status s = lk_semaphore_try_acquire(raw_, &l);
    if (s == LK_WOULD_BLOCK) return std::nullopt;
    detail::check(s, "lk_semaphore_try_acquire");
    return dlock::lock(l);
  }
  /// How many holders it admits at once.
  std::uint32_t limit() const {
    std::uint32_t n = 0;
    detail::check(lk_semaphore_limit(raw_, &n), "lk_semaphore_limit");
    return n;
  }
  std::string_view name() const noexcept {
    const char *n = lk_semaphore_name(raw_);
    return n ? std::string_view(n) : std::string_view();
  }
  struct lk_semaphore *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  struct lk_semaphore *raw_ = nullptr;
};

/// A read/write lock (docs/design.md §27), made by client::rwlock or
/// session::rwlock: reader() and writer() give ordinary locks, not
/// acquired yet, with mode(). Holds nothing itself; the locks outlive it.
/// Readers that share a name need sessions of their own: two holders on
/// one session exclude each other. Move-only.
class rwlock {
 public:
  rwlock() noexcept = default;
  /// Takes ownership of a C handle.
  explicit rwlock(struct lk_rwlock *raw) noexcept : raw_(raw) {}
  rwlock(const rwlock &) = delete;
  rwlock &operator=(const rwlock &) = delete;
  rwlock(rwlock &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  rwlock &operator=(rwlock &&o) noexcept {
    if (this != &o) {
      lk_rwlock_free(raw_);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~rwlock() { lk_rwlock_free(raw_); }

  /// A new reader: holds together with other readers, never a writer.
  class lock reader() const {
    struct lk_lock *l = nullptr;
    detail::check(lk_rwlock_reader(raw_, &l), "lk_rwlock_reader");
    return dlock::lock(l);
  }
  /// A new writer: holds alone.
  class lock writer() const {
    struct lk_lock *l = nullptr;
    detail::check(lk_rwlock_writer(raw_, &l), "lk_rwlock_writer");
    return dlock::lock(l);
  }
  std::string_view name() const noexcept {
    const char *n = lk_rwlock_name(raw_);
    return n ? std::string_view(n) : std::string_view();
  }
  struct lk_rwlock *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  struct lk_rwlock *raw_ = nullptr;
};

/// One lease shared by many locks.
class session {
 public:
  session() noexcept = default;
  explicit session(struct lk_session *raw) noexcept : raw_(raw) {}
  session(const session &) = delete;
  session &operator=(const session &) = delete;
  session(session &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  session &operator=(session &&o) noexcept {
    if (this != &o) {
      lk_session_free(raw_);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~session() { lk_session_free(raw_); }

  class lock lock(const std::string &name) const {
    struct lk_lock *l = nullptr;
    detail::check(lk_session_lock_new(raw_, detail::name(name), &l), "lk_session_lock_new");
    return dlock::lock(l);
  }
  /// A candidate in the election `name` on this session (its own lease
  /// and deadline); not campaigning yet.
  class election election(const std::string &name) const {
    struct lk_election *e = nullptr;
    detail::check(lk_session_election_new(raw_, detail::name(name), &e), "lk_session_election_new");
    return dlock::election(e);
  }
  /// A semaphore of `limit` slots called `name` on this session (its
  /// slots held under this lease). The first handle of `name` records
  /// the limit; throws dlock::error (invalid_argument) for another limit,
  /// 0 or over LK_MAX_SEMAPHORE_LIMIT.
  class semaphore semaphore(const std::string &name, std::uint32_t limit) const {
    struct lk_semaphore *s = nullptr;
    detail::check(lk_session_semaphore_new(raw_, detail::name(name), limit, &s), "lk_session_semaphore_new");
    return dlock::semaphore(s);
  }
  /// The read/write lock `name` on this session (its holders held under
  /// this lease); sends nothing.
  class rwlock rwlock(const std::string &name) const {
    struct lk_rwlock *r = nullptr;
    detail::check(lk_session_rwlock_new(raw_, detail::name(name), &r), "lk_session_rwlock_new");
    return dlock::rwlock(r);
  }
  /// Releases every lock of the session and revokes its lease.
  void close() { detail::check(lk_session_close(raw_), "lk_session_close"); }
  /// The timing the session runs with: the settings given and the ones
  /// the core derived from them.
  timing options() const {
    lk_client_options o = LK_CLIENT_OPTIONS_INIT;
    detail::check(lk_session_options(raw_, &o), "lk_session_options");
    return {detail::from_ms(o.ttl_ms),         detail::from_ms(o.keepalive_interval_ms),
            detail::from_ms(o.keepalive_timeout_ms), detail::from_ms(o.retry_interval_ms),
            detail::from_ms(o.margin_ms),      o.reacquire};
  }
  /// The lease id, or std::nullopt while none is granted.
  std::optional<std::int64_t> lease() const noexcept {
    std::int64_t l = 0;
    if (lk_session_lease(raw_, &l) != LK_OK) return std::nullopt;
    return l;
  }
  struct lk_session *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  struct lk_session *raw_ = nullptr;
};

/// A connection to a lock service; its locks outlive it.
class client {
 public:
  client() noexcept = default;
  explicit client(struct lk_client *raw) noexcept : raw_(raw) {}
  /// etcd when `o.endpoints` is set, else the embedded service.
  explicit client(const options &o) {
    lk_client_options c = o.c_options();
    detail::check(lk_client_new(&c, &raw_), "lk_client_new");
  }
  /// The embedded in-process service (quick starts and tests).
  static client memory(options o = {}) {
    o.endpoints.clear();
    return client(o);
  }
  /// etcd when DLOCK_ENDPOINTS is set (TLS and auth from DLOCK_*), else
  /// embedded; only the timing fields of `o` are used.
  static client from_env(const options &o = {}) {
    lk_client_options c = o.c_options();
    struct lk_client *raw = nullptr;
    detail::check(lk_client_from_env(&c, &raw), "lk_client_from_env");
    return client(raw);
  }
  client(const client &) = delete;
  client &operator=(const client &) = delete;
  client(client &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  client &operator=(client &&o) noexcept {
    if (this != &o) {
      lk_client_free(raw_);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~client() { lk_client_free(raw_); }

  /// A lock on the client's default session (not acquired yet).
  class lock lock(const std::string &name) const {
    struct lk_lock *l = nullptr;
    detail::check(lk_lock_new(raw_, detail::name(name), &l), "lk_lock_new");
    return dlock::lock(l);
  }
  /// A session with its own lease; timing and reacquire from `o`.
  class session session(const options &o) const {
    lk_client_options c = o.c_options();
    struct lk_session *s = nullptr;
    detail::check(lk_session_new(raw_, &c, &s), "lk_session_new");
    return dlock::session(s);
  }
  /// The default session, the one lock() uses.
  class session default_session() const {
    struct lk_session *s = nullptr;
    detail::check(lk_client_session(raw_, &s), "lk_client_session");
    return dlock::session(s);
  }
  /// The timing of the default session: the settings given and the ones
  /// the core derived from them.
  timing options() const { return default_session().options(); }

  /// A candidate in the election `name` on the default session; not
  /// campaigning yet (set callbacks, then election::campaign).
  class election election(const std::string &name) const {
    struct lk_election *e = nullptr;
    detail::check(lk_election_new(raw_, detail::name(name), &e), "lk_election_new");
    return dlock::election(e);
  }
  /// A semaphore of `limit` slots called `name` on the default session
  /// (see session::semaphore).
  class semaphore semaphore(const std::string &name, std::uint32_t limit) const {
    struct lk_semaphore *s = nullptr;
    detail::check(lk_semaphore_new(raw_, detail::name(name), limit, &s), "lk_semaphore_new");
    return dlock::semaphore(s);
  }
  /// The read/write lock `name` on the default session (see
  /// session::rwlock).
  class rwlock rwlock(const std::string &name) const {
    struct lk_rwlock *r = nullptr;
    detail::check(lk_rwlock_new(raw_, detail::name(name), &r), "lk_rwlock_new");
    return dlock::rwlock(r);
  }
  /// Observes the election `name`: pull the events with observer::next.
  class observer observe(const std::string &name) const {
    struct lk_observer *o = nullptr;
    detail::check(lk_observer_new(raw_, detail::name(name), &o), "lk_observer_new");
    return dlock::observer(o);
  }
  /// Observes the election `name` with a callback: `fn` runs for each
  /// event, in order, on the observer's own thread (not dlock's callback
  /// thread); after close() or the destructor it runs no more (so do not
  /// call them holding a mutex `fn` takes).
  class observer observe(const std::string &name, observer::observed_fn fn) const {
    auto held = std::make_unique<observer::observed_fn>(std::move(fn));
    struct lk_observer *o = nullptr;
    detail::check(lk_observer_start(raw_, detail::name(name), &observer::observed_call, held.get(), &o),
                  "lk_observer_start");
    return dlock::observer(o, std::move(held));
  }

  /// Embedded backend's fault switches (examples and tests): cut this
  /// client's link (requests wait), then heal it (they arrive late).
  void partition() { detail::check(lk_link_partition(raw_), "lk_link_partition"); }
  void heal() { detail::check(lk_link_heal(raw_), "lk_link_heal"); }

  /// Every session and lock of this client in the Prometheus text format
  /// (docs/metrics.md).
  std::string metrics_text() const {
    std::string text;
    std::size_t len = 0;
    detail::check(lk_client_metrics_text(raw_, nullptr, 0, &len), "lk_client_metrics_text");
    while (len > text.size()) {  // a lock made meanwhile can lengthen it
      text.resize(len + len / 4 + 64);
      detail::check(lk_client_metrics_text(raw_, reinterpret_cast<std::uint8_t *>(text.data()), text.size(), &len),
                    "lk_client_metrics_text");
    }
    text.resize(len);
    return text;
  }

  /// lk_client_shutdown: ends this client's sessions now (every held
  /// lock's key deleted, leases revoked), within one keepalive timeout.
  /// The handles stay valid and behave as closed. Other clients untouched.
  void shutdown() { detail::check(lk_client_shutdown(raw_), "lk_client_shutdown"); }

  struct lk_client *native() const noexcept { return raw_; }
  explicit operator bool() const noexcept { return raw_ != nullptr; }

 private:
  struct lk_client *raw_ = nullptr;
};

/// Accepts a write only if its token is at least the highest seen for its
/// lock name. Thread-safe: share one gate.
class fence_gate {
 public:
  fence_gate() { detail::check(lk_fence_gate_new(&raw_), "lk_fence_gate_new"); }
  fence_gate(const fence_gate &) = delete;
  fence_gate &operator=(const fence_gate &) = delete;
  fence_gate(fence_gate &&o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
  fence_gate &operator=(fence_gate &&o) noexcept {
    if (this != &o) {
      lk_fence_gate_free(raw_);
      raw_ = std::exchange(o.raw_, nullptr);
    }
    return *this;
  }
  ~fence_gate() { lk_fence_gate_free(raw_); }

  /// true: admitted (and remembered); false: stale, a higher token was seen.
  bool admit(const std::string &name, std::uint64_t token) {
    enum lk_status s = lk_fence_gate_admit(raw_, name.c_str(), token);
    if (s == LK_STALE) return false;
    detail::check(s, "lk_fence_gate_admit");
    return true;
  }
  /// A read: true iff `token` is at least the highest write admitted
  /// for `name` (then remembered); false: stale.
  bool admit_read(const std::string &name, std::uint64_t token) {
    enum lk_status s = lk_fence_gate_admit_read(raw_, name.c_str(), token);
    if (s == LK_STALE) return false;
    detail::check(s, "lk_fence_gate_admit_read");
    return true;
  }
  /// A write (as admit): true iff `token` is at least the highest write
  /// and the highest read admitted for `name`; false: stale.
  bool admit_write(const std::string &name, std::uint64_t token) {
    enum lk_status s = lk_fence_gate_admit_write(raw_, name.c_str(), token);
    if (s == LK_STALE) return false;
    detail::check(s, "lk_fence_gate_admit_write");
    return true;
  }
  /// {W, R}: the highest write and read tokens admitted for `name`; 0 for
  /// none yet.
  std::pair<std::uint64_t, std::uint64_t> watermarks(const std::string &name) const {
    std::uint64_t w = 0, r = 0;
    detail::check(lk_fence_gate_watermarks(raw_, name.c_str(), &w, &r), "lk_fence_gate_watermarks");
    return {w, r};
  }
  /// The highest token seen for `name`; 0 if none.
  std::uint64_t highest(const std::string &name) const {
    std::uint64_t t = 0;
    detail::check(lk_fence_gate_highest(raw_, name.c_str(), &t), "lk_fence_gate_highest");
    return t;
  }
  struct lk_fence_gate *native() const noexcept { return raw_; }

 private:
  struct lk_fence_gate *raw_ = nullptr;
};

/// lk_shutdown: ends every session of every client of this process at once
/// (dlock does this by itself at exit()); idempotent, any thread.
inline void shutdown() { detail::check(lk_shutdown(), "lk_shutdown"); }

/// The library's version ("0.1.0").
inline std::string_view version() noexcept { return lk_version(); }

}  // namespace dlock

namespace std {
template <>
struct is_error_code_enum<dlock::errc> : true_type {};
}  // namespace std

#endif  // DLOCK_HPP
