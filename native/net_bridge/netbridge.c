/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmgpu-netbridge: a guest's region carried over the network, so that a guest on a machine
 * without a GPU uses a GPU of another host.  Two halves, one TLS 1.3 connection per guest
 * process (channel):
 *
 *   guest's machine                                   GPU host
 *   guest process -- region R --  netbridge attach  ==TLS==  netbridge serve -- region F -- forwarder
 *                 (host of R, VMGPU_FEAT_REMOTE)            (a guest process of F, one per channel)
 *
 * attach is the host of a local region with the remote region's geometry; for each channel a
 * guest process claims there it connects to serve, which forks a child that claims a channel of
 * the forwarder's region as that process's stand-in.  Ring records pass unchanged both ways (the
 * forwarder validates every request as from any guest).  Bulk bytes pass as the guest noted them
 * (VMGPU_REC_BULK_NOTE): the guest's bytes before the request that names them, the host's
 * before the completion that follows their release.  Positions match on both sides: the two
 * bulk areas have one size and see the same allocations in the same order.
 *
 * Trust: the guest proves itself with its token (the pool's, at admission); serve keeps only the
 * token's SHA-256.  attach checks serve's certificate by its SHA-256 fingerprint (pinned; the
 * pool publishes it).  Each side checks every frame the other sends: kinds, lengths, that bulk
 * bytes fall in a range noted in that direction, that a request comes only after the bytes it
 * may name.  A lost link is a lost channel: the guest process gets the sticky error it gets when
 * its forwarder dies.
 *
 *   vmgpu-netbridge cert DIR
 *   vmgpu-netbridge serve --listen ADDR:PORT --guests DIR --cert DIR
 *   vmgpu-netbridge attach --connect ADDR:PORT --guest NAME --region R --size SIZE --fingerprint HEX
 *                          --token-file FILE
 *
 * serve serves every guest of its host on one port: DIR/NAME holds "REGION TOKEN-SHA256" for each
 * (vmgpu pool join writes them); the hello names the guest.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "vmgpu/shm.h"

#define PROTO_VERSION 1
#define HELLO_MAX 1024
#define TOKEN_HEX 64
#define RECV_SLICE_NS 20000000ull /* a relay thread looks at its stop flag this often */
#define MAX_RANGES 64             /* bulk ranges in flight per channel (the guest's copies keep 4) */
#define MAX_LINKS 256             /* links serve holds at once (each a guest process, or one saying hello) */
#define MAX_BULK (1ull << 30)     /* the largest bulk area the bridge carries (frames' lengths are 32-bit) */

enum frame_kind {
	F_HELLO = 1,   /* guest -> host, first: "vmgpu-net 1 PURPOSE TOKEN" */
	F_WELCOME = 2, /* host -> guest: the geometry (purpose "geometry") or "channel N" */
	F_REFUSED = 3, /* host -> guest: why, then the host closes */
	F_REC = 4,     /* a ring record; aux: its type */
	F_BULK = 5,    /* bulk bytes; aux: their position */
	F_RELEASE = 6, /* host -> guest: the forwarder released the bulk area up to aux */
};

struct frame {
	uint32_t kind, len;
	uint64_t aux;
};

struct geometry {
	uint32_t version, nchannels, req_ring_size, cpl_ring_size, wait_mode, pad;
	uint64_t bulk_size, heap_block_size;
};

static const char *prog = "vmgpu-netbridge";

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	char line[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%lld.%03ld %s[%d]: %s\n", (long long)ts.tv_sec, ts.tv_nsec / 1000000, prog, (int)getpid(),
		line);
}

static __attribute__((noreturn)) void die(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s: %s\n", prog, line);
	exit(2);
}

/* ---- a TLS connection shared by a channel's two relay threads ------------------------------ */

/* One thread reads, the other writes; OpenSSL allows one call on an SSL at a time, so each
 * call is made under the lock on a non-blocking socket, and a thread that must wait for the
 * socket waits outside the lock. */
struct link {
	SSL *ssl;
	int fd;
	pthread_mutex_t mu;  /* each SSL call (a reader's and a writer's share the SSL object) */
	pthread_mutex_t wmu; /* each whole frame written: two writers' frames never interleave, and a
			      * write OpenSSL asks to retry (the socket full) is retried with its own
			      * bytes, not the other writer's (serve has two: completions, releases) */
	atomic_int dead;
	uint64_t deadline_ns; /* nonzero: every read and write must be done by then (the hello) */
	char why[160];
};

static void link_init(struct link *l)
{
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->wmu, NULL);
}

static void link_fail(struct link *l, const char *why)
{
	pthread_mutex_lock(&l->mu);
	if (!l->why[0])
		snprintf(l->why, sizeof l->why, "%s", why);
	pthread_mutex_unlock(&l->mu);
	atomic_store(&l->dead, 1);
	shutdown(l->fd, SHUT_RDWR);
}

static int link_io(struct link *l, void *buf, size_t n, bool writing)
{
	uint8_t *p = buf;
	while (n > 0) {
		if (atomic_load(&l->dead))
			return -1;
		if (l->deadline_ns && vmgpu_now_ns() > l->deadline_ns) {
			link_fail(l, "the other side did not finish its hello in time");
			return -1;
		}
		pthread_mutex_lock(&l->mu);
		size_t done = 0;
		ERR_clear_error(); /* SSL_get_error reads this thread's queue: nothing stale in it */
		int r = writing ? SSL_write_ex(l->ssl, p, n, &done) : SSL_read_ex(l->ssl, p, n, &done);
		int e = r ? SSL_ERROR_NONE : SSL_get_error(l->ssl, r);
		pthread_mutex_unlock(&l->mu);
		if (r) {
			p += done;
			n -= done;
			continue;
		}
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			struct pollfd pf = {l->fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, 0};
			poll(&pf, 1, 100);
			continue;
		}
		link_fail(l, e == SSL_ERROR_ZERO_RETURN ? "the other side closed the link" : "the link broke");
		return -1;
	}
	return 0;
}

/* A record's bytes read into buf, or the link failed with `refusal` before they are waited for if
 * the record is longer than `most` (the longest the ring it goes to takes). */
static int record_in(struct link *l, void *buf, uint32_t len, uint32_t most, const char *refusal)
{
	if (len > most) {
		link_fail(l, refusal);
		return -1;
	}
	return link_io(l, buf, len, false);
}

/* A frame: header, a, b.  A small one is gathered into one write; a large one (bulk bytes) is
 * written from where its bytes are, after its header, not copied first. */
static int send_frame(struct link *l, uint32_t kind, uint64_t aux, const void *a, uint32_t alen, const void *b,
		      uint32_t blen)
{
	uint8_t buf[4096];
	struct frame f = {kind, alen + blen, aux};
	size_t n = sizeof f + alen + blen;
	int r;
	pthread_mutex_lock(&l->wmu);
	if (n <= sizeof buf) {
		memcpy(buf, &f, sizeof f);
		if (alen)
			memcpy(buf + sizeof f, a, alen);
		if (blen)
			memcpy(buf + sizeof f + alen, b, blen);
		r = link_io(l, buf, n, true);
	} else {
		r = link_io(l, &f, sizeof f, true);
		if (!r && alen)
			r = link_io(l, (void *)a, alen, true);
		if (!r && blen)
			r = link_io(l, (void *)b, blen, true);
	}
	pthread_mutex_unlock(&l->wmu);
	return r;
}

/* A frame's header, its length checked against cap; the payload is read by the caller. */
static int recv_header(struct link *l, struct frame *f, uint32_t cap)
{
	if (link_io(l, f, sizeof *f, false) < 0)
		return -1;
	if (f->len > cap) {
		link_fail(l, "a frame longer than any the protocol sends");
		return -1;
	}
	return 0;
}

static int set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* A peer that vanishes without closing (a machine gone, a cable cut) is noticed in about 30 s,
 * not after TCP's 15 minutes: its channel and what it holds are given back. */
static void tcp_liveness(int fd)
{
	int on = 1, idle = 10, intvl = 5, cnt = 3;
	unsigned timeout_ms = 30000;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
	setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof timeout_ms);
}

static void tls_errors(char *out, size_t n)
{
	unsigned long e = ERR_get_error();
	if (e)
		ERR_error_string_n(e, out, n);
	else
		snprintf(out, n, "%s", errno ? strerror(errno) : "handshake failed");
	ERR_clear_error();
}

/* ---- addresses, files ------------------------------------------------------------------- */

static int parse_hostport(const char *s, struct sockaddr_storage *out, socklen_t *len)
{
	char host[256];
	const char *colon = strrchr(s, ':');
	if (!colon || colon == s || (size_t)(colon - s) >= sizeof host)
		return -1;
	const char *h = s;
	size_t hl = (size_t)(colon - s);
	if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(host, h, hl);
	host[hl] = 0;
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end || port <= 0 || port > 65535)
		return -1;
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_STREAM}, *ai;
	if (getaddrinfo(host, NULL, &hints, &ai))
		return -1;
	memcpy(out, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	if (out->ss_family == AF_INET)
		((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
	else
		((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
	return 0;
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	unsigned shift = 0;
	if (*end == 'K' || *end == 'k')
		shift = 10;
	else if (*end == 'M' || *end == 'm')
		shift = 20;
	else if (*end == 'G' || *end == 'g')
		shift = 30;
	else if (*end)
		return -1;
	if (shift && end[1])
		return -1;
	if (v > (UINT64_MAX >> shift))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

static void hex_of(const unsigned char *md, unsigned n, char *out)
{
	for (unsigned i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", md[i]);
}

/* A token, a token's SHA-256 or a certificate's fingerprint: 64 lowercase hexadecimal digits. */
static bool is_hex64(const char *s)
{
	return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64;
}

/* path opened never through a link, only if it is a regular file of ours with none of the
 * `others` mode bits; -1 otherwise (with *st filled where it is one). */
static int open_ours(const char *path, int flags, mode_t others, struct stat *st)
{
	int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, st) || !S_ISREG(st->st_mode) || st->st_uid != geteuid() || (st->st_mode & others)) {
		close(fd);
		errno = EPERM;
		return -1;
	}
	return fd;
}

/* A directory of ours that no one else can write (not a link). */
static bool dir_ours(const char *dir)
{
	struct stat st;
	return !lstat(dir, &st) && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && !(st.st_mode & 022);
}

static void sha256_hex(const void *data, size_t n, char out[65])
{
	unsigned char md[32];
	unsigned mdlen = 0;
	EVP_Digest(data, n, md, &mdlen, EVP_sha256(), NULL);
	hex_of(md, 32, out);
}

/* A token file: 64 hexadecimal characters (and a newline), owned by us, not readable by others. */
static void read_token(const char *path, char token[TOKEN_HEX + 1])
{
	struct stat st;
	int fd = open_ours(path, O_RDONLY, 077, &st);
	if (fd < 0 && errno == EPERM)
		die("--token-file %s must be a regular file of yours that only you can read (chmod 600)", path);
	if (fd < 0)
		die("--token-file %s: %s", path, strerror(errno));
	char buf[TOKEN_HEX + 3];
	ssize_t n = read(fd, buf, TOKEN_HEX + 2);
	close(fd);
	if (n == TOKEN_HEX + 1 && buf[TOKEN_HEX] == '\n')
		n = TOKEN_HEX;
	buf[n < 0 ? 0 : n] = 0; /* what is checked ends where what was read ends */
	if (!is_hex64(buf))
		die("--token-file %s does not hold a token (64 lowercase hexadecimal characters)", path);
	memcpy(token, buf, TOKEN_HEX);
	token[TOKEN_HEX] = 0;
}

/* ---- cert: a self-signed key and certificate for serve ---------------------------------- */

static FILE *create_private(const char *dir, const char *name)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		die("cannot create %s: %s (an existing one is never replaced)", path, strerror(errno));
	return fdopen(fd, "w");
}

static void cert_fingerprint(X509 *x, char out[65])
{
	unsigned char md[32];
	unsigned n = 0;
	X509_digest(x, EVP_sha256(), md, &n);
	hex_of(md, 32, out);
}

static int cmd_cert(const char *dir)
{
	if (!dir_ours(dir))
		die("cert: %s must be a directory of yours that no one else can write", dir);
	EVP_PKEY *key = EVP_EC_gen("P-256");
	X509 *x = X509_new();
	if (!key || !x)
		die("cert: cannot make a key");
	ASN1_INTEGER_set(X509_get_serialNumber(x), (long)time(NULL));
	X509_gmtime_adj(X509_getm_notBefore(x), -3600);
	X509_gmtime_adj(X509_getm_notAfter(x), 10L * 365 * 24 * 3600);
	X509_set_pubkey(x, key);
	X509_NAME *name = X509_get_subject_name(x);
	X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"vmgpu-netbridge", -1, -1, 0);
	X509_set_issuer_name(x, name);
	if (!X509_sign(x, key, EVP_sha256()))
		die("cert: cannot sign");
	FILE *k = create_private(dir, "key.pem"), *c = create_private(dir, "cert.pem");
	if (!PEM_write_PrivateKey(k, key, NULL, NULL, 0, NULL, NULL) || !PEM_write_X509(c, x))
		die("cert: cannot write");
	fclose(k);
	fclose(c);
	char fp[65];
	cert_fingerprint(x, fp);
	printf("%s\n", fp);
	X509_free(x);
	EVP_PKEY_free(key);
	return 0;
}

/* ---- a channel's bulk ranges in flight --------------------------------------------------- */

struct range {
	uint64_t pos, len;
	void *ptr;
};

struct ranges {
	struct range r[MAX_RANGES];
	unsigned head, count;
};

static int ranges_push(struct ranges *q, uint64_t pos, uint64_t len, void *ptr)
{
	if (q->count == MAX_RANGES)
		return -1;
	q->r[(q->head + q->count++) % MAX_RANGES] = (struct range){pos, len, ptr};
	return 0;
}

static struct range *ranges_front(struct ranges *q)
{
	return q->count ? &q->r[q->head] : NULL;
}

static void ranges_pop(struct ranges *q)
{
	q->head = (q->head + 1) % MAX_RANGES;
	q->count--;
}

static bool note_ok(const struct vmgpu_bulk_note *n, uint64_t bulk_size)
{
	return n->len > 0 && n->len <= bulk_size && n->len % VMGPU_CACHELINE == 0 && n->dir >= VMGPU_BULK_TO_HOST &&
	       n->dir <= VMGPU_BULK_BOTH && (n->pos & (bulk_size - 1)) + n->len <= bulk_size && n->pad == 0;
}

/* ===================================== serve ============================================== */

struct served {
	struct link l;
	struct vmgpu_gchan *ch;
	uint64_t bulk_size;
	uint32_t max_req, max_cpl;
	pthread_mutex_t mu;  /* out below, shared by the threads */
	pthread_mutex_t flush_mu; /* one flush at a time: serve_down's and serve_release's */
	struct ranges out;   /* the forwarder writes these; sent back once it released them */
	struct ranges in;    /* the guest's bytes owed before its next request */
	uint64_t released;   /* last release sent (under flush_mu) */
	uint64_t released_seen; /* serve_release's: the last release it saw */
};

/* The guest's frames into the forwarder's region. */
static void *serve_up(void *arg)
{
	struct served *s = arg;
	uint32_t cap = s->max_req > s->bulk_size ? s->max_req : (uint32_t)s->bulk_size;
	uint8_t *buf = malloc(s->max_req); /* bulk bytes go straight to their range */
	while (buf && !atomic_load(&s->l.dead)) {
		struct frame f;
		if (recv_header(&s->l, &f, cap) < 0)
			break;
		if (f.kind == F_BULK) {
			/* the guest's bytes of the oldest range it owes, exactly, read straight into it */
			struct range *r = ranges_front(&s->in);
			if (!r || r->pos != f.aux || r->len != f.len) {
				link_fail(&s->l, "bulk bytes the guest did not note");
				break;
			}
			if (link_io(&s->l, r->ptr, f.len, false) < 0)
				break;
			ranges_pop(&s->in);
			continue;
		}
		if (record_in(&s->l, buf, f.len, s->max_req, "a record longer than any request") < 0)
			break;
		if (f.kind == F_REC && f.aux == VMGPU_REC_BULK_NOTE) {
			struct vmgpu_bulk_note n;
			if (f.len != sizeof n) {
				link_fail(&s->l, "a malformed bulk note");
				break;
			}
			memcpy(&n, buf, sizeof n);
			if (!note_ok(&n, s->bulk_size)) {
				link_fail(&s->l, "a bulk note outside the bulk area");
				break;
			}
			uint64_t pos;
			void *ptr;
			/* never a wait: the guest allocated after attach saw this much released here */
			int e = vmgpu_gchan_bulk_alloc_dir(s->ch, n.len, n.dir, 0, &pos, &ptr);
			if (e < 0) {
				link_fail(&s->l, e == -EAGAIN ? "a bulk note past what the forwarder released"
							      : "the forwarder's channel broke");
				break;
			}
			if (pos != n.pos) {
				link_fail(&s->l, "a bulk note at a position the bulk area does not give");
				break;
			}
			pthread_mutex_lock(&s->mu);
			int full = ((n.dir & VMGPU_BULK_TO_HOST) && ranges_push(&s->in, pos, n.len, ptr) < 0) ||
				   ((n.dir & VMGPU_BULK_FROM_HOST) && ranges_push(&s->out, pos, n.len, ptr) < 0);
			pthread_mutex_unlock(&s->mu);
			if (full) {
				link_fail(&s->l, "more bulk ranges in flight than the protocol allows");
				break;
			}
		} else if (f.kind == F_REC && f.aux != VMGPU_REC_PAD && f.aux < 0xff00) { /* (its length checked above) */
			if (s->in.count) {
				link_fail(&s->l, "a request before the bulk bytes it may name");
				break;
			}
			int e;
			while ((e = vmgpu_gchan_send(s->ch, (uint16_t)f.aux, buf, f.len, RECV_SLICE_NS)) == -EAGAIN &&
			       !atomic_load(&s->l.dead))
				; /* the forwarder is behind: wait for it, in slices, while the link lives */
			if (e < 0) {
				link_fail(&s->l, "the forwarder's channel broke");
				break;
			}
		} else {
			link_fail(&s->l, "a frame the guest may not send");
			break;
		}
	}
	free(buf);
	return NULL;
}

/* Bytes the forwarder wrote and released go back before anything that follows. */
static int serve_flush_out(struct served *s)
{
	uint64_t rel = vmgpu_gchan_bulk_released(s->ch);
	if (rel == s->released)
		return 0;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		struct range *r = ranges_front(&s->out);
		struct range copy = r ? *r : (struct range){0};
		bool due = r && (int64_t)(rel - (r->pos + r->len)) >= 0;
		if (due)
			ranges_pop(&s->out);
		pthread_mutex_unlock(&s->mu);
		if (!due)
			break;
		if (send_frame(&s->l, F_BULK, copy.pos, copy.ptr, (uint32_t)copy.len, NULL, 0) < 0)
			return -1;
	}
	s->released = rel;
	return send_frame(&s->l, F_RELEASE, rel, NULL, 0, NULL, 0);
}

static int serve_flush(struct served *s)
{
	pthread_mutex_lock(&s->flush_mu);
	int r = serve_flush_out(s);
	pthread_mutex_unlock(&s->flush_mu);
	return r;
}

/* The forwarder's releases of the bulk area back to the guest as they happen.  A guest streaming a
 * copy in async chunks gets no completion until its last one, and waits for its bulk area in the
 * meantime: serve_down alone passed releases on with completions or at its RECV_SLICE_NS, so such a
 * copy moved one bulk area per 20 ms (0.2 GB/s). */
static void *serve_release(void *arg)
{
	struct served *s = arg;
	while (!atomic_load(&s->l.dead)) {
		uint64_t rel = vmgpu_gchan_bulk_wait_release(s->ch, s->released_seen, RECV_SLICE_NS);
		if (rel == s->released_seen)
			continue;
		s->released_seen = rel;
		if (serve_flush(s) < 0)
			break;
	}
	return NULL;
}

/* The forwarder's completions back to the guest. */
static void *serve_down(void *arg)
{
	struct served *s = arg;
	uint8_t *buf = malloc(s->max_cpl);
	while (buf && !atomic_load(&s->l.dead)) {
		uint16_t type;
		int n = vmgpu_gchan_recv(s->ch, buf, s->max_cpl, &type, RECV_SLICE_NS);
		if (n == -ETIMEDOUT || n == -EAGAIN)
			continue;
		if (n < 0) {
			link_fail(&s->l, "the forwarder stopped serving this channel");
			break;
		}
		/* what the forwarder released goes first: the completion may be of a copy into it */
		if (serve_flush(s) < 0 || send_frame(&s->l, F_REC, type, buf, (uint32_t)n, NULL, 0) < 0)
			break;
	}
	free(buf);
	return NULL;
}

struct serve_opts {
	const char *listen, *guests, *certdir;
};

/* A guest name as vmgpu allows it: 1-64 of [A-Za-z0-9._-], not starting with a dot or dash. */
static bool guest_name_ok(const char *g)
{
	size_t n = strlen(g);
	return n >= 1 && n <= 64 && strspn(g, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n &&
	       g[0] != '.' && g[0] != '-';
}

/* DIR/GUEST: "REGION TOKEN-SHA256" written by `vmgpu pool join` for each guest it serves, a
 * regular file of ours that no one else can write, never through a link. */
static int guest_entry(const char *dir, const char *guest, char *region, size_t rlen, char sha[65])
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, guest);
	struct stat st;
	int fd = open_ours(path, O_RDONLY, 022, &st);
	if (fd < 0)
		return -1;
	char buf[4200];
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	char fmt[32];
	snprintf(fmt, sizeof fmt, "%%%zus %%64s", rlen - 1);
	if (sscanf(buf, fmt, region, sha) != 2 || !is_hex64(sha) || region[0] != '/')
		return -1;
	return 0;
}

/* The guest's region, as its forwarder made it (ours, a regular file, never through a link). */
static void *map_region(const char *path, uint64_t *size)
{
	struct stat st;
	int fd = open_ours(path, O_RDWR, 0, &st);
	void *base = MAP_FAILED;
	if (fd >= 0 && st.st_size >= 4096)
		base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (fd >= 0)
		close(fd);
	if (base == MAP_FAILED)
		return NULL;
	*size = (uint64_t)st.st_size;
	return base;
}

/* One connection, in its own process: TLS, the guest's token, then its channel. */
static int serve_one(SSL_CTX *ctx, int fd, const struct serve_opts *o, const char *peer)
{
	struct served s = {.l.fd = fd};
	link_init(&s.l);
	pthread_mutex_init(&s.mu, NULL);
	pthread_mutex_init(&s.flush_mu, NULL);
	struct timeval tv = {10, 0}; /* the handshake and the hello: 10 s, then the relay's own waits */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	alarm(15); /* and whatever the peer does, this process is gone 15 s on unless it is welcomed */
	s.l.deadline_ns = vmgpu_now_ns() + 10000000000ull;
	s.l.ssl = SSL_new(ctx);
	SSL_set_fd(s.l.ssl, fd);
	if (SSL_accept(s.l.ssl) != 1) {
		char e[160];
		tls_errors(e, sizeof e);
		logf_("refused %s: no TLS handshake (%s)", peer, e);
		return 1;
	}
	struct frame f;
	char hello[HELLO_MAX + 1] = {0};
	if (recv_header(&s.l, &f, HELLO_MAX) < 0 || f.kind != F_HELLO || link_io(&s.l, hello, f.len, false) < 0) {
		logf_("refused %s: no hello", peer);
		return 1;
	}
	char purpose[16] = "", guest[72] = "", token[TOKEN_HEX + 2] = "";
	int version = 0;
	char want[65], got[65], region[4096];
	if (sscanf(hello, "vmgpu-net %d %15s %71s %65s", &version, purpose, guest, token) != 4 ||
	    version != PROTO_VERSION || strlen(token) != TOKEN_HEX || !guest_name_ok(guest)) {
		const char *why = "not a vmgpu-net 1 hello";
		send_frame(&s.l, F_REFUSED, 0, why, (uint32_t)strlen(why), NULL, 0);
		logf_("refused %s: %s", peer, why);
		return 1;
	}
	/* a guest this host does not serve and a wrong token get the same answer */
	bool known = guest_entry(o->guests, guest, region, sizeof region, want) == 0;
	if (!known)
		memset(want, 'x', 64);
	want[64] = 0;
	sha256_hex(token, TOKEN_HEX, got);
	OPENSSL_cleanse(token, sizeof token);
	if (CRYPTO_memcmp(want, got, 64) != 0 || !known) {
		const char *why = "this token is not the guest's";
		send_frame(&s.l, F_REFUSED, 0, why, (uint32_t)strlen(why), NULL, 0);
		logf_("refused %s: %s for guest %s", peer, known ? "a wrong token" : "a guest this host does not serve",
		      guest);
		return 1;
	}
	uint64_t size;
	void *base = map_region(region, &size);
	struct vmgpu_wait_opts wo;
	vmgpu_wait_opts_default(&wo);
	struct vmgpu_guest *g;
	if (!base || vmgpu_guest_attach(base, size, &wo, &g) < 0) {
		const char *why = "the forwarder's region is not ready";
		send_frame(&s.l, F_REFUSED, 0, why, (uint32_t)strlen(why), NULL, 0);
		logf_("guest %s: %s (%s)", guest, why, base ? vmgpu_shm_errmsg() : region);
		return 1;
	}
	const struct vmgpu_layout *L = vmgpu_guest_layout(g);
	if (strcmp(purpose, "geometry") == 0) {
		struct geometry geo = {PROTO_VERSION, L->nchannels, L->req_ring_size, L->cpl_ring_size, L->wait_mode, 0,
				       L->bulk_size, L->heap_block_size};
		send_frame(&s.l, F_WELCOME, 0, &geo, sizeof geo, NULL, 0);
		SSL_shutdown(s.l.ssl);
		return 0;
	}
	if (strcmp(purpose, "channel") != 0) {
		const char *why = "an unknown purpose";
		send_frame(&s.l, F_REFUSED, 0, why, (uint32_t)strlen(why), NULL, 0);
		return 1;
	}
	if (vmgpu_guest_claim(g, 5000000000ull, &s.ch) < 0) {
		char why[200];
		snprintf(why, sizeof why, "no channel: %s", vmgpu_shm_errmsg());
		send_frame(&s.l, F_REFUSED, 0, why, (uint32_t)strlen(why), NULL, 0);
		logf_("refused %s: %s", peer, why);
		return 1;
	}
	if (L->bulk_size > MAX_BULK) {
		const char *why = "the forwarder's bulk area is larger than this bridge carries";
		send_frame(&s.l, F_REFUSED, 0, why, (uint32_t)strlen(why), NULL, 0);
		logf_("guest %s: %s", guest, why);
		return 1;
	}
	s.bulk_size = L->bulk_size;
	s.max_req = vmgpu_gchan_max_payload(s.ch, 0);
	s.max_cpl = vmgpu_gchan_max_payload(s.ch, 1);
	char welcome[32];
	int wl = snprintf(welcome, sizeof welcome, "channel %u", vmgpu_gchan_index(s.ch));
	if (send_frame(&s.l, F_WELCOME, 0, welcome, (uint32_t)wl, NULL, 0) < 0)
		return 1;
	logf_("%s: guest %s served as channel %u of %s", peer, guest, vmgpu_gchan_index(s.ch), region);
	alarm(0);
	s.l.deadline_ns = 0;
	tv = (struct timeval){0, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	set_nonblocking(fd);
	s.released = s.released_seen = vmgpu_gchan_bulk_released(s.ch);
	pthread_t up, down, rel;
	pthread_create(&up, NULL, serve_up, &s);
	pthread_create(&down, NULL, serve_down, &s);
	pthread_create(&rel, NULL, serve_release, &s);
	pthread_join(up, NULL);
	link_fail(&s.l, "the guest closed the link");
	pthread_join(down, NULL);
	pthread_join(rel, NULL);
	logf_("%s: channel %u ended: %s", peer, vmgpu_gchan_index(s.ch), s.l.why);
	/* the guest process is gone for the forwarder as it would be on this host */
	vmgpu_gchan_close(s.ch);
	return 0;
}

static volatile sig_atomic_t stopping;
static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

static int cmd_serve(const struct serve_opts *o)
{
	if (!o->listen || !o->guests || !o->certdir)
		die("serve needs --listen, --guests and --cert");
	if (!dir_ours(o->guests))
		die("--guests %s must be a directory of yours that no one else can write", o->guests);
	struct sockaddr_storage sa;
	socklen_t salen;
	if (parse_hostport(o->listen, &sa, &salen))
		die("--listen %s is not ADDRESS:PORT (a numeric address)", o->listen);
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	char cert[4096], key[4096];
	snprintf(cert, sizeof cert, "%s/cert.pem", o->certdir);
	snprintf(key, sizeof key, "%s/key.pem", o->certdir);
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	if (SSL_CTX_use_certificate_file(ctx, cert, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
		die("--cert %s: no usable cert.pem and key.pem (make them with `%s cert DIR`)", o->certdir, prog);
	int ls = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ls < 0 || bind(ls, (struct sockaddr *)&sa, salen) || listen(ls, 64))
		die("--listen %s: %s", o->listen, strerror(errno));
	struct sigaction act = {.sa_handler = on_stop};
	sigaction(SIGTERM, &act, NULL);
	sigaction(SIGINT, &act, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* a process group of its own: the children serving links end with it, and nothing else does */
	setpgid(0, 0);
	logf_("listening on %s for the guests in %s", o->listen, o->guests);
	printf("listening\n");
	fflush(stdout);
	unsigned children = 0;
	while (!stopping) {
		while (waitpid(-1, NULL, WNOHANG) > 0)
			children--;
		struct pollfd pf = {ls, POLLIN, 0};
		if (poll(&pf, 1, 200) <= 0)
			continue;
		struct sockaddr_storage peer;
		socklen_t pl = sizeof peer;
		int fd = accept4(ls, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		char name[80] = "?", port[16] = "";
		getnameinfo((struct sockaddr *)&peer, pl, name, sizeof name, port, sizeof port,
			    NI_NUMERICHOST | NI_NUMERICSERV);
		char who[100];
		snprintf(who, sizeof who, "%s:%s", name, port);
		if (children >= MAX_LINKS) {
			/* a bound on what peers can make this host hold (a peer that never says hello is
			 * gone after 15 s); guests' processes past it are refused and try again */
			logf_("refused %s: %u links already (the most this bridge serves)", who, children);
			close(fd);
			continue;
		}
		tcp_liveness(fd);
		pid_t pid = fork();
		if (pid == 0) {
			close(ls);
			signal(SIGTERM, SIG_DFL);
			signal(SIGINT, SIG_DFL);
			_exit(serve_one(ctx, fd, o, who));
		}
		if (pid < 0)
			logf_("refused %s: cannot fork: %s", who, strerror(errno));
		else
			children++;
		close(fd);
	}
	/* the children's links end with us: each closes its channel, the forwarder reclaims it */
	kill(0, SIGTERM);
	while (wait(NULL) > 0)
		;
	close(ls);
	SSL_CTX_free(ctx);
	logf_("stopped");
	return 0;
}

/* ===================================== attach ============================================= */

struct attach_opts {
	const char *connect, *region, *fingerprint, *token_file, *guest;
	uint64_t size;
	char token[TOKEN_HEX + 1];
	struct sockaddr_storage sa;
	socklen_t salen;
	SSL_CTX *ctx;
};

/* A TLS link to serve, its certificate checked against the pinned fingerprint and the hello
 * answered; the welcome's payload (at most cap bytes) in out.  NULL with why on failure. */
static SSL *dial(struct attach_opts *o, const char *purpose, int *fdp, void *out, uint32_t cap, uint32_t *outlen,
		 char *why, size_t whylen)
{
	int fd = socket(o->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = {10, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (fd >= 0)
		tcp_liveness(fd);
	if (fd < 0 || connect(fd, (struct sockaddr *)&o->sa, o->salen)) {
		snprintf(why, whylen, "cannot connect to %s: %s", o->connect, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	SSL *ssl = SSL_new(o->ctx);
	SSL_set_fd(ssl, fd);
	if (SSL_connect(ssl) != 1) {
		char e[160];
		tls_errors(e, sizeof e);
		snprintf(why, whylen, "no TLS with %s: %s", o->connect, e);
		goto fail;
	}
	X509 *cert = SSL_get1_peer_certificate(ssl);
	char fp[65] = "";
	if (cert)
		cert_fingerprint(cert, fp);
	X509_free(cert);
	if (!cert || CRYPTO_memcmp(fp, o->fingerprint, 64) != 0) {
		snprintf(why, whylen, "%s's certificate is not the pinned one (fingerprint %s)", o->connect, fp);
		goto fail;
	}
	struct link l = {.ssl = ssl, .fd = fd, .deadline_ns = vmgpu_now_ns() + 15000000000ull};
	link_init(&l);
	char hello[256];
	int hl = snprintf(hello, sizeof hello, "vmgpu-net %d %s %s %s", PROTO_VERSION, purpose, o->guest, o->token);
	struct frame f;
	uint8_t reply[256];
	if (send_frame(&l, F_HELLO, 0, hello, (uint32_t)hl, NULL, 0) < 0 || recv_header(&l, &f, sizeof reply - 1) < 0 ||
	    link_io(&l, reply, f.len, false) < 0) {
		snprintf(why, whylen, "%s closed the link during the hello", o->connect);
		goto fail;
	}
	if (f.kind == F_REFUSED) {
		reply[f.len] = 0;
		snprintf(why, whylen, "%s refused: %s", o->connect, (char *)reply);
		goto fail;
	}
	if (f.kind != F_WELCOME || f.len > cap) {
		snprintf(why, whylen, "%s answered the hello with something else", o->connect);
		goto fail;
	}
	memcpy(out, reply, f.len);
	*outlen = f.len;
	*fdp = fd;
	return ssl;
fail:
	SSL_free(ssl);
	close(fd);
	return NULL;
}

struct relay {
	struct link l;
	struct vmgpu_hchan *hc;
	struct attach_opts *o;
	uint32_t idx, max_req, max_cpl;
	uint64_t bulk_size;
	struct ranges in;  /* the guest's ranges not yet sent (bytes go before its next request) */
	struct ranges out; /* ranges the remote forwarder will fill (pushed by up, taken by down) */
	pthread_mutex_t omu;
	pthread_t up, down;
	atomic_int stop, done;
	bool running;
	bool fence; /* its link ended and its channel is still to be reclaimed */
	uint64_t records, writes; /* relay_up's: records sent, writes they took (batching) */
};

/* The region's heartbeat, from a thread of its own: a slow dial or hello never stops it (guests
 * take a silent host for a dead one). */
static void *beat_thread(void *arg)
{
	struct vmgpu_host *h = arg;
	while (!stopping) {
		vmgpu_host_beat(h);
		vmgpu_host_republish(h);
		struct timespec ts = {0, 100000000};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* Frames to serve gathered into one write (a TLS record, a TCP segment or a few) while the
 * guest keeps its ring busy: a run of launches crosses together.  Sent as soon as the ring is
 * empty, so a call that waits for its answer is never held back. */
#define BATCH_BYTES (64u << 10)

struct batch {
	uint8_t *buf;
	size_t len, cap;
};

static int batch_flush(struct relay *r, struct batch *b)
{
	if (!b->len)
		return 0;
	pthread_mutex_lock(&r->l.wmu);
	int e = link_io(&r->l, b->buf, b->len, true);
	pthread_mutex_unlock(&r->l.wmu);
	b->len = 0;
	r->writes++;
	return e;
}

static int batch_frame(struct relay *r, struct batch *b, uint32_t kind, uint64_t aux, const void *p, uint32_t n)
{
	if (b->len + sizeof(struct frame) + n > b->cap && batch_flush(r, b) < 0)
		return -1;
	struct frame f = {kind, n, aux};
	memcpy(b->buf + b->len, &f, sizeof f);
	memcpy(b->buf + b->len + sizeof f, p, n);
	b->len += sizeof f + n;
	r->records++;
	return b->len >= BATCH_BYTES ? batch_flush(r, b) : 0;
}

/* The guest process's records to serve. */
static void *relay_up(void *arg)
{
	struct relay *r = arg;
	uint8_t *buf = malloc(r->max_req);
	struct batch b = {malloc(BATCH_BYTES + sizeof(struct frame) + r->max_req), 0,
			  BATCH_BYTES + sizeof(struct frame) + r->max_req};
	const char *why = "the guest process's channel ended";
	while (buf && b.buf && !atomic_load(&r->stop) && !atomic_load(&r->l.dead)) {
		uint16_t type;
		/* more records at once while some are gathered; a wait only with nothing gathered */
		int n = vmgpu_hchan_recv(r->hc, buf, r->max_req, &type, b.len ? 0 : RECV_SLICE_NS);
		if (n == -ETIMEDOUT || n == -EAGAIN) {
			if (b.len) {
				if (batch_flush(r, &b) < 0)
					break;
				continue;
			}
			/* this thread alone looks at the channel's owner while it is relayed */
			int ev = vmgpu_hchan_poll(r->hc, vmgpu_now_ns());
			if (ev == VMGPU_HC_SERVING)
				continue;
			why = ev == VMGPU_HC_CLOSED ? "the guest process closed its channel" : "the guest process is gone";
			break;
		}
		if (n < 0) {
			why = "the guest process broke its channel";
			break;
		}
		if (type == VMGPU_REC_BULK_NOTE) {
			struct vmgpu_bulk_note note;
			if (n == sizeof note)
				memcpy(&note, buf, sizeof note);
			if (n != sizeof note || !note_ok(&note, r->bulk_size)) {
				why = "the guest process sent a malformed bulk note";
				break; /* it broke the protocol: its channel is lost */
			}
			pthread_mutex_lock(&r->omu);
			int full = ((note.dir & VMGPU_BULK_TO_HOST) && ranges_push(&r->in, note.pos, note.len, NULL) < 0) ||
				   ((note.dir & VMGPU_BULK_FROM_HOST) && ranges_push(&r->out, note.pos, note.len, NULL) < 0);
			pthread_mutex_unlock(&r->omu);
			if (full) {
				why = "the guest process has more bulk ranges in flight than the protocol allows";
				break;
			}
		} else if (ranges_front(&r->in)) {
			/* the bytes the guest wrote go first: the request may name them (after what is
			 * gathered, which came before them) */
			if (batch_flush(r, &b) < 0)
				break;
			struct range *g;
			while ((g = ranges_front(&r->in))) {
				void *p = vmgpu_hchan_bulk(r->hc, g->pos, g->len);
				if (!p) {
					why = "a bulk range outside the channel's bulk area";
					goto out;
				}
				if (send_frame(&r->l, F_BULK, g->pos, p, (uint32_t)g->len, NULL, 0) < 0)
					goto out;
				ranges_pop(&r->in);
			}
		}
		if (batch_frame(r, &b, F_REC, type, buf, (uint32_t)n) < 0)
			break;
	}
out:
	free(buf);
	free(b.buf);
	pthread_mutex_lock(&r->l.mu);
	if (!r->l.why[0]) /* the reason, before the other side can answer with one of its own */
		snprintf(r->l.why, sizeof r->l.why, "%s", why);
	if (atomic_load(&r->stop) == 0 && strstr(why, "closed its channel"))
		SSL_shutdown(r->l.ssl); /* an orderly end: serve sees the link closed, not broken */
	pthread_mutex_unlock(&r->l.mu);
	link_fail(&r->l, why);
	atomic_store(&r->done, 1);
	return NULL;
}

/* serve's frames into the guest process's channel. */
static void *relay_down(void *arg)
{
	struct relay *r = arg;
	uint32_t cap = r->max_cpl > r->bulk_size ? r->max_cpl : (uint32_t)r->bulk_size;
	uint8_t *buf = malloc(r->max_cpl); /* bulk bytes go straight to their range */
	while (buf && !atomic_load(&r->l.dead)) {
		struct frame f;
		if (recv_header(&r->l, &f, cap) < 0)
			break;
		if (f.kind == F_BULK) {
			/* bytes for the oldest range the guest asked to be filled, exactly, read straight in */
			pthread_mutex_lock(&r->omu);
			struct range *g = ranges_front(&r->out);
			void *p = g && g->pos == f.aux && g->len == f.len ? vmgpu_hchan_bulk(r->hc, g->pos, g->len) : NULL;
			if (p)
				ranges_pop(&r->out);
			pthread_mutex_unlock(&r->omu);
			if (!p) {
				link_fail(&r->l, "bulk bytes for a range the guest did not ask to be filled");
				break;
			}
			if (link_io(&r->l, p, f.len, false) < 0)
				break;
			continue;
		}
		if (record_in(&r->l, buf, f.len, r->max_cpl, "a record longer than any completion") < 0)
			break;
		if (f.kind == F_REC && f.aux != VMGPU_REC_PAD && f.aux < 0xff00) {
			/* never a waiting send: a wait checks the owner's liveness, which relay_up alone
			 * may touch (one thread per channel and side); a full ring is retried instead */
			int e;
			while ((e = vmgpu_hchan_send(r->hc, (uint16_t)f.aux, buf, f.len, 0)) == -EAGAIN &&
			       !atomic_load(&r->stop) && !atomic_load(&r->l.dead))
				usleep(50);
			if (e < 0)
				break;
		} else if (f.kind == F_RELEASE && f.len == 0) {
			vmgpu_hchan_bulk_release(r->hc, f.aux);
		} else {
			link_fail(&r->l, "a frame serve may not send");
			break;
		}
	}
	free(buf);
	link_fail(&r->l, "the link ended");
	atomic_store(&r->done, 1);
	return NULL;
}

static void relay_start(struct relay *r)
{
	char why[300], welcome[64];
	uint32_t wl = 0;
	int fd = -1;
	SSL *ssl = dial(r->o, "channel", &fd, welcome, sizeof welcome - 1, &wl, why, sizeof why);
	memset(&r->l, 0, sizeof r->l);
	link_init(&r->l);
	r->in = (struct ranges){0};
	r->out = (struct ranges){0};
	r->records = r->writes = 0;
	atomic_store(&r->stop, 0);
	atomic_store(&r->done, 0);
	if (!ssl) {
		logf_("channel %u: %s; the guest process loses its GPU", r->idx, why);
		r->running = false;
		atomic_store(&r->done, 1);
		return;
	}
	r->l.ssl = ssl;
	r->l.fd = fd;
	struct timeval tv = {0, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	set_nonblocking(fd);
	welcome[wl] = 0;
	logf_("channel %u: relayed to %s (%s there)", r->idx, r->o->connect, welcome);
	r->running = true;
	pthread_create(&r->up, NULL, relay_up, r);
	pthread_create(&r->down, NULL, relay_down, r);
}

static void relay_stop(struct relay *r)
{
	if (!r->running)
		return;
	atomic_store(&r->stop, 1);
	link_fail(&r->l, "this bridge is stopping");
	pthread_join(r->up, NULL);
	pthread_join(r->down, NULL);
	if (r->l.why[0])
		logf_("channel %u: link closed (%s); %llu records in %llu writes", r->idx, r->l.why,
		      (unsigned long long)r->records, (unsigned long long)r->writes);
	SSL_free(r->l.ssl);
	close(r->l.fd);
	r->running = false;
}

static int cmd_attach(struct attach_opts *o)
{
	if (!o->connect || !o->region || !o->fingerprint || !o->token_file || !o->size || !o->guest)
		die("attach needs --connect, --guest, --region, --size, --fingerprint and --token-file");
	if (!guest_name_ok(o->guest))
		die("--guest %s is not a guest name (1-64 of A-Z a-z 0-9 . _ -)", o->guest);
	if (!is_hex64(o->fingerprint))
		die("--fingerprint must be the 64 lowercase hexadecimal characters `%s cert` printed", prog);
	if (parse_hostport(o->connect, &o->sa, &o->salen))
		die("--connect %s is not ADDRESS:PORT (a numeric address)", o->connect);
	read_token(o->token_file, o->token);
	o->ctx = SSL_CTX_new(TLS_client_method());
	SSL_CTX_set_min_proto_version(o->ctx, TLS1_3_VERSION);
	SSL_CTX_set_verify(o->ctx, SSL_VERIFY_NONE, NULL); /* the fingerprint is checked in dial() */
	signal(SIGPIPE, SIG_IGN);

	/* the remote region's geometry: ours is the same, so bulk positions agree */
	struct geometry geo;
	uint32_t gl = 0;
	int fd;
	char why[300];
	SSL *ssl = dial(o, "geometry", &fd, &geo, sizeof geo, &gl, why, sizeof why);
	if (!ssl)
		die("%s", why);
	SSL_free(ssl);
	close(fd);
	if (gl != sizeof geo || geo.version != PROTO_VERSION || geo.nchannels == 0 || geo.nchannels > 4096 ||
	    geo.bulk_size > MAX_BULK)
		die("%s sent a geometry this bridge does not understand", o->connect);
	struct vmgpu_shm_params p = {geo.nchannels, geo.req_ring_size, geo.cpl_ring_size, VMGPU_WAIT_FUTEX,
				     geo.bulk_size, geo.heap_block_size};
	uint64_t need = vmgpu_region_min_size(&p, 0);
	if (!need)
		die("%s sent a geometry this bridge cannot lay out: %s", o->connect, vmgpu_shm_errmsg());
	if (o->size < need)
		die("--size: the remote geometry needs a region of at least %llu bytes", (unsigned long long)need);

	int rfd = open(o->region, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (rfd < 0)
		die("--region %s: %s (an existing file is never taken over)", o->region, strerror(errno));
	void *base = MAP_FAILED;
	if (ftruncate(rfd, (off_t)o->size) == 0)
		base = mmap(NULL, o->size, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
	close(rfd);
	struct vmgpu_host *h = NULL;
	struct vmgpu_wait_opts wo;
	vmgpu_wait_opts_default(&wo);
	if (base == MAP_FAILED || vmgpu_region_format(base, o->size, &p, "remote") < 0 ||
	    vmgpu_host_attach(base, o->size, &p, &wo, &h) < 0) {
		unlink(o->region);
		die("--region %s: %s", o->region, base == MAP_FAILED ? strerror(errno) : vmgpu_shm_errmsg());
	}
	vmgpu_host_set_remote(h);
	struct sigaction act = {.sa_handler = on_stop};
	sigaction(SIGTERM, &act, NULL);
	sigaction(SIGINT, &act, NULL);
	const struct vmgpu_layout *L = vmgpu_host_layout(h);
	struct relay *relays = calloc(L->nchannels, sizeof *relays);
	for (uint32_t i = 0; i < L->nchannels; i++) {
		relays[i] = (struct relay){.o = o, .idx = i, .bulk_size = L->bulk_size, .hc = vmgpu_host_chan(h, i)};
		pthread_mutex_init(&relays[i].omu, NULL);
		relays[i].max_req = L->req_ring_size;
		relays[i].max_cpl = L->cpl_ring_size;
	}
	logf_("region %s: the GPU is at %s (%u channels, bulk %llu bytes)", o->region, o->connect, L->nchannels,
	      (unsigned long long)L->bulk_size);
	printf("ready\n");
	fflush(stdout);
	vmgpu_host_beat(h);
	pthread_t beater;
	pthread_create(&beater, NULL, beat_thread, h);
	while (!stopping) {
		uint64_t now = vmgpu_now_ns();
		for (uint32_t i = 0; i < L->nchannels; i++) {
			struct relay *r = &relays[i];
			if (r->running) {
				/* the relay watches its channel itself; once the channel or the link ended, the
				 * channel is reclaimed (a guest process that lost its link gets a sticky error) */
				if (atomic_load(&r->done)) {
					relay_stop(r);
					r->fence = true;
				}
				else
					continue;
			}
			if (r->fence) {
				/* reclaimed for sure before the channel is looked at again (a reclaim that lost
				 * a race with the owner's write is tried again) */
				if (vmgpu_hchan_reclaim(r->hc) == 0 || vmgpu_hchan_poll(r->hc, now) == VMGPU_HC_IDLE)
					r->fence = false;
				continue;
			}
			int ev = vmgpu_hchan_poll(r->hc, now);
			if (ev == VMGPU_HC_OPENED) {
				relay_start(r);
				if (!r->running)
					r->fence = true;
			} else if (ev == VMGPU_HC_CLOSED || ev == VMGPU_HC_LOST) {
				r->fence = true;
			}
		}
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	pthread_join(beater, NULL);
	for (uint32_t i = 0; i < L->nchannels; i++)
		relay_stop(&relays[i]);
	vmgpu_host_close(h);
	unlink(o->region);
	logf_("stopped; region %s removed", o->region);
	return 0;
}

static void usage(FILE *to)
{
	fprintf(to,
		"usage: %s cert DIR\n"
		"       %s serve --listen ADDR:PORT --guests DIR --cert DIR\n"
		"       %s attach --connect ADDR:PORT --guest NAME --region FILE --size SIZE --fingerprint HEX\n"
		"              --token-file FILE\n"
		"\n"
		"A guest's region carried over TLS to a forwarder on another host.\n"
		"  cert     make DIR/key.pem and DIR/cert.pem (self-signed, P-256) for serve; prints the\n"
		"           certificate's SHA-256 fingerprint, which attach pins\n"
		"  serve    on the GPU host: DIR/NAME says, for each guest served here, \"REGION SHA256\" (its\n"
		"           forwarder's region and its token's SHA-256); each guest process that proves\n"
		"           its guest's token gets a channel of that region\n"
		"  attach   on the guest's machine: make the region FILE (SIZE bytes) the guest maps, and\n"
		"           carry each of its channels to serve at ADDR:PORT\n",
		prog, prog, prog);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(cmd, "cert")) {
		if (argc != 3)
			die("cert takes one directory");
		return cmd_cert(argv[2]);
	}
	static struct option opts[] = {{"listen", 1, 0, 'l'},	   {"region", 1, 0, 'r'},     {"cert", 1, 0, 'c'},
				       {"guests", 1, 0, 'g'},	   {"connect", 1, 0, 'C'},    {"size", 1, 0, 's'},
				       {"fingerprint", 1, 0, 'f'}, {"token-file", 1, 0, 'T'}, {"guest", 1, 0, 'G'},
				       {"help", 0, 0, 'h'},	   {0, 0, 0, 0}};
	struct serve_opts so = {0};
	static struct attach_opts ao;
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			so.listen = optarg;
			break;
		case 'r':
			ao.region = optarg;
			break;
		case 'g':
			so.guests = optarg;
			break;
		case 'G':
			ao.guest = optarg;
			break;
		case 'c':
			so.certdir = optarg;
			break;
		case 'C':
			ao.connect = optarg;
			break;
		case 's':
			if (parse_size(optarg, &ao.size))
				die("--size %s is not a size (bytes, or with K, M or G)", optarg);
			break;
		case 'f':
			ao.fingerprint = optarg;
			break;
		case 'T':
			ao.token_file = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc)
		die("unexpected argument %s", argv[optind]);
	if (!strcmp(cmd, "serve"))
		return cmd_serve(&so);
	if (!strcmp(cmd, "attach"))
		return cmd_attach(&ao);
	die("unknown command %s (cert, serve or attach)", cmd);
}
