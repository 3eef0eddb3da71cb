// HIP-on-CUDA test shim: a libamdhip64.so.5 that implements the hip* calls ds4-chat uses over the CUDA
// driver API, so the unmodified HIP build of ds4-chat can be exercised on an NVIDIA GPU.
//
// TEST INFRASTRUCTURE ONLY (see README.md): it covers exactly the entry points listed in
// src/backend/hip/ffi.rs (HIP_SYMBOLS, HIP_OPTIONAL_SYMBOLS) and nothing else; it is never shipped.
//
// Mapping rules:
//  * results: CUresult codes that have a hipError_t namesake of the same value pass through; a few
//    are folded onto their nearest HIP meaning; every other code becomes hipErrorUnknown (999), so no
//    value outside hipError_t ever reaches the caller;
//  * context: HIP's per-thread "current device" is emulated with the device's primary context, made
//    current on each thread before the thread's first driver call;
//  * versioned driver symbols (cuMemAlloc_v2, cuStreamBeginCapture_v2, ...): resolved with dlsym under
//    the names cuda.h's macros expand to, so this file follows whatever cuda.h it is compiled with;
//  * hipDeviceGetAttribute: HIP's enum values differ from CUdevice_attribute; translated by table;
//  * hipModuleLaunchKernel: HIP_LAUNCH_PARAM_END is (void*)3, CU_LAUNCH_PARAM_END is (void*)0;
//  * symbol versions: exported under the version nodes of ROCm's own map (hip_amd.map), so
//    `hipInit@hip_4.2` references of a linked binary resolve as well as our dlsym lookups.

#include <cuda.h>
#include <dlfcn.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))
#define STR2(x) #x
#define STR(x) STR2(x)

typedef int hipError_t;
enum : int {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorInsufficientDriver = 35,
  hipErrorNoDevice = 100,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidKernelFile = 218,
  hipErrorNotInitialized = 3,
  hipErrorLaunchFailure = 719,
  hipErrorUnknown = 999,
};

// ---------------------------------------------------------------------------------------------------
// Driver entry points, resolved from libcuda.so.1 at first use.

#define CU_FUNCTIONS(X)                                                                                  \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)                 \
  X(cuDeviceTotalMem) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)             \
  X(cuCtxSynchronize) X(cuMemGetInfo) X(cuMemAlloc) X(cuMemFree) X(cuMemcpy) X(cuMemcpyHtoD)             \
  X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)             \
  X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamSynchronize) X(cuStreamDestroy)    \
  X(cuStreamWaitEvent)                                                                                   \
  X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)        \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuFuncSetAttribute)   \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch)                   \
  X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuMemHostRegister) X(cuMemHostGetDevicePointer)              \
  X(cuMemHostUnregister)

// `name` expands to the versioned symbol (cuMemAlloc -> cuMemAlloc_v2) in decltype and STR, but not in
// the pasted variable name.
#define DECLARE_PTR(name) static decltype(&name) p_##name = nullptr;
CU_FUNCTIONS(DECLARE_PTR)

static std::once_flag g_init_once;
static hipError_t g_init_status = hipErrorNotInitialized;
static int g_device_count = 0;
static std::mutex g_ctx_mutex;
static std::vector<CUcontext> g_primary;  // retained primary context per device (null until used)

static thread_local int t_device = 0;
static thread_local CUcontext t_current = nullptr;

static hipError_t map_result(CUresult r) {
  int v = static_cast<int>(r);
  switch (v) {
    // Same value and meaning in hipError_t.
    case 0: case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 8:
    case 100: case 101:
    case 200: case 201: case 202: case 205: case 206: case 207: case 208: case 209: case 210:
    case 211: case 212: case 213: case 214: case 215: case 216: case 217: case 218: case 219:
    case 300: case 301: case 302: case 303: case 304:
    case 400: case 401: case 500: case 600:
    case 700: case 701: case 702: case 704: case 705: case 709: case 710: case 712: case 713:
    case 719: case 720: case 801:
    case 900: case 901: case 902: case 903: case 904: case 905: case 906: case 907: case 908: case 910:
    case 999:
      return v;
    // Folded onto the nearest HIP meaning.
    case 34:   // CUDA_ERROR_STUB_LIBRARY
    case 36:   // CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER
    case 803:  // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
      return hipErrorInsufficientDriver;
    case 221: case 222: case 223:  // JIT compiler missing, PTX too new, JIT disabled
      return hipErrorInvalidKernelFile;
    case 714: case 715: case 716: case 717: case 718:  // device-side faults: a failed launch in HIP terms
      return hipErrorLaunchFailure;
    default:
      return hipErrorUnknown;  // includes 708 (PRIMARY_CONTEXT_ACTIVE), whose HIP namesake means else
  }
}

static void do_init() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "hip-on-cuda: cannot load libcuda.so.1: %s\n", dlerror());
    g_init_status = hipErrorInsufficientDriver;
    return;
  }
#define LOAD_PTR(name)                                                                    \
  p_##name = reinterpret_cast<decltype(p_##name)>(dlsym(lib, STR(name)));                 \
  if (!p_##name) {                                                                        \
    fprintf(stderr, "hip-on-cuda: libcuda.so.1 lacks %s\n", STR(name));                   \
    g_init_status = hipErrorInsufficientDriver;                                           \
    return;                                                                               \
  }
  CU_FUNCTIONS(LOAD_PTR)
#undef LOAD_PTR
  hipError_t e = map_result(p_cuInit(0));
  if (e != hipSuccess) {
    g_init_status = e;
    return;
  }
  e = map_result(p_cuDeviceGetCount(&g_device_count));
  if (e != hipSuccess) {
    g_init_status = e;
    return;
  }
  g_primary.assign(static_cast<size_t>(g_device_count), nullptr);
  g_init_status = hipSuccess;
}

static hipError_t ensure_init() {
  std::call_once(g_init_once, do_init);
  return g_init_status;
}

// Make device `dev`'s primary context current on this thread.
static hipError_t bind_device(int dev) {
  hipError_t e = ensure_init();
  if (e != hipSuccess) return e;
  if (dev < 0 || dev >= g_device_count) return hipErrorInvalidDevice;
  CUcontext ctx;
  {
    std::lock_guard<std::mutex> lock(g_ctx_mutex);
    if (!g_primary[dev]) {
      CUdevice d;
      e = map_result(p_cuDeviceGet(&d, dev));
      if (e != hipSuccess) return e;
      e = map_result(p_cuDevicePrimaryCtxRetain(&g_primary[dev], d));
      if (e != hipSuccess) return e;
    }
    ctx = g_primary[dev];
  }
  e = map_result(p_cuCtxSetCurrent(ctx));
  if (e != hipSuccess) return e;
  t_device = dev;
  t_current = ctx;
  return hipSuccess;
}

// Every call that needs a context goes through this first.
static hipError_t ensure_ctx() {
  if (t_current) return hipSuccess;
  if (ensure_init() != hipSuccess) return g_init_status;
  if (g_device_count == 0) return hipErrorNoDevice;
  return bind_device(t_device);
}

#define NEED_CTX()                          \
  do {                                      \
    hipError_t ctx_status_ = ensure_ctx();  \
    if (ctx_status_ != hipSuccess) return ctx_status_; \
  } while (0)

static hipError_t to_cu_device(int ordinal, CUdevice* out) {
  hipError_t e = ensure_init();
  if (e != hipSuccess) return e;
  if (ordinal < 0 || ordinal >= g_device_count) return hipErrorInvalidDevice;
  return map_result(p_cuDeviceGet(out, ordinal));
}

// ---------------------------------------------------------------------------------------------------
// Initialisation and device queries.

SHIM_EXPORT hipError_t hipInit(unsigned int flags) {
  if (flags != 0) return hipErrorInvalidValue;
  return ensure_init();
}

SHIM_EXPORT hipError_t hipDriverGetVersion(int* version) {
  if (!version) return hipErrorInvalidValue;
  hipError_t e = ensure_init();
  if (e != hipSuccess) return e;
  return map_result(p_cuDriverGetVersion(version));
}

// There is no HIP runtime here: report the CUDA driver's version so logs show what really ran.
SHIM_EXPORT hipError_t hipRuntimeGetVersion(int* version) { return hipDriverGetVersion(version); }

SHIM_EXPORT hipError_t hipGetDeviceCount(int* count) {
  if (!count) return hipErrorInvalidValue;
  *count = 0;
  hipError_t e = ensure_init();
  if (e != hipSuccess) return e;
  *count = g_device_count;
  return g_device_count > 0 ? hipSuccess : hipErrorNoDevice;  // ROCm's answer with no device
}

SHIM_EXPORT hipError_t hipSetDevice(int device) { return bind_device(device); }

SHIM_EXPORT hipError_t hipDeviceGetName(char* name, int len, int device) {
  if (!name || len <= 0) return hipErrorInvalidValue;
  CUdevice d;
  hipError_t e = to_cu_device(device, &d);
  if (e != hipSuccess) return e;
  return map_result(p_cuDeviceGetName(name, len, d));
}

SHIM_EXPORT hipError_t hipDeviceTotalMem(size_t* bytes, int device) {
  if (!bytes) return hipErrorInvalidValue;
  CUdevice d;
  hipError_t e = to_cu_device(device, &d);
  if (e != hipSuccess) return e;
  return map_result(p_cuDeviceTotalMem(bytes, d));
}

// hipDeviceAttribute_t (values unchanged ROCm 5.2 -> 7.x) -> CUdevice_attribute; -1 = no equivalent.
static int map_attribute(int hip_attr) {
  switch (hip_attr) {
    case 2: return CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT;
    case 3: return CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY;
    case 4: return CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM;
    case 5: return CU_DEVICE_ATTRIBUTE_CLOCK_RATE;
    case 9: return CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS;
    case 16: return CU_DEVICE_ATTRIBUTE_INTEGRATED;
    case 19: return CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE;
    case 23: return CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
    case 24: return CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY;
    case 26: return CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X;
    case 27: return CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y;
    case 28: return CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z;
    case 29: return CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X;
    case 30: return CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y;
    case 31: return CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z;
    case 56: return CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
    case 57: return CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR;
    case 59: return CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH;
    case 60: return CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE;
    case 61: return CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
    case 63: return CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    case 65: return CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS;
    case 67: return CU_DEVICE_ATTRIBUTE_PCI_BUS_ID;
    case 71: return CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK;
    case 72: return CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR;
    case 74: return CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK;
    case 75: return CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    case 76: return CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR;
    case 83: return CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY;
    case 85: return CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING;
    case 87: return CU_DEVICE_ATTRIBUTE_WARP_SIZE;
    case 10002: return CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR;  // AMD-specific name
    default: return -1;
  }
}

SHIM_EXPORT hipError_t hipDeviceGetAttribute(int* value, int attr, int device) {
  if (!value) return hipErrorInvalidValue;
  CUdevice d;
  hipError_t e = to_cu_device(device, &d);
  if (e != hipSuccess) return e;
  if (attr == 84) {  // TotalGlobalMem: no CUdevice_attribute; HIP reports it as an int
    size_t bytes = 0;
    e = map_result(p_cuDeviceTotalMem(&bytes, d));
    if (e == hipSuccess) *value = bytes > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(bytes);
    return e;
  }
  int cu_attr = map_attribute(attr);
  if (cu_attr < 0) return hipErrorInvalidValue;
  return map_result(p_cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(cu_attr), d));
}

SHIM_EXPORT hipError_t hipDeviceSynchronize(void) {
  NEED_CTX();
  return map_result(p_cuCtxSynchronize());
}

SHIM_EXPORT const char* hipGetErrorName(hipError_t code) {
  switch (code) {
#define N(v, s) case v: return s;
    N(0, "hipSuccess") N(1, "hipErrorInvalidValue") N(2, "hipErrorOutOfMemory") N(3, "hipErrorNotInitialized")
    N(4, "hipErrorDeinitialized") N(5, "hipErrorProfilerDisabled") N(6, "hipErrorProfilerNotInitialized")
    N(7, "hipErrorProfilerAlreadyStarted") N(8, "hipErrorProfilerAlreadyStopped") N(9, "hipErrorInvalidConfiguration")
    N(12, "hipErrorInvalidPitchValue") N(13, "hipErrorInvalidSymbol") N(17, "hipErrorInvalidDevicePointer")
    N(21, "hipErrorInvalidMemcpyDirection") N(35, "hipErrorInsufficientDriver") N(52, "hipErrorMissingConfiguration")
    N(53, "hipErrorPriorLaunchFailure") N(98, "hipErrorInvalidDeviceFunction") N(100, "hipErrorNoDevice")
    N(101, "hipErrorInvalidDevice") N(200, "hipErrorInvalidImage") N(201, "hipErrorInvalidContext")
    N(202, "hipErrorContextAlreadyCurrent") N(205, "hipErrorMapFailed") N(206, "hipErrorUnmapFailed")
    N(207, "hipErrorArrayIsMapped") N(208, "hipErrorAlreadyMapped") N(209, "hipErrorNoBinaryForGpu")
    N(210, "hipErrorAlreadyAcquired") N(211, "hipErrorNotMapped") N(212, "hipErrorNotMappedAsArray")
    N(213, "hipErrorNotMappedAsPointer") N(214, "hipErrorECCNotCorrectable") N(215, "hipErrorUnsupportedLimit")
    N(216, "hipErrorContextAlreadyInUse") N(217, "hipErrorPeerAccessUnsupported") N(218, "hipErrorInvalidKernelFile")
    N(219, "hipErrorInvalidGraphicsContext") N(300, "hipErrorInvalidSource") N(301, "hipErrorFileNotFound")
    N(302, "hipErrorSharedObjectSymbolNotFound") N(303, "hipErrorSharedObjectInitFailed")
    N(304, "hipErrorOperatingSystem") N(400, "hipErrorInvalidHandle") N(401, "hipErrorIllegalState")
    N(500, "hipErrorNotFound") N(600, "hipErrorNotReady") N(700, "hipErrorIllegalAddress")
    N(701, "hipErrorLaunchOutOfResources") N(702, "hipErrorLaunchTimeOut") N(704, "hipErrorPeerAccessAlreadyEnabled")
    N(705, "hipErrorPeerAccessNotEnabled") N(708, "hipErrorSetOnActiveProcess") N(709, "hipErrorContextIsDestroyed")
    N(710, "hipErrorAssert") N(712, "hipErrorHostMemoryAlreadyRegistered") N(713, "hipErrorHostMemoryNotRegistered")
    N(719, "hipErrorLaunchFailure") N(720, "hipErrorCooperativeLaunchTooLarge") N(801, "hipErrorNotSupported")
    N(900, "hipErrorStreamCaptureUnsupported") N(901, "hipErrorStreamCaptureInvalidated")
    N(902, "hipErrorStreamCaptureMerge") N(903, "hipErrorStreamCaptureUnmatched") N(904, "hipErrorStreamCaptureUnjoined")
    N(905, "hipErrorStreamCaptureIsolation") N(906, "hipErrorStreamCaptureImplicit") N(907, "hipErrorCapturedEvent")
    N(908, "hipErrorStreamCaptureWrongThread") N(910, "hipErrorGraphExecUpdateFailure") N(999, "hipErrorUnknown")
    N(1052, "hipErrorRuntimeMemory") N(1053, "hipErrorRuntimeOther") N(1054, "hipErrorTbd")
#undef N
    default: return "hipErrorUnknown";
  }
}

// ---------------------------------------------------------------------------------------------------
// Memory.

SHIM_EXPORT hipError_t hipMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return hipErrorInvalidValue;
  NEED_CTX();
  return map_result(p_cuMemGetInfo(free_bytes, total_bytes));
}

SHIM_EXPORT hipError_t hipMalloc(void** ptr, size_t bytes) {
  if (!ptr) return hipErrorInvalidValue;
  *ptr = nullptr;
  if (bytes == 0) return hipSuccess;  // HIP: a null pointer, success
  NEED_CTX();
  CUdeviceptr d = 0;
  hipError_t e = map_result(p_cuMemAlloc(&d, bytes));
  if (e == hipSuccess) *ptr = reinterpret_cast<void*>(d);
  return e;
}

SHIM_EXPORT hipError_t hipFree(void* ptr) {
  if (!ptr) return hipSuccess;
  NEED_CTX();
  return map_result(p_cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
}

static CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// hipMemcpyKind: 0 H2H, 1 H2D, 2 D2H, 3 D2D, 4 Default (same values as cudaMemcpyKind).
SHIM_EXPORT hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  if (bytes == 0) return hipSuccess;
  NEED_CTX();
  switch (kind) {
    case 1: return map_result(p_cuMemcpyHtoD(dptr(dst), src, bytes));
    case 2: return map_result(p_cuMemcpyDtoH(dst, dptr(src), bytes));
    case 3: return map_result(p_cuMemcpyDtoD(dptr(dst), dptr(src), bytes));
    case 0: case 4: return map_result(p_cuMemcpy(dptr(dst), dptr(src), bytes));  // unified addressing
    default: return hipErrorInvalidValue;
  }
}

SHIM_EXPORT hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, CUstream stream) {
  if (bytes == 0) return hipSuccess;
  NEED_CTX();
  switch (kind) {
    case 1: return map_result(p_cuMemcpyHtoDAsync(dptr(dst), src, bytes, stream));
    case 2: return map_result(p_cuMemcpyDtoHAsync(dst, dptr(src), bytes, stream));
    case 3: return map_result(p_cuMemcpyDtoDAsync(dptr(dst), dptr(src), bytes, stream));
    case 0: case 4: return map_result(p_cuMemcpyAsync(dptr(dst), dptr(src), bytes, stream));
    default: return hipErrorInvalidValue;
  }
}

SHIM_EXPORT hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, CUstream stream) {
  if (bytes == 0) return hipSuccess;
  NEED_CTX();
  return map_result(p_cuMemsetD8Async(dptr(dst), static_cast<unsigned char>(value), bytes, stream));
}

// hipHostRegister flags: Portable 1, Mapped 2, IoMemory 4 equal CU_MEMHOSTREGISTER_*; bit 8 is
// hipHostRegisterReadOnly in ROCm >= 6 (hipExtHostRegisterCoarseGrained in 5.x, which has no CUDA
// meaning): it is passed on as READ_ONLY.
SHIM_EXPORT hipError_t hipHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  if (!ptr || bytes == 0) return hipErrorInvalidValue;
  NEED_CTX();
  unsigned int cu_flags = flags & (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY);
  if (flags & 8u) cu_flags |= CU_MEMHOSTREGISTER_READ_ONLY;
  return map_result(p_cuMemHostRegister(ptr, bytes, cu_flags));
}

SHIM_EXPORT hipError_t hipHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned int flags) {
  if (!device_ptr || flags != 0) return hipErrorInvalidValue;
  NEED_CTX();
  CUdeviceptr d = 0;
  hipError_t e = map_result(p_cuMemHostGetDevicePointer(&d, host_ptr, 0));
  if (e == hipSuccess) *device_ptr = reinterpret_cast<void*>(d);
  return e;
}

SHIM_EXPORT hipError_t hipHostUnregister(void* ptr) {
  NEED_CTX();
  return map_result(p_cuMemHostUnregister(ptr));
}

// ---------------------------------------------------------------------------------------------------
// Streams and events.

SHIM_EXPORT hipError_t hipStreamCreateWithFlags(CUstream* stream, unsigned int flags) {
  if (!stream) return hipErrorInvalidValue;
  NEED_CTX();
  return map_result(p_cuStreamCreate(stream, flags & CU_STREAM_NON_BLOCKING));  // hipStreamNonBlocking = 1
}

SHIM_EXPORT hipError_t hipStreamSynchronize(CUstream stream) {
  NEED_CTX();
  return map_result(p_cuStreamSynchronize(stream));
}

SHIM_EXPORT hipError_t hipStreamDestroy(CUstream stream) {
  NEED_CTX();
  return map_result(p_cuStreamDestroy(stream));
}

SHIM_EXPORT hipError_t hipStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  NEED_CTX();
  // hipStreamWaitEvent's only flag value is 0, as cuStreamWaitEvent's default.
  if (flags != 0) return hipErrorInvalidValue;
  return map_result(p_cuStreamWaitEvent(stream, event, 0));
}

SHIM_EXPORT hipError_t hipEventCreateWithFlags(CUevent* event, unsigned int flags) {
  if (!event) return hipErrorInvalidValue;
  NEED_CTX();
  // Default 0, BlockingSync 1, DisableTiming 2, Interprocess 4 match CU_EVENT_*; AMD-only high bits
  // (release-to-device/system) are dropped.
  return map_result(p_cuEventCreate(event, flags & 0x7u));
}

SHIM_EXPORT hipError_t hipEventRecord(CUevent event, CUstream stream) {
  NEED_CTX();
  return map_result(p_cuEventRecord(event, stream));
}

SHIM_EXPORT hipError_t hipEventSynchronize(CUevent event) {
  NEED_CTX();
  return map_result(p_cuEventSynchronize(event));
}

SHIM_EXPORT hipError_t hipEventElapsedTime(float* ms, CUevent start, CUevent stop) {
  if (!ms) return hipErrorInvalidValue;
  NEED_CTX();
  return map_result(p_cuEventElapsedTime(ms, start, stop));
}

SHIM_EXPORT hipError_t hipEventDestroy(CUevent event) {
  NEED_CTX();
  return map_result(p_cuEventDestroy(event));
}

// ---------------------------------------------------------------------------------------------------
// Modules and launches.

// The image is whatever the runtime handed over: on NVIDIA that is a cubin (or PTX) built by nvcc,
// which ds4-chat reads from $DS4_KERNEL_DIR.
SHIM_EXPORT hipError_t hipModuleLoadData(CUmodule* module, const void* image) {
  if (!module || !image) return hipErrorInvalidValue;
  NEED_CTX();
  return map_result(p_cuModuleLoadData(module, image));
}

SHIM_EXPORT hipError_t hipModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  if (!function || !name) return hipErrorInvalidValue;
  NEED_CTX();
  return map_result(p_cuModuleGetFunction(function, module, name));
}

SHIM_EXPORT hipError_t hipModuleUnload(CUmodule module) {
  NEED_CTX();
  return map_result(p_cuModuleUnload(module));
}

// AMD allows up to 64 KiB of dynamic LDS without opting in; CUDA needs an opt-in above 48 KiB.
static hipError_t opt_in_shared_bytes(CUfunction f, unsigned int shared_bytes) {
  if (shared_bytes <= 48u * 1024u) return hipSuccess;
  return map_result(
      p_cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(shared_bytes)));
}

SHIM_EXPORT hipError_t hipModuleLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                             unsigned int bx, unsigned int by, unsigned int bz,
                                             unsigned int shared_bytes, CUstream stream, void** params,
                                             void** extra) {
  NEED_CTX();
  if (hipError_t e = opt_in_shared_bytes(f, shared_bytes); e != hipSuccess) return e;
  void* cu_extra[8];
  void** extra_arg = nullptr;
  if (extra) {
    // HIP: {1 (buffer pointer), ptr, 2 (buffer size), &size, 3 (end)}; CUDA ends with (void*)0.
    size_t i = 0, o = 0;
    for (;;) {
      uintptr_t key = reinterpret_cast<uintptr_t>(extra[i]);
      if (key == 3) {  // HIP_LAUNCH_PARAM_END
        cu_extra[o++] = CU_LAUNCH_PARAM_END;
        break;
      }
      if ((key != 1 && key != 2) || o + 3 > sizeof(cu_extra) / sizeof(cu_extra[0])) return hipErrorInvalidValue;
      cu_extra[o++] = key == 1 ? CU_LAUNCH_PARAM_BUFFER_POINTER : CU_LAUNCH_PARAM_BUFFER_SIZE;
      cu_extra[o++] = extra[i + 1];
      i += 2;
    }
    extra_arg = cu_extra;
  }
  return map_result(p_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, extra_arg));
}

// HIP_LAUNCH_CONFIG and hipLaunchAttribute have CUlaunchConfig's and CUlaunchAttribute's layout; the
// attribute ids are CUDA's (the runtime passes only CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION).
struct HipLaunchConfig {
  unsigned int grid[3], block[3], shared_bytes;
  CUstream stream;
  CUlaunchAttribute* attrs;
  unsigned int num_attrs;
};
static_assert(sizeof(HipLaunchConfig) == sizeof(CUlaunchConfig), "HIP_LAUNCH_CONFIG layout");
static_assert(sizeof(CUlaunchAttribute) == 72, "hipLaunchAttribute layout");

SHIM_EXPORT hipError_t hipDrvLaunchKernelEx(const HipLaunchConfig* config, CUfunction f, void** params,
                                            void** extra) {
  if (!config || extra) return hipErrorInvalidValue;
  NEED_CTX();
  if (hipError_t e = opt_in_shared_bytes(f, config->shared_bytes); e != hipSuccess) return e;
  CUlaunchConfig c{};
  c.gridDimX = config->grid[0];
  c.gridDimY = config->grid[1];
  c.gridDimZ = config->grid[2];
  c.blockDimX = config->block[0];
  c.blockDimY = config->block[1];
  c.blockDimZ = config->block[2];
  c.sharedMemBytes = config->shared_bytes;
  c.hStream = config->stream;
  c.attrs = config->attrs;
  c.numAttrs = config->num_attrs;
  return map_result(p_cuLaunchKernelEx(&c, f, params, nullptr));
}

// ---------------------------------------------------------------------------------------------------
// Stream capture and graphs (hipStreamCaptureMode 0/1/2 = CUstreamCaptureMode).

SHIM_EXPORT hipError_t hipStreamBeginCapture(CUstream stream, int mode) {
  NEED_CTX();
  return map_result(p_cuStreamBeginCapture(stream, static_cast<CUstreamCaptureMode>(mode)));
}

SHIM_EXPORT hipError_t hipStreamEndCapture(CUstream stream, CUgraph* graph) {
  if (!graph) return hipErrorInvalidValue;
  NEED_CTX();
  return map_result(p_cuStreamEndCapture(stream, graph));
}

// HIP keeps the 5-argument form CUDA 12 removed; the error node and log are not filled.
SHIM_EXPORT hipError_t hipGraphInstantiate(CUgraphExec* exec, CUgraph graph, void* error_node, char* log,
                                           size_t log_len) {
  if (!exec) return hipErrorInvalidValue;
  NEED_CTX();
  if (error_node) *static_cast<void**>(error_node) = nullptr;
  if (log && log_len) log[0] = 0;
  return map_result(p_cuGraphInstantiate(exec, graph, 0));
}

SHIM_EXPORT hipError_t hipGraphLaunch(CUgraphExec exec, CUstream stream) {
  NEED_CTX();
  return map_result(p_cuGraphLaunch(exec, stream));
}

SHIM_EXPORT hipError_t hipGraphExecDestroy(CUgraphExec exec) {
  NEED_CTX();
  return map_result(p_cuGraphExecDestroy(exec));
}

SHIM_EXPORT hipError_t hipGraphDestroy(CUgraph graph) {
  NEED_CTX();
  return map_result(p_cuGraphDestroy(graph));
}
