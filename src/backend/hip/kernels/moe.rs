//! Builders of kernels/moe.hip: the router and the per-token routed-expert kernels of every expert
//! format (decode steps and small batches).

use super::abi::*;
use super::launch::{Launch, blocks, f, ptr, u};
use super::matvec::MATVEC_ROWS;
use crate::gguf::types::GgmlType;

/// `ds4_router`: expert ids and weights per token (bias and tid2eid may be NULL; tokens is read
/// only for hash layers). Grid (n_tok).
pub fn router(
    sel: DevPtr,
    selw: DevPtr,
    logits: DevPtr,
    bias: DevPtr,
    tid2eid: DevPtr,
    tokens: DevPtr,
    n_expert: u32,
    n_used: u32,
    weight_scale: f32,
    n_tok: u32,
) -> Launch {
    assert!(
        n_expert <= 1024 && n_used <= 16,
        "router: n_expert {n_expert} / n_used {n_used} too large"
    );
    Launch::new(
        &ROUTER,
        [n_tok, 1, 1],
        vec![
            ptr(sel),
            ptr(selw),
            ptr(logits),
            ptr(bias),
            ptr(tid2eid),
            ptr(tokens),
            u(n_expert),
            u(n_used),
            f(weight_scale),
            u(n_tok),
        ],
    )
}

/// Routed-expert weight formats that have kernels (docs/gguf.md#element-types).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertFormat {
    Iq2Xxs,
    Q2K,
    Q4K,
}

impl ExpertFormat {
    pub const ALL: [ExpertFormat; 3] = [ExpertFormat::Iq2Xxs, ExpertFormat::Q2K, ExpertFormat::Q4K];

    /// The element type of the format's rows.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            ExpertFormat::Iq2Xxs => GgmlType::Iq2Xxs,
            ExpertFormat::Q2K => GgmlType::Q2K,
            ExpertFormat::Q4K => GgmlType::Q4K,
        }
    }

    /// From a tensor's element type; `None` for types without expert kernels.
    pub fn from_ggml_type(t: GgmlType) -> Option<ExpertFormat> {
        ExpertFormat::ALL.into_iter().find(|f| f.ggml_type() == t)
    }

    /// The format's kernel names end with its type's name: `ds4_moe_gate_up_q2_k`, `ds4_matvec_iq2_xxs`.
    pub(super) fn kernel_suffix(self) -> String {
        self.ggml_type().name().to_lowercase()
    }

    /// `ds4_<role>_<format>`: the format's kernel for `role` (`moe_gate_up`, `moe_down`,
    /// `moe_gemm_gate_up`, `moe_gemm_down`, `matvec`).
    pub(super) fn kernel(self, role: &str) -> &'static KernelDef {
        let name = format!("ds4_{role}_{}", self.kernel_suffix());
        kernel_def(&name).unwrap_or_else(|| panic!("no kernel {name}"))
    }
}

/// Q8_K activation planes (see [`QuantOut`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Q8K {
    pub q: DevPtr,
    pub d: DevPtr,
    pub bsums: DevPtr,
}

impl Q8K {
    /// The three plane pointers in the order the kernels that read them take them.
    pub(super) fn args(&self) -> [Arg; 3] {
        [self.q, self.d, self.bsums].map(ptr)
    }
}

/// `ds4_moe_gate_up_<fmt>`: mid[t][k][r] = swiglu(gate_e[r]·x_t, up_e[r]·x_t) * selw[t][k].
/// Grid (ceil(n_ff/8), n_used, n_tok).
pub fn moe_gate_up(
    fmt: ExpertFormat,
    mid: DevPtr,
    gate: DevPtr,
    up: DevPtr,
    x: Q8K,
    sel: DevPtr,
    selw: DevPtr,
    n_in: u32,
    n_ff: u32,
    n_used: u32,
    limit: f32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        fmt.kernel("moe_gate_up"),
        [blocks(n_ff, MATVEC_ROWS), n_used, n_tok],
        [
            &[ptr(mid), ptr(gate), ptr(up)][..],
            &x.args(),
            &[ptr(sel), ptr(selw), u(n_in), u(n_ff), u(n_used), f(limit)],
        ]
        .concat(),
    )
}

/// Experts per token the per-token expert kernels handle (`DS4_MOE_MAX_USED` in kernels/moe.hip).
pub const MOE_MAX_USED: usize = 8;

/// `ds4_moe_down_<fmt>`: out[t][r] = Σ_k down_e[r]·mid_{t,k} (slot order), mid given as Q8_K rows
/// (t*n_used + k). Grid (ceil(n_out/8), n_tok).
pub fn moe_down(
    fmt: ExpertFormat,
    out: DevPtr,
    down: DevPtr,
    mid: Q8K,
    sel: DevPtr,
    n_ff: u32,
    n_out: u32,
    n_used: u32,
    n_tok: u32,
) -> Launch {
    Launch::new(
        fmt.kernel("moe_down"),
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        [
            &[ptr(out), ptr(down)][..],
            &mid.args(),
            &[ptr(sel), u(n_ff), u(n_out), u(n_used)],
        ]
        .concat(),
    )
}

/// `ds4_matvec_<fmt>`: plain K-quant matvec with Q8_K activations. Grid (ceil(n_out/8), n_tok).
pub fn matvec_k(fmt: ExpertFormat, y: DevPtr, w: DevPtr, x: Q8K, n_in: u32, n_out: u32, n_tok: u32) -> Launch {
    Launch::new(
        fmt.kernel("matvec"),
        [blocks(n_out, MATVEC_ROWS), n_tok, 1],
        [&[ptr(y), ptr(w)][..], &x.args(), &[u(n_in), u(n_out)]].concat(),
    )
}
