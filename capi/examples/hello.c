#include <stdio.h>
#include <string.h>
#include "shmlocks.h"

int main(void) {
	shmlocks_error err;
	uint64_t table, lock, token;
	if (shmlocks_open(NULL, NULL, &table, &err) != 0) { // $SHMLOCKS_TABLE or the default table
		fprintf(stderr, "%s: %s\n", shmlocks_code_name(err.code), err.message);
		return 1;
	}
	const char *name = "invoices";
	if (shmlocks_request(table, name, strlen(name), 0, 5000, 0, &lock, &token, &err) != 0) {
		fprintf(stderr, "%s: %s\n", shmlocks_code_name(err.code), err.message); // e.g. SHMLOCKS_ERR_TIMEOUT
		return 1;
	}
	printf("holding %s, fencing token %llu\n", name, (unsigned long long)token);
	shmlocks_release(lock, &err);
	return shmlocks_close(table, &err);
}
