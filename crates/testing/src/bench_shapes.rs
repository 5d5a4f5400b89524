//! Benchmark shape lists shared by the CPU and CUDA benchmarks (the PyTorch scripts
//! `scripts/conv_bench_torch.py` and `scripts/gpu/torch_conv.py` carry the same list).

/// One convolution layer: input `[n, cin, hw, hw]`, weight `[cout, cin, k, k]`.
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    pub name: &'static str,
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    /// Input height = width.
    pub hw: usize,
}

const fn c(
    name: &'static str,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pad: usize,
    hw: usize,
) -> ConvShape {
    ConvShape {
        name,
        cin,
        cout,
        k,
        stride,
        pad,
        hw,
    }
}

/// The 23 distinct convolution shapes of torchvision's ResNet-50 (v1.5: stride on the 3x3)
/// at a 224x224 input.
pub const RESNET50_CONVS: [ConvShape; 23] = [
    c("stem 7x7/2", 3, 64, 7, 2, 3, 224),
    c("l1 1x1 64-64", 64, 64, 1, 1, 0, 56),
    c("l1 3x3 64-64", 64, 64, 3, 1, 1, 56),
    c("l1 1x1 64-256", 64, 256, 1, 1, 0, 56),
    c("l1 1x1 256-64", 256, 64, 1, 1, 0, 56),
    c("l2 1x1 256-128", 256, 128, 1, 1, 0, 56),
    c("l2 3x3/2 128", 128, 128, 3, 2, 1, 56),
    c("l2 1x1 128-512", 128, 512, 1, 1, 0, 28),
    c("l2 ds 1x1/2 256-512", 256, 512, 1, 2, 0, 56),
    c("l2 1x1 512-128", 512, 128, 1, 1, 0, 28),
    c("l2 3x3 128", 128, 128, 3, 1, 1, 28),
    c("l3 1x1 512-256", 512, 256, 1, 1, 0, 28),
    c("l3 3x3/2 256", 256, 256, 3, 2, 1, 28),
    c("l3 1x1 256-1024", 256, 1024, 1, 1, 0, 14),
    c("l3 ds 1x1/2 512-1024", 512, 1024, 1, 2, 0, 28),
    c("l3 1x1 1024-256", 1024, 256, 1, 1, 0, 14),
    c("l3 3x3 256", 256, 256, 3, 1, 1, 14),
    c("l4 1x1 1024-512", 1024, 512, 1, 1, 0, 14),
    c("l4 3x3/2 512", 512, 512, 3, 2, 1, 14),
    c("l4 1x1 512-2048", 512, 2048, 1, 1, 0, 7),
    c("l4 ds 1x1/2 1024-2048", 1024, 2048, 1, 2, 0, 14),
    c("l4 1x1 2048-512", 2048, 512, 1, 1, 0, 7),
    c("l4 3x3 512", 512, 512, 3, 1, 1, 7),
];

/// The 8 distinct convolution shapes of `ferrite train fashion-cnn`'s ResNet
/// (`examples/fashion_cnn.rs`, widths 24/48/96) at a 28x28 input; "l1 3x3 24" runs twice per
/// step.
pub const FASHION_CNN_CONVS: [ConvShape; 8] = [
    c("stem 3x3 1-24", 1, 24, 3, 1, 1, 28),
    c("l1 3x3 24", 24, 24, 3, 1, 1, 28),
    c("l2 3x3/2 24-48", 24, 48, 3, 2, 1, 28),
    c("l2 ds 1x1/2 24-48", 24, 48, 1, 2, 0, 28),
    c("l2 3x3 48", 48, 48, 3, 1, 1, 14),
    c("l3 3x3/2 48-96", 48, 96, 3, 2, 1, 14),
    c("l3 ds 1x1/2 48-96", 48, 96, 1, 2, 0, 14),
    c("l3 3x3 96", 96, 96, 3, 1, 1, 7),
];
