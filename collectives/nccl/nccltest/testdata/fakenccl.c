/* A fake libnccl.so.2: the NCCL calls package nccl makes, for several ranks
 * of one process (one goroutine per rank), on the CPU. A collective completes
 * once every rank's stream has reached it; point-to-point calls match in
 * order per (sender, receiver) pair. Every call is recorded with the values
 * it received, so the Go tests can check the exact ncclDataType_t,
 * ncclRedOp_t, counts, buffers and streams passed; buffers that are not
 * device memory of the fake runtime are refused with ncclInvalidArgument. */
#include "fakegpu.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { Success, UnhandledCuda, SystemError, InternalError, InvalidArgument, InvalidUsage, RemoteError, InProgress };
enum { Uint8 = 1, Float32 = 7, Float64 = 8, Bfloat16 = 9 };
enum { Sum = 0, Max = 2, Min = 3 };
enum { AllReduce = 1, ReduceScatter, AllGather, Broadcast };

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
	size_t size;
	unsigned magic, version;
	int blocking, cgaClusterSize, minCTAs, maxCTAs;
	const char *netName;
} cfg214;

#define MAXR 16
struct comm;
struct coll {
	int kind, dtype, op, root;
	size_t count;
	const void *send;
	void *recv;
	struct comm *comm;
	long seq;
};
struct p2p {
	int is_send, dtype, peer, done, posted;
	size_t count;
	void *buf;
	struct p2p *next; /* mailbox FIFO */
};
struct group { int n; struct comm *comm; struct p2p *ops[64]; };
struct clique {
	char id[128];
	int nranks, joined, broken;
	struct comm *members[MAXR];
	long seq_done;
	int arrived;
	struct coll *parts[MAXR];
	struct p2p *box[MAXR][MAXR]; /* box[src][dst]: posted sends */
	struct clique *next;
};
struct comm { struct clique *cl; int rank, nranks, gone, async_err; };

static struct clique *cliques;
static char last_error[256];
static unsigned long id_counter;

static size_t esize(int dt) { return dt == Uint8 ? 1 : dt == Float32 ? 4 : dt == Float64 ? 8 : dt == Bfloat16 ? 2 : 0; }

static uint64_t fnv(const void *p, size_t n) {
	const unsigned char *b = p;
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

static int fail(int code, const char *fmt, const char *what) {
	fake_lock();
	snprintf(last_error, sizeof last_error, fmt, what);
	fake_unlock();
	return code;
}
static int injected(const char *fn) {
	int c = fake_inject(fn);
	if (c) fail(c, "fake: injected failure in %s", fn);
	return c;
}

int ncclGetVersion(int *v) { *v = fake_nccl_version(); return Success; }

const char *ncclGetErrorString(int r) {
	switch (r) {
	case Success: return "fake: no error";
	case UnhandledCuda: return "fake: unhandled cuda error";
	case SystemError: return "fake: unhandled system error";
	case InternalError: return "fake: internal error";
	case InvalidArgument: return "fake: invalid argument";
	case InvalidUsage: return "fake: invalid usage";
	case RemoteError: return "fake: remote process exited or there was a network error";
	case InProgress: return "fake: NCCL operation in progress";
	}
	return "fake: unknown result code";
}

const char *ncclGetLastError(void *comm) { (void)comm; return last_error; }

int ncclGetUniqueId(ncclUniqueId *id) {
	int c = injected("ncclGetUniqueId");
	if (c) return c;
	memset(id, 0, sizeof *id);
	fake_lock();
	unsigned long n = ++id_counter;
	fake_unlock();
	snprintf(id->internal, sizeof id->internal, "FAKE-NCCL-ID-%lu", n);
	for (int i = 64; i < 128; i++) id->internal[i] = (char)(i * 7 + n); /* fill every byte */
	fake_rec r; fake_rec_init(&r, "ncclGetUniqueId");
	r.sendbuf = (int64_t)fnv(id, sizeof *id);
	fake_record(&r);
	return Success;
}

int ncclCommInitRankConfig(struct comm **out, int nranks, ncclUniqueId id, int rank, cfg214 *cfg) {
	fake_rec r; fake_rec_init(&r, "ncclCommInitRankConfig");
	r.rank = rank, r.count = nranks, r.sendbuf = (int64_t)fnv(&id, sizeof id);
	if (cfg) r.op = cfg->blocking, r.peer = cfg->version, r.bytes = (int64_t)cfg->size, r.kind = cfg->magic;
	fake_record(&r);
	*out = NULL;
	int c = injected("ncclCommInitRankConfig");
	if (c) return c;
	if (!cfg || cfg->magic != 0xcafebeef || cfg->size < 40) return fail(InvalidArgument, "fake: %s", "bad ncclConfig_t");
	if (cfg->blocking != 0) return fail(InvalidUsage, "fake: %s", "only non-blocking communicators are faked");
	if (nranks < 1 || nranks > MAXR || rank < 0 || rank >= nranks) return fail(InvalidArgument, "fake: %s", "bad rank or nranks");
	fake_lock();
	struct clique *cl = cliques;
	while (cl && memcmp(cl->id, id.internal, 128) != 0) cl = cl->next;
	if (!cl) {
		cl = calloc(1, sizeof *cl);
		memcpy(cl->id, id.internal, 128);
		cl->nranks = nranks;
		cl->next = cliques, cliques = cl;
	}
	if (cl->nranks != nranks || cl->members[rank]) {
		fake_unlock();
		return fail(InvalidUsage, "fake: %s", "nranks differ or rank joined twice");
	}
	struct comm *cm = calloc(1, sizeof *cm);
	cm->cl = cl, cm->rank = rank, cm->nranks = nranks;
	cl->members[rank] = cm;
	cl->joined++;
	fake_unlock();
	*out = cm;
	return InProgress;
}

int ncclCommGetAsyncError(struct comm *c, int *res) {
	int inj = fake_inject("asyncError");
	fake_lock();
	if (inj) c->async_err = inj;
	if (c->async_err) *res = c->async_err;
	else if (c->cl->broken) *res = RemoteError;
	else if (c->cl->joined < c->nranks) *res = InProgress;
	else *res = Success;
	fake_unlock();
	return Success;
}

static int leave(struct comm *c, const char *fn, int broken) {
	fake_rec r; fake_rec_init(&r, fn);
	r.rank = c ? c->rank : -1, r.comm = (int64_t)(intptr_t)c;
	fake_record(&r);
	if (!c) return InvalidArgument;
	fake_lock();
	c->gone = 1;
	c->cl->members[c->rank] = NULL;
	if (broken) c->cl->broken = 1;
	fake_unlock();
	return Success; /* comm is not freed: dropped stream work may point at it */
}
int ncclCommDestroy(struct comm *c) { return leave(c, "ncclCommDestroy", 0); }
int ncclCommAbort(struct comm *c) { return leave(c, "ncclCommAbort", 1); }

/* Reductions, in each type's own precision; bfloat16 is widened to float
 * and rounded back to nearest even after every step, as a GPU kernel does. */
static float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2bf(float f) {
	uint32_t u; memcpy(&u, &f, 4);
	if (isnan(f)) return 0x7fc0;
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}
static double red(int op, double a, double b) { return op == Sum ? a + b : op == Max ? (a > b ? a : b) : (a < b ? a : b); }

/* acc[i] = op over ranks r of src[r][off+i] */
static void reduce(int dt, int op, int n, const void **src, size_t off, size_t count, void *acc) {
	for (size_t i = 0; i < count; i++) {
		if (dt == Float32) {
			float a = ((const float *)src[0])[off + i];
			for (int r = 1; r < n; r++) a = (float)red(op, a, ((const float *)src[r])[off + i]);
			((float *)acc)[i] = a;
		} else if (dt == Float64) {
			double a = ((const double *)src[0])[off + i];
			for (int r = 1; r < n; r++) a = red(op, a, ((const double *)src[r])[off + i]);
			((double *)acc)[i] = a;
		} else {
			uint16_t a = ((const uint16_t *)src[0])[off + i];
			for (int r = 1; r < n; r++) a = f2bf((float)red(op, bf2f(a), bf2f(((const uint16_t *)src[r])[off + i])));
			((uint16_t *)acc)[i] = a;
		}
	}
}

static void complete_round(struct clique *cl) {
	int n = cl->nranks;
	struct coll *p0 = cl->parts[0];
	for (int r = 1; r < n; r++) {
		struct coll *p = cl->parts[r];
		if (p->kind != p0->kind || p->count != p0->count || p->dtype != p0->dtype || p->op != p0->op || p->root != p0->root) {
			snprintf(last_error, sizeof last_error, "fake: rank %d and rank 0 called different collectives", r);
			for (int q = 0; q < n; q++) cl->parts[q]->comm->async_err = InvalidUsage;
			goto out;
		}
	}
	size_t es = esize(p0->dtype), cnt = p0->count;
	const void *src[MAXR];
	for (int r = 0; r < n; r++) src[r] = cl->parts[r]->send;
	char *tmp = malloc((size_t)n * cnt * es + 1);
	switch (p0->kind) {
	case AllReduce:
		reduce(p0->dtype, p0->op, n, src, 0, cnt, tmp);
		for (int r = 0; r < n; r++) memcpy(cl->parts[r]->recv, tmp, cnt * es);
		break;
	case ReduceScatter:
		for (int r = 0; r < n; r++) reduce(p0->dtype, p0->op, n, src, (size_t)r * cnt, cnt, tmp + (size_t)r * cnt * es);
		for (int r = 0; r < n; r++) memcpy(cl->parts[r]->recv, tmp + (size_t)r * cnt * es, cnt * es);
		break;
	case AllGather:
		for (int r = 0; r < n; r++) memcpy(tmp + (size_t)r * cnt * es, src[r], cnt * es);
		for (int r = 0; r < n; r++) memcpy(cl->parts[r]->recv, tmp, (size_t)n * cnt * es);
		break;
	case Broadcast:
		memcpy(tmp, src[p0->root], cnt * es);
		for (int r = 0; r < n; r++) memcpy(cl->parts[r]->recv, tmp, cnt * es);
		break;
	}
	free(tmp);
out:
	cl->arrived = 0;
	memset(cl->parts, 0, sizeof cl->parts);
	cl->seq_done++;
}

static int coll_progress(void *arg) {
	struct coll *c = arg;
	struct clique *cl = c->comm->cl;
	if (cl->broken || c->comm->gone) return 0; /* hangs, as a real kernel would */
	if (c->seq < 0) {
		c->seq = cl->seq_done;
		cl->parts[c->comm->rank] = c;
		if (++cl->arrived == cl->nranks) complete_round(cl);
	}
	return cl->seq_done > c->seq;
}

static __thread int group_depth;
static __thread struct group *open_group;
static __thread void *group_stream;

static int coll(const char *fn, int kind, const void *send, void *recv, size_t count, int dt, int op, int root,
                struct comm *c, void *stream) {
	fake_rec r; fake_rec_init(&r, fn);
	r.dtype = dt, r.op = op, r.count = (int64_t)count, r.peer = root, r.rank = c ? c->rank : -1;
	r.stream = (int64_t)(intptr_t)stream, r.comm = (int64_t)(intptr_t)c;
	r.sendbuf = (int64_t)(intptr_t)send, r.recvbuf = (int64_t)(intptr_t)recv;
	fake_record(&r);
	int e = injected(fn);
	if (e) return e;
	if (!c || c->gone) return fail(InvalidArgument, "fake: %s on a destroyed communicator", fn);
	if (group_depth) return fail(InvalidUsage, "fake: %s inside a group is not faked", fn);
	if (!esize(dt) || (dt == Uint8 && (kind == AllReduce || kind == ReduceScatter)))
		return fail(InvalidArgument, "fake: %s: bad ncclDataType_t", fn);
	if ((kind == AllReduce || kind == ReduceScatter) && op != Sum && op != Max && op != Min)
		return fail(InvalidArgument, "fake: %s: bad ncclRedOp_t", fn);
	if (kind == Broadcast && (root < 0 || root >= c->nranks)) return fail(InvalidArgument, "fake: %s: bad root", fn);
	if (!stream) return fail(InvalidUsage, "fake: %s on the legacy default stream", fn);
	/* Both buffers must be device memory, of the extent the operation touches
	 * (a root's send buffer only for Broadcast). */
	size_t one = count * esize(dt), all = one * (size_t)c->nranks;
	size_t sendn = kind == ReduceScatter ? all : one, recvn = kind == AllGather ? all : one;
	int sends = kind != Broadcast || root == c->rank;
	if ((sends && !fake_is_device(send, sendn)) || !fake_is_device(recv, recvn))
		return fail(InvalidArgument, "fake: %s: a buffer is not device memory", fn);
	struct coll *x = calloc(1, sizeof *x);
	x->kind = kind, x->dtype = dt, x->op = op, x->root = root, x->count = count;
	x->send = send, x->recv = recv, x->comm = c, x->seq = -1;
	fake_stream_enqueue(stream, coll_progress, x, free);
	return Success;
}

int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, struct comm *c, void *st) {
	return coll("ncclAllReduce", AllReduce, s, r, n, dt, op, -1, c, st);
}
int ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, struct comm *c, void *st) {
	return coll("ncclReduceScatter", ReduceScatter, s, r, n, dt, op, -1, c, st);
}
int ncclAllGather(const void *s, void *r, size_t n, int dt, struct comm *c, void *st) {
	return coll("ncclAllGather", AllGather, s, r, n, dt, -1, -1, c, st);
}
int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, struct comm *c, void *st) {
	return coll("ncclBroadcast", Broadcast, s, r, n, dt, -1, root, c, st);
}

static int group_progress(void *arg) {
	struct group *g = arg;
	struct clique *cl = g->comm->cl;
	if (cl->broken || g->comm->gone) return 0;
	int me = g->comm->rank, all = 1;
	for (int i = 0; i < g->n; i++) {
		struct p2p *p = g->ops[i];
		if (p->done) continue;
		if (p->is_send) {
			if (!p->posted) {
				struct p2p **q = &cl->box[me][p->peer];
				while (*q) q = &(*q)->next;
				*q = p, p->posted = 1;
			}
		} else {
			struct p2p *s = cl->box[p->peer][me];
			if (s) {
				if (s->count != p->count || s->dtype != p->dtype) {
					snprintf(last_error, sizeof last_error, "fake: send of %zu and receive of %zu elements", s->count, p->count);
					g->comm->async_err = InvalidUsage;
					if (cl->members[p->peer]) cl->members[p->peer]->async_err = InvalidUsage;
				} else {
					memcpy(p->buf, s->buf, p->count * esize(p->dtype));
				}
				cl->box[p->peer][me] = s->next;
				s->done = 1, p->done = 1;
			}
		}
		all &= p->done;
	}
	return all;
}
static void group_free(void *arg) {
	struct group *g = arg;
	for (int i = 0; i < g->n; i++) free(g->ops[i]);
	free(g);
}

static int p2p(const char *fn, int is_send, void *buf, size_t count, int dt, int peer, struct comm *c, void *stream) {
	fake_rec r; fake_rec_init(&r, fn);
	r.dtype = dt, r.count = (int64_t)count, r.peer = peer, r.rank = c ? c->rank : -1;
	r.stream = (int64_t)(intptr_t)stream, r.comm = (int64_t)(intptr_t)c, r.op = group_depth;
	if (is_send) r.sendbuf = (int64_t)(intptr_t)buf; else r.recvbuf = (int64_t)(intptr_t)buf;
	fake_record(&r);
	int e = injected(fn);
	if (e) return e;
	if (!c || c->gone) return fail(InvalidArgument, "fake: %s on a destroyed communicator", fn);
	if (!esize(dt)) return fail(InvalidArgument, "fake: %s: bad ncclDataType_t", fn);
	if (peer < 0 || peer >= c->nranks || peer == c->rank) return fail(InvalidArgument, "fake: %s: bad peer", fn);
	if (!stream) return fail(InvalidUsage, "fake: %s on the legacy default stream", fn);
	if (!fake_is_device(buf, count * esize(dt))) return fail(InvalidArgument, "fake: %s: the buffer is not device memory", fn);
	struct p2p *p = calloc(1, sizeof *p);
	p->is_send = is_send, p->dtype = dt, p->peer = peer, p->count = count, p->buf = buf;
	struct group *g = open_group;
	if (!g) g = calloc(1, sizeof *g);
	if ((g->comm && g->comm != c) || g->n == 64) return fail(InvalidUsage, "fake: %s: group spans communicators", fn);
	g->comm = c, g->ops[g->n++] = p;
	if (group_depth) {
		open_group = g, group_stream = stream;
		return Success;
	}
	fake_stream_enqueue(stream, group_progress, g, group_free);
	return Success;
}
int ncclSend(const void *b, size_t n, int dt, int peer, struct comm *c, void *st) {
	return p2p("ncclSend", 1, (void *)b, n, dt, peer, c, st);
}
int ncclRecv(void *b, size_t n, int dt, int peer, struct comm *c, void *st) {
	return p2p("ncclRecv", 0, b, n, dt, peer, c, st);
}

int ncclGroupStart(void) {
	fake_rec r; fake_rec_init(&r, "ncclGroupStart"); fake_record(&r);
	group_depth++;
	return Success;
}
int ncclGroupEnd(void) {
	fake_rec r; fake_rec_init(&r, "ncclGroupEnd"); fake_record(&r);
	if (group_depth == 0) return fail(InvalidUsage, "fake: %s without ncclGroupStart", "ncclGroupEnd");
	if (--group_depth > 0) return Success;
	struct group *g = open_group;
	open_group = NULL;
	if (g) fake_stream_enqueue(group_stream, group_progress, g, group_free);
	return InProgress; /* as a non-blocking communicator may answer */
}
