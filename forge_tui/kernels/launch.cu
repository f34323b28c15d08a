/* Host code the CUDA candidates share (sections filled in by forge_tui/kernels/launch.py). */

//@section cluster_config
${wide}        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = ${cl};
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(${grid});
        cfg.blockDim = dim3(${threads});
        cfg.dynamicSmemBytes = ${smem};
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
//@section cluster_wide
        cudaFuncSetAttribute(${kernel}, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
//@section ring_launch
    {
        cudaFuncSetAttribute(${kernel}, cudaFuncAttributeMaxDynamicSharedMemorySize, ${smem});
${config}        int fit = 0;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&fit, ${kernel}, &cfg);
        if (e != cudaSuccess) return (int)e;
        if (fit < 1) return (int)cudaErrorInvalidConfiguration;
        const int64_t clusters = (int64_t)fit < (int64_t)(${units}) ? (int64_t)fit : (int64_t)(${units});
        cfg.gridDim = dim3((unsigned)(clusters * ${cl}));
        e = cudaLaunchKernelEx(&cfg, ${kernel}, ${args});
        if (e != cudaSuccess) return (int)e;
    }
//@section stream_ws_bytes
static const int64_t PART_BYTES = ${part_bytes};
static const int64_t WS_BYTES = PART_BYTES + (int64_t)sizeof(unsigned) * (${units} + 1);
//@section stream_counters
    unsigned* done = (unsigned*)((char*)workspace + PART_BYTES);
    unsigned* ticket = done + ${units};
    /* the counters start at zero on every call (the workspace holds garbage) */
    cudaMemsetAsync(done, 0, sizeof(unsigned) * (${units} + 1), s);
//@section workspace_entry
FORGE_EXPORT int64_t forge_workspace_bytes(const forge_tensor* in, int32_t n_in, const forge_tensor* out,
                                           int32_t n_out, const forge_scalar* sc, int32_t n_sc) {
    return ${bytes};
}

FORGE_EXPORT int forge_launch_ws(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                                 const forge_scalar* sc, int32_t n_sc, void* workspace, int64_t ws_bytes,
                                 void* stream) {
