// The CUDA driver calls the example makes itself (its context, stream, memory), opened with
// dlopen: the example builds and runs its no-GPU paths on a machine without libcuda. The types
// come from cuda.h; no libcuda symbol is linked.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <stdexcept>
#include <string>

class CudaDriver {
   public:
    // Opens libcuda.so.1; `ok()` is false (and `why()` says why) when it is not there.
    CudaDriver() {
        lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib_ == nullptr) {
            const char* e = dlerror();
            why_ = e != nullptr ? e : "libcuda.so.1 not found";
            return;
        }
        try {
            load(init, "cuInit");
            load(device_get_count, "cuDeviceGetCount");
            load(device_get, "cuDeviceGet");
            load(ctx_create, "cuCtxCreate_v2");
            load(ctx_destroy, "cuCtxDestroy_v2");
            load(ctx_set_current, "cuCtxSetCurrent");
            load(stream_create, "cuStreamCreate");
            load(stream_destroy, "cuStreamDestroy_v2");
            load(stream_synchronize, "cuStreamSynchronize");
            load(mem_alloc, "cuMemAlloc_v2");
            load(mem_free, "cuMemFree_v2");
            load(memset_d8, "cuMemsetD8_v2");
            load(memcpy_htod, "cuMemcpyHtoD_v2");
            load(memcpy_dtoh, "cuMemcpyDtoH_v2");
            load(get_error_name, "cuGetErrorName");
        } catch (const std::runtime_error& e) {
            why_ = e.what();
            dlclose(lib_);
            lib_ = nullptr;
        }
    }
    ~CudaDriver() {
        if (lib_ != nullptr) dlclose(lib_);
    }
    CudaDriver(const CudaDriver&) = delete;
    CudaDriver& operator=(const CudaDriver&) = delete;

    bool ok() const { return lib_ != nullptr; }
    const std::string& why() const { return why_; }

    // Throws with the call's name and the driver's error name unless `r` is CUDA_SUCCESS.
    void check(CUresult r, const char* what) const {
        if (r == CUDA_SUCCESS) return;
        const char* name = nullptr;
        if (get_error_name == nullptr || get_error_name(r, &name) != CUDA_SUCCESS || name == nullptr) name = "?";
        throw std::runtime_error(std::string(what) + " failed: " + name);
    }

    CUresult (*init)(unsigned int) = nullptr;
    CUresult (*device_get_count)(int*) = nullptr;
    CUresult (*device_get)(CUdevice*, int) = nullptr;
    CUresult (*ctx_create)(CUcontext*, unsigned int, CUdevice) = nullptr;
    CUresult (*ctx_destroy)(CUcontext) = nullptr;
    CUresult (*ctx_set_current)(CUcontext) = nullptr;
    CUresult (*stream_create)(CUstream*, unsigned int) = nullptr;
    CUresult (*stream_destroy)(CUstream) = nullptr;
    CUresult (*stream_synchronize)(CUstream) = nullptr;
    CUresult (*mem_alloc)(CUdeviceptr*, size_t) = nullptr;
    CUresult (*mem_free)(CUdeviceptr) = nullptr;
    CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t) = nullptr;
    CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t) = nullptr;
    CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t) = nullptr;
    CUresult (*get_error_name)(CUresult, const char**) = nullptr;

   private:
    template <typename F>
    void load(F& f, const char* name) {
        f = reinterpret_cast<F>(dlsym(lib_, name));
        if (f == nullptr) throw std::runtime_error(std::string("libcuda.so.1 has no ") + name);
    }

    void* lib_ = nullptr;
    std::string why_;
};
