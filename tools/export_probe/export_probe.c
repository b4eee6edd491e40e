// Export-table probe (run on the GPU host, natively): an LD_PRELOAD library that hands a program,
// for the export tables named in XPROBE_UUIDS (32 hex digits each, comma-separated; "all": every
// table), a copy of the driver's table whose function slots go through logging trampolines. Each
// call's integer-register arguments, the 32 bytes behind every argument that points at readable
// memory (before the call and again after it: what the slot wrote), and the value it returned are
// logged for the first XPROBE_CALLS (8) calls of each slot; call counts per slot at exit.  Output
// goes to XPROBE_OUT (default stderr), one line per event, prefixed by the process id.
//
// This is how an undocumented slot's meaning is found: which slots a framework calls, with what,
// and what the real driver answers.  It never changes an answer.  Build: see build.sh.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_TABLES 8
#define MAX_SLOTS 128
#define MAX_DEPTH 64

typedef int (*get_table_fn)(const void **, const void *);
typedef int (*proc_v2_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*proc_fn)(const char *, void **, int, uint64_t);

struct table {
    unsigned char uuid[16];
    char name[40];
    const uint64_t *real;
    uint64_t copy[MAX_SLOTS];
    unsigned long calls[MAX_SLOTS];
    int slots;
};

static struct table tables[MAX_TABLES];
static int ntables;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static int max_calls = 8;
static get_table_fn real_get;
static proc_v2_fn real_proc_v2;
static proc_fn real_proc;
static void *(*real_dlsym)(void *, const char *);

extern const uint64_t xprobe_stubs[MAX_TABLES * MAX_SLOTS];
void xprobe_landing(void);

struct frame {
    uint64_t ret;
    uint64_t args[6];
    int index;
};
static __thread struct frame stack[MAX_DEPTH];
static __thread int depth;

static FILE *log_file(void)
{
    if (!out) {
        const char *path = getenv("XPROBE_OUT");
        out = path ? fopen(path, "a") : NULL;
        if (!out)
            out = stderr;
        setvbuf(out, NULL, _IOLBF, 0);
        const char *n = getenv("XPROBE_CALLS");
        if (n)
            max_calls = atoi(n);
    }
    return out;
}

/* the 32 bytes at p as hex, or "-" where they cannot be read (process_vm_readv never faults) */
static void peek(uint64_t p, char *text, size_t size)
{
    unsigned char b[32];
    struct iovec local = {b, sizeof b}, remote = {(void *)p, sizeof b};
    if (p < 0x10000 || process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != (ssize_t)sizeof b) {
        snprintf(text, size, "-");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < sizeof b && k + 3 < size; i++)
        k += (size_t)snprintf(text + k, size - k, "%02x", b[i]);
}

static void log_args(const char *what, int index, const uint64_t *args, uint64_t rv)
{
    struct table *t = &tables[index / MAX_SLOTS];
    char mem[6][72];
    for (int i = 0; i < 6; i++)
        peek(args[i], mem[i], sizeof mem[i]);
    fprintf(log_file(),
            "[xprobe %d] %s %s slot=%d rv=%#lx args=%#lx,%#lx,%#lx,%#lx,%#lx,%#lx mem=%s|%s|%s|%s|%s|%s\n",
            (int)getpid(), what, t->name, index % MAX_SLOTS, (unsigned long)rv, (unsigned long)args[0],
            (unsigned long)args[1], (unsigned long)args[2], (unsigned long)args[3], (unsigned long)args[4],
            (unsigned long)args[5], mem[0], mem[1], mem[2], mem[3], mem[4], mem[5]);
}

/* called by the trampoline: gpr = {rax, r9, r8, rcx, rdx, rsi, rdi} as pushed; ret = where the
 * caller's return address lies.  Returns the real slot to jump to. */
uint64_t xprobe_enter(uint64_t index, const uint64_t *gpr, uint64_t *ret);
uint64_t xprobe_enter(uint64_t index, const uint64_t *gpr, uint64_t *ret)
{
    struct table *t = &tables[index / MAX_SLOTS];
    uint64_t args[6] = {gpr[6], gpr[5], gpr[4], gpr[3], gpr[2], gpr[1]};
    unsigned long n = __atomic_fetch_add(&t->calls[index % MAX_SLOTS], 1, __ATOMIC_RELAXED);
    uint64_t target = t->real[index % MAX_SLOTS];
    if ((int)n >= max_calls || depth >= MAX_DEPTH)
        return target;
    log_args("call", (int)index, args, 0);
    struct frame *f = &stack[depth++];
    f->ret = *ret;
    memcpy(f->args, args, sizeof args);
    f->index = (int)index;
    *ret = (uint64_t)(uintptr_t)xprobe_landing;
    return target;
}

/* called by the landing pad with the slot's return value; returns the caller's return address */
uint64_t xprobe_leave(uint64_t rv);
uint64_t xprobe_leave(uint64_t rv)
{
    struct frame *f = &stack[--depth];
    log_args("done", f->index, f->args, rv);
    return f->ret;
}

static int wanted(const char *hex)
{
    const char *list = getenv("XPROBE_UUIDS");
    if (!list)
        return 0;
    if (!strcmp(list, "all"))
        return 1;
    /* each comma-separated item names a table by its first hex digits */
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n && !strncmp(hex, p, n))
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

static const void *wrap_table(const void *uuid, const uint64_t *real)
{
    char hex[33];
    for (int i = 0; i < 16; i++)
        sprintf(hex + 2 * i, "%02x", ((const unsigned char *)uuid)[i]);
    fprintf(log_file(), "[xprobe %d] table %s at %p\n", (int)getpid(), hex, (const void *)real);
    if (!real || !wanted(hex))
        return real;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < ntables; i++)
        if (!memcmp(tables[i].uuid, uuid, 16)) {
            pthread_mutex_unlock(&lock);
            return tables[i].copy;
        }
    if (ntables == MAX_TABLES) {
        pthread_mutex_unlock(&lock);
        return real;
    }
    struct table *t = &tables[ntables];
    memcpy(t->uuid, uuid, 16);
    snprintf(t->name, sizeof t->name, "%.8s", hex);
    t->real = real;
    /* slot 0 is the table's size in bytes where it is small; otherwise read up to a NULL */
    int n = real[0] >= 16 && real[0] < 8 * MAX_SLOTS && real[0] % 8 == 0 ? (int)(real[0] / 8) : MAX_SLOTS;
    char words[MAX_SLOTS * 20];
    size_t k = 0;
    for (int s = 0; s < n; s++) {
        uint64_t w;
        struct iovec local = {&w, 8}, remote = {(void *)&real[s], 8};
        if (process_vm_readv(getpid(), &local, 1, &remote, 1, 0) != 8)
            break;
        Dl_info info;
        int is_fn = w >= 0x10000 && dladdr((void *)(uintptr_t)w, &info) && info.dli_fname;
        t->copy[s] = is_fn ? xprobe_stubs[ntables * MAX_SLOTS + s] : w;
        t->slots = s + 1;
        k += (size_t)snprintf(words + k, sizeof words - k, " %d:%s%#lx", s, is_fn ? "fn+" : "",
                              is_fn ? (unsigned long)(w - (uint64_t)(uintptr_t)info.dli_fbase) : (unsigned long)w);
        if (n == MAX_SLOTS && w == 0)
            break;
    }
    ntables++;
    pthread_mutex_unlock(&lock);
    fprintf(log_file(), "[xprobe %d] layout %s slots=%d%s\n", (int)getpid(), hex, t->slots, words);
    return t->copy;
}

static int my_get(const void **table, const void *uuid)
{
    int rc = real_get(table, uuid);
    char hex[33];
    for (int i = 0; i < 16; i++)
        sprintf(hex + 2 * i, "%02x", ((const unsigned char *)uuid)[i]);
    fprintf(log_file(), "[xprobe %d] cuGetExportTable %s -> %d\n", (int)getpid(), hex, rc);
    if (rc == 0 && table)
        *table = wrap_table(uuid, *table);
    return rc;
}

static void *special(const char *name, void *real)
{
    if (!strcmp(name, "cuGetExportTable")) {
        real_get = (get_table_fn)real;
        return (void *)my_get;
    }
    return real;
}

static int my_proc_v2(const char *s, void **p, int v, uint64_t f, int *st)
{
    int rc = real_proc_v2(s, p, v, f, st);
    if (rc == 0 && p && *p)
        *p = special(s, *p);
    return rc;
}

static int my_proc(const char *s, void **p, int v, uint64_t f)
{
    int rc = real_proc(s, p, v, f);
    if (rc == 0 && p && *p)
        *p = special(s, *p);
    return rc;
}

void *dlsym(void *handle, const char *name)
{
    if (!real_dlsym)
        real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym)
        real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    void *r = real_dlsym(handle, name);
    if (!r || strncmp(name, "cu", 2))
        return r;
    if (!strcmp(name, "cuGetProcAddress_v2")) {
        real_proc_v2 = (proc_v2_fn)r;
        return (void *)my_proc_v2;
    }
    if (!strcmp(name, "cuGetProcAddress")) {
        real_proc = (proc_fn)r;
        return (void *)my_proc;
    }
    return special(name, r);
}

__attribute__((destructor)) static void counts(void)
{
    for (int i = 0; i < ntables; i++)
        for (int s = 0; s < tables[i].slots; s++)
            if (tables[i].calls[s])
                fprintf(log_file(), "[xprobe %d] count %s slot=%d calls=%lu\n", (int)getpid(), tables[i].name, s,
                        tables[i].calls[s]);
}
