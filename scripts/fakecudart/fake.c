/*
 * A fake CUDA 12 runtime for profiling cuda-mem's host-side overhead on a machine without a
 * GPU (scripts/fakecudart/README.md). Never linked into anything shipped: a program built in
 * cuda-mem-sys's load mode (CUDA_PATH=.../12.0) opens it only when CUDA_MEM_CUDART names it.
 *
 * One device (ordinal 0, sm_90 attributes). Streams and events are heap tokens; every
 * asynchronous call succeeds at once and does nothing to memory (no copy, no fill), so a
 * harness times the library's bookkeeping around calls that cost about what a function call
 * costs. Device and pinned memory come from malloc; memory pools hand out malloc'ed blocks.
 * Pointer attributes are answered from a small table of live allocations.
 *
 * Build: cc -shared -fPIC -O2 -I$CUDA_PATH/include -o libfakecudart.so fake.c
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static __thread int current_device = 0;
static __thread cudaError_t last_error = cudaSuccess;

/* ---- call counters and the eviction knob (fake_* functions: the harness's side) ------------
 *
 * Every runtime function counts its calls, per thread, by name (COUNT: a small open-addressed
 * table keyed by the address of the function's __func__, a few ns per call); the harness
 * reads them with fake_counts() and fake_counts_reset(). The functions that stand for real
 * work of the runtime (queueing, waiting, polling: EVICT) also touch FAKE_EVICT_KIB KiB of the
 * fake's own memory, one store per 64-byte line, as a real call does to the caller's caches:
 * the library's data is then cold at its next call, as it is on the GPU machine. */

enum { COUNT_SLOTS = 256 };
struct counter { const char *name; unsigned long long n; };
static __thread struct counter counters[COUNT_SLOTS];

static void count(const char *name) {
    size_t i = ((uintptr_t)name >> 3) % COUNT_SLOTS;
    for (;;) {
        if (counters[i].name == name) { counters[i].n++; return; }
        if (!counters[i].name) { counters[i].name = name; counters[i].n = 1; return; }
        i = (i + 1) % COUNT_SLOTS;
    }
}
#define COUNT() count(__func__)

/* The calling thread's counts since its last reset: up to `cap` names and counts (in table
 * order, only those called at least once); returns how many there are in all. */
size_t fake_counts(const char **names, unsigned long long *counts, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < COUNT_SLOTS; i++) {
        if (!counters[i].name || !counters[i].n) continue;
        if (k < cap) { names[k] = counters[i].name; counts[k] = counters[i].n; }
        k++;
    }
    return k;
}
void fake_counts_reset(void) {
    for (size_t i = 0; i < COUNT_SLOTS; i++) counters[i].n = 0;
}

static volatile unsigned char *evict_buf;
static size_t evict_bytes;
__attribute__((constructor)) static void evict_init(void) {
    const char *e = getenv("FAKE_EVICT_KIB");
    size_t kib = e ? strtoul(e, NULL, 10) : 0;
    if (kib) {
        evict_bytes = kib << 10;
        unsigned char *b = malloc(evict_bytes);
        if (b) memset(b, 1, evict_bytes); /* real pages, not the shared zero page */
        else evict_bytes = 0;
        evict_buf = b;
    }
}
/* Under valgrind's callgrind (run.sh with CACHE=1): dumps the counts (instructions, cache misses)
 * since the last mark under the name `name`, and zeroes them. A no-op outside valgrind. */
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
void fake_callgrind_mark(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
#else
void fake_callgrind_mark(const char *name) { (void)name; }
#endif

static unsigned char evict_sink;
static void evict(void) {
    /* Loads, not stores: cheaper (no dirty lines to write back), and they evict as well. */
    unsigned char x = 0;
    for (size_t i = 0; i < evict_bytes; i += 64) x ^= evict_buf[i];
    evict_sink = x;
}
#define EVICT() evict()

static cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

/* ---- versions, errors ------------------------------------------------------------------ */

cudaError_t cudaRuntimeGetVersion(int *v) { COUNT(); *v = 12000; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { COUNT(); *v = 12080; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { COUNT(); cudaError_t e = last_error; last_error = cudaSuccess; return e; }
cudaError_t cudaPeekAtLastError(void) { COUNT(); return last_error; }
const char *cudaGetErrorName(cudaError_t e) { COUNT(); return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }
const char *cudaGetErrorString(cudaError_t e) { COUNT(); return e == cudaSuccess ? "no error" : "fake error"; }

/* ---- devices ------------------------------------------------------------------------ */

cudaError_t cudaGetDeviceCount(int *n) { COUNT(); *n = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { COUNT(); *d = current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { COUNT();
    if (d != 0) return fail(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaSetDeviceFlags(unsigned int f) { COUNT(); (void)f; return cudaSuccess; }
cudaError_t cudaGetDeviceFlags(unsigned int *f) { COUNT(); *f = cudaDeviceMapHost; return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { COUNT(); EVICT(); return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *free_, size_t *total) { COUNT();
    *free_ = (size_t)140 << 30;
    *total = (size_t)141 << 30;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int device) { COUNT();
    if (device != 0) return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrManagedMemory:
    case cudaDevAttrConcurrentManagedAccess:
    case cudaDevAttrMemoryPoolsSupported:
    case cudaDevAttrHostNativeAtomicSupported:
    case cudaDevAttrCanUseHostPointerForRegisteredMem:
        *v = 1;
        break;
    case cudaDevAttrMemoryPoolSupportedHandleTypes: *v = cudaMemHandleTypePosixFileDescriptor; break;
    default: *v = 0; break;
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) { COUNT();
    if (device != 0) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    strcpy(p->name, "fake sm_90 (scripts/fakecudart)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = (size_t)141 << 30;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->memoryPoolsSupported = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int device) { COUNT();
    if (device != 0) return fail(cudaErrorInvalidDevice);
    strncpy(buf, "0000:00:00.0", (size_t)len);
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int p) { COUNT(); (void)d; (void)p; *can = 0; return cudaSuccess; }

/* ---- allocations: a table of live blocks, for pointer attributes ------------------------- */

enum { MAX_BLOCKS = 4096 };
struct block { char *p; size_t n; enum cudaMemoryType type; unsigned flags; };
static struct block blocks[MAX_BLOCKS];

static void *add_block(size_t n, enum cudaMemoryType type, unsigned flags) {
    char *p = malloc(n ? n : 1);
    if (!p) return NULL;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (!blocks[i].p) {
            blocks[i] = (struct block){p, n, type, flags};
            return p;
        }
    }
    return p; /* untracked: pointer attributes say unregistered */
}

static struct block *find_block(const void *q) {
    const char *c = q;
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].p && c >= blocks[i].p && c < blocks[i].p + (blocks[i].n ? blocks[i].n : 1))
            return &blocks[i];
    return NULL;
}

static cudaError_t free_block(void *p) {
    if (!p) return cudaSuccess;
    struct block *b = find_block(p);
    if (b && b->p == p) b->p = NULL;
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) { COUNT();
    *p = add_block(n, cudaMemoryTypeDevice, 0);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int f) { COUNT();
    *p = add_block(n, cudaMemoryTypeManaged, f);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void *p) { COUNT(); return free_block(p); }
static cudaError_t host_alloc(void **p, size_t n, unsigned int f) {
    *p = add_block(n, cudaMemoryTypeHost, f | cudaHostAllocMapped);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int f) { COUNT(); return host_alloc(p, n, f); }
cudaError_t cudaMallocHost(void **p, size_t n) { COUNT(); return host_alloc(p, n, 0); }
cudaError_t cudaFreeHost(void *p) { COUNT(); return free_block(p); }
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int f) { COUNT();
    (void)f;
    *d = h; /* unified addressing: the same address */
    return cudaSuccess;
}
cudaError_t cudaHostGetFlags(unsigned int *f, void *h) { COUNT();
    struct block *b = find_block(h);
    if (!b || b->type != cudaMemoryTypeHost) return fail(cudaErrorInvalidValue);
    *f = b->flags;
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int f) { COUNT(); (void)p; (void)n; (void)f; return cudaSuccess; }
cudaError_t cudaHostUnregister(void *p) { COUNT(); (void)p; return cudaSuccess; }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) { COUNT();
    memset(a, 0, sizeof *a);
    struct block *b = find_block(p);
    if (!b) {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
        return cudaSuccess;
    }
    a->type = b->type;
    a->device = 0;
    a->devicePointer = (void *)p;
    a->hostPointer = b->type == cudaMemoryTypeDevice ? NULL : (void *)p;
    return cudaSuccess;
}

/* ---- memory pools ------------------------------------------------------------------- */

struct pool { int device; uint64_t threshold; };
static struct pool default_pool = {0, 0};

static cudaError_t default_mem_pool(cudaMemPool_t *p, int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    *p = (cudaMemPool_t)&default_pool;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *p, int device) { COUNT(); return default_mem_pool(p, device); }
cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *p, int device) { COUNT(); return default_mem_pool(p, device); }
cudaError_t cudaMemPoolCreate(cudaMemPool_t *p, const struct cudaMemPoolProps *props) { COUNT();
    struct pool *q = calloc(1, sizeof *q);
    q->device = props->location.id;
    *p = (cudaMemPool_t)q;
    return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t p) { COUNT();
    if ((struct pool *)p != &default_pool) free(p);
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v) { COUNT();
    if (a == cudaMemPoolAttrReleaseThreshold) ((struct pool *)p)->threshold = *(uint64_t *)v;
    return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t p, enum cudaMemPoolAttr a, void *v) { COUNT();
    *(uint64_t *)v = a == cudaMemPoolAttrReleaseThreshold ? ((struct pool *)p)->threshold : 0;
    return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t p, size_t keep) { COUNT(); (void)p; (void)keep; return cudaSuccess; }
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t p, const struct cudaMemAccessDesc *d, size_t n) { COUNT();
    (void)p; (void)d; (void)n;
    return cudaSuccess;
}
cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags *f, cudaMemPool_t p, struct cudaMemLocation *l) { COUNT();
    (void)p; (void)l;
    *f = cudaMemAccessFlagsProtReadWrite;
    return cudaSuccess;
}

static __thread size_t last_pool_size;

/* Pooled blocks: a per-thread free list of one size class, so that a pair costs about what a
 * pool that keeps its memory costs (no malloc per pair), and nothing enters the block table
 * (pointer attributes of pooled memory are not asked on the measured paths). */
static __thread void *spare[64];
static __thread size_t spare_size[64];
static __thread int spares;

static cudaError_t pool_alloc(void **p, size_t n) {
    last_pool_size = n;
    for (int i = spares - 1; i >= 0; i--) {
        if (spare_size[i] == n) {
            *p = spare[i];
            spares--;
            spare[i] = spare[spares];
            spare_size[i] = spare_size[spares];
            return cudaSuccess;
        }
    }
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t pool, cudaStream_t s) { COUNT(); EVICT();
    (void)pool; (void)s;
    return pool_alloc(p, n);
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { COUNT(); EVICT();
    (void)s;
    return pool_alloc(p, n);
}
/* The size is not known here: pooled blocks are kept with the size of the last request of
 * the thread (a harness allocates one size at a time). */
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { COUNT(); EVICT();
    (void)s;
    if (!p) return cudaSuccess;
    if (spares < 64) {
        spare[spares] = p;
        spare_size[spares] = last_pool_size;
        spares++;
        return cudaSuccess;
    }
    free(p);
    return cudaSuccess;
}

/* ---- streams and events: heap tokens ------------------------------------------------ */

struct token { int device; unsigned flags; int capturing; };

static cudaError_t stream_create(cudaStream_t *s, unsigned int f) {
    struct token *t = malloc(sizeof *t);
    t->device = current_device;
    t->flags = f;
    t->capturing = 0;
    *s = (cudaStream_t)t;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) { COUNT(); return stream_create(s, f); }
cudaError_t cudaStreamCreate(cudaStream_t *s) { COUNT(); return stream_create(s, 0); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int f, int p) { COUNT();
    (void)p;
    return stream_create(s, f);
}
static int is_token(cudaStream_t s) { return (uintptr_t)s > 2; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { COUNT();
    if (is_token(s)) free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { COUNT(); EVICT(); (void)s; return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t s) { COUNT(); EVICT(); (void)s; return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) { COUNT(); EVICT(); (void)s; (void)e; (void)f; return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) { COUNT();
    *st = is_token(s) && ((struct token *)s)->capturing ? cudaStreamCaptureStatusActive
                                                        : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *f) { COUNT();
    *f = is_token(s) ? ((struct token *)s)->flags : 0;
    return cudaSuccess;
}

static cudaError_t event_create(cudaEvent_t *e, unsigned int f) {
    struct token *t = malloc(sizeof *t);
    t->device = current_device;
    t->flags = f;
    *e = (cudaEvent_t)t;
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) { COUNT(); return event_create(e, f); }
cudaError_t cudaEventCreate(cudaEvent_t *e) { COUNT(); return event_create(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { COUNT(); free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { COUNT(); EVICT(); (void)e; (void)s; return cudaSuccess; }
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f) { COUNT(); EVICT(); (void)e; (void)s; (void)f; return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t e) { COUNT(); EVICT(); (void)e; return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { COUNT(); EVICT(); (void)e; return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { COUNT(); (void)a; (void)b; *ms = 0; return cudaSuccess; }

/* ---- copies and fills: accepted, not performed ------------------------------------------ */

cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) { COUNT(); EVICT();
    (void)d; (void)s; (void)n; (void)k; (void)st;
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) { COUNT(); EVICT();
    (void)d; (void)v; (void)n; (void)st;
    return cudaSuccess;
}
/* The synchronous calls do the work (setup code zero-fills and copies through them). */
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { COUNT(); EVICT();
    (void)k;
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) { COUNT(); EVICT();
    memset(d, v, n);
    return cudaSuccess;
}

/* ---- stream capture and graphs: a capture records nothing; graphs are tokens ------------- */

static __thread enum cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) { COUNT();
    enum cudaStreamCaptureMode old = capture_mode;
    capture_mode = *m;
    *m = old;
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) { COUNT();
    (void)m;
    if (!is_token(s)) return fail(cudaErrorStreamCaptureUnsupported);
    if (((struct token *)s)->capturing) return fail(cudaErrorIllegalState);
    ((struct token *)s)->capturing = 1;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) { COUNT();
    if (!is_token(s) || !((struct token *)s)->capturing) return fail(cudaErrorIllegalState);
    ((struct token *)s)->capturing = 0;
    *g = (cudaGraph_t)malloc(16);
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) { COUNT();
    (void)g; (void)f;
    *e = (cudaGraphExec_t)malloc(16);
    return cudaSuccess;
}
cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t s) { COUNT(); EVICT(); (void)e; (void)s; return cudaSuccess; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { COUNT(); EVICT(); (void)e; (void)s; return cudaSuccess; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { COUNT(); free(e); return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { COUNT(); free(g); return cudaSuccess; }
