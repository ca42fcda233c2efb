// bench: uncontended acquire+release through libshmlocks against flock(2),
// from C, in one process (make bench-lang; docs/benchmarks.md).
//
//	bench TABLE LOCKFILE N
//
// prints "c-shmlocks <ns per pair>" and "c-flock <ns per pair>".
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "shmlocks.h"

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: bench TABLE LOCKFILE N\n");
		return 2;
	}
	long n = atol(argv[3]);
	shmlocks_error err;
	uint64_t t, l, tok;
	if (shmlocks_open(argv[1], NULL, &t, &err) != 0) {
		fprintf(stderr, "open: %s\n", err.message);
		return 1;
	}
	for (int round = 0; round < 2; round++) { // the first round warms up
		double t0 = now();
		for (long i = 0; i < n; i++) {
			if (shmlocks_request(t, "bench", 5, 0, -1, 0, &l, &tok, &err) != 0 || shmlocks_release(l, &err) != 0) {
				fprintf(stderr, "request/release: %s\n", err.message);
				return 1;
			}
		}
		if (round == 1) printf("c-shmlocks %.1f\n", (now() - t0) / n);
	}
	int fd = open(argv[2], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		perror("open");
		return 1;
	}
	for (int round = 0; round < 2; round++) {
		double t0 = now();
		for (long i = 0; i < n; i++) {
			if (flock(fd, LOCK_EX) != 0 || flock(fd, LOCK_UN) != 0) {
				perror("flock");
				return 1;
			}
		}
		if (round == 1) printf("c-flock %.1f\n", (now() - t0) / n);
	}
	return shmlocks_close(t, &err);
}
