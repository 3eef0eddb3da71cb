//! The exact attention (kernels/attention.hip) against the CPU reference, bitwise: scores, softmax
//! with sinks and weighted values over the ring and the compressed rows (dense, ratio 4 with
//! indexer selection, ratio 128, prefill).

use ds4_chat::backend::cpu::attention::{Visible, attend};

use super::attention_case::{AttentionCase, attention_shape};
use super::support::*;

/// Every check of this file, with its shapes.
pub fn run(gpu: &Gpu, rng: &mut CheckRng, emit: Emit) {
    let cases = [
        ("decode dense", 1usize, 200usize, 0usize, 0usize, 0usize),
        ("decode ratio4 +indexer sel", 1, 1000, 4, 250, 64),
        ("prefill 20 tok ratio128", 20, 130, 128, 1, 0),
        ("prefill 3 tok ratio4", 3, 37, 4, 9, 0),
    ];
    each(
        gpu,
        rng,
        emit,
        cases,
        |c| format!("kernel.attention[{}]", c.0),
        check_attention,
    );
}

/// Attention with sinks over the raw ring and the compressed rows against the
/// CPU `attend`, for decode (split rows + combine) and batched prefill, with and without the
/// indexer's row selection. `shape` = (n_tok, pos0, ratio, n_comp_avail, top_k; 0 = no selection).
/// One attention case: (label, tokens, first position, ratio, compressed rows, top_k).
type Case = (&'static str, usize, usize, usize, usize, usize);

fn check_attention(gpu: &Gpu, rng: &mut CheckRng, name: &str, case: Case) -> Checked {
    let (_, n_tok, pos0, ratio, n_comp_avail, top_k) = case;
    let (n_head, head_dim, window, ring_cap) = (16usize, 512usize, 128usize, 256usize);
    let att = attention_shape(n_head, head_dim, ring_cap, window, ratio, top_k);
    let case = AttentionCase::new(gpu, rng, att, n_tok, pos0, n_comp_avail, |v| v)?;
    let (q, ring, comp, sinks, sel) = (&case.q, &case.ring, &case.comp, &case.sinks, &case.sel);
    let visible_comp = |p: usize| (p + 1).checked_div(ratio).map_or(0, |c| c.min(n_comp_avail));
    let selected = case.selected();
    let rows = case.rows();
    let out = gpu.poisoned::<f32>(n_tok * n_head * head_dim)?;
    // A score stride of 3 spare rows (as a captured decode graph sizes it for the session): the
    // spare score blocks exit and the output is the same.
    case.run_exact(gpu, &out, rows + 3)?;
    let got = out.to_vec::<f32>()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("1-thread pool");
    let mut want = vec![0f32; n_tok * n_head * head_dim];
    for t in 0..n_tok {
        let p = pos0 + t;
        let first = (p + 1).saturating_sub(window);
        let raw: Vec<f32> = (first..=p)
            .flat_map(|pos| {
                ring[(pos % ring_cap) * head_dim..(pos % ring_cap + 1) * head_dim]
                    .iter()
                    .copied()
            })
            .collect();
        let n_c = visible_comp(p);
        let allowed: Option<Vec<bool>> = (selected && n_c > top_k).then(|| {
            let mut a = vec![false; n_c];
            for &r in &sel[t * top_k..(t + 1) * top_k] {
                a[r as usize] = true;
            }
            a
        });
        let vis = Visible {
            raw: &raw,
            comp: &comp[..n_c * head_dim],
            allowed: allowed.as_deref(),
        };
        let mut scores = vec![0f32; n_head * (raw.len() / head_dim + n_c).max(1)];
        let qt = &q[t * n_head * head_dim..(t + 1) * n_head * head_dim];
        attend(
            &pool,
            qt,
            &vis,
            sinks,
            head_dim,
            &mut want[t * n_head * head_dim..(t + 1) * n_head * head_dim],
            &mut scores,
        );
    }
    Ok(same_bits(
        name,
        &got,
        &want,
        format!(
            "{n_tok} tok at {pos0}, {n_head}x{head_dim}, {rows} rows (stride {})",
            rows + 3
        ),
    ))
}
