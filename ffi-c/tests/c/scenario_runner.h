/* The shared scenario runner for C faces: libdlock_scenarios.so, the C ABI
 * of the dlock-scenarios crate (scenarios/runner/src/ffi.rs; keep the two in
 * step). The runner parses the files of scenarios/, sleeps until each step's `at`,
 * does the `wait` steps on the trace, judges every `expect`, compares the
 * final trace with its windows and prints the report. A face only performs
 * steps through its own API and says what it observed.
 *
 * Environment: DLOCK_SCENARIO=part plays only matching files;
 * DLOCK_SCENARIO_SLACK_MS=n widens the upper end of every window by n ms.
 *
 * Link with -ldlock_scenarios (a shared library; beside libdlock.so or
 * libdlock.a is fine, as it is not a second Rust staticlib). */
#ifndef DLOCK_SCENARIO_RUNNER_H
#define DLOCK_SCENARIO_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The trace of the scenario being played (opaque). */
struct lks_sink;

/* Appends "<holder> <event>" (e.g. "a acquired token=1") to the trace, time
 * stamped on arrival. From any thread, from `setup` until `teardown` returns;
 * never after. NULL line: nothing. */
void lks_trace(const struct lks_sink *sink, const char *line);

struct lks_settings {
  uint64_t ttl_ms;
  uint64_t keepalive_interval_ms;
  uint64_t keepalive_timeout_ms;
  uint64_t retry_interval_ms;
  uint64_t margin_ms;
};

/* What `setup` gets; every pointer is valid until `setup` returns. The
 * holder_* arrays have n_holders entries each, in holder order, none NULL
 * (the runner fills in the layout's defaults). Create clients, sessions and
 * locks in holder order: the core handles a session's locks in creation
 * order, and the traces rely on it. */
struct lks_scenario {
  const char *name;
  const char *about;
  struct lks_settings settings; /* for every holder and session; reacquire on */
  const char *const *holders;   /* holder names */
  size_t n_holders;
  /* The layout. Holders with the same client word share one client (one
   * link to the service); default: the holder's own name. */
  const char *const *holder_client;
  /* The session word within the client: "default" is the client's own
   * session, any other word one session made for it (lk_session_new with
   * the settings above); holders with the same client and word share it. */
  const char *const *holder_session;
  /* The lock's full name; default: scenario/"<name>", shared. For an
   * election candidate or an observer: the election's name. */
  const char *const *holder_lock;
  /* What the holder is: "lock" (a lock on the session), "election" (a
   * candidate, lk_election_new on the session: every lock step works on its
   * lk_lock, its callbacks give the lock's events) or "observe" (an
   * observer on the client, no session: started by LKS_DO_OBSERVE; its
   * events are "observed leader value=V token=N", "observed proclaimed
   * value=V token=N", "observed no-leader", "observed reconnecting"),
   * "read" / "write" (a reader / writer of the read/write lock holder_lock)
   * or "semaphore" (lk_session_semaphore_new(holder_lock, holder_limit) on
   * the session: its acquire wins a slot's lk_lock, every lock step then
   * works on that lock; see LKS_DO_SLOT). */
  const char *const *holder_role;
  /* A semaphore holder's limit; 0 for every other holder. */
  const uint32_t *holder_limit;
};

/* The `do` of a step. `wait` never reaches a face: the runner does it. */
enum lks_do {
  LKS_DO_ACQUIRE = 0,      /* blocking acquire (10 s) on a thread of its own */
  LKS_DO_TRY_ACQUIRE = 1,  /* -> LKS_SAW_WORD: "ok" or the status word */
  LKS_DO_PERMIT = 2,       /* -> LKS_SAW_PERMIT; keep it as `label`, or end it */
  LKS_DO_END = 3,          /* end the permit `label` */
  LKS_DO_VALID = 4,        /* -> LKS_SAW_BOOL: the permit `label`'s validity */
  LKS_DO_STATE = 5,        /* -> LKS_SAW_WORD: the state's name */
  LKS_DO_TOKEN = 6,        /* -> LKS_SAW_TOKEN (has_token false: none) */
  LKS_DO_RELEASE = 7,      /* blocking release */
  LKS_DO_FAULT = 8,        /* `fault` on the link of the holder's client, or its service */
  LKS_DO_STALL_DRIVER = 9, /* block the driver thread for `ms` */
  LKS_DO_CLOSE = 10,       /* close the lock: releases; no callback after */
  LKS_DO_EVENTS = 11,      /* -> LKS_SAW_EVENTS: the pull-style event stream */
  LKS_DO_ACQUIRE_START = 12, /* start a cancellable acquire (10 s); keep its handle */
  LKS_DO_CANCEL = 13,        /* cancel the holder's last acquire_start: nothing held by it */
  LKS_DO_SHUTDOWN = 14,      /* end every session of the holder's client (its exit path) */
  /* Elections (holder_role "election", or "observe" for LKS_DO_OBSERVE). */
  LKS_DO_CAMPAIGN = 15, /* campaign with `value` (10 s) in the background, as acquire */
  LKS_DO_PROCLAIM = 16, /* -> LKS_SAW_WORD: "ok" or the status word, proclaiming `value` */
  LKS_DO_RESIGN = 17,   /* resign in the background, grace `ms` */
  LKS_DO_LEADER = 18,   /* -> LKS_SAW_LEADER: the current leader */
  LKS_DO_OBSERVE = 19,  /* start the observer holder's observer: its events to the trace */
  /* Read/write locks (holder_role "read" or "write"). */
  LKS_DO_DOWNGRADE = 20, /* -> LKS_SAW_WORD: "ok" or the status word of lk_lock_downgrade */
  LKS_DO_MODE = 21,      /* -> LKS_SAW_WORD: "read" or "write" (lk_lock_mode) */
  /* Semaphores (holder_role "semaphore"). Its LKS_DO_ACQUIRE (background)
   * and LKS_DO_TRY_ACQUIRE (which answers "ok" or the status word), when
   * they win a slot, keep its lk_lock (LKS_DO_SLOT and every lock step may
   * follow a `wait` on the line at once), trace "took slot=I lock=NAME"
   * (lk_lock_slot, lk_lock_name) and then set the slot lock's callbacks;
   * an acquire that fails traces "acquire failed: STATUS". */
  LKS_DO_SLOT = 22,     /* -> LKS_SAW_SLOT: the slot won and its lock's name */
  LKS_DO_SEMAPHORE = 23 /* -> LKS_SAW_WORD: "ok" or the status word of another handle
                           of the holder's semaphore asking for the limit `ms` */
};

enum lks_fault {
  LKS_FAULT_PARTITION = 0,
  LKS_FAULT_HEAL = 1,
  LKS_FAULT_DROP_REPLIES = 2,
  LKS_FAULT_KEEP_REPLIES = 3,
  LKS_FAULT_DELAY_REPLIES = 4, /* `ms`; 0 ends it */
  LKS_FAULT_FAIL_KEEPALIVES = 5,
  LKS_FAULT_STOP_FAILING = 6,
  LKS_FAULT_LEASE_LOST = 7,
  LKS_FAULT_FREEZE_EXPIRY = 8,
  LKS_FAULT_THAW_EXPIRY = 9,
  LKS_FAULT_DELETE_KEY = 10,  /* the service deletes the key holding the holder's lock name */
  LKS_FAULT_REVOKE_LEASE = 11 /* the service revokes the holder's session's current lease */
};

/* One step, flat; strings valid until `perform` returns, NULL when absent. */
struct lks_step {
  int what;               /* enum lks_do */
  const char *do_name;    /* "permit", ... (for messages) */
  const char *holder;     /* the holder's name */
  const char *label;      /* permit: its `as`; end, valid: the permit's */
  int fault;              /* enum lks_fault; -1 unless LKS_DO_FAULT */
  const char *fault_name; /* "partition", ... */
  uint64_t ms;            /* stall_driver; fault delay_replies; events: how many to read;
                             resign: the grace; semaphore: the limit */
  const char *value;      /* campaign, proclaim: the value (NUL-free text) */
};

/* What the face saw. */
enum lks_saw {
  LKS_SAW_DONE = 0,       /* nothing to compare (the preset) */
  LKS_SAW_WORD = 1,       /* `word` */
  LKS_SAW_BOOL = 2,       /* `flag` */
  LKS_SAW_TOKEN = 3,      /* `has_token`, `token` */
  LKS_SAW_PERMIT = 4,     /* `word` ("granted" or the refusal), `token` */
  LKS_SAW_EVENTS = 5,     /* `lines`, `n_lines` (no holder prefix) */
  LKS_SAW_UNSUPPORTED = 6, /* the face cannot do this step yet: noted, skipped */
  LKS_SAW_LEADER = 7,      /* `word` the value (NULL: nobody leads), `has_token`, `token` */
  LKS_SAW_SLOT = 8         /* `has_token`, `token` the slot, `word` its lock's name
                              (has_token false, word NULL: no slot won yet) */
};

/* Filled by `perform` (preset to LKS_SAW_DONE, all else zero). Strings and
 * `lines` must stay valid until `perform` returns; the runner copies them. */
struct lks_observed {
  int kind; /* enum lks_saw */
  const char *word;
  bool flag;
  bool has_token;
  uint64_t token;
  const char *const *lines;
  size_t n_lines;
  const char *error; /* when `perform` returns nonzero: why (may be NULL) */
};

/* A face: the runner calls warm_up once (may be NULL), then per scenario
 * setup, perform for each step, and teardown (always, also after a
 * failure). Nonzero from setup/perform is a failure of the scenario. */
struct lks_face {
  void *ctx;
  void (*warm_up)(void *ctx);
  /* One fresh memory service; per client word a client (its own link), per
   * session word a session, per holder a lock named holder_lock[i] on it,
   * its callbacks pushing to `sink`. On failure set *error (valid until
   * setup returns) and return nonzero. */
  int (*setup)(void *ctx, const struct lks_scenario *scenario, const struct lks_sink *sink,
               const char **error);
  int (*perform)(void *ctx, const struct lks_step *step, struct lks_observed *out);
  /* Release (so pending acquires return), join, free. After it returns no
   * callback may call lks_trace with this scenario's sink. */
  void (*teardown)(void *ctx);
};

/* Plays every *.json of `dir` in name order; prints each report (the trace
 * with times) and "scenarios: N played, N failed". Returns the number of
 * failures (at least 1 when nothing was played). */
int lks_play_dir(const char *dir, const struct lks_face *face);

/* The optional parts of the format a face plays (`plays` bits). */
#define LKS_PLAYS_ELECTIONS 1u /* holder_role "election"/"observe", LKS_DO_CAMPAIGN.. */
#define LKS_PLAYS_RWLOCKS 2u   /* holder_role "read"/"write", LKS_DO_DOWNGRADE, LKS_DO_MODE */
#define LKS_PLAYS_SEMAPHORES 4u /* holder_role "semaphore", LKS_DO_SLOT, LKS_DO_SEMAPHORE */

/* lks_play_dir for a face that plays the parts in `plays`: a file needing a
 * part the face does not play is reported "SKIPPED, unsupported" (not a
 * failure; "scenarios: N played, N failed, N SKIPPED"). Every face is to
 * play every file: lks_play_dir is lks_play_dir_with(dir, face, 0). */
int lks_play_dir_with(const char *dir, const struct lks_face *face, unsigned plays);

/* The number of *.json files in `dir`; -1 if it cannot be read. */
int lks_count_files(const char *dir);

#ifdef __cplusplus
}
#endif

#endif
