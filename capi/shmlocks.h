/*
 * shmlocks.h: the C ABI of libshmlocks.so, the W3C Web Locks API for the
 * processes of one machine, on the same lock table as the Go package
 * github.com/shmlocks/shmlocks/manager, the shmlocks command and the Python
 * module shmlocks (docs/c-abi.md).
 *
 * Stability: ABI version 1. The functions, constants, flag bits, error codes
 * and the layout of shmlocks_error below keep their meaning for as long as the
 * library's soname is libshmlocks.so; later versions only add (functions,
 * flag bits, error codes, option fields). A program may check
 * shmlocks_abi_version() >= the version it was built against.
 *
 * Handles: tables, locks and cancel tokens are 64-bit integers, never
 * pointers, and never reused for the life of the process: a handle that was
 * released or freed, never issued, or is of another kind is refused with
 * SHMLOCKS_ERR_BAD_HANDLE and changes nothing; a closed table's handle
 * gives SHMLOCKS_ERR_CLOSED.
 *
 * Errors: every function that can fail returns 0 or a SHMLOCKS_ERR_* code,
 * and, when err is not NULL, fills err->code with the same code and
 * err->message with a NUL-terminated message that names the name, limit or
 * field involved (truncated to fit). Outputs are written only on success.
 *
 * Threads: every function may be called from any thread, concurrently. A
 * blocking shmlocks_request ties up only its own thread; another thread may
 * abort it with shmlocks_cancel.
 *
 * Fork: the Go runtime inside the library does not survive fork(2). In a
 * child forked after the library was loaded, every function returns
 * SHMLOCKS_ERR_FORK without entering the runtime (which would hang); the
 * child holds none of the parent's locks. Load the library in the child (a
 * process that forks before loading it is fine), or exec.
 */
#ifndef SHMLOCKS_H
#define SHMLOCKS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHMLOCKS_ABI_VERSION 1

/* Request flags (shmlocks_request). Exclusive is the default (0). */
#define SHMLOCKS_SHARED 1u       /* a shared lock instead of an exclusive one */
#define SHMLOCKS_IF_AVAILABLE 2u /* grant only without waiting, else SHMLOCKS_ERR_NOT_AVAILABLE */
#define SHMLOCKS_STEAL 4u        /* take the name from its holders and go first (exclusive only) */

/* Error codes. */
enum {
	SHMLOCKS_OK = 0,
	SHMLOCKS_ERR_NOT_SUPPORTED = 1, /* a name starting with '-' or over the table's MaxNameLen, a forbidden option mix */
	SHMLOCKS_ERR_ABORTED = 2,       /* the request's cancel token was cancelled before the grant */
	SHMLOCKS_ERR_TIMEOUT = 3,       /* timeout_ms passed before the grant (0: at once, even if free) */
	SHMLOCKS_ERR_NOT_AVAILABLE = 4, /* SHMLOCKS_IF_AVAILABLE and the lock not grantable at once */
	SHMLOCKS_ERR_STOLEN = 5,        /* release of a lock that was stolen or reaped while held */
	SHMLOCKS_ERR_CLOSED = 6,        /* the table was closed (shmlocks_close) */
	SHMLOCKS_ERR_TABLE_FULL = 7,    /* no free name, request or agent entry; nothing held is disturbed */
	SHMLOCKS_ERR_CORRUPT = 8,       /* the file is not a valid lock table */
	SHMLOCKS_ERR_UNSAFE = 9,        /* the table or its directory could be controlled by another user */
	SHMLOCKS_ERR_DEADLOCK = 10,     /* the request was the victim of a wait-for cycle */
	SHMLOCKS_ERR_BAD_HANDLE = 11,   /* a handle that was released or freed, never issued, or of another kind */
	SHMLOCKS_ERR_INVALID = 12,      /* a bad argument: NULL pointer, unknown flag bit, bad option field */
	SHMLOCKS_ERR_FORK = 13,         /* called in a child forked after the library was loaded */
	SHMLOCKS_ERR_OPEN = 14,         /* the table file could not be opened or created (the OS error) */
	SHMLOCKS_ERR_INTERNAL = 15      /* a bug in the library (a recovered panic); the process is unharmed */
};

/* An error's code and message. 512 bytes; the layout is part of the ABI. */
typedef struct shmlocks_error {
	int32_t code;
	char message[508];
} shmlocks_error;

/* SHMLOCKS_ABI_VERSION of the loaded library. Never fails. */
int shmlocks_abi_version(void);

/* The name of an error code ("SHMLOCKS_ERR_TIMEOUT"), a static string;
 * "SHMLOCKS_ERR_UNKNOWN" for a code this version does not know. Never fails. */
const char *shmlocks_code_name(int code);

/*
 * Opens the lock table at path (created when it does not exist) and
 * registers a new agent (a Web Locks client) of it: *table receives its
 * handle. path NULL or "": $SHMLOCKS_TABLE if set and not empty, else the
 * user's default table (/tmp/shmlocks-UID/shmlocks.tbl), as the shmlocks
 * command does. options_json may be NULL or a JSON object with any of
 * "maxResources", "maxRequests", "maxAgents", "maxNameLen" (numbers, used
 * only when the file is created), "fileMode" (a number, e.g. 384 for 0600),
 * "fairness" ("fifo" or "bounded:1ms"); an unknown field is
 * SHMLOCKS_ERR_INVALID naming it.
 */
int shmlocks_open(const char *path, const char *options_json, uint64_t *table, shmlocks_error *err);

/*
 * Closes a table handle: releases every lock taken through it (their lost
 * descriptors become readable; a later shmlocks_release of one returns
 * SHMLOCKS_ERR_CLOSED and frees its handle), aborts its pending requests
 * (SHMLOCKS_ERR_CLOSED) and deregisters the agent. Every later call with the
 * handle, a second close included, returns SHMLOCKS_ERR_CLOSED.
 */
int shmlocks_close(uint64_t table, shmlocks_error *err);

/* A cancel token: shmlocks_cancel aborts every request made with it, waiting
 * or later (SHMLOCKS_ERR_ABORTED). Free it once those requests returned
 * (freeing cancels it). */
int shmlocks_cancel_new(uint64_t *cancel, shmlocks_error *err);
int shmlocks_cancel(uint64_t cancel, shmlocks_error *err);
int shmlocks_cancel_free(uint64_t cancel, shmlocks_error *err);

/*
 * Requests the lock name (name_len bytes: NUL and non-ASCII bytes are part
 * of the name) on a table, waits until it is granted and returns its lock
 * handle in *lock and its fencing token in *token (strictly increasing per
 * name, across every process and language, for the life of the table
 * file). Per name, requests are granted in arrival (FIFO) order: exclusive
 * ones alone, a run of shared ones together, a shared request never
 * overtakes a queued exclusive one.
 *
 * flags: SHMLOCKS_SHARED, SHMLOCKS_IF_AVAILABLE, SHMLOCKS_STEAL (or 0).
 * timeout_ms < 0: no time limit; >= 0: SHMLOCKS_ERR_TIMEOUT when not granted
 * within it (0 fails at once, even when the lock is free: use
 * SHMLOCKS_IF_AVAILABLE to try without waiting). cancel: 0, or a token of
 * shmlocks_cancel_new that another thread may cancel. A request that fails
 * (timeout, cancel, close) leaves the table as if it had never come.
 */
int shmlocks_request(uint64_t table, const char *name, size_t name_len, uint32_t flags, int64_t timeout_ms,
                     uint64_t cancel, uint64_t *lock, uint64_t *token, shmlocks_error *err);

/*
 * Releases a lock and frees its handle (and its lost descriptor, if any).
 * SHMLOCKS_ERR_STOLEN if it was stolen or reaped meanwhile,
 * SHMLOCKS_ERR_CLOSED if its table was closed (the handle is freed too);
 * a second release is SHMLOCKS_ERR_BAD_HANDLE and touches nothing.
 */
int shmlocks_release(uint64_t lock, shmlocks_error *err);

/* *lost = 1 if the lock was taken away (stolen, reaped, its table closed)
 * since it was granted, else 0. */
int shmlocks_lost(uint64_t lock, int *lost, shmlocks_error *err);

/*
 * *fd receives a descriptor (an eventfd, non-blocking, close-on-exec) that
 * becomes readable when the lock is taken away: watch it with
 * poll/epoll/select or an event loop. The library owns it: do not close or
 * read it; it is closed by shmlocks_release, so stop watching it first. The
 * same descriptor is returned on every call for one lock.
 */
int shmlocks_lost_fd(uint64_t lock, int *fd, shmlocks_error *err);

/*
 * Every agent's held locks and pending requests in the table, as JSON:
 * {"held":[{"name","mode","clientId","pid","token"}...],"pending":[...]}
 * (pending in queue order per name; "nameBase64" beside "name" when the
 * name is not valid UTF-8). *json receives a NUL-terminated string of *len
 * bytes (len may be NULL) that the caller frees with shmlocks_free.
 */
int shmlocks_query(uint64_t table, char **json, size_t *len, shmlocks_error *err);

/* The client id of a table handle's agent (as in query's "clientId"), to be
 * freed with shmlocks_free. */
int shmlocks_client_id(uint64_t table, char **id, shmlocks_error *err);

/* Frees a string returned by the library. NULL is a no-op. */
void shmlocks_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* SHMLOCKS_H */
