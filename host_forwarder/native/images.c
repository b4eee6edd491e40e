/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Module images by content, shared by all of a guest's processes: an image
 * crosses the channel once; later loads of the same bytes (another process, a
 * reload) are answered from here.  The hash is recomputed over the received
 * bytes before an image is kept, so what a guest claims cannot poison it.
 * Bounded (VMGPU_IMAGE_CACHE_MIB, default 1024); least recently used unreferenced
 * images go first.
 */
#include <stdlib.h>

#include "vg_hash.h"
#include "vh_dispatch.h"

struct vh_image {
	uint64_t size, hash[2], last_use;
	uint8_t *bytes;
	int refs;
	struct vh_image *next;
};

struct vh_images {
	pthread_mutex_t mu;
	struct vh_image *head;
	uint64_t bytes, limit, clock;
};

static struct vh_images *cache_of(struct vh_fwd *f)
{
	static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&init_mu);
	if (!f->images) {
		struct vh_images *c = calloc(1, sizeof *c);
		if (c) {
			pthread_mutex_init(&c->mu, NULL);
			const char *e = getenv("VMGPU_IMAGE_CACHE_MIB");
			c->limit = (e && atoll(e) >= 0 ? (uint64_t)atoll(e) : 1024) << 20;
		}
		f->images = c;
	}
	pthread_mutex_unlock(&init_mu);
	return f->images;
}

const uint8_t *vh_image_bytes(const struct vh_image *img)
{
	return img->bytes;
}

struct vh_image *vh_image_find(struct vh_fwd *f, uint64_t size, const uint64_t hash[2])
{
	struct vh_images *c = cache_of(f);
	if (!c)
		return NULL;
	pthread_mutex_lock(&c->mu);
	struct vh_image *img = c->head;
	for (; img; img = img->next)
		if (img->size == size && img->hash[0] == hash[0] && img->hash[1] == hash[1])
			break;
	if (img) {
		img->refs++;
		img->last_use = ++c->clock;
	}
	pthread_mutex_unlock(&c->mu);
	return img;
}

/* Keep bytes (malloc'd, size + 1 with a final NUL) if their size bytes hash to
 * `claimed`; returns a referenced image owning them, or NULL (the caller keeps them). */
struct vh_image *vh_image_add(struct vh_fwd *f, uint8_t *bytes, uint64_t size, const uint64_t claimed[2])
{
	struct vh_images *c = cache_of(f);
	uint64_t h[2];
	if (!c || size > c->limit)
		return NULL;
	vg_hash128(bytes, size, h);
	if (h[0] != claimed[0] || h[1] != claimed[1])
		return NULL;
	struct vh_image *img = calloc(1, sizeof *img);
	if (!img)
		return NULL;
	pthread_mutex_lock(&c->mu);
	while (c->bytes + size > c->limit) {
		struct vh_image **victim = NULL;
		for (struct vh_image **pp = &c->head; *pp; pp = &(*pp)->next)
			if ((*pp)->refs == 0 && (!victim || (*pp)->last_use < (*victim)->last_use))
				victim = pp;
		if (!victim)
			break;
		struct vh_image *v = *victim;
		*victim = v->next;
		c->bytes -= v->size;
		free(v->bytes);
		free(v);
	}
	if (c->bytes + size > c->limit) {
		pthread_mutex_unlock(&c->mu);
		free(img);
		return NULL;
	}
	*img = (struct vh_image){size, {h[0], h[1]}, ++c->clock, bytes, 1, c->head};
	c->head = img;
	c->bytes += size;
	pthread_mutex_unlock(&c->mu);
	return img;
}

void vh_image_put(struct vh_fwd *f, struct vh_image *img)
{
	if (!img)
		return;
	struct vh_images *c = cache_of(f);
	pthread_mutex_lock(&c->mu);
	img->refs--;
	pthread_mutex_unlock(&c->mu);
}
