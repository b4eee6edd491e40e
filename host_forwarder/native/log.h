/* SPDX-License-Identifier: Apache-2.0 */
/* The forwarder's log: one line per event on stderr, each marked with the guest (log.c). */
#ifndef VH_LOG_H
#define VH_LOG_H

/* A line in the forwarder's log, marked as the others are. */
void vh_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A start-up error: logged as "error: ...", and 1 returned (main's exit status). */
int vh_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
