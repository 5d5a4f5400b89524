//! Whole models written with the layers of this crate, with the parameter and buffer names of
//! their PyTorch definitions, so their state dicts load unchanged:
//! - `ResNet` with `BasicBlock`s in torchvision's layout (`torchvision.models.resnet18`:
//!   `conv1`, `bn1`, `layer1.0.conv1`, `layer2.0.downsample.0`, ..., `fc`), any stage widths and
//!   depths (`ResNetConfig::resnet18` is torchvision's), and a small-image stem;
//! - `TransformerEncoder`: `torch.nn.TransformerEncoder` (`layers.0.self_attn.in_proj_weight`,
//!   ..., `norm.weight`).

use crate::layers::activation::relu;
use crate::module::{forward_child, in_child};
use crate::{
    AdaptiveAvgPool2d, BatchNorm, Conv2d, EncoderConfig, LayerNorm, Linear, MaxPool2d, Members,
    MembersMut, Module, ReLU, Sequential, TransformerEncoderLayer,
};
use ferrite_core::{ConvArgs, DType, Device, Error, Padding, PoolArgs, Result, Tensor};

fn conv(
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dtype: DType,
    dev: &Device,
) -> Result<Conv2d> {
    let args = ConvArgs {
        stride: [stride; 2],
        padding: Padding::Zeros([pad; 2]),
        ..ConvArgs::default()
    };
    Conv2d::new(cin, cout, [k, k], args, false, dtype, dev)
}

/// torchvision's `BasicBlock`: two 3x3 convolutions with batch norm, and a 1x1 convolution +
/// batch norm (`downsample`) on the shortcut where the stride or width changes.
pub struct BasicBlock {
    pub conv1: Conv2d,
    pub bn1: BatchNorm,
    pub relu: ReLU,
    pub conv2: Conv2d,
    pub bn2: BatchNorm,
    pub downsample: Option<Sequential>,
}

impl BasicBlock {
    pub fn new(
        inplanes: usize,
        planes: usize,
        stride: usize,
        dtype: DType,
        dev: &Device,
    ) -> Result<BasicBlock> {
        let downsample = if stride != 1 || inplanes != planes {
            Some(
                Sequential::new()
                    .with(conv(inplanes, planes, 1, stride, 0, dtype, dev)?)
                    .with(BatchNorm::default_2d(planes, dtype, dev)?),
            )
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: conv(inplanes, planes, 3, stride, 1, dtype, dev)?,
            bn1: BatchNorm::default_2d(planes, dtype, dev)?,
            relu: ReLU,
            conv2: conv(planes, planes, 3, 1, 1, dtype, dev)?,
            bn2: BatchNorm::default_2d(planes, dtype, dev)?,
            downsample,
        })
    }
}

impl Module for BasicBlock {
    fn type_name(&self) -> &'static str {
        "BasicBlock"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = forward_child("conv1", &self.conv1, x)?;
        let h = relu(&forward_child("bn1", &self.bn1, &h)?)?;
        let h = forward_child("conv2", &self.conv2, &h)?;
        let h = forward_child("bn2", &self.bn2, &h)?;
        let shortcut = match &self.downsample {
            Some(d) => forward_child("downsample", d, x)?,
            None => x.clone(),
        };
        relu(
            &h.add(&shortcut)
                .map_err(|e| in_child(e, "", "BasicBlock"))?,
        )
    }

    fn members(&self) -> Members<'_> {
        let mut children: Vec<(String, &dyn Module)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("relu".into(), &self.relu),
            ("conv2".into(), &self.conv2),
            ("bn2".into(), &self.bn2),
        ];
        if let Some(d) = &self.downsample {
            children.push(("downsample".into(), d));
        }
        Members {
            children,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut children: Vec<(String, &mut dyn Module)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("bn1".into(), &mut self.bn1),
            ("relu".into(), &mut self.relu),
            ("conv2".into(), &mut self.conv2),
            ("bn2".into(), &mut self.bn2),
        ];
        if let Some(d) = &mut self.downsample {
            children.push(("downsample".into(), d));
        }
        MembersMut {
            children,
            ..MembersMut::default()
        }
    }
}

/// Shape of a `ResNet` of `BasicBlock`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResNetConfig {
    pub in_channels: usize,
    /// Output channels of each stage (`layer1`, `layer2`, ...); torchvision: 64, 128, 256, 512.
    pub widths: Vec<usize>,
    /// Blocks per stage; ResNet-18: 2, 2, 2, 2.
    pub blocks: Vec<usize>,
    pub num_classes: usize,
    /// `false`: torchvision's stem (7x7 stride-2 convolution, 3x3 stride-2 max pooling);
    /// `true`: a 3x3 stride-1 `conv1` and no max pooling, for 28x28 or 32x32 images.
    pub small_stem: bool,
}

impl ResNetConfig {
    /// torchvision's ResNet-18.
    pub fn resnet18(num_classes: usize) -> ResNetConfig {
        ResNetConfig {
            in_channels: 3,
            widths: vec![64, 128, 256, 512],
            blocks: vec![2, 2, 2, 2],
            num_classes,
            small_stem: false,
        }
    }
}

/// A ResNet of `BasicBlock`s: `conv1`, `bn1`, `relu`, `maxpool` (torchvision's stem only),
/// `layer1`..`layerN` (each a `Sequential` of blocks, the first of stages after the first with
/// stride 2), `avgpool` (adaptive, 1x1), flatten, `fc`. Input `[n, in_channels, h, w]`, output
/// `[n, num_classes]` logits.
pub struct ResNet {
    pub conv1: Conv2d,
    pub bn1: BatchNorm,
    pub relu: ReLU,
    pub maxpool: Option<MaxPool2d>,
    pub layers: Vec<Sequential>,
    pub avgpool: AdaptiveAvgPool2d,
    pub fc: Linear,
    names: Vec<String>,
}

impl ResNet {
    pub fn new(c: &ResNetConfig, dtype: DType, dev: &Device) -> Result<ResNet> {
        if c.widths.is_empty() || c.widths.len() != c.blocks.len() || c.blocks.contains(&0) {
            return Err(Error::module(
                "ResNet",
                format!(
                    "need one positive block count per stage, got widths {:?} and blocks {:?}",
                    c.widths, c.blocks
                ),
            ));
        }
        let w0 = c.widths[0];
        let (conv1, maxpool) = if c.small_stem {
            (conv(c.in_channels, w0, 3, 1, 1, dtype, dev)?, None)
        } else {
            let pool = PoolArgs {
                stride: [2, 2],
                padding: [1, 1],
                ..PoolArgs::new([3, 3])
            };
            (
                conv(c.in_channels, w0, 7, 2, 3, dtype, dev)?,
                Some(MaxPool2d::new(pool)?),
            )
        };
        let mut layers = Vec::new();
        let mut inplanes = w0;
        for (i, (&w, &n)) in c.widths.iter().zip(&c.blocks).enumerate() {
            let mut stage = Sequential::new();
            for b in 0..n {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                stage = stage.with(BasicBlock::new(inplanes, w, stride, dtype, dev)?);
                inplanes = w;
            }
            layers.push(stage);
        }
        Ok(ResNet {
            conv1,
            bn1: BatchNorm::default_2d(w0, dtype, dev)?,
            relu: ReLU,
            maxpool,
            names: (1..=layers.len()).map(|i| format!("layer{i}")).collect(),
            layers,
            avgpool: AdaptiveAvgPool2d::new([1, 1])?,
            fc: Linear::new(inplanes, c.num_classes, true, dtype, dev)?,
        })
    }
}

impl Module for ResNet {
    fn type_name(&self) -> &'static str {
        "ResNet"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = forward_child("conv1", &self.conv1, x)?;
        let mut h = relu(&forward_child("bn1", &self.bn1, &h)?)?;
        if let Some(p) = &self.maxpool {
            h = forward_child("maxpool", p, &h)?;
        }
        for (name, stage) in self.names.iter().zip(&self.layers) {
            h = forward_child(name, stage, &h)?;
        }
        let h = forward_child("avgpool", &self.avgpool, &h)?;
        let n = h.dims()[0];
        let h = h.reshape([n, self.fc.in_features()])?;
        forward_child("fc", &self.fc, &h)
    }

    fn members(&self) -> Members<'_> {
        let mut children: Vec<(String, &dyn Module)> = vec![
            ("conv1".into(), &self.conv1),
            ("bn1".into(), &self.bn1),
            ("relu".into(), &self.relu),
        ];
        if let Some(p) = &self.maxpool {
            children.push(("maxpool".into(), p));
        }
        for (name, stage) in self.names.iter().zip(&self.layers) {
            children.push((name.clone(), stage));
        }
        children.push(("avgpool".into(), &self.avgpool));
        children.push(("fc".into(), &self.fc));
        Members {
            children,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut children: Vec<(String, &mut dyn Module)> = vec![
            ("conv1".into(), &mut self.conv1),
            ("bn1".into(), &mut self.bn1),
            ("relu".into(), &mut self.relu),
        ];
        if let Some(p) = &mut self.maxpool {
            children.push(("maxpool".into(), p));
        }
        for (name, stage) in self.names.iter().zip(&mut self.layers) {
            children.push((name.clone(), stage));
        }
        children.push(("avgpool".into(), &mut self.avgpool));
        children.push(("fc".into(), &mut self.fc));
        MembersMut {
            children,
            ..MembersMut::default()
        }
    }
}

/// `torch.nn.TransformerEncoder(encoder_layer, num_layers, norm)`: `num_layers` encoder
/// layers of one configuration (`layers.0`, `layers.1`, ...), then an optional final `norm`.
pub struct TransformerEncoder {
    pub layers: EncoderLayers,
    pub norm: Option<LayerNorm>,
}

/// The `layers` of a `TransformerEncoder`: a `ModuleList` of encoder layers (children `0`,
/// `1`, ...), typed so the encoder can pass masks to each.
pub struct EncoderLayers(pub Vec<TransformerEncoderLayer>);

impl Module for EncoderLayers {
    fn type_name(&self) -> &'static str {
        "ModuleList"
    }

    fn forward(&self, _x: &Tensor) -> Result<Tensor> {
        Err(Error::module(
            "ModuleList",
            "has no forward: the TransformerEncoder that owns it runs its layers",
        ))
    }

    fn members(&self) -> Members<'_> {
        Members {
            children: self
                .0
                .iter()
                .enumerate()
                .map(|(i, l)| (i.to_string(), l as &dyn Module))
                .collect(),
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        MembersMut {
            children: self
                .0
                .iter_mut()
                .enumerate()
                .map(|(i, l)| (i.to_string(), l as &mut dyn Module))
                .collect(),
            ..MembersMut::default()
        }
    }
}

fn in_layer(e: Error, i: usize) -> Error {
    in_child(
        in_child(e, &i.to_string(), "TransformerEncoderLayer"),
        "layers",
        "ModuleList",
    )
}

impl TransformerEncoder {
    /// With `final_norm`, a `LayerNorm(d_model, layer_norm_eps)` after the last layer.
    pub fn new(
        c: EncoderConfig,
        num_layers: usize,
        final_norm: bool,
        dtype: DType,
        dev: &Device,
    ) -> Result<TransformerEncoder> {
        if num_layers == 0 {
            return Err(Error::module(
                "TransformerEncoder",
                "num_layers must be positive",
            ));
        }
        let layers = (0..num_layers)
            .map(|i| TransformerEncoderLayer::new(c, dtype, dev).map_err(|e| in_layer(e, i)))
            .collect::<Result<Vec<_>>>()?;
        let norm = match final_norm {
            true => Some(
                LayerNorm::new(&[c.d_model], c.layer_norm_eps, true, c.bias, dtype, dev)
                    .map_err(|e| in_child(e, "norm", "LayerNorm"))?,
            ),
            false => None,
        };
        Ok(TransformerEncoder {
            layers: EncoderLayers(layers),
            norm,
        })
    }

    /// The stack with an optional key-padding mask (bool [B, S]) and causal self-attention in
    /// every layer (PyTorch's `mask=generate_square_subsequent_mask(S), is_causal=True`).
    pub fn forward_masked(
        &self,
        x: &Tensor,
        key_padding_mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.0.iter().enumerate() {
            h = layer
                .forward_masked(&h, key_padding_mask, causal)
                .map_err(|e| in_layer(e, i))?;
        }
        match &self.norm {
            Some(n) => forward_child("norm", n, &h),
            None => Ok(h),
        }
    }
}

impl Module for TransformerEncoder {
    fn type_name(&self) -> &'static str {
        "TransformerEncoder"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None, false)
    }

    fn members(&self) -> Members<'_> {
        let mut children: Vec<(String, &dyn Module)> = vec![("layers".into(), &self.layers)];
        if let Some(n) = &self.norm {
            children.push(("norm".into(), n));
        }
        Members {
            children,
            ..Members::default()
        }
    }

    fn members_mut(&mut self) -> MembersMut<'_> {
        let mut children: Vec<(String, &mut dyn Module)> =
            vec![("layers".into(), &mut self.layers)];
        if let Some(n) = &mut self.norm {
            children.push(("norm".into(), n));
        }
        MembersMut {
            children,
            ..MembersMut::default()
        }
    }
}
