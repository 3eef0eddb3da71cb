//! `HipSession`'s block verify and commit (`DeviceSession::verify` / `block_logits` / `commit`,
//! docs/model.md#block-verify-and-commit), with the device buffers of `block.rs`.
//!
//! A verify is one batch through the launch sequence of `layers.rs` (so in exact arithmetic each row
//! is bitwise a decode step's), bracketed by the state keep (`ds4_copy_spans`) and followed by the
//! head on every row. A commit that drops a suffix puts the states back and walks the kept tokens'
//! compressor inputs again (block.rs says why that is all). Both are captured as graphs, one per
//! block length and one per kept count, replayed as the decode step is.

use std::cell::OnceCell;

use super::HipSession;
use crate::backend::hip::block::{self, SpanSet, span_ptr};
use crate::backend::hip::decode::{self, DecodeGraph};
use crate::backend::hip::kernels;
use crate::backend::hip::pass::{Pass, dev, p0};
use crate::backend::{BackendError, check_eval_tokens};

/// A verified block the cache still holds whole: its first position and tokens.
pub(super) struct PendingBlock {
    p0: usize,
    tokens: Vec<u32>,
}

/// The verify state of a session: the pending block, the rows of the last verify and their host
/// copy, the captured graphs.
pub(super) struct BlockVerify {
    pending: Option<PendingBlock>,
    rows: usize,
    host: OnceCell<Vec<f32>>,
    /// Index n: the verify of n tokens; index k: the commit that keeps k tokens.
    verify_graphs: Vec<Option<DecodeGraph>>,
    commit_graphs: Vec<Option<DecodeGraph>>,
    pub(super) spans: block::SpanTables,
}

impl BlockVerify {
    pub(super) fn new(spans: block::SpanTables) -> BlockVerify {
        let none = || (0..=block::BLOCK_MAX_TOKENS).map(|_| None).collect();
        BlockVerify {
            pending: None,
            rows: 0,
            host: OnceCell::new(),
            verify_graphs: none(),
            commit_graphs: none(),
            spans,
        }
    }

    /// Any evaluation, reset or restore keeps the whole pending block (the trait's rule).
    pub(super) fn commit_whole(&mut self) {
        self.pending = None;
    }

    /// Drop the captured graphs (the launch sequence changed: a DSpark capture was attached).
    pub(super) fn drop_graphs(&mut self) {
        self.verify_graphs
            .iter_mut()
            .chain(&mut self.commit_graphs)
            .for_each(|g| *g = None);
    }

    /// Forget the last verify's rows (the cache moved on).
    pub(super) fn forget_rows(&mut self) {
        self.commit_whole();
        self.rows = 0;
        self.host.take();
    }
}

/// The launch copying the spans of `set`.
fn copy_launch(s: &HipSession, set: SpanSet) -> kernels::Launch {
    let (first, n) = s.verify.spans.range(set);
    kernels::copy_spans(span_ptr(p0(&s.acts.spans), first), n as u32)
}

/// The verify of `n` tokens (step parameters written): keep the states, the batch with its
/// compressor inputs kept, the head on every row, the last row into the logits. `host_pos`: as for
/// `Pass::forward_tokens`.
fn verify_launches(s: &HipSession, n: usize, host_pos: Option<usize>) -> Result<(), BackendError> {
    let pass = Pass {
        keep_compressor_inputs: true,
        ..s.pass()
    };
    pass.launch(&copy_launch(s, SpanSet::Keep))?;
    pass.forward_tokens(n, false, host_pos)?;
    pass.head_rows(0, n, p0(&s.acts.block_logits))?;
    pass.launch(&copy_launch(s, SpanSet::BlockRow(n - 1)))
}

/// The commit that keeps `keep` tokens of a longer block (step parameters of the block written):
/// the states back, the kept tokens' compressor inputs walked again into the states only, the
/// logits after the last kept token.
fn commit_launches(s: &HipSession, keep: usize) -> Result<(), BackendError> {
    let hp = &s.model.hp;
    let pass = s.pass();
    pass.launch(&copy_launch(s, SpanSet::Restore))?;
    if keep > 0 {
        let base = p0(&s.acts.block_redo);
        for (l, (ls, lw)) in s.layers.iter().zip(&s.model.w.layers).enumerate() {
            let ratio = hp.ratio(l);
            let (comp_in, index_in) = block::redo_ptrs(hp, base, l);
            let comp = lw
                .compressor
                .as_ref()
                .zip(ls.comp.as_ref())
                .map(|(cw, st)| (cw, st, comp_in, hp.head_dim));
            let index = (lw.indexer.as_ref().map(|i| &i.compressor))
                .zip(ls.index.as_ref())
                .map(|(cw, st)| (cw, st, index_in, hp.idx_head_dim));
            for (cw, st, [kv, gate], hd) in comp.into_iter().chain(index) {
                // Capacity 0: the walk writes the states and no compressed row (kernels/compressor.hip).
                pass.launch(&kernels::compressor_pool(
                    p0(&st[0]),
                    p0(&st[1]),
                    p0(&st[2]),
                    kv,
                    gate,
                    pass.w(&cw.ape),
                    s.acts.pos_ptr(),
                    hd as u32,
                    ratio,
                    keep as u32,
                    0,
                ))?;
            }
        }
    }
    let logits = match keep {
        0 => SpanSet::LogitsBefore,
        k => SpanSet::BlockRow(k - 1),
    };
    pass.launch(&copy_launch(s, logits))?;
    pass.flush_launches()
}

/// Which captured graph a launch sequence replays.
#[derive(Clone, Copy)]
enum GraphSlot {
    /// The verify of n tokens.
    Verify(usize),
    /// The commit that keeps k tokens.
    Commit(usize),
}

impl BlockVerify {
    fn graph(&self, slot: GraphSlot) -> &Option<DecodeGraph> {
        match slot {
            GraphSlot::Verify(n) => &self.verify_graphs[n],
            GraphSlot::Commit(k) => &self.commit_graphs[k],
        }
    }

    fn graph_mut(&mut self, slot: GraphSlot) -> &mut Option<DecodeGraph> {
        match slot {
            GraphSlot::Verify(n) => &mut self.verify_graphs[n],
            GraphSlot::Commit(k) => &mut self.commit_graphs[k],
        }
    }
}

/// Issues a verify or commit step's launches: with the host's position, or `None` while a graph
/// captures them (the position then comes from the device's counter).
type IssueLaunches<'a> = dyn Fn(&HipSession, Option<usize>) -> Result<(), BackendError> + 'a;

impl HipSession {
    /// Replay the graph of `slot` (captured at its first use; `what` names it in errors), or with
    /// the graph off issue the launches directly with the host's position.
    fn replay_or_launch(&mut self, slot: GraphSlot, what: &str, issue: &IssueLaunches<'_>) -> Result<(), BackendError> {
        if !self.decode_graph_active() {
            return issue(self, Some(self.n_past));
        }
        if self.verify.graph(slot).is_none() {
            let g = DecodeGraph::capture_launches(&self.pass(), what, || issue(self, None))?;
            *self.verify.graph_mut(slot) = Some(g);
        }
        let g = self.verify.graph(slot).as_ref().expect("captured above");
        g.replay(&self.acts, &self.stream)
    }

    pub(super) fn verify_block(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        if tokens.is_empty() {
            return Err(BackendError::Other("block verify of an empty block".into()));
        }
        let max = block::block_capacity(self.acts.n_max);
        if tokens.len() > max {
            return Err(BackendError::Other(format!(
                "a block of {} tokens is longer than the {max} one verify pass takes",
                tokens.len()
            )));
        }
        check_eval_tokens(tokens, self.n_past, self.ctx, self.model.hp.n_vocab)?;
        self.hip.bind_thread().map_err(dev)?;
        self.verify.forget_rows();
        self.invalidate_logits();
        let n = tokens.len();
        decode::write_step(&mut self.acts, &mut self.step_host, &self.stream, self.n_past, tokens)?;
        let what = format!("the verify graph of {n} tokens");
        self.replay_or_launch(GraphSlot::Verify(n), &what, &|s, host_pos| {
            verify_launches(s, n, host_pos)
        })?;
        self.stream.synchronize().map_err(dev)?;
        self.profile.collect();
        self.capture_batch(self.n_past, n)?;
        self.verify.pending = Some(PendingBlock {
            p0: self.n_past,
            tokens: tokens.to_vec(),
        });
        self.verify.rows = n;
        self.n_past += n;
        Ok(())
    }

    pub(super) fn verified_logits(&self) -> &[f32] {
        let rows = self.verify.rows;
        if rows == 0 {
            return &[];
        }
        self.verify.host.get_or_init(|| {
            let mut v = vec![0.0f32; rows * self.model.hp.n_vocab];
            // As `logits()`: a failed copy reads as NaN, and the next eval reports the error.
            let copied = self
                .hip
                .bind_thread()
                .and_then(|_| self.acts.block_logits.copy_to_host(0, &mut v));
            if copied.is_err() {
                v.fill(f32::NAN);
            }
            v
        })
    }

    pub(super) fn commit_block(&mut self, keep: usize) -> Result<(), BackendError> {
        let Some(block) = self.verify.pending.take() else {
            return Err(BackendError::Other(
                "commit without a verified block (verify first)".into(),
            ));
        };
        let n = block.tokens.len();
        if keep > n {
            let e = format!("cannot keep {keep} tokens of a verified block of {n}");
            self.verify.pending = Some(block);
            return Err(BackendError::Other(e));
        }
        if keep == n {
            return Ok(());
        }
        self.hip.bind_thread().map_err(dev)?;
        self.invalidate_logits();
        // The walk reads the block's first position from the step parameters.
        decode::write_step(
            &mut self.acts,
            &mut self.step_host,
            &self.stream,
            block.p0,
            &block.tokens,
        )?;
        let what = format!("the commit graph keeping {keep} tokens");
        self.replay_or_launch(GraphSlot::Commit(keep), &what, &|s, _| commit_launches(s, keep))?;
        self.stream.synchronize().map_err(dev)?;
        self.profile.collect();
        self.n_past = block.p0 + keep;
        let len = self.n_past;
        self.with_capture(|c| c.truncate(len));
        Ok(())
    }
}
