//! Pooling layers (no parameters): `MaxPool1d/2d`, `AvgPool1d/2d`, `AdaptiveAvgPool2d`,
//! `AdaptiveMaxPool2d`, configured by `PoolArgs` (PyTorch's kernel_size, stride — default the
//! kernel —, padding, dilation, ceil_mode, count_include_pad). Padding above half the kernel is
//! an error at construction, as in PyTorch; a window larger than the padded input is an error
//! at forward.

use super::conv::in_module;
use crate::Module;
use ferrite_core::{Error, PoolArgs, Result, Tensor};

fn check_pool<const N: usize>(module: &'static str, a: &PoolArgs<N>, dilation: bool) -> Result<()> {
    if a.kernel.contains(&0) || a.stride.contains(&0) || a.dilation.contains(&0) {
        return Err(Error::module(
            module,
            format!(
                "kernel_size {:?}, stride {:?} and dilation {:?} must be positive",
                a.kernel, a.stride, a.dilation
            ),
        ));
    }
    if (0..N).any(|i| 2 * a.padding[i] > a.kernel[i]) {
        return Err(Error::module(
            module,
            format!(
                "padding {:?} must be at most half of kernel_size {:?}",
                a.padding, a.kernel
            ),
        ));
    }
    if !dilation && a.dilation.iter().any(|&d| d != 1) {
        return Err(Error::module(
            module,
            format!("has no dilation, got {:?}", a.dilation),
        ));
    }
    Ok(())
}

macro_rules! pool_module {
    ($name:ident, $n:literal, $dilation:literal, |$x:ident, $a:ident| $body:expr) => {
        pub struct $name {
            pub args: PoolArgs<$n>,
        }

        impl $name {
            pub fn new(args: PoolArgs<$n>) -> Result<$name> {
                check_pool(stringify!($name), &args, $dilation)?;
                Ok($name { args })
            }
        }

        impl Module for $name {
            fn type_name(&self) -> &'static str {
                stringify!($name)
            }

            fn forward(&self, $x: &Tensor) -> Result<Tensor> {
                let $a = &self.args;
                in_module(stringify!($name), $body)
            }
        }
    };
}

pool_module!(MaxPool2d, 2, true, |x, a| x.max_pool2d(a));
pool_module!(MaxPool1d, 1, true, |x, a| x.max_pool1d(a));
pool_module!(AvgPool2d, 2, false, |x, a| x.avg_pool2d(a));
pool_module!(AvgPool1d, 1, false, |x, a| x.avg_pool1d(a));

macro_rules! adaptive_module {
    ($name:ident, $method:ident) => {
        pub struct $name {
            pub output_size: [usize; 2],
        }

        impl $name {
            pub fn new(output_size: [usize; 2]) -> Result<$name> {
                if output_size.contains(&0) {
                    return Err(Error::module(
                        stringify!($name),
                        format!("output_size {output_size:?} must be positive"),
                    ));
                }
                Ok($name { output_size })
            }
        }

        impl Module for $name {
            fn type_name(&self) -> &'static str {
                stringify!($name)
            }

            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                in_module(stringify!($name), x.$method(self.output_size))
            }
        }
    };
}

adaptive_module!(AdaptiveAvgPool2d, adaptive_avg_pool2d);
adaptive_module!(AdaptiveMaxPool2d, adaptive_max_pool2d);
