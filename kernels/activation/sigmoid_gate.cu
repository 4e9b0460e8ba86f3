// The output gate of Qwen3.5/3.6's gated attention, in place:
//   x = bf16( x * bf16(sigmoid(gate)) ),  sigmoid(g) = 1 / (1 + exp(-g))
// The inner rounding mirrors transformers in a bf16 model, which takes the sigmoid in bf16 before
// the product. Rows are `ld_x` (x) and `ld_gate` (gate) elements apart, so that the gate can be a
// column range of a fused projection's output.
// Grid: (ceil(width / blockDim.x), rows).
#include "aot_common.cuh"

extern "C" __global__ void sigmoid_gate_mul_bf16(__nv_bfloat16* __restrict__ x, int ld_x,
                                                 const __nv_bfloat16* __restrict__ gate, int ld_gate, int width) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    const int64_t row = blockIdx.y;
    __nv_bfloat16* xp = x + row * ld_x + j;
    const float g = aot::to_f32(gate[row * ld_gate + j]);
    const float s = aot::round_bf16(1.0f / (1.0f + expf(-g)));
    *xp = __float2bfloat16_rn(aot::to_f32(*xp) * s);
}
