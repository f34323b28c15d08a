/*
 * forge-runner: the process a candidate kernel runs in, apart from the judge.
 *
 * The judge (a Python process that holds the reference, the expected outputs, the comparison
 * code and the timers) starts one runner per candidate. The runner holds nothing worth tampering
 * with: the candidate's inputs, outputs and workspace (shared memory on the CPU, CUDA IPC
 * allocations on the GPU), their descriptors, and a pipe pair to the judge. It has no Python
 * interpreter and no PyTorch.
 *
 * Before the candidate's library is loaded the runner confines itself: Landlock (where the
 * kernel has it) limits the files it can open to the library itself and the devices CUDA needs;
 * a seccomp filter the judge built with libseccomp (sent as compiled BPF) forbids new
 * processes, exec, network, file writes and signals or scheduling changes aimed at other
 * processes. Only then does dlopen() run the library's constructors.
 *
 * Every reply is written after the work it reports is finished: on CUDA a call returns only
 * once cuCtxSynchronize() says the whole context (every stream) is idle. The judge times the
 * round trip with its own clock; nothing the runner says about time is trusted.
 *
 * Protocol (little-endian): the judge writes [u8 op][u32 length][payload]; the runner answers
 * [i32 status][u32 length][payload]. Status 0 is success; a failure carries a message.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "forge_kernel.h"

/* ---- Landlock (declared here: older libc headers lack the wrappers) -------------------------- */
#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)
#define LL_FS_TRUNCATE (1ULL << 14)
#define LL_FS_IOCTL_DEV (1ULL << 15)
#define LL_NET_BIND_TCP (1ULL << 0)
#define LL_NET_CONNECT_TCP (1ULL << 1)
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define LL_SCOPE_SIGNAL (1ULL << 1)

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};
struct __attribute__((packed)) ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
};

/* ---- the CUDA driver API, loaded at run time (the runner builds without CUDA headers) -------- */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(int*, int);
    CUresult (*PrimaryCtxRetain)(void**, int);
    CUresult (*CtxSetCurrent)(void*);
    CUresult (*CtxSynchronize)(void);
    CUresult (*IpcOpen)(CUdeviceptr*, CUipcMemHandle, unsigned);
    CUresult (*MemAlloc)(CUdeviceptr*, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, void*);
    CUresult (*GetErrorName)(CUresult, const char**);
} cu;
static CUdeviceptr cu_scratch;

/* ---- state ------------------------------------------------------------------------------------ */
static int fd_in = -1, fd_out = -1;
static int use_cuda = 0;
static char* arena = NULL;        /* base address of inputs and outputs (host or device) */
static uint64_t arena_size = 0;
static char* workspace = NULL;          /* one region per input set, workspace_stride apart */
static uint64_t workspace_size = 0;
static uint64_t workspace_stride = 0;
/* Up to MAX_SETS descriptor tables: set k holds the k-th copy of the inputs and outputs, so a
   timed request can call the candidate on several input sets back to back. */
#define MAX_SETS 64
static forge_tensor ins[MAX_SETS][64], outs[MAX_SETS][64];
static forge_scalar scs[256];
/* What a call is handed: copies of set k's descriptors and of the scalars, written afresh before
   every call, so that nothing a candidate writes into them (a pointer in an unused dimension, a
   count in a scalar's reserved field) reaches its next call. */
static forge_tensor call_ins[64], call_outs[64];
static forge_scalar call_scs[256];
static uint64_t in_off[MAX_SETS][64], out_off[MAX_SETS][64];
static int32_t n_in = 0, n_out = 0, n_sc = 0, n_sets = 0;
static void* lib = NULL;
typedef int (*launch_fn)(const forge_tensor*, int32_t, forge_tensor*, int32_t, const forge_scalar*, int32_t, void*);
typedef int (*launch_ws_fn)(const forge_tensor*, int32_t, forge_tensor*, int32_t, const forge_scalar*, int32_t,
                            void*, int64_t, void*);
typedef int64_t (*sizer_fn)(const forge_tensor*, int32_t, const forge_tensor*, int32_t, const forge_scalar*, int32_t);
static launch_fn f_launch = NULL;
static launch_ws_fn f_launch_ws = NULL;
static sizer_fn f_sizer = NULL;

/* ---- pipe I/O ----------------------------------------------------------------------------------- */
static long spin_ns = 0; /* > 0: poll the pipe this long before sleeping on it (a woken process
                            on a virtual machine can take 50-100 µs to run again) */

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int read_full(void* buf, size_t n) {
    char* p = (char*)buf;
    long long start = spin_ns > 0 ? now_ns() : 0;
    while (n) {
        ssize_t r = read(fd_in, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) {
            if (now_ns() - start > spin_ns) {
                struct pollfd pfd = {fd_in, POLLIN, 0};
                poll(&pfd, 1, -1);
            }
            continue;
        }
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        start = spin_ns > 0 ? now_ns() : 0;
    }
    return 0;
}

static void write_full(const void* buf, size_t n) {
    const char* p = (const char*)buf;
    while (n) {
        ssize_t w = write(fd_out, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(70);
        p += w;
        n -= (size_t)w;
    }
}

static void reply(int32_t status, const void* payload, uint32_t len) {
    char head[8];
    memcpy(head, &status, 4);
    memcpy(head + 4, &len, 4);
    write_full(head, 8);
    if (len) write_full(payload, len);
}

static void reply_msg(int32_t status, const char* fmt, const char* a, const char* b) {
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    reply(status, msg, (uint32_t)strlen(msg));
}

static const char* cu_name(CUresult r) {
    const char* s = "CUDA error";
    if (cu.GetErrorName) cu.GetErrorName(r, &s);
    return s;
}

/* ---- setup ------------------------------------------------------------------------------------- */
static int cuda_init(void) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return -1;
#define SYM(field, name) cu.field = dlsym(h, name)
    SYM(Init, "cuInit");
    SYM(DeviceGet, "cuDeviceGet");
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(CtxSetCurrent, "cuCtxSetCurrent");
    SYM(CtxSynchronize, "cuCtxSynchronize");
    SYM(IpcOpen, "cuIpcOpenMemHandle_v2");
    if (!cu.IpcOpen) SYM(IpcOpen, "cuIpcOpenMemHandle");
    SYM(MemAlloc, "cuMemAlloc_v2");
    SYM(MemsetD8Async, "cuMemsetD8Async");
    SYM(GetErrorName, "cuGetErrorName");
#undef SYM
    if (!cu.Init || !cu.DeviceGet || !cu.PrimaryCtxRetain || !cu.CtxSetCurrent || !cu.CtxSynchronize ||
        !cu.IpcOpen || !cu.MemAlloc || !cu.MemsetD8Async)
        return -2;
    int dev = 0;
    void* ctx = NULL;
    if (cu.Init(0) || cu.DeviceGet(&dev, 0) || cu.PrimaryCtxRetain(&ctx, dev) || cu.CtxSetCurrent(ctx)) return -3;
    if (cu.MemAlloc(&cu_scratch, 256)) return -4;
    return 0;
}

/* Maps a shared region: on the CPU a memfd inherited from the judge, on the GPU an IPC handle. */
static int map_region(const char* p, uint32_t len, int cpu_fd, char** base, uint64_t* size) {
    if (use_cuda) {
        if (len < 64 + 16) return -1;
        CUipcMemHandle h;
        uint64_t off, sz;
        memcpy(&h, p, 64);
        memcpy(&off, p + 64, 8);
        memcpy(&sz, p + 72, 8);
        CUdeviceptr ptr = 0;
        CUresult r = cu.IpcOpen(&ptr, h, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */);
        if (r) return (int)r;
        *base = (char*)(uintptr_t)ptr + off;
        *size = sz;
        return 0;
    }
    if (len < 8) return -1;
    uint64_t sz;
    memcpy(&sz, p, 8);
    if (*base && *size) munmap(*base, *size);
    void* m = mmap(NULL, sz ? sz : 1, PROT_READ | PROT_WRITE, MAP_SHARED, cpu_fd, 0);
    if (m == MAP_FAILED) return errno;
    *base = (char*)m;
    *size = sz;
    return 0;
}

static void rebase(void) {
    for (int k = 0; k < n_sets; ++k) {
        for (int i = 0; i < n_in; ++i) ins[k][i].data = arena + in_off[k][i];
        for (int i = 0; i < n_out; ++i) outs[k][i].data = arena + out_off[k][i];
    }
}

/* payload: i32 sets, i32 inputs, i32 outputs, i32 scalars, then per set its input and output
   descriptors (data = offset into the arena), then the scalars. */
static int set_descriptors(const char* p, uint32_t len) {
    if (len < 16) return -1;
    int32_t k, a, b, c;
    memcpy(&k, p, 4);
    memcpy(&a, p + 4, 4);
    memcpy(&b, p + 8, 4);
    memcpy(&c, p + 12, 4);
    if (k < 1 || k > MAX_SETS || a < 0 || a > 64 || b < 0 || b > 64 || c < 0 || c > 256) return -1;
    size_t need = 16 + (size_t)k * (size_t)(a + b) * sizeof(forge_tensor) + (size_t)c * sizeof(forge_scalar);
    if (len != need) return -1;
    n_sets = k;
    n_in = a;
    n_out = b;
    n_sc = c;
    p += 16;
    for (int s = 0; s < k; ++s) {
        memcpy(ins[s], p, (size_t)a * sizeof(forge_tensor));
        p += (size_t)a * sizeof(forge_tensor);
        memcpy(outs[s], p, (size_t)b * sizeof(forge_tensor));
        p += (size_t)b * sizeof(forge_tensor);
        for (int i = 0; i < n_in; ++i) in_off[s][i] = (uint64_t)(uintptr_t)ins[s][i].data;
        for (int i = 0; i < n_out; ++i) out_off[s][i] = (uint64_t)(uintptr_t)outs[s][i].data;
    }
    memcpy(scs, p, (size_t)c * sizeof(forge_scalar));
    rebase();
    return 0;
}

/* ---- confinement ------------------------------------------------------------------------------- */
static int landlock(const char* p, uint32_t len, char* why, size_t why_len) {
    /* payload: u32 count, then per rule: u64 access, u32 path length, path bytes */
    long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
    if (abi < 1) {
        snprintf(why, why_len, "landlock unavailable (%s)", strerror(errno));
        return 1;
    }
    uint64_t fs = LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_REMOVE_DIR |
                  LL_FS_REMOVE_FILE | LL_FS_MAKE_CHAR | LL_FS_MAKE_DIR | LL_FS_MAKE_REG | LL_FS_MAKE_SOCK |
                  LL_FS_MAKE_FIFO | LL_FS_MAKE_BLOCK | LL_FS_MAKE_SYM;
    if (abi >= 2) fs |= LL_FS_REFER;
    if (abi >= 3) fs |= LL_FS_TRUNCATE;
    if (abi >= 5) fs |= LL_FS_IOCTL_DEV;
    struct ll_ruleset_attr attr = {fs, 0, 0};
    size_t attr_size = 8;
    if (abi >= 4) {
        attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
        attr_size = 16;
    }
    if (abi >= 6) {
        attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
        attr_size = 24;
    }
    int rs = (int)syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0);
    if (rs < 0) {
        snprintf(why, why_len, "landlock_create_ruleset: %s", strerror(errno));
        return -1;
    }
    if (len < 4) return -1;
    uint32_t count;
    memcpy(&count, p, 4);
    const char* q = p + 4;
    const char* end = p + len;
    for (uint32_t i = 0; i < count; ++i) {
        if (q + 12 > end) return -1;
        uint64_t access;
        uint32_t plen;
        memcpy(&access, q, 8);
        memcpy(&plen, q + 8, 4);
        q += 12;
        if (plen == 0 || plen > 4095 || q + plen > end) return -1;
        char path[4096];
        memcpy(path, q, plen);
        path[plen] = 0;
        q += plen;
        int fd = open(path, O_PATH | O_CLOEXEC);
        if (fd < 0) continue; /* a path this machine lacks (no such device): nothing to allow */
        struct ll_path_beneath_attr pb = {access & fs, fd};
        if (syscall(__NR_landlock_add_rule, rs, LL_RULE_PATH_BENEATH, &pb, 0)) {
            snprintf(why, why_len, "landlock_add_rule %.300s: %s", path, strerror(errno));
            close(fd);
            close(rs);
            return -1;
        }
        close(fd);
    }
    if (syscall(__NR_landlock_restrict_self, rs, 0)) {
        snprintf(why, why_len, "landlock_restrict_self: %s", strerror(errno));
        close(rs);
        return -1;
    }
    close(rs);
    snprintf(why, why_len, "landlock ABI %ld", abi);
    return 0;
}

/* Drops every capability (a runner started as root keeps root's uid but loses its powers: no
   ptrace of the judge, no reading of other processes' memory, no bypassing file permissions). */
static void drop_capabilities(void) {
    for (int c = 0; c <= 63; ++c) prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    syscall(SYS_capset, &hdr, data);
}

static int seccomp(const char* p, uint32_t len) {
    if (len == 0 || len % sizeof(struct sock_filter)) return -1;
    struct sock_fprog prog = {(unsigned short)(len / sizeof(struct sock_filter)), (struct sock_filter*)p};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog)) return errno;
    return 0;
}

/* 'L' payload: u32 n_preload, (u32 len, name)*, u32 landlock_len, landlock rules, u32 bpf_len, bpf,
   u32 path_len, path. */
static void load(const char* p, uint32_t len) {
    const char* end = p + len;
    uint32_t n, l;
#define TAKE_U32(v) do { if (p + 4 > end) goto bad; memcpy(&(v), p, 4); p += 4; } while (0)
    TAKE_U32(n);
    for (uint32_t i = 0; i < n; ++i) {
        TAKE_U32(l);
        if (l == 0 || l > 255 || p + l > end) goto bad;
        char name[256];
        memcpy(name, p, l);
        name[l] = 0;
        p += l;
        dlopen(name, RTLD_NOW | RTLD_GLOBAL); /* the candidate's usual dependencies, opened before */
    }
    uint32_t ll_len, bpf_len, path_len;
    TAKE_U32(ll_len);
    if (p + ll_len > end) goto bad;
    const char* ll = p;
    p += ll_len;
    TAKE_U32(bpf_len);
    if (p + bpf_len > end) goto bad;
    const char* bpf = p;
    p += bpf_len;
    TAKE_U32(path_len);
    if (path_len == 0 || path_len > 4095 || p + path_len != end) goto bad;
#undef TAKE_U32
    char path[4096];
    memcpy(path, p, path_len);
    path[path_len] = 0;

    char ll_note[512] = "landlock not requested";
    if (ll_len) {
        if (landlock(ll, ll_len, ll_note, sizeof ll_note) < 0) {
            reply_msg(2, "confinement failed: %s%s", ll_note, NULL);
            return;
        }
    }
    drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
        reply_msg(2, "confinement failed: no_new_privs: %s%s", strerror(errno), NULL);
        return;
    }
    if (bpf_len) {
        int e = seccomp(bpf, bpf_len);
        if (e) {
            reply_msg(2, "confinement failed: seccomp: %s%s", strerror(e), NULL);
            return;
        }
    }
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        reply_msg(3, "the library could not be loaded: %s%s", dlerror(), NULL);
        return;
    }
    f_launch = (launch_fn)dlsym(lib, "forge_launch");
    f_launch_ws = (launch_ws_fn)dlsym(lib, "forge_launch_ws");
    f_sizer = (sizer_fn)dlsym(lib, "forge_workspace_bytes");
    if (f_launch && f_launch_ws) {
        reply_msg(3, "the library exports both forge_launch and forge_launch_ws; define exactly one%s%s", NULL, NULL);
        return;
    }
    if (f_launch_ws && !f_sizer) {
        reply_msg(3, "the library exports forge_launch_ws but not forge_workspace_bytes%s%s", NULL, NULL);
        return;
    }
    if (!f_launch && !f_launch_ws) {
        reply_msg(3, "the library does not export forge_launch (or forge_launch_ws)%s%s", NULL, NULL);
        return;
    }
    char ok[600];
    snprintf(ok, sizeof ok, "%d %s", f_launch_ws ? 1 : 0, ll_note);
    reply(0, ok, (uint32_t)strlen(ok));
    return;
bad:
    reply_msg(1, "malformed load request%s%s", NULL, NULL);
}

/* ---- commands ------------------------------------------------------------------------------------ */
/* 'C' payload: i32 first set, i32 count. Calls the candidate on sets first..first+count-1 back to
   back (stopping at the first non-zero return), then waits for the device to be idle. */
static void call(const char* p, uint32_t len) {
    int32_t first = 0, count = 1;
    if (len == 8) {
        memcpy(&first, p, 4);
        memcpy(&count, p + 4, 4);
    }
    if (first < 0 || count < 1 || first + count > n_sets) {
        reply_msg(1, "no such input sets%s%s", NULL, NULL);
        return;
    }
    int rc = 0;
    for (int k = first; k < first + count && rc == 0; ++k) {
        memcpy(call_ins, ins[k], (size_t)n_in * sizeof(forge_tensor));
        memcpy(call_outs, outs[k], (size_t)n_out * sizeof(forge_tensor));
        memcpy(call_scs, scs, (size_t)n_sc * sizeof(forge_scalar));
        if (f_launch_ws)
            rc = f_launch_ws(call_ins, n_in, call_outs, n_out, call_scs, n_sc,
                             workspace + (uint64_t)k * workspace_stride, (int64_t)workspace_size, NULL);
        else
            rc = f_launch(call_ins, n_in, call_outs, n_out, call_scs, n_sc, NULL);
    }
    int32_t res[2] = {rc, 0};
    if (use_cuda) {
        CUresult r = cu.CtxSynchronize();
        if (r) {
            res[1] = r;
            char msg[200];
            snprintf(msg, sizeof msg, "%d %d %s", rc, (int)r, cu_name(r));
            reply(4, msg, (uint32_t)strlen(msg));
            return;
        }
    }
    reply(0, res, sizeof res);
}

/* 'T' payload: i32 threads. The OpenMP team size of the candidate's next parallel regions
   (omp_set_num_threads on this, the calling, thread): the judge times both sides on one thread
   when the machine is busy. Replies 1 when the library has no OpenMP runtime. */
static void set_threads(const char* p, uint32_t len) {
    int32_t n = 0;
    if (len != 4) {
        reply_msg(1, "malformed threads request%s%s", NULL, NULL);
        return;
    }
    memcpy(&n, p, 4);
    if (n < 1) {
        reply_msg(1, "threads must be at least 1%s%s", NULL, NULL);
        return;
    }
    void (*omp_set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    int32_t found = omp_set != NULL;
    if (omp_set) omp_set(n);
    reply(0, &found, 4);
}

static void empty(void) {
    if (use_cuda) {
        CUresult r = cu.MemsetD8Async(cu_scratch, 0, 4, NULL);
        if (!r) r = cu.CtxSynchronize();
        if (r) {
            reply_msg(4, "%s%s", cu_name(r), NULL);
            return;
        }
    }
    reply(0, NULL, 0);
}

int main(int argc, char** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: forge-runner FD_IN FD_OUT cpu|cuda ARENA_FD WORKSPACE_FD [SPIN_US]\n");
        return 64;
    }
    fd_in = atoi(argv[1]);
    fd_out = atoi(argv[2]);
    use_cuda = strcmp(argv[3], "cuda") == 0;
    if (argc > 6) spin_ns = atol(argv[6]) * 1000L;
    if (spin_ns > 0) fcntl(fd_in, F_SETFL, fcntl(fd_in, F_GETFL) | O_NONBLOCK);
    int arena_fd = atoi(argv[4]);
    int ws_fd = atoi(argv[5]);
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    prctl(PR_SET_PDEATHSIG, 9); /* never outlive the judge */
    if (use_cuda) {
        int e = cuda_init();
        int32_t st = e ? 5 : 0;
        char msg[64];
        snprintf(msg, sizeof msg, "cuda init %d", e);
        reply(st, msg, (uint32_t)strlen(msg));
        if (e) return 5;
    } else {
        reply(0, "ready", 5);
    }
    for (;;) {
        char head[5];
        if (read_full(head, 5)) return 0;
        uint32_t len;
        memcpy(&len, head + 1, 4);
        if (len > (64u << 20)) return 65;
        char* buf = NULL;
        if (len) {
            buf = (char*)malloc(len);
            if (!buf || read_full(buf, len)) return 66;
        }
        int e;
        switch (head[0]) {
        case 'A':
            e = map_region(buf, len, arena_fd, &arena, &arena_size);
            if (!e) rebase();
            if (e) {
                char code[64];
                snprintf(code, sizeof code, "%d (payload %u bytes)", e, len);
                reply_msg(1, "could not map the arena: %s%s", code, use_cuda ? cu_name((CUresult)e) : "");
            } else reply(0, NULL, 0);
            break;
        case 'W': {
            /* payload: the region (as for 'A'), then u64 bytes per set and u64 stride between sets */
            uint32_t head_len = use_cuda ? 80 : 8;
            if (len != head_len + 16) {
                reply_msg(1, "malformed workspace request%s%s", NULL, NULL);
                break;
            }
            uint64_t total = 0;
            e = map_region(buf, head_len, ws_fd, &workspace, &total);
            memcpy(&workspace_size, buf + head_len, 8);
            memcpy(&workspace_stride, buf + head_len + 8, 8);
            if (!e && (workspace_stride < workspace_size || workspace_stride * (uint64_t)n_sets > total)) e = -1;
            if (e) reply_msg(1, "could not map the workspace%s%s", NULL, NULL); else reply(0, NULL, 0);
            break;
        }
        case 'D':
            if (set_descriptors(buf, len)) reply_msg(1, "malformed descriptors%s%s", NULL, NULL);
            else reply(0, NULL, 0);
            break;
        case 'L':
            load(buf, len);
            break;
        case 'S': {
            if (!f_sizer) {
                int64_t zero = 0;
                reply(0, &zero, 8);
                break;
            }
            int64_t n = f_sizer(ins[0], n_in, outs[0], n_out, scs, n_sc);
            reply(0, &n, 8);
            break;
        }
        case 'C':
            if (!f_launch && !f_launch_ws) reply_msg(1, "no library loaded%s%s", NULL, NULL);
            else call(buf, len);
            break;
        case 'E':
            empty();
            break;
        case 'T':
            set_threads(buf, len);
            break;
        case 'Q':
            free(buf);
            return 0;
        default:
            reply_msg(1, "unknown request%s%s", NULL, NULL);
        }
        free(buf);
    }
}
