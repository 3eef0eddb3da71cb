// The HIP runtime's own smoke-test kernels (ds4-chat selftest: launch, graph capture/replay, mapped host
// memory). Not model math. Written without includes so that both `nvcc -x cu` and `clang -x hip` take
// it as is (both provide blockIdx/blockDim/threadIdx themselves).

// y[i] += a * x[i] for i < n. Launch: grid ceil(n / 256), block 256.
extern "C" __global__ void ds4_test_axpy(float* y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
