// One version of the sampling kernel behind a plain launcher: build.sh compiles this file once per
// source tree, with -DSAMPLE_AB_NAME naming the launcher and the kernel renamed (the two versions
// would clash in one unit: both define `sample_tokens` and the same anonymous helpers).
#include "kernels/sampling/sample.cu"

#include <cuda_runtime.h>

void SAMPLE_AB_NAME(int rows, int* tokens, const float* logits, int vocab, int row_stride, const float* temperature,
                    const uint32_t* top_k, const float* top_p, const uint64_t* seed, const uint64_t* counter,
                    cudaStream_t s) {
    sample_tokens<<<rows, 1024, 0, s>>>(tokens, logits, vocab, row_stride, temperature, top_k, top_p, seed, counter);
}
