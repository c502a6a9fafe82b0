/*
 * A preload library that lets libfaketime run under a jemalloc-linked redis-server.
 *
 * Placed BEFORE libfaketime in LD_PRELOAD. Without it, Debian's redis-server deadlocks at start (even
 * `--version`): jemalloc's first clock_gettime and pthread_cond_init calls land in libfaketime's lazy
 * initialisation, which allocates, which re-enters jemalloc's initialisation (libfaketime issues #130, #327, #478).
 *
 * - clock_gettime on any clock but the realtime ones goes straight to the kernel (the raw syscall), never
 *   through libfaketime: monotonic time stays real (as FAKETIME_DONT_FAKE_MONOTONIC=1 asks anyway) and the
 *   call cannot allocate. Realtime reads are handed on to libfaketime, which fakes them.
 * - pthread_cond_init without attributes is the static initialiser, which needs no call at all; with
 *   attributes it is handed on.
 * - dlopen drops RTLD_DEEPBIND: Valkey loads modules with it, which binds a module's clock_gettime to libc ahead
 *   of everything preloaded, so the module would read the real clock while the server reads the controlled one.
 *
 * Build: gcc -O2 -shared -fPIC -o libtbclock.so shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*cond_init_fn)(pthread_cond_t *, const pthread_condattr_t *);
typedef void *(*dlopen_fn)(const char *, int);

int clock_gettime(clockid_t clock, struct timespec *ts) {
    if (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE) {
        static clock_gettime_fn next;
        if (next == NULL) {
            next = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        }
        if (next != NULL) {
            return next(clock, ts);
        }
    }
    return (int)syscall(SYS_clock_gettime, clock, ts);
}

int pthread_cond_init(pthread_cond_t *cond, const pthread_condattr_t *attr) {
    if (attr == NULL) {
        static const pthread_cond_t initial = PTHREAD_COND_INITIALIZER;
        *cond = initial;
        return 0;
    }
    static cond_init_fn next;
    if (next == NULL) {
        next = (cond_init_fn)dlvsym(RTLD_NEXT, "pthread_cond_init", "GLIBC_2.3.2");
    }
    return next == NULL ? -1 : next(cond, attr);
}

void *dlopen(const char *file, int mode) {
    static dlopen_fn next;
    if (next == NULL) {
        next = (dlopen_fn)dlsym(RTLD_NEXT, "dlopen");
    }
    return next == NULL ? NULL : next(file, mode & ~RTLD_DEEPBIND);
}
