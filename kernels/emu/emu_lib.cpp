// CPU emulator of the ds4 kernels as a shared library (see hip/hip_runtime.h here for the model).
// Included by hip_api.cpp (the HIP runtime on the CPU, tools/build-hip-emu.sh), which runs launches
// through registry(); the C ABI below also lets a test load the kernels alone:
//   c++ -std=c++17 -O1 -fPIC -shared -DDS4_EMU -DDS4_EMU_WARP=32 -Ikernels/emu -Ikernels \
//       kernels/emu/emu_lib.cpp -o libds4emu.so
// Entry points (C ABI):
//   int ds4emu_launch(const char* name, const unsigned grid[3], const unsigned block[3], void** args)
//       runs one launch; args as for hipModuleLaunchKernel (one pointer per argument);
//       returns 0, or -1 for an unknown kernel, -2 for a deadlock (threads stuck at a barrier).
//   int ds4emu_warp_size(void)
//   const char* ds4emu_kernel_name(int i)    NULL past the last registered kernel
#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <functional>
#include <utility>
#include <vector>

#include "ds4.hip"

ds4emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

// A fiber starts once through makecontext/swapcontext; afterwards every switch is _setjmp /
// _longjmp, which (unlike swapcontext) makes no signal-mask system call. Fibers persist across
// blocks and launches: after the kernel body returns, a fiber parks and is resumed for the next
// block, so a block costs no system call at all (a deadlocked block's fibers are restarted).
struct Fiber {
    ucontext_t ctx;
    jmp_buf jb;
    std::vector<char> stack;
    bool done = false, started = false;
};

ucontext_t g_sched;
jmp_buf g_sched_jb;
std::vector<Fiber> g_fibers;
unsigned g_nthreads = 0;  // threads of the running block (g_fibers may hold more, parked)
unsigned g_cur = 0;
const std::function<void()>* g_body = nullptr;
bool g_progress = false;

// Barriers: arrivals counted against the live threads of the group.
struct Barrier {
    unsigned count = 0, gen = 0;
};
Barrier g_block_bar;
std::vector<Barrier> g_warp_bar;
std::vector<uint64_t> g_shfl;      // two slots per thread: shuffles alternate between them
std::vector<unsigned> g_shfl_phase;  // per thread
std::vector<char> g_gather;          // 64 bytes per thread (ds4emu_warp_gather)

void yield_to_scheduler() {
    if (!_setjmp(g_fibers[g_cur].jb)) _longjmp(g_sched_jb, 1);
}

unsigned live_in(unsigned first, unsigned n) {
    unsigned live = 0;
    for (unsigned i = first; i < first + n && i < g_nthreads; ++i) live += !g_fibers[i].done;
    return live;
}

void barrier_wait(Barrier& b, unsigned first, unsigned n) {
    const unsigned gen = b.gen;
    g_progress = true;
    if (++b.count >= live_in(first, n)) {
        b.count = 0;
        ++b.gen;
        g_progress = true;
        return;
    }
    while (b.gen == gen) yield_to_scheduler();
}

void fiber_entry() {
  for (;;) {
    (*g_body)();
    g_fibers[g_cur].done = true;
    g_progress = true;
    // Threads waiting at a barrier for this one may now be complete.
    for (auto* b : {&g_block_bar}) {
        if (b->count > 0 && b->count >= live_in(0, g_nthreads)) {
            b->count = 0;
            ++b->gen;
        }
    }
    const unsigned w = g_cur / DS4_EMU_WARP;
    Barrier& wb = g_warp_bar[w];
    if (wb.count > 0 && wb.count >= live_in(w * DS4_EMU_WARP, DS4_EMU_WARP)) {
        wb.count = 0;
        ++wb.gen;
    }
    // Park; the scheduler resumes here (with g_cur set) to run the body for the next block.
    if (!_setjmp(g_fibers[g_cur].jb)) _longjmp(g_sched_jb, 2);
  }
}

// Runs one block: returns false on deadlock.
bool run_block(unsigned nthreads) {
    const size_t stack_bytes = 256 * 1024;
    // Reserved once so parked fibers never move (blocks have at most 1024 threads).
    if (g_fibers.capacity() < 1024) g_fibers.reserve(1024);
    if (g_fibers.size() < nthreads) g_fibers.resize(nthreads);
    g_nthreads = nthreads;
    g_warp_bar.assign((nthreads + DS4_EMU_WARP - 1) / DS4_EMU_WARP, Barrier{});
    g_shfl.assign(2 * (size_t)nthreads, 0);
    g_shfl_phase.assign(nthreads, 0);
    g_gather.assign(64 * (size_t)nthreads, 0);
    g_block_bar = Barrier{};
    for (unsigned i = 0; i < nthreads; ++i) {
        Fiber& f = g_fibers[i];
        f.done = false;
        if (f.started) continue;
        if (f.stack.size() != stack_bytes) f.stack.assign(stack_bytes, 0);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = stack_bytes;
        f.ctx.uc_link = &g_sched;
        makecontext(&f.ctx, fiber_entry, 0);
    }
    for (;;) {
        bool any = false;
        g_progress = false;
        for (unsigned i = 0; i < nthreads; ++i) {
            if (g_fibers[i].done) continue;
            any = true;
            g_cur = i;
            threadIdx = ds4emu_dim3{i, 0, 0};
            if (!_setjmp(g_sched_jb)) {
                if (!g_fibers[i].started) {
                    g_fibers[i].started = true;
                    swapcontext(&g_sched, &g_fibers[i].ctx);
                } else {
                    _longjmp(g_fibers[i].jb, 1);
                }
            }
        }
        if (!any) return true;
        if (!g_progress) {
            // Deadlock: the stuck fibers' stacks are mid-kernel; start every fiber afresh next time.
            for (auto& f : g_fibers) f.started = false;
            return false;
        }
    }
}

template <typename... A, size_t... I>
void call_impl(void (*f)(A...), void** a, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(a[I])...);
}
template <typename... A>
std::function<void(void**)> caller(void (*f)(A...)) {
    return [f](void** a) { call_impl(f, a, std::index_sequence_for<A...>{}); };
}

template <typename... A>
std::vector<size_t> arg_sizes(void (*)(A...)) {
    return {sizeof(typename std::remove_reference<A>::type)...};
}

struct Entry {
    const char* name;
    std::function<void(void**)> call;
    std::vector<size_t> arg_bytes;  // size of each argument, for copying launches (hip_api.cpp graphs)
};
#define K(name) Entry{#name, caller(&name), arg_sizes(&name)}
const std::vector<Entry>& registry() {
    static const std::vector<Entry> r = {
        K(ds4_embed_hc), K(ds4_fill_f32), K(ds4_copy_spans), K(ds4_rms_norm_quant), K(ds4_matvec_q8_0), K(ds4_matvec_q8_0_swiglu),
        K(ds4_matvec_f16), K(ds4_matvec_f16_pair), K(ds4_router), K(ds4_moe_gate_up_iq2_xxs),
        K(ds4_moe_down_iq2_xxs), K(ds4_moe_gate_up_q2_k), K(ds4_moe_down_q2_k), K(ds4_moe_gate_up_q4_k),
        K(ds4_moe_down_q4_k), K(ds4_matvec_iq2_xxs), K(ds4_matvec_q2_k), K(ds4_matvec_q4_k), K(ds4_hc_mix),
        K(ds4_hc_pre_finish), K(ds4_hc_pre_fused), K(ds4_hc_head_finish), K(ds4_hc_post), K(ds4_rows_finish), K(ds4_attention_scores),
        K(ds4_attention_softmax), K(ds4_attention_values), K(ds4_compressor_pool), K(ds4_indexer_scores), K(ds4_indexer_topk),
        K(ds4_argmax), K(ds4_sample_min_p), K(ds4_gemm_q8_0), K(ds4_gemm_q8_0_swiglu), K(ds4_moe_group),
        K(ds4_moe_gemm_gate_up_iq2_xxs), K(ds4_moe_gemm_gate_up_q2_k), K(ds4_moe_gemm_gate_up_q4_k),
        K(ds4_moe_gemm_down_iq2_xxs), K(ds4_moe_gemm_down_q2_k), K(ds4_moe_gemm_down_q4_k), K(ds4_moe_sum),
        K(ds4_gemm_f16), K(ds4_gemm_q8_0_mma), K(ds4_gemm_f16_mma), K(ds4_test_mathf),
        K(ds4_matvec_q8_0_cols), K(ds4_matvec_q8_0_swiglu_cols), K(ds4_matvec_f16_cols), K(ds4_matvec_f16_pair_cols),
        // Fast-arithmetic twins (kernels/*_fast.hip).
        K(ds4_hc_pre_fused_fast), K(ds4_matvec_q8_0_fast), K(ds4_matvec_q8_0_swiglu_fast), K(ds4_argmax_fast),
        K(ds4_sample_min_p_max_fast), K(ds4_sample_min_p_draw_fast),
        K(ds4_gemm_q8_0_swiglu_mma), K(ds4_moe_gemm_gate_up_iq2_xxs_mma), K(ds4_moe_gemm_gate_up_q2_k_mma),
        K(ds4_moe_gemm_gate_up_q4_k_mma), K(ds4_moe_gemm_down_iq2_xxs_mma), K(ds4_moe_gemm_down_q2_k_mma),
        K(ds4_moe_gemm_down_q4_k_mma),
        K(ds4_matvec_f16_fast), K(ds4_matvec_f16_pair_fast), K(ds4_matvec_q8_0_pair_fast), K(ds4_matvec_q8_0_q8_fast), K(ds4_matvec_q8_0_normed_fast),
        K(ds4_rms_norm_quant_fast), K(ds4_hc_post_pre_fast), K(ds4_hc_pre_token_fast),
        K(ds4_hc_post_pre_token_fast), K(ds4_hc_post_fast), K(ds4_hc_mix_fast), K(ds4_rows_finish_fast), K(ds4_rows_finish_hadamard_fast),
        K(ds4_rows_finish_pair_fast), K(ds4_matvec_q8_0_normed_rows_fast), K(ds4_matvec_f16_normed_hadamard_fast),
        K(ds4_matvec_q8_0_swiglu_q8_fast), K(ds4_matvec_q8_0_cols_fast), K(ds4_matvec_q8_0_q8_cols_fast),
        K(ds4_matvec_q8_0_pair_cols_fast), K(ds4_matvec_q8_0_swiglu_cols_fast), K(ds4_matvec_f16_cols_fast),
        K(ds4_matvec_f16_pair_cols_fast),
        K(ds4_attention_prefill_fast), K(ds4_attention_decode_split_mma), K(ds4_compressor_pool_fast),
        K(ds4_moe_gate_up_iq2_xxs_fast), K(ds4_moe_gate_up_q2_k_fast), K(ds4_moe_gate_up_q4_k_fast),
        K(ds4_moe_gate_up_iq2_xxs_q8k_fast), K(ds4_moe_gate_up_q2_k_q8k_fast), K(ds4_moe_gate_up_q4_k_q8k_fast),
        K(ds4_moe_down_iq2_xxs_fast), K(ds4_moe_down_q2_k_fast), K(ds4_moe_down_q4_k_fast),
        K(ds4_attention_decode_split), K(ds4_attention_decode_merge), K(ds4_attention_decode_merge_q8),
        K(ds4_indexer_scores_fast), K(ds4_indexer_scores_decode_fast),
        K(ds4_indexer_topk_segments), K(ds4_indexer_topk_merge), K(ds4_router_fast), K(ds4_matvec_f16_router_fast),
        // Emulator-only test entries (tests/hip_kernels/emulator.rs; names start with ds4_emutest_).
        K(ds4_emutest_block_dot_f16_seq),
    };
    return r;
}

}  // namespace

void __syncthreads() { barrier_wait(g_block_bar, 0, g_nthreads); }

void ds4emu_warp_sync() {
    const unsigned w = threadIdx.x / DS4_EMU_WARP;
    barrier_wait(g_warp_bar[w], w * DS4_EMU_WARP, DS4_EMU_WARP);
}

// One warp barrier per shuffle: a lane cannot reuse a slot before every lane has passed the next
// shuffle's barrier, i.e. after all of them have read this one.
void ds4emu_shfl_exchange(uint64_t mine, unsigned src_thread, uint64_t* out) {
    const unsigned ph = g_shfl_phase[threadIdx.x];
    g_shfl_phase[threadIdx.x] = ph ^ 1;
    g_shfl[2 * threadIdx.x + ph] = mine;
    ds4emu_warp_sync();
    *out = g_shfl[2 * (size_t)src_thread + ph];
}

// Two warp barriers: every lane has written its slot before any reads, and has read before any
// lane's next gather overwrites it.
void ds4emu_warp_gather(const void* mine, unsigned bytes, void* all) {
    const unsigned lane = threadIdx.x % DS4_EMU_WARP, w0 = threadIdx.x - lane;
    memcpy(&g_gather[64 * (size_t)threadIdx.x], mine, bytes);
    ds4emu_warp_sync();
    for (unsigned i = 0; i < DS4_EMU_WARP; ++i) memcpy((char*)all + (size_t)i * bytes, &g_gather[64 * (size_t)(w0 + i)], bytes);
    ds4emu_warp_sync();
}

extern "C" int ds4emu_warp_size(void) { return DS4_EMU_WARP; }

extern "C" const char* ds4emu_kernel_name(int i) {
    const auto& r = registry();
    return i >= 0 && (size_t)i < r.size() ? r[(size_t)i].name : nullptr;
}

extern "C" int ds4emu_launch(const char* name, const unsigned grid[3], const unsigned block[3], void** args) {
    const Entry* e = nullptr;
    for (const auto& x : registry())
        if (strcmp(x.name, name) == 0) e = &x;
    if (!e) return -1;
    gridDim = ds4emu_dim3{grid[0], grid[1], grid[2]};
    blockDim = ds4emu_dim3{block[0], block[1], block[2]};
    const std::function<void()> body = [&] { e->call(args); };
    g_body = &body;
    for (unsigned z = 0; z < grid[2]; ++z)
        for (unsigned y = 0; y < grid[1]; ++y)
            for (unsigned x = 0; x < grid[0]; ++x) {
                blockIdx = ds4emu_dim3{x, y, z};
                if (!run_block(block[0] * block[1] * block[2])) {
                    fprintf(stderr, "ds4emu: %s deadlocked in block (%u,%u,%u)\n", name, x, y, z);
                    return -2;
                }
            }
    return 0;
}
