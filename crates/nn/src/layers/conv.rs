//! `Conv1d`, `Conv2d`, `ConvTranspose2d` with PyTorch's names, layouts and default
//! initialization: weight `[out, in/groups, k...]` (transposed: `[in, out/groups, k...]`) and
//! bias drawn from U(-1/√fan_in, 1/√fan_in) (kaiming_uniform with a = √5), fan_in being the
//! weight's `size(1) * prod(kernel)`. Inputs are batched: `[n, c, l]` / `[n, c, h, w]`.

use crate::{init, Members, MembersMut, Module, Parameter};
use ferrite_core::{ConvArgs, ConvTransposeArgs, DType, Device, Error, Padding, Result, Tensor};

/// Turns an op's error into the module's (`Conv2d: conv2d: ...`), keeping module errors.
pub(crate) fn in_module<T>(module: &'static str, r: Result<T>) -> Result<T> {
    r.map_err(|e| match e {
        e @ Error::Module { .. } => e,
        e => Error::module(module, e.to_string()),
    })
}

fn params_of<'a>(w: &'a Parameter, b: &'a Option<Parameter>) -> Vec<(String, &'a Parameter)> {
    let mut p = vec![("weight".to_string(), w)];
    if let Some(b) = b {
        p.push(("bias".to_string(), b));
    }
    p
}

fn params_of_mut<'a>(
    w: &'a mut Parameter,
    b: &'a mut Option<Parameter>,
) -> Vec<(String, &'a mut Parameter)> {
    let mut p = vec![("weight".to_string(), w)];
    if let Some(b) = b {
        p.push(("bias".to_string(), b));
    }
    p
}

/// Checks channels, groups, kernel and geometry; returns the weight and bias bound.
#[allow(clippy::too_many_arguments)]
fn check_conv(
    module: &'static str,
    in_channels: usize,
    out_channels: usize,
    kernel: &[usize],
    stride: &[usize],
    dilation: &[usize],
    groups: usize,
    same: bool,
) -> Result<()> {
    let err = |m: String| Err(Error::module(module, m));
    if in_channels == 0 || out_channels == 0 {
        return err(format!(
            "in_channels ({in_channels}) and out_channels ({out_channels}) must be positive"
        ));
    }
    if groups == 0 || !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
        return err(format!(
            "groups {groups} must divide in_channels {in_channels} and out_channels {out_channels}"
        ));
    }
    if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
        return err(format!(
            "kernel_size {kernel:?}, stride {stride:?} and dilation {dilation:?} must be positive"
        ));
    }
    if same && stride.iter().any(|&s| s != 1) {
        return err(format!("padding='same' needs stride 1, got {stride:?}"));
    }
    Ok(())
}

fn uniform_param(shape: Vec<usize>, bound: f64, dtype: DType, dev: &Device) -> Result<Parameter> {
    Parameter::new(&init::uniform(shape, -bound, bound, dtype, dev)?)
}

pub struct Conv2d {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    pub args: ConvArgs<2>,
}

impl Conv2d {
    /// PyTorch's `Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation,
    /// groups, bias)`, zero padding.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        args: ConvArgs<2>,
        bias: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<Conv2d> {
        check_conv(
            "Conv2d",
            in_channels,
            out_channels,
            &kernel_size,
            &args.stride,
            &args.dilation,
            args.groups,
            args.padding == Padding::Same,
        )?;
        let cg = in_channels / args.groups;
        let bound = 1.0 / ((cg * kernel_size[0] * kernel_size[1]) as f64).sqrt();
        let weight = uniform_param(
            vec![out_channels, cg, kernel_size[0], kernel_size[1]],
            bound,
            dtype,
            dev,
        )?;
        let bias = bias
            .then(|| uniform_param(vec![out_channels], bound, dtype, dev))
            .transpose()?;
        Ok(Conv2d { weight, bias, args })
    }

    pub fn in_channels(&self) -> usize {
        self.weight.dims()[1] * self.args.groups
    }
}

/// The message for a channel mismatch, before the op sees the input.
fn check_input(module: &'static str, x: &Tensor, rank: usize, channels: usize) -> Result<()> {
    let layout = if rank == 3 {
        "[n, c, l]"
    } else {
        "[n, c, h, w]"
    };
    if x.rank() != rank {
        return Err(Error::module(
            module,
            format!("expected input {layout}, got {}", x.shape()),
        ));
    }
    if x.dims()[1] != channels {
        return Err(Error::module(
            module,
            format!(
                "expected {channels} input channels, got {} in input {}",
                x.dims()[1],
                x.shape()
            ),
        ));
    }
    Ok(())
}

impl Module for Conv2d {
    fn type_name(&self) -> &'static str {
        "Conv2d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_input("Conv2d", x, 4, self.in_channels())?;
        let b = self.bias.as_ref().map(|b| b.tensor());
        in_module(
            "Conv2d",
            x.conv2d(&self.weight.tensor(), b.as_ref(), &self.args),
        )
    }

    fn members(&self) -> Members<'_> {
        Members {
            params: params_of(&self.weight, &self.bias),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            params: params_of_mut(&mut self.weight, &mut self.bias),
            ..MembersMut::default()
        }
    }
}

pub struct Conv1d {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    pub args: ConvArgs<1>,
}

impl Conv1d {
    /// PyTorch's `Conv1d(in_channels, out_channels, kernel_size, stride, padding, dilation,
    /// groups, bias)`, zero padding.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        args: ConvArgs<1>,
        bias: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<Conv1d> {
        check_conv(
            "Conv1d",
            in_channels,
            out_channels,
            &[kernel_size],
            &args.stride,
            &args.dilation,
            args.groups,
            args.padding == Padding::Same,
        )?;
        let cg = in_channels / args.groups;
        let bound = 1.0 / ((cg * kernel_size) as f64).sqrt();
        let weight = uniform_param(vec![out_channels, cg, kernel_size], bound, dtype, dev)?;
        let bias = bias
            .then(|| uniform_param(vec![out_channels], bound, dtype, dev))
            .transpose()?;
        Ok(Conv1d { weight, bias, args })
    }
}

impl Module for Conv1d {
    fn type_name(&self) -> &'static str {
        "Conv1d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_input("Conv1d", x, 3, self.weight.dims()[1] * self.args.groups)?;
        let b = self.bias.as_ref().map(|b| b.tensor());
        in_module(
            "Conv1d",
            x.conv1d(&self.weight.tensor(), b.as_ref(), &self.args),
        )
    }

    fn members(&self) -> Members<'_> {
        Members {
            params: params_of(&self.weight, &self.bias),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            params: params_of_mut(&mut self.weight, &mut self.bias),
            ..MembersMut::default()
        }
    }
}

pub struct ConvTranspose2d {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    pub args: ConvTransposeArgs<2>,
}

impl ConvTranspose2d {
    /// PyTorch's `ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding,
    /// output_padding, groups, bias, dilation)`; weight `[in, out/groups, kh, kw]`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        args: ConvTransposeArgs<2>,
        bias: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<ConvTranspose2d> {
        check_conv(
            "ConvTranspose2d",
            in_channels,
            out_channels,
            &kernel_size,
            &args.stride,
            &args.dilation,
            args.groups,
            false,
        )?;
        for a in 0..2 {
            if args.output_padding[a] >= args.stride[a].max(args.dilation[a]) {
                return Err(Error::module(
                    "ConvTranspose2d",
                    format!(
                        "output_padding {:?} must be smaller than stride {:?} or dilation {:?}",
                        args.output_padding, args.stride, args.dilation
                    ),
                ));
            }
        }
        let og = out_channels / args.groups;
        let bound = 1.0 / ((og * kernel_size[0] * kernel_size[1]) as f64).sqrt();
        let weight = uniform_param(
            vec![in_channels, og, kernel_size[0], kernel_size[1]],
            bound,
            dtype,
            dev,
        )?;
        let bias = bias
            .then(|| uniform_param(vec![out_channels], bound, dtype, dev))
            .transpose()?;
        Ok(ConvTranspose2d { weight, bias, args })
    }
}

impl Module for ConvTranspose2d {
    fn type_name(&self) -> &'static str {
        "ConvTranspose2d"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_input("ConvTranspose2d", x, 4, self.weight.dims()[0])?;
        let b = self.bias.as_ref().map(|b| b.tensor());
        in_module(
            "ConvTranspose2d",
            x.conv_transpose2d(&self.weight.tensor(), b.as_ref(), &self.args),
        )
    }

    fn members(&self) -> Members<'_> {
        Members {
            params: params_of(&self.weight, &self.bias),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            params: params_of_mut(&mut self.weight, &mut self.bias),
            ..MembersMut::default()
        }
    }
}
