//! The selection-margin probe of `selftest --forward`: how close the last token came to a different
//! expert or indexer selection. Off in the product (`HipBackend` holds none); with it, the router and
//! indexer scores are read back after their launches (one synchronization each), so decode steps use
//! direct launches.

use std::cell::Cell;

/// Smallest gap of the last evaluated token between the K-th and (K+1)-th biased router score over
/// the score-routed layers, and between the top_k-th and next indexer score (relative to the
/// largest) over the selecting layers: where these are ~0, float noise may flip a selection.
#[derive(Debug)]
pub(super) struct SelectionProbe {
    margins: Cell<(f32, f32)>,
}

impl Default for SelectionProbe {
    fn default() -> SelectionProbe {
        SelectionProbe {
            margins: Cell::new((f32::INFINITY, f32::INFINITY)),
        }
    }
}

impl SelectionProbe {
    /// Forget the last token's margins (a new batch starts).
    pub(super) fn reset(&self) {
        self.margins.set((f32::INFINITY, f32::INFINITY));
    }

    /// (router, indexer) margins of the last token.
    pub(super) fn margins(&self) -> (f32, f32) {
        self.margins.get()
    }

    /// Keep the gap between the `k`-th and next largest of `scores` (router when `router`, else
    /// indexer), relative to the largest when `relative`.
    pub(super) fn note(&self, scores: &mut [f32], k: usize, relative: bool, router: bool) {
        if scores.len() <= k {
            return;
        }
        scores.sort_by(|a, b| b.total_cmp(a));
        let mut m = scores[k - 1] - scores[k];
        if relative {
            m /= scores[0].abs().max(1e-30);
        }
        let (r, i) = self.margins.get();
        self.margins.set(if router { (r.min(m), i) } else { (r, i.min(m)) });
    }
}
