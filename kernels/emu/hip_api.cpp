// A HIP runtime on the CPU: the host-side hip* calls the project resolves (src/backend/hip/ffi.rs
// HIP_SYMBOLS) implemented over host memory, with kernel launches run by the kernel emulator of
// emu_lib.cpp. Loaded in place of libamdhip64 through DS4_HIP_LIBRARY, it lets the unmodified HIP
// backend (runtime layer, kernel module, launch order of the forward pass) run end to end on a
// machine without a GPU; tests/hip_emu_forward.rs compares it with the CPU engine in CI.
//
//   c++ -std=c++17 -O2 -fPIC -shared -DDS4_EMU -DDS4_EMU_WARP=32 -Ikernels/emu -Ikernels \
//       kernels/emu/hip_api.cpp -o libds4emu_hip.so
//
// Model: one device (reported as an integrated gfx1151 with wave DS4_EMU_WARP); "device memory" is
// host memory, so every copy is a memcpy and a host pointer is its own device pointer. A stream runs
// each call when it is made (synchronization is a no-op), except while it captures: then launches,
// copies and fills are recorded into a graph that hipGraphLaunch replays (kernel arguments are copied
// at capture time, as HIP does). A stream that waits for an event recorded in a capture joins it, as
// in HIP: its work goes into the same graph in the order the host issues it (a valid order of the
// graph's branches), and ending the capture fails with hipErrorStreamCaptureUnjoined unless the
// capturing stream waited for all of a joined stream's work. The device reports DS4_EMU_MEM_MIB
// (default 16384) MiB of memory and refuses allocations past it, so memory-limit paths can be tested. Blocks run one after
// another, so inter-block ordering bugs do not show here (runs on a GPU cover those).
// Test infrastructure only: not part of the product.
#include <time.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "emu_lib.cpp"

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

typedef int hipError_t;
// hipError_t values (hip/hip_runtime_api.h, unchanged 5.x to 7.x).
const hipError_t kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3, kInvalidDevice = 101,
                 kInvalidHandle = 400, kNotFound = 500, kLaunchFailure = 719, kNotSupported = 801,
                 kStreamCaptureUnsupported = 900, kStreamCaptureUnjoined = 904, kHostMemoryAlreadyRegistered = 712,
                 kHostMemoryNotRegistered = 713;

// One recorded stream operation of a captured graph.
struct Op {
    enum Kind { Launch, Copy, Fill } kind;
    const Entry* kernel = nullptr;
    unsigned grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
    std::vector<std::vector<char>> args;
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
    int value = 0;
};
struct Stream;
struct Graph {
    std::vector<Op> ops;
    // Streams that joined the capture through an event (hipStreamWaitEvent).
    std::vector<Stream*> joined;
};
struct Stream {
    Graph* capturing = nullptr;
    // Joined a capture another stream began; ops it recorded there, and how many of them the
    // capturing side has waited for.
    bool joined = false;
    size_t ops = 0, waited = 0;
};
struct Event {
    double ms = 0;
    // Recorded in a capture: the graph, the stream and that stream's ops so far.
    Graph* graph = nullptr;
    Stream* by = nullptr;
    size_t ops_at = 0;
};
struct Module {
    int unused = 0;
};

std::recursive_mutex g_lock;
bool g_init = false;
std::map<void*, size_t> g_allocs;
std::map<char*, size_t> g_registered;
size_t g_used = 0;
// Kernels executed and stream captures begun by the calling thread (operations run on the thread
// that submits them): the tests count a backend's launches through them (ds4emu_thread_counts).
thread_local unsigned long long t_kernels_run = 0, t_captures = 0;

size_t total_bytes() {
    const char* s = getenv("DS4_EMU_MEM_MIB");
    const size_t mib = s && *s ? strtoull(s, nullptr, 10) : 16384;
    return mib << 20;
}

double now_ms() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

hipError_t run_op(const Op& op) {
    switch (op.kind) {
        case Op::Copy:
            memmove(op.dst, op.src, op.bytes);
            return kSuccess;
        case Op::Fill:
            memset(op.dst, op.value, op.bytes);
            return kSuccess;
        case Op::Launch: {
            ++t_kernels_run;
            std::vector<void*> ptrs;
            for (const auto& a : op.args) ptrs.push_back(const_cast<char*>(a.data()));
            return ds4emu_launch(op.kernel->name, op.grid, op.block, ptrs.data()) == 0 ? kSuccess : kLaunchFailure;
        }
    }
    return kInvalidValue;
}

// Run an operation now, or record it when the stream captures.
hipError_t submit(void* stream, Op op) {
    Stream* s = static_cast<Stream*>(stream);
    if (s && s->capturing) {
        s->capturing->ops.push_back(std::move(op));
        ++s->ops;
        return kSuccess;
    }
    return run_op(op);
}

#define NEED_INIT() \
    if (!g_init) return kNotInitialized
}  // namespace

EMU_EXPORT hipError_t hipInit(unsigned flags) {
    if (flags != 0) return kInvalidValue;
    g_init = true;
    return kSuccess;
}
EMU_EXPORT hipError_t hipDriverGetVersion(int* v) {
    if (!v) return kInvalidValue;
    *v = 70000000;
    return kSuccess;
}
EMU_EXPORT hipError_t hipRuntimeGetVersion(int* v) { return hipDriverGetVersion(v); }
EMU_EXPORT hipError_t hipGetDeviceCount(int* n) {
    NEED_INIT();
    if (!n) return kInvalidValue;
    *n = 1;
    return kSuccess;
}
EMU_EXPORT hipError_t hipSetDevice(int d) {
    NEED_INIT();
    return d == 0 ? kSuccess : kInvalidDevice;
}
EMU_EXPORT hipError_t hipDeviceGetName(char* name, int len, int d) {
    NEED_INIT();
    if (!name || len <= 0) return kInvalidValue;
    if (d != 0) return kInvalidDevice;
    snprintf(name, (size_t)len, "ds4 kernel emulator on the CPU (wave%d)", DS4_EMU_WARP);
    return kSuccess;
}
EMU_EXPORT hipError_t hipDeviceTotalMem(size_t* bytes, int d) {
    NEED_INIT();
    if (!bytes) return kInvalidValue;
    if (d != 0) return kInvalidDevice;
    *bytes = total_bytes();
    return kSuccess;
}
EMU_EXPORT hipError_t hipDeviceGetAttribute(int* value, int attr, int d) {
    NEED_INIT();
    if (!value) return kInvalidValue;
    if (d != 0) return kInvalidDevice;
    switch (attr) {
        case 3: *value = 1; break;             // CanMapHostMemory
        case 5: *value = 1000000; break;       // ClockRateKhz
        case 16: *value = 1; break;            // Integrated (a Strix Halo-like APU)
        case 19: *value = 2 << 20; break;      // L2CacheSize
        case 23: *value = 11; break;           // ComputeCapabilityMajor (gfx11)
        case 56: *value = 1024; break;         // MaxThreadsPerBlock
        case 59: *value = 256; break;          // MemoryBusWidth
        case 61: *value = 5; break;            // ComputeCapabilityMinor (gfx1151)
        case 63: *value = 1; break;            // MultiprocessorCount
        case 65: *value = 1; break;            // PageableMemoryAccess
        case 74: *value = 64 * 1024; break;    // MaxSharedMemoryPerBlock
        case 85: *value = 1; break;            // UnifiedAddressing
        case 87: *value = DS4_EMU_WARP; break; // WarpSize
        default: return kInvalidValue;
    }
    return kSuccess;
}
EMU_EXPORT hipError_t hipDeviceSynchronize(void) {
    NEED_INIT();
    return kSuccess;
}
EMU_EXPORT const char* hipGetErrorName(hipError_t e) {
    switch (e) {
        case kSuccess: return "hipSuccess";
        case kInvalidValue: return "hipErrorInvalidValue";
        case kOutOfMemory: return "hipErrorOutOfMemory";
        case kNotInitialized: return "hipErrorNotInitialized";
        case kInvalidDevice: return "hipErrorInvalidDevice";
        case kInvalidHandle: return "hipErrorInvalidHandle";
        case kNotFound: return "hipErrorNotFound";
        case kLaunchFailure: return "hipErrorLaunchFailure";
        case kNotSupported: return "hipErrorNotSupported";
        case kStreamCaptureUnsupported: return "hipErrorStreamCaptureUnsupported";
        case kStreamCaptureUnjoined: return "hipErrorStreamCaptureUnjoined";
        case kHostMemoryAlreadyRegistered: return "hipErrorHostMemoryAlreadyRegistered";
        case kHostMemoryNotRegistered: return "hipErrorHostMemoryNotRegistered";
        default: return "hipErrorUnknown";
    }
}
EMU_EXPORT hipError_t hipMemGetInfo(size_t* free_bytes, size_t* total) {
    NEED_INIT();
    if (!free_bytes || !total) return kInvalidValue;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    *total = total_bytes();
    *free_bytes = *total > g_used ? *total - g_used : 0;
    return kSuccess;
}
EMU_EXPORT hipError_t hipMalloc(void** p, size_t bytes) {
    NEED_INIT();
    if (!p) return kInvalidValue;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    const size_t n = bytes ? (bytes + 255) / 256 * 256 : 256;
    if (g_used + n > total_bytes()) return kOutOfMemory;
    void* m = aligned_alloc(256, n);
    if (!m) return kOutOfMemory;
    g_allocs[m] = n;
    g_used += n;
    *p = m;
    return kSuccess;
}
EMU_EXPORT hipError_t hipFree(void* p) {
    NEED_INIT();
    if (!p) return kSuccess;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    auto it = g_allocs.find(p);
    if (it == g_allocs.end()) return kInvalidValue;
    g_used -= it->second;
    g_allocs.erase(it);
    free(p);
    return kSuccess;
}
EMU_EXPORT hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, int kind) {
    NEED_INIT();
    if (kind < 0 || kind > 4 || (bytes && (!dst || !src))) return kInvalidValue;
    memmove(dst, src, bytes);
    return kSuccess;
}
// A copy from `src` (kind Copy) or a fill with the byte `value` (kind Fill) of `bytes` at `dst`, in
// the order of `stream`.
static hipError_t submit_bytes(void* stream, Op::Kind kind, void* dst, const void* src, int value, size_t bytes) {
    std::lock_guard<std::recursive_mutex> g(g_lock);
    Op op{kind};
    op.dst = dst;
    op.src = src;
    op.value = value;
    op.bytes = bytes;
    return submit(stream, std::move(op));
}
EMU_EXPORT hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
    NEED_INIT();
    if (kind < 0 || kind > 4 || (bytes && (!dst || !src))) return kInvalidValue;
    return submit_bytes(stream, Op::Copy, dst, src, 0, bytes);
}
EMU_EXPORT hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, void* stream) {
    NEED_INIT();
    if (bytes && !dst) return kInvalidValue;
    return submit_bytes(stream, Op::Fill, dst, nullptr, value, bytes);
}
EMU_EXPORT hipError_t hipHostRegister(void* p, size_t bytes, unsigned flags) {
    NEED_INIT();
    (void)flags;
    if (!p || !bytes) return kInvalidValue;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    if (g_registered.count(static_cast<char*>(p))) return kHostMemoryAlreadyRegistered;
    g_registered[static_cast<char*>(p)] = bytes;
    return kSuccess;
}
EMU_EXPORT hipError_t hipHostGetDevicePointer(void** dev, void* host, unsigned flags) {
    NEED_INIT();
    if (!dev || flags != 0) return kInvalidValue;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    char* h = static_cast<char*>(host);
    auto it = g_registered.upper_bound(h);
    if (it == g_registered.begin()) return kInvalidValue;
    --it;
    if (h >= it->first + it->second) return kInvalidValue;
    *dev = host;  // one address space
    return kSuccess;
}
EMU_EXPORT hipError_t hipHostUnregister(void* p) {
    NEED_INIT();
    std::lock_guard<std::recursive_mutex> g(g_lock);
    return g_registered.erase(static_cast<char*>(p)) ? kSuccess : kHostMemoryNotRegistered;
}
EMU_EXPORT hipError_t hipStreamCreateWithFlags(void** s, unsigned flags) {
    NEED_INIT();
    (void)flags;
    if (!s) return kInvalidValue;
    *s = new Stream();
    return kSuccess;
}
EMU_EXPORT hipError_t hipStreamSynchronize(void* s) {
    NEED_INIT();
    if (s && static_cast<Stream*>(s)->capturing) return kStreamCaptureUnsupported;
    return kSuccess;
}
EMU_EXPORT hipError_t hipStreamDestroy(void* s) {
    NEED_INIT();
    delete static_cast<Stream*>(s);
    return kSuccess;
}
EMU_EXPORT hipError_t hipEventCreateWithFlags(void** e, unsigned flags) {
    NEED_INIT();
    (void)flags;
    if (!e) return kInvalidValue;
    *e = new Event();
    return kSuccess;
}
EMU_EXPORT hipError_t hipEventRecord(void* e, void* stream) {
    NEED_INIT();
    if (!e) return kInvalidHandle;
    Event* ev = static_cast<Event*>(e);
    Stream* s = static_cast<Stream*>(stream);
    ev->ms = now_ms();
    ev->graph = s ? s->capturing : nullptr;
    ev->by = ev->graph ? s : nullptr;
    ev->ops_at = ev->graph ? s->ops : 0;
    return kSuccess;
}
// Work runs when it is issued, so an event recorded outside a capture has always completed; one
// recorded in a capture brings the waiting stream into it.
EMU_EXPORT hipError_t hipStreamWaitEvent(void* stream, void* e, unsigned flags) {
    NEED_INIT();
    if (!e) return kInvalidHandle;
    if (flags != 0) return kInvalidValue;
    Stream* s = static_cast<Stream*>(stream);
    Event* ev = static_cast<Event*>(e);
    if (!ev->graph) return kSuccess;
    if (!s) return kStreamCaptureUnsupported;
    if (!s->capturing) {
        s->capturing = ev->graph;
        s->joined = true;
        s->ops = s->waited = 0;
        ev->graph->joined.push_back(s);
    } else if (s->capturing != ev->graph) {
        return kInvalidValue;
    }
    if (ev->by && ev->by != s && ev->by->joined && ev->ops_at > ev->by->waited) ev->by->waited = ev->ops_at;
    return kSuccess;
}
EMU_EXPORT hipError_t hipEventSynchronize(void* e) {
    NEED_INIT();
    return e ? kSuccess : kInvalidHandle;
}
EMU_EXPORT hipError_t hipEventElapsedTime(float* ms, void* a, void* b) {
    NEED_INIT();
    if (!ms || !a || !b) return kInvalidHandle;
    *ms = (float)(static_cast<Event*>(b)->ms - static_cast<Event*>(a)->ms);
    return kSuccess;
}
EMU_EXPORT hipError_t hipEventDestroy(void* e) {
    NEED_INIT();
    delete static_cast<Event*>(e);
    return kSuccess;
}
// Any image is accepted: the emulator runs the kernels compiled into this library.
EMU_EXPORT hipError_t hipModuleLoadData(void** m, const void* image) {
    NEED_INIT();
    if (!m || !image) return kInvalidValue;
    *m = new Module();
    return kSuccess;
}
EMU_EXPORT hipError_t hipModuleGetFunction(void** f, void* m, const char* name) {
    NEED_INIT();
    if (!f || !m || !name) return kInvalidValue;
    for (const auto& e : registry())
        if (strcmp(e.name, name) == 0) {
            *f = const_cast<Entry*>(&e);
            return kSuccess;
        }
    return kNotFound;
}
EMU_EXPORT hipError_t hipModuleUnload(void* m) {
    NEED_INIT();
    delete static_cast<Module*>(m);
    return kSuccess;
}
EMU_EXPORT hipError_t hipModuleLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared_bytes, void* stream,
                                            void** params, void** extra) {
    NEED_INIT();
    if (!f || !params || extra) return kInvalidValue;
    if (shared_bytes != 0) return kNotSupported;  // the kernels use static shared memory only
    if (!gx || !gy || !gz || !bx || !by || !bz || (size_t)bx * by * bz > 1024) return kInvalidValue;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    Op op{Op::Launch};
    op.kernel = static_cast<const Entry*>(f);
    op.grid[0] = gx, op.grid[1] = gy, op.grid[2] = gz;
    op.block[0] = bx, op.block[1] = by, op.block[2] = bz;
    for (size_t i = 0; i < op.kernel->arg_bytes.size(); ++i) {
        const char* a = static_cast<const char*>(params[i]);
        op.args.emplace_back(a, a + op.kernel->arg_bytes[i]);
    }
    return submit(stream, std::move(op));
}
EMU_EXPORT hipError_t hipStreamBeginCapture(void* stream, int mode) {
    NEED_INIT();
    Stream* s = static_cast<Stream*>(stream);
    if (!s || mode < 0 || mode > 2) return kInvalidValue;
    if (s->capturing) return kStreamCaptureUnsupported;
    s->capturing = new Graph();
    ++t_captures;
    return kSuccess;
}
EMU_EXPORT hipError_t hipStreamEndCapture(void* stream, void** graph) {
    NEED_INIT();
    Stream* s = static_cast<Stream*>(stream);
    if (!s || !graph || !s->capturing || s->joined) return kInvalidValue;
    Graph* g = s->capturing;
    s->capturing = nullptr;
    bool unjoined = false;
    for (Stream* j : g->joined) {
        unjoined |= j->ops != j->waited;
        j->capturing = nullptr;
        j->joined = false;
        j->ops = j->waited = 0;
    }
    g->joined.clear();
    if (unjoined) {
        delete g;
        *graph = nullptr;
        return kStreamCaptureUnjoined;
    }
    *graph = g;
    return kSuccess;
}
EMU_EXPORT hipError_t hipGraphInstantiate(void** exec, void* graph, void* error_node, char* log, size_t log_len) {
    NEED_INIT();
    if (!exec || !graph) return kInvalidValue;
    if (error_node) *static_cast<void**>(error_node) = nullptr;
    if (log && log_len) log[0] = 0;
    *exec = new Graph(*static_cast<Graph*>(graph));
    return kSuccess;
}
EMU_EXPORT hipError_t hipGraphLaunch(void* exec, void* stream) {
    NEED_INIT();
    if (!exec) return kInvalidHandle;
    std::lock_guard<std::recursive_mutex> g(g_lock);
    Stream* s = static_cast<Stream*>(stream);
    if (s && s->capturing) return kStreamCaptureUnsupported;
    for (const Op& op : static_cast<Graph*>(exec)->ops) {
        const hipError_t e = run_op(op);
        if (e != kSuccess) return e;
    }
    return kSuccess;
}
EMU_EXPORT hipError_t hipGraphExecDestroy(void* exec) {
    NEED_INIT();
    delete static_cast<Graph*>(exec);
    return kSuccess;
}
EMU_EXPORT hipError_t hipGraphDestroy(void* graph) {
    NEED_INIT();
    delete static_cast<Graph*>(graph);
    return kSuccess;
}

// Not HIP: kernels this thread has executed (directly or by graph replays) and stream captures it
// has begun, since it started.
EMU_EXPORT void ds4emu_thread_counts(unsigned long long* kernels_run, unsigned long long* captures) {
    *kernels_run = t_kernels_run;
    *captures = t_captures;
}
