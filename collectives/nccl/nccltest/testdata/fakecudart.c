/* A fake libcudart.so: the CUDA runtime calls package nccl makes, on the CPU.
 * "Device memory" is host memory, but the fake knows which blocks cudaMalloc
 * handed out: cudaMemcpyAsync, cudaFree and the fake NCCL reject addresses
 * outside them, as a GPU would fault on them. */
#include "fakegpu.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
void fake_lock(void) { pthread_mutex_lock(&mu); }
void fake_unlock(void) { pthread_mutex_unlock(&mu); }

#define MAXREC 200000
static fake_rec recs[MAXREC];
static int nrec;

void fake_rec_init(fake_rec *r, const char *fn) {
	memset(r, 0xff, sizeof *r);
	memset(r->fn, 0, sizeof r->fn);
	strncpy(r->fn, fn, sizeof r->fn - 1);
	r->dev = fake_current_device();
}
void fake_record(const fake_rec *r) {
	fake_lock();
	if (nrec < MAXREC) recs[nrec++] = *r;
	fake_unlock();
}
int fake_log_len(void) {
	fake_lock();
	int n = nrec;
	fake_unlock();
	return n;
}
int fake_log_get(int i, fake_rec *out) {
	fake_lock();
	int ok = i >= 0 && i < nrec;
	if (ok) *out = recs[i];
	fake_unlock();
	return ok;
}

/* Error injection: the (skip+1)-th next call of fn returns code. */
struct inj { char fn[32]; int code, skip, armed; };
static struct inj injs[16];
void fake_inject_set(const char *fn, int code, int skip) {
	fake_lock();
	for (int i = 0; i < 16; i++) {
		if (!injs[i].armed) {
			strncpy(injs[i].fn, fn, 31);
			injs[i].code = code, injs[i].skip = skip, injs[i].armed = 1;
			break;
		}
	}
	fake_unlock();
}
static int inject_locked(const char *fn) {
	for (int i = 0; i < 16; i++) {
		if (injs[i].armed && strcmp(injs[i].fn, fn) == 0) {
			if (injs[i].skip-- > 0) return 0;
			injs[i].armed = 0;
			return injs[i].code;
		}
	}
	return 0;
}
int fake_inject(const char *fn) {
	fake_lock();
	int c = inject_locked(fn);
	fake_unlock();
	return c;
}

static int ndevices = 2, version = 22105;
static long live_allocs, live_streams;
static __thread int cur_dev;

void fake_reset(void) {
	fake_lock();
	nrec = 0;
	memset(injs, 0, sizeof injs);
	ndevices = 2, version = 22105;
	fake_unlock();
}
void fake_set_devices(int n) { fake_lock(); ndevices = n; fake_unlock(); }
void fake_set_nccl_version(int v) { fake_lock(); version = v; fake_unlock(); }
int fake_nccl_version(void) { fake_lock(); int v = version; fake_unlock(); return v; }
long fake_live_allocs(void) { fake_lock(); long n = live_allocs; fake_unlock(); return n; }
long fake_live_streams(void) { fake_lock(); long n = live_streams; fake_unlock(); return n; }
int fake_current_device(void) { return cur_dev; }

/* Streams. */
struct op { fake_progress_fn progress; void *arg; void (*done)(void *); struct op *next; };
struct stream { struct op *head, *tail; };

void fake_stream_enqueue(void *s, fake_progress_fn progress, void *arg, void (*done)(void *)) {
	struct stream *st = s;
	struct op *o = calloc(1, sizeof *o);
	o->progress = progress, o->arg = arg, o->done = done;
	fake_lock();
	if (st->tail) st->tail->next = o; else st->head = o;
	st->tail = o;
	fake_unlock();
}

/* Runs queued work in order until it blocks; called with the lock held. */
static int advance_locked(struct stream *st) {
	while (st->head) {
		struct op *o = st->head;
		if (!o->progress(o->arg)) return 600; /* cudaErrorNotReady */
		st->head = o->next;
		if (!st->head) st->tail = NULL;
		if (o->done) o->done(o->arg);
		free(o);
	}
	return 0;
}

int cudaGetDeviceCount(int *n) {
	fake_rec r; fake_rec_init(&r, "cudaGetDeviceCount"); fake_record(&r);
	fake_lock(); *n = ndevices; fake_unlock();
	return 0;
}
int cudaSetDevice(int d) {
	fake_rec r; fake_rec_init(&r, "cudaSetDevice"); r.peer = d; fake_record(&r);
	fake_lock(); int n = ndevices; fake_unlock();
	if (d < 0 || d >= n) return 101; /* cudaErrorInvalidDevice */
	cur_dev = d;
	return 0;
}
int cudaStreamCreateWithFlags(void **s, unsigned flags) {
	int c = fake_inject("cudaStreamCreateWithFlags");
	if (c) return c;
	*s = calloc(1, sizeof(struct stream));
	fake_lock(); live_streams++; fake_unlock();
	fake_rec r; fake_rec_init(&r, "cudaStreamCreateWithFlags");
	r.op = flags, r.stream = (int64_t)(intptr_t)*s;
	fake_record(&r);
	return 0;
}
int cudaStreamDestroy(void *s) {
	fake_rec r; fake_rec_init(&r, "cudaStreamDestroy"); r.stream = (int64_t)(intptr_t)s; fake_record(&r);
	struct stream *st = s;
	fake_lock();
	/* Pending work is dropped, not freed: a peer may still point at it. */
	st->head = st->tail = NULL;
	live_streams--;
	fake_unlock();
	free(st);
	return 0;
}
int cudaStreamQuery(void *s) {
	fake_lock();
	int c = inject_locked("cudaStreamQuery");
	if (!c) c = advance_locked(s);
	fake_unlock();
	return c;
}
/* The live device allocations. */
struct block { char *p; size_t n; };
static struct block *blocks;
static size_t nblocks, capblocks;

static long find_block_locked(const void *p) {
	for (size_t i = 0; i < nblocks; i++)
		if ((const char *)p >= blocks[i].p && (const char *)p < blocks[i].p + blocks[i].n) return (long)i;
	return -1;
}
/* fake_is_device reports whether [p, p+n) lies inside one live allocation. */
int fake_is_device(const void *p, size_t n) {
	fake_lock();
	long i = find_block_locked(p);
	int ok = i >= 0 && (const char *)p + n <= blocks[i].p + blocks[i].n;
	fake_unlock();
	return ok;
}

/* cudaMalloc records the size asked for (bytes) and the address returned
 * (recvbuf). */
int cudaMalloc(void **p, size_t n) {
	fake_rec r; fake_rec_init(&r, "cudaMalloc"); r.bytes = (int64_t)n;
	int c = fake_inject("cudaMalloc");
	if (c) { fake_record(&r); return c; }
	*p = calloc(1, n ? n : 1);
	r.recvbuf = (int64_t)(intptr_t)*p;
	fake_record(&r);
	fake_lock();
	if (nblocks == capblocks) {
		capblocks = capblocks ? 2 * capblocks : 64;
		blocks = realloc(blocks, capblocks * sizeof *blocks);
	}
	blocks[nblocks].p = *p, blocks[nblocks].n = n ? n : 1;
	nblocks++;
	live_allocs++;
	fake_unlock();
	return 0;
}
/* cudaFree records the address (sendbuf) and refuses one that is not the
 * start of a live allocation (a double free, or host memory). */
int cudaFree(void *p) {
	if (!p) return 0;
	fake_rec r; fake_rec_init(&r, "cudaFree"); r.sendbuf = (int64_t)(intptr_t)p; fake_record(&r);
	fake_lock();
	long i = find_block_locked(p);
	if (i < 0 || blocks[i].p != p) {
		fake_unlock();
		return 1; /* cudaErrorInvalidValue */
	}
	blocks[i] = blocks[--nblocks];
	live_allocs--;
	fake_unlock();
	free(p);
	return 0;
}

struct copy { void *dst; const void *src; size_t n; };
static int copy_progress(void *arg) {
	struct copy *c = arg;
	memcpy(c->dst, c->src, c->n);
	return 1;
}
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
	fake_rec r; fake_rec_init(&r, "cudaMemcpyAsync");
	r.kind = kind, r.bytes = (int64_t)n, r.stream = (int64_t)(intptr_t)stream;
	r.sendbuf = (int64_t)(intptr_t)src, r.recvbuf = (int64_t)(intptr_t)dst;
	fake_record(&r);
	int c = fake_inject("cudaMemcpyAsync");
	if (c) return c;
	if (kind != 1 && kind != 2) return 21; /* cudaErrorInvalidMemcpyDirection */
	/* Host to device: dst on the device, src not; device to host the reverse. */
	const void *dev = kind == 1 ? dst : src, *host = kind == 1 ? src : dst;
	if (!fake_is_device(dev, n) || fake_is_device(host, 1)) return 1; /* cudaErrorInvalidValue */
	struct copy *cp = malloc(sizeof *cp);
	cp->dst = dst, cp->src = src, cp->n = n;
	fake_stream_enqueue(stream, copy_progress, cp, free);
	return 0;
}
const char *cudaGetErrorString(int e) {
	switch (e) {
	case 1: return "fake: invalid argument";
	case 2: return "fake: out of memory";
	case 101: return "fake: invalid device ordinal";
	case 700: return "fake: an illegal memory access was encountered";
	}
	return "fake: CUDA error";
}
