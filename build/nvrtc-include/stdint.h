// <stdint.h> for kernels compiled by NVRTC (the CUDA 12 toolchain), which has no C library
// headers: the fixed-width types from CCCL's <cuda/std/cstdint>, in the global namespace where
// nvcc's <stdint.h> puts them. Only the build's NVRTC runs see this folder.
#pragma once
#include <cuda/std/cstdint>

using cuda::std::int8_t;
using cuda::std::int16_t;
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint8_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::intptr_t;
using cuda::std::uintptr_t;
