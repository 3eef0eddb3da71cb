// L2 prefetch micro-benchmark (plain CUDA, sm_90): does cp.async.bulk.prefetch.L2 ahead of a
// streaming read make the read an L2 read, and up to which size does a prefetched matrix stay in
// L2? Run on an H100 or H200: nvcc -arch=sm_90 -O3 l2-prefetch-bench.cu -o /tmp/l2bench && /tmp/l2bench.
// What came of it: kernels/README.md "Concurrent chains".
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ void bulk_prefetch(const void* p, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ void line_prefetch(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Streaming read: 4 independent 16-byte loads in flight per thread per iteration.
template <bool SELF>
__global__ void __launch_bounds__(256) stream_read(const uint4* p, size_t n, unsigned* out, unsigned chunk) {
    const size_t per = (n + gridDim.x - 1) / gridDim.x;
    const size_t b0 = blockIdx.x * per, b1 = min(n, b0 + per);
    if (SELF && threadIdx.x < 32) {
        const char* base = (const char*)(p + b0);
        const size_t bytes = (b1 - b0) * 16;
        for (size_t o = (size_t)threadIdx.x * chunk; o < bytes; o += 32 * (size_t)chunk)
            bulk_prefetch(base + o, (unsigned)min((size_t)chunk, bytes - o));
    }
    unsigned acc = 0;
    size_t i = b0 + threadIdx.x;
    for (; i + 3 * 256 < b1; i += 4 * 256) {
        uint4 a = __ldg(p + i), b = __ldg(p + i + 256), c = __ldg(p + i + 512), d = __ldg(p + i + 768);
        acc ^= a.x ^ a.y ^ b.z ^ b.w ^ c.x ^ c.w ^ d.y ^ d.z;
    }
    for (; i < b1; i += 256) { uint4 a = __ldg(p + i); acc ^= a.x ^ a.w; }
    if (acc == 0x12345678u) out[0] = acc;
}

__global__ void prefetch_bulk(const char* p, size_t bytes, unsigned chunk) {
    const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
    for (size_t o = t * chunk; o < bytes; o += nt * chunk) bulk_prefetch(p + o, (unsigned)min((size_t)chunk, bytes - o));
}
__global__ void prefetch_lines(const char* p, size_t bytes) {
    const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x, nt = (size_t)gridDim.x * blockDim.x;
    for (size_t o = t * 128; o < bytes; o += nt * 128) line_prefetch(p + o);
}
__global__ void spin(unsigned ns) {
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)); } while (t1 - t0 < ns);
}
__global__ void flush(uint4* f, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        f[i] = make_uint4(i, i, i, i);
}

int main() {
    const size_t flush_n = (512u << 20) / 16;
    uint4 *f, *w; unsigned* out;
    CK(cudaMalloc(&f, flush_n * 16)); CK(cudaMalloc(&w, 64u << 20)); CK(cudaMalloc(&out, 64));
    CK(cudaMemset(w, 1, 64u << 20));
    cudaStream_t s; CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    const double sizes_mb[] = {2.0, 6.6, 16.8, 17.8, 25.0, 30.0, 35.6, 42.0};
    const int grid = 264;
    printf("size_MB  mode                       median_us  TB/s\n");
    for (double mb : sizes_mb) {
        const size_t bytes = ((size_t)(mb * 1e6) + 15) / 16 * 16, n = bytes / 16;
        for (int mode = 0; mode < 8; ++mode) {
            const char* names[] = {"cold", "warm (read twice)", "bulk 64K + spin 30us", "bulk 16K + spin 30us",
                                   "lines + spin 30us", "self bulk 16K, cold", "self bulk 64K, cold",
                                   "bulk 64K + spin 10us"};
            std::vector<float> t;
            for (int r = 0; r < 15; ++r) {
                flush<<<528, 256, 0, s>>>(f, flush_n);
                if (mode == 1) stream_read<false><<<grid, 256, 0, s>>>(w, n, out, 0);
                if (mode == 2 || mode == 7) prefetch_bulk<<<8, 128, 0, s>>>((const char*)w, bytes, 65536);
                if (mode == 3) prefetch_bulk<<<8, 128, 0, s>>>((const char*)w, bytes, 16384);
                if (mode == 4) prefetch_lines<<<132, 256, 0, s>>>((const char*)w, bytes);
                if (mode >= 2 && mode <= 4) spin<<<1, 32, 0, s>>>(30000);
                if (mode == 7) spin<<<1, 32, 0, s>>>(10000);
                CK(cudaEventRecord(e0, s));
                if (mode == 5) stream_read<true><<<grid, 256, 0, s>>>(w, n, out, 16384);
                else if (mode == 6) stream_read<true><<<grid, 256, 0, s>>>(w, n, out, 65536);
                else stream_read<false><<<grid, 256, 0, s>>>(w, n, out, 0);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000.0f);
            }
            CK(cudaGetLastError());
            std::sort(t.begin(), t.end());
            const float med = t[t.size() / 2];
            printf("%7.1f  %-26s %9.2f  %5.2f\n", mb, names[mode], med, bytes / (med * 1e-6) / 1e12);
        }
    }
    // The window cost: how long does a prefetch kernel itself take (bulk, 35.6 MB)?
    for (int chunk : {16384, 65536, 262144}) {
        std::vector<float> t;
        for (int r = 0; r < 15; ++r) {
            flush<<<528, 256, 0, s>>>(f, flush_n);
            CK(cudaEventRecord(e0, s));
            prefetch_bulk<<<8, 128, 0, s>>>((const char*)w, 35600000, chunk);
            CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000.0f);
        }
        std::sort(t.begin(), t.end());
        printf("prefetch kernel alone, 35.6 MB, chunk %d: %.2f us\n", chunk, t[t.size() / 2]);
    }
    CK(cudaGetLastError());
    return 0;
}
