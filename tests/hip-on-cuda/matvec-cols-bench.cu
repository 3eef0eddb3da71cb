// Column matvec micro-benchmark (plain CUDA, sm_90): the fast Q8_0 products of a verify block on
// the Flash shapes, timed from HBM (weights rotate over copies larger than L2). For each shape and
// n tokens: the single-token kernel for one token, the single-token kernel over n tokens (grid.y =
// n), and the column kernels; every column's output is compared bitwise with the single-token
// kernel's. Build and run on the NVIDIA machine, from the repository root:
//   nvcc -x cu -std=c++17 -O3 -fmad=false -arch=sm_90 -Ikernels/cuda -Ikernels \
//        tests/hip-on-cuda/matvec-cols-bench.cu -o /tmp/mvc && /tmp/mvc
#include "matvec_cols_fast.hip"


#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define CK(x)                                                                 \
    do {                                                                      \
        cudaError_t e = (x);                                                  \
        if (e != cudaSuccess) {                                               \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                    \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

struct Shape {
    const char* what;
    u32 n_in, n_out, rows_per_group;
};

static u32 div_up(u32 a, u32 b) { return (a + b - 1) / b; }
// src/backend/hip/kernels/fast_twins.rs q8_0_fast_blocks (tiled shapes only here).
static u32 tiled_blocks(u32 n_in, u32 n_out, u32 max_blocks) {
    const u32 rounds = div_up(n_out, 128 / (n_in / 256));
    return div_up(rounds, div_up(rounds, max_blocks));
}

static u16 f16_bits(float f) {
    __half h = __float2half(f);
    u16 b;
    memcpy(&b, &h, 2);
    return b;
}

int main(int argc, char** argv) {
    const u32 max_blocks = argc > 1 ? (u32)atoi(argv[1]) : 264;
    const int only = argc > 2 ? atoi(argv[2]) : -1;  // one shape, n = 6, for a profiler
    const Shape shapes[] = {
        {"attn q_a 4096x1024", 4096, 1024, 1024},
        {"attn q_b 1024x32768", 1024, 32768, 32768},
        {"attn kv 4096x512", 4096, 512, 512},
        {"attn o_a 8x(4096x1024) grouped", 4096, 8192, 1024},
        {"attn o_b 8192x4096", 8192, 4096, 4096},
        {"shared down 2048x4096", 2048, 4096, 4096},
        {"indexer q 1024x8192", 1024, 8192, 8192},
    };
    const size_t pool_bytes = (size_t)1 << 30;  // weight copies: each launch reads one not in L2
    u8* pool;
    CK(cudaMalloc(&pool, pool_bytes));
    {
        std::vector<u8> h(pool_bytes);
        u32 s = 12345;
        for (size_t i = 0; i < pool_bytes; ++i) {
            s = s * 1664525u + 1013904223u;
            h[i] = (u8)(s >> 24);
        }
        // Q8_0 records: 2-byte f16 scale + 32 codes; keep scales finite (records at 34-byte steps).
        for (size_t i = 0; i + 34 <= pool_bytes; i += 34) {
            const u16 b = f16_bits(0.001f + (h[i + 2] % 64) * 1e-4f);
            memcpy(&h[i], &b, 2);
        }
        CK(cudaMemcpy(pool, h.data(), pool_bytes, cudaMemcpyHostToDevice));
    }
    const u32 max_x = 8 * 8 * 8192;  // 8 tokens of up to 8 groups x 8192
    i8* xq;
    float *xd, *y1, *yn;
    CK(cudaMalloc(&xq, max_x));
    CK(cudaMalloc(&xd, max_x / 32 * 4));
    CK(cudaMalloc(&y1, 8 * 65536 * 4));
    CK(cudaMalloc(&yn, 8 * 65536 * 4));
    {
        std::vector<i8> hq(max_x);
        std::vector<float> hd(max_x / 32);
        u32 s = 777;
        for (auto& v : hq) {
            s = s * 1664525u + 1013904223u;
            v = (i8)(s >> 24);
        }
        for (size_t i = 0; i < hd.size(); ++i) hd[i] = 0.01f + (i % 17) * 1e-3f;
        CK(cudaMemcpy(xq, hq.data(), hq.size(), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(xd, hd.data(), hd.size() * 4, cudaMemcpyHostToDevice));
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("max blocks %u; us per launch (weights from HBM); GB/s of one weight read\n", max_blocks);
    printf("%-32s %3s %9s %9s %9s %9s  %s\n", "shape", "n", "single1", "singleN", "cols", "cols/s1", "bits");
    int index = -1;
    for (const Shape& sh : shapes) {
        if (only >= 0 && ++index != only) continue;
        const size_t wbytes = (size_t)sh.n_out * (sh.n_in / 32) * 34;
        const u32 copies = (u32)(pool_bytes / wbytes);
        const u32 x_stride = sh.n_in * (sh.n_out / sh.rows_per_group);
        const u32 blocks = tiled_blocks(sh.n_in, sh.n_out, max_blocks);
        for (u32 n : {2u, 3u, 4u, 6u, 8u}) {
            if (only >= 0 && n != 6) continue;
            auto time = [&](auto launch) {
                for (int i = 0; i < 3; ++i) launch(pool);
                const int iters = 60;
                CK(cudaEventRecord(e0));
                for (int i = 0; i < iters; ++i) launch(pool + (size_t)(i % copies) * wbytes);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                return ms * 1000.0f / iters;
            };
            const float s1 = time([&](const u8* w) {
                ds4_matvec_q8_0_fast<<<dim3(blocks, 1), 256>>>(y1, w, xq, xd, sh.n_in, sh.n_out, sh.rows_per_group,
                                                               x_stride);
            });
            const float sn = time([&](const u8* w) {
                ds4_matvec_q8_0_fast<<<dim3(blocks, n), 256>>>(y1, w, xq, xd, sh.n_in, sh.n_out, sh.rows_per_group,
                                                               x_stride);
            });
            const float cn = time([&](const u8* w) {
                ds4_matvec_q8_0_cols_fast<<<dim3(blocks, 1), 256>>>(yn, w, xq, xd, sh.n_in, sh.n_out,
                                                                    sh.rows_per_group, x_stride, n);
            });
            CK(cudaGetLastError());
            // Bits: both kernels over the same copy of the weights.
            ds4_matvec_q8_0_fast<<<dim3(blocks, n), 256>>>(y1, pool, xq, xd, sh.n_in, sh.n_out, sh.rows_per_group,
                                                           x_stride);
            ds4_matvec_q8_0_cols_fast<<<dim3(blocks, 1), 256>>>(yn, pool, xq, xd, sh.n_in, sh.n_out,
                                                                sh.rows_per_group, x_stride, n);
            CK(cudaDeviceSynchronize());
            std::vector<u32> a((size_t)n * sh.n_out), b((size_t)n * sh.n_out);
            CK(cudaMemcpy(a.data(), y1, a.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), yn, b.size() * 4, cudaMemcpyDeviceToHost));
            size_t diff = 0;
            for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
            printf("%-32s %3u %9.2f %9.2f %9.2f %9.2f  %s (%.0f GB/s single1)\n", sh.what, n, s1, sn, cn, cn / s1,
                   diff ? "DIFFER" : "equal", wbytes / (s1 * 1e3));
        }
    }
    return 0;
}
