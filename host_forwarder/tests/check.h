/* SPDX-License-Identifier: Apache-2.0 */
/* Checks for the forwarder's unit test programs (t_*.c): exit 1 at the first that fails. */
#ifndef VH_TEST_CHECK_H
#define VH_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			exit(1);                                                           \
		}                                                                          \
	} while (0)
#define CHECK_EQ(a, b)                                                                              \
	do {                                                                                        \
		unsigned long long _a = (unsigned long long)(a), _b = (unsigned long long)(b);      \
		if (_a != _b) {                                                                     \
			fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %llu, %s = %llu\n", __FILE__, \
				__LINE__, #a, _a, #b, _b);                                          \
			exit(1);                                                                    \
		}                                                                                   \
	} while (0)

#endif
