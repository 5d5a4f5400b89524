// index kernels (placeholder: filled in below).
extern "C" __global__ void index_placeholder() {}
