/* Shared between the fake CUDA runtime and the fake NCCL used by the tests of
 * package nccl and its users (package nccltest). Nothing here runs on a GPU:
 * "device memory" is calloc'd host memory that the fake runtime tracks, and a
 * stream is a queue of deferred host work that advances when it
 * is queried, so stream ordering bugs still show. */
#ifndef FAKEGPU_H
#define FAKEGPU_H
#include <stddef.h>
#include <stdint.h>

/* One recorded call. Unused fields are -1. The Go test reads these back
 * through fake_log_get, so the layout is plain int64 words. */
typedef struct fake_rec {
	char fn[32];
	int64_t rank, dtype, op, count, peer, dev, kind, bytes;
	int64_t stream, comm, sendbuf, recvbuf;
} fake_rec;

void fake_lock(void);
void fake_unlock(void);
void fake_rec_init(fake_rec *r, const char *fn);
void fake_record(const fake_rec *r);
int fake_inject(const char *fn);  /* the injected error code for fn, or 0 */
int fake_is_device(const void *p, size_t n); /* [p, p+n) is inside one cudaMalloc block */
int fake_current_device(void);
int fake_nccl_version(void);

/* progress runs with the fake lock held and returns 1 once the work is done;
 * done then frees arg. */
typedef int (*fake_progress_fn)(void *arg);
void fake_stream_enqueue(void *stream, fake_progress_fn progress, void *arg, void (*done)(void *));
#endif
