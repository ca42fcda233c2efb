// The C test agent of the cross-language tests: takes locks of the table
// $SHMLOCKS_TABLE through libshmlocks.so on command, in the line protocol
// of python/tests/agent.py (which documents it; no chaos command here).
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shmlocks.h"

static void watchdog(void) {
	const char *s = getenv("AGENT_DEADLINE");
	alarm(s != NULL ? (unsigned)atoi(s) : 60); // SIGALRM's default action ends the process
}

int main(void) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	watchdog();
	shmlocks_error err;
	uint64_t table, latest = 0, token;
	if (shmlocks_open(NULL, NULL, &table, &err) != 0) { // NULL: $SHMLOCKS_TABLE
		printf("error %s %s\n", shmlocks_code_name(err.code), err.message);
		return 1;
	}
	printf("ready\n");
	char line[4096];
	while (fgets(line, sizeof line, stdin) != NULL) {
		char *save, *cmd = strtok_r(line, " \n", &save);
		if (cmd == NULL) continue;
		if (strcmp(cmd, "acquire") == 0) {
			char *name = strtok_r(NULL, " \n", &save), *a;
			uint32_t flags = 0;
			int64_t timeout = -1;
			while ((a = strtok_r(NULL, " \n", &save)) != NULL) {
				if (strcmp(a, "shared") == 0) flags |= SHMLOCKS_SHARED;
				if (strcmp(a, "ifavail") == 0) flags |= SHMLOCKS_IF_AVAILABLE;
				if (strcmp(a, "steal") == 0) flags |= SHMLOCKS_STEAL;
				if (strncmp(a, "timeout=", 8) == 0) timeout = atoll(a + 8);
			}
			uint64_t l;
			if (shmlocks_request(table, name, name ? strlen(name) : 0, flags, timeout, 0, &l, &token, &err) != 0) {
				printf("error %s %s\n", shmlocks_code_name(err.code), err.message);
				continue;
			}
			latest = l;
			printf("acquired %llu\n", (unsigned long long)token);
		} else if (strcmp(cmd, "release") == 0) {
			if (shmlocks_release(latest, &err) != 0) {
				printf("error %s %s\n", shmlocks_code_name(err.code), err.message);
				continue;
			}
			printf("released\n");
		} else if (strcmp(cmd, "waitlost") == 0) {
			char *ms = strtok_r(NULL, " \n", &save);
			struct pollfd p = {.events = POLLIN};
			if (shmlocks_lost_fd(latest, &p.fd, &err) != 0) {
				printf("error %s %s\n", shmlocks_code_name(err.code), err.message);
				continue;
			}
			int lost = 0;
			if (poll(&p, 1, ms ? atoi(ms) : 0) == 1) shmlocks_lost(latest, &lost, &err);
			printf(lost ? "lost\n" : "notlost\n");
		} else if (strcmp(cmd, "exit") == 0) {
			return 0;
		} else {
			printf("error usage unknown command %s\n", cmd);
		}
	}
	return 0;
}
