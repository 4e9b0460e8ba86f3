// Embedding gather: row r of the output is row tokens[r] of the table (bf16, copied exactly).
// With `ssq_out`, also the sum of squares of each row (fp32, fixed order), which the next
// projection's fused RMSNorm prologue reads (one group per row: ssq_out[r]).
#include "aot_common.cuh"

extern "C" __global__ void embedding_bf16(__nv_bfloat16* __restrict__ out, float* __restrict__ ssq_out,
                                          const __nv_bfloat16* __restrict__ table, const int* __restrict__ tokens,
                                          int vocab, int hidden, int ld_out) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    const int token = tokens[row];
    if (token < 0 || token >= vocab) __trap();
    const __nv_bfloat16* src = table + static_cast<int64_t>(token) * hidden;
    __nv_bfloat16* dst = out + static_cast<int64_t>(row) * ld_out;
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const __nv_bfloat16 v = src[i];
        dst[i] = v;
        const float f = aot::to_f32(v);
        sum_sq += f * f;
    }
    const float total = aot::block_sum(sum_sq, scratch);
    if (ssq_out != nullptr && threadIdx.x == 0) ssq_out[row] = total;
}
