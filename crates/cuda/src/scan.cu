// scan kernels (placeholder: filled in below).
extern "C" __global__ void scan_placeholder() {}
