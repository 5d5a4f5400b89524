//! ferrite-nn: neural-network modules over ferrite tensors, named and laid out as in PyTorch's
//! `torch.nn` so that state dicts move between the two unchanged.
//!
//! - `Module` (forward, members) and `ModuleExt` (dotted-path walks, train/eval, device and
//!   dtype moves) in `module.rs`;
//! - `Parameter` and `Buffer`: tensors that own one buffer for life, written in place
//!   (`parameter.rs`);
//! - containers: `Sequential`, `ModuleList`, `ModuleDict` (`container.rs`);
//! - layers (`layers/`), losses (`loss.rs`), initialization (`init.rs`);
//! - state dicts (`state_dict.rs`) stored as safetensors (`safetensors.rs`, validated reader);
//! - model summaries (`summary.rs`);
//! - whole models in PyTorch's layouts: ResNet (torchvision), TransformerEncoder (`models.rs`).

mod container;
pub mod init;
pub mod layers;
pub mod loss;
pub mod models;
mod module;
mod parameter;
pub mod safetensors;
mod state_dict;
mod summary;

pub use container::{ModuleDict, ModuleList, Sequential};
pub use layers::activation::{
    Hardsigmoid, Hardswish, Identity, LeakyReLU, LogSoftmax, Mish, ReLU, SiLU, Sigmoid, Softmax,
    Softplus, Softsign, Swish, Tanh, ELU, GELU,
};
pub use layers::attention::{
    Activation, DecoderConfig, EncoderConfig, MultiheadAttention, TransformerDecoderLayer,
    TransformerEncoderLayer,
};
pub use layers::conv::{Conv1d, Conv2d, ConvTranspose2d};
pub use layers::dropout::{dropout, Dropout};
pub use layers::embedding::Embedding;
pub use layers::linear::{linear, Bilinear, Linear};
pub use layers::norm::{LayerNorm, RMSNorm};
pub use layers::norm2d::{
    BatchNorm, BatchNorm1d, BatchNorm2d, Dropout2d, GroupNorm, InstanceNorm2d,
};
pub use layers::pool::{
    AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d,
};
pub use layers::reshape::{Flatten, Unflatten};
pub use layers::rnn::{Recurrent, RnnConfig, RnnMode, GRU, LSTM, RNN};

/// Functional forms of the layers (PyTorch's `torch.nn.functional`).
pub mod functional {
    pub use crate::layers::activation::{
        elu, gelu, hardsigmoid, hardswish, leaky_relu, log_softmax, mish, relu, sigmoid, silu,
        softmax, softplus, softsign, tanh,
    };
    pub use crate::layers::dropout::dropout;
    pub use crate::layers::linear::linear;
}
pub use module::{forward_child, in_child, Members, MembersMut, Module, ModuleExt};
pub use parameter::{Buffer, Parameter};
pub use state_dict::{
    load_state_dict, load_state_dict_file, save_state_dict, state_dict, LoadReport,
};
pub use summary::{summary, Summary, SummaryRow};
