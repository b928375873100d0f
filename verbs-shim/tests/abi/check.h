/* What the C test programs share: one line per check, "ok NAME" or "FAIL NAME: detail". */
#ifndef SOFTRDMA_TEST_CHECK_H
#define SOFTRDMA_TEST_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int n_checks;
static int n_failures;

/* Records one check: prints "ok name" or "FAIL name: detail"; returns cond. */
__attribute__((format(printf, 3, 4), unused)) static int check(int cond, const char *name, const char *fmt, ...)
{
	n_checks++;
	if (cond) {
		printf("ok %s\n", name);
	} else {
		va_list ap;

		n_failures++;
		printf("FAIL %s: ", name);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
	}
	fflush(stdout);
	return cond;
}

#endif
