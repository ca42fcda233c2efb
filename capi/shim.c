//go:build linux && cgo

// The exported C functions of shmlocks.h. Each one first checks, in C, that
// the process is the one that loaded the library: in a child forked after
// the load, entering the Go runtime hangs (its threads were not copied), so
// such a call returns SHMLOCKS_ERR_FORK without entering it. Then it calls
// the Go function of the same name with the prefix shmlocksgo_ (exports.go).

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "shmlocks.h"
#include "_cgo_export.h"

// loadPid is the process that loaded the library; forked is set by the
// pthread_atfork child handler (fork(2) through libc, as Python's os.fork,
// multiprocessing and every pre-forking server use), and the pid is
// compared on the calls that are not on the lock's fast path, which also
// catches a child made by a raw clone.
static pid_t loadPid;
static volatile int forked;

// The table files this process opened (device and inode): a child forked
// after the load closes every descriptor of them it inherited. An agent is
// alive while any open file holding its lock byte exists (the kernel's
// word, docs/design.md §6): a child that kept the parent's descriptors
// would keep the parent's locks after the parent died, for the child's
// whole life, without ever being able to release them.
#define MAX_TABLES 64
static struct { dev_t dev; ino_t ino; } tables[MAX_TABLES];
static volatile int ntables;

void shmlocks_note_table(unsigned long long dev, unsigned long long ino) {
	int n = ntables;
	for (int i = 0; i < n; i++)
		if (tables[i].dev == (dev_t)dev && tables[i].ino == (ino_t)ino) return;
	if (n < MAX_TABLES) {
		tables[n].dev = (dev_t)dev;
		tables[n].ino = (ino_t)ino;
		ntables = n + 1;
	}
}

static void shmlocks_atfork_child(void) {
	forked = 1;
	struct rlimit rl;
	long max = 4096;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < 1 << 20) max = (long)rl.rlim_cur;
	int n = ntables;
	for (long fd = 0; fd < max && n > 0; fd++) {
		struct stat st;
		if (fstat((int)fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
		for (int i = 0; i < n; i++) {
			if (st.st_dev == tables[i].dev && st.st_ino == tables[i].ino) {
				close((int)fd);
				break;
			}
		}
	}
}

__attribute__((constructor)) static void shmlocks_load(void) {
	loadPid = getpid();
	pthread_atfork(NULL, NULL, shmlocks_atfork_child);
}

static int forkError(shmlocks_error *err) {
	if (err != NULL) {
		err->code = SHMLOCKS_ERR_FORK;
		snprintf(err->message, sizeof err->message,
		         "shmlocks: called in process %d, forked from %d after it loaded libshmlocks: the Go runtime does not survive fork; "
		         "load the library in the child (or exec)",
		         (int)getpid(), (int)loadPid);
	}
	return SHMLOCKS_ERR_FORK;
}

#define FORK_CHECK(err) \
	if (forked) return forkError(err)
#define FORK_CHECK_PID(err) \
	if (forked || getpid() != loadPid) return forkError(err)

int shmlocks_abi_version(void) { return SHMLOCKS_ABI_VERSION; }

const char *shmlocks_code_name(int code) {
	static const char *const names[] = {
		"SHMLOCKS_OK",          "SHMLOCKS_ERR_NOT_SUPPORTED", "SHMLOCKS_ERR_ABORTED",   "SHMLOCKS_ERR_TIMEOUT",
		"SHMLOCKS_ERR_NOT_AVAILABLE", "SHMLOCKS_ERR_STOLEN",  "SHMLOCKS_ERR_CLOSED",    "SHMLOCKS_ERR_TABLE_FULL",
		"SHMLOCKS_ERR_CORRUPT", "SHMLOCKS_ERR_UNSAFE",        "SHMLOCKS_ERR_DEADLOCK",  "SHMLOCKS_ERR_BAD_HANDLE",
		"SHMLOCKS_ERR_INVALID", "SHMLOCKS_ERR_FORK",          "SHMLOCKS_ERR_OPEN",      "SHMLOCKS_ERR_INTERNAL",
	};
	if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "SHMLOCKS_ERR_UNKNOWN";
	return names[code];
}

int shmlocks_open(const char *path, const char *options_json, uint64_t *table, shmlocks_error *err) {
	FORK_CHECK_PID(err);
	if (path == NULL || path[0] == '\0') {
		// The environment as it is now: the Go runtime keeps a copy made at load.
		const char *env = getenv("SHMLOCKS_TABLE");
		path = (env != NULL && env[0] != '\0') ? env : NULL;
	}
	return shmlocksgo_open((char *)path, (char *)options_json, table, err);
}

int shmlocks_close(uint64_t table, shmlocks_error *err) {
	FORK_CHECK_PID(err);
	return shmlocksgo_close(table, err);
}

int shmlocks_cancel_new(uint64_t *cancel, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_cancel_new(cancel, err);
}

int shmlocks_cancel(uint64_t cancel, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_cancel(cancel, err);
}

int shmlocks_cancel_free(uint64_t cancel, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_cancel_free(cancel, err);
}

int shmlocks_request(uint64_t table, const char *name, size_t name_len, uint32_t flags, int64_t timeout_ms,
                     uint64_t cancel, uint64_t *lock, uint64_t *token, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_request(table, (char *)name, name_len, flags, timeout_ms, cancel, lock, token, err);
}

int shmlocks_release(uint64_t lock, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_release(lock, err);
}

int shmlocks_lost(uint64_t lock, int *lost, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_lost(lock, lost, err);
}

int shmlocks_lost_fd(uint64_t lock, int *fd, shmlocks_error *err) {
	FORK_CHECK(err);
	return shmlocksgo_lost_fd(lock, fd, err);
}

int shmlocks_query(uint64_t table, char **json, size_t *len, shmlocks_error *err) {
	FORK_CHECK_PID(err);
	return shmlocksgo_query(table, json, len, err);
}

int shmlocks_client_id(uint64_t table, char **id, shmlocks_error *err) {
	FORK_CHECK_PID(err);
	return shmlocksgo_client_id(table, id, err);
}

void shmlocks_free(void *p) { free(p); }
