//! Ordered device work: `Stream` (with capture into a graph), `Event` (waits and timing), and the
//! captured `Graph` / instantiated `GraphExec` a decode step replays.

use super::super::ffi;
use super::context::HipContext;
use super::{HipResult, check};
use std::ffi::c_int;

/// An ordered queue of device work.
pub struct Stream {
    pub(super) ctx: HipContext,
    pub(super) raw: ffi::RawStream,
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

/// hipStreamCaptureMode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum CaptureMode {
    Global = 0,
    ThreadLocal = 1,
    Relaxed = 2,
}

impl Stream {
    pub fn raw(&self) -> ffi::RawStream {
        self.raw
    }

    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: live stream.
        check("hipStreamSynchronize", unsafe {
            (self.ctx.api().hipStreamSynchronize)(self.raw)
        })
    }

    /// Start recording this stream's work into a graph instead of running it.
    pub fn begin_capture(&self, mode: CaptureMode) -> HipResult<()> {
        // SAFETY: live stream.
        check("hipStreamBeginCapture", unsafe {
            (self.ctx.api().hipStreamBeginCapture)(self.raw, mode as c_int)
        })
    }

    /// Stop recording and return the captured graph.
    pub fn end_capture(&self) -> HipResult<Graph> {
        let mut raw: ffi::RawGraph = std::ptr::null_mut();
        // SAFETY: live stream, valid out-pointer.
        check("hipStreamEndCapture", unsafe {
            (self.ctx.api().hipStreamEndCapture)(self.raw, &mut raw)
        })?;
        Ok(Graph {
            ctx: self.ctx.clone(),
            raw,
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: live stream destroyed once.
        let _ = unsafe { (self.ctx.api().hipStreamDestroy)(self.raw) };
    }
}

/// A marker in a stream: for waiting and timing.
pub struct Event {
    pub(super) ctx: HipContext,
    pub(super) raw: ffi::RawEvent,
}

// SAFETY: HIP events may be used from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    pub fn record(&self, stream: &Stream) -> HipResult<()> {
        // SAFETY: live event and stream.
        check("hipEventRecord", unsafe {
            (self.ctx.api().hipEventRecord)(self.raw, stream.raw)
        })
    }

    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: live event.
        check("hipEventSynchronize", unsafe {
            (self.ctx.api().hipEventSynchronize)(self.raw)
        })
    }

    /// Milliseconds between `start` and `self` (both recorded, both timing events).
    pub fn elapsed_ms_since(&self, start: &Event) -> HipResult<f32> {
        let mut ms = 0f32;
        // SAFETY: live events, valid out-pointer.
        check("hipEventElapsedTime", unsafe {
            (self.ctx.api().hipEventElapsedTime)(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: live event destroyed once.
        let _ = unsafe { (self.ctx.api().hipEventDestroy)(self.raw) };
    }
}

/// A captured graph (a template; instantiate it to run it).
pub struct Graph {
    pub(super) ctx: HipContext,
    pub(super) raw: ffi::RawGraph,
}

// SAFETY: graph handles may be used from any thread.
unsafe impl Send for Graph {}

impl Graph {
    pub fn instantiate(&self) -> HipResult<GraphExec> {
        let mut raw: ffi::RawGraphExec = std::ptr::null_mut();
        // SAFETY: live graph; null error node and log are allowed by the API.
        check("hipGraphInstantiate", unsafe {
            (self.ctx.api().hipGraphInstantiate)(&mut raw, self.raw, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        })?;
        Ok(GraphExec {
            ctx: self.ctx.clone(),
            raw,
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: live graph destroyed once.
        let _ = unsafe { (self.ctx.api().hipGraphDestroy)(self.raw) };
    }
}

/// An instantiated graph: replay it with `launch`.
pub struct GraphExec {
    pub(super) ctx: HipContext,
    pub(super) raw: ffi::RawGraphExec,
}

// SAFETY: executable graphs may be launched from any thread.
unsafe impl Send for GraphExec {}
unsafe impl Sync for GraphExec {}

impl GraphExec {
    pub fn launch(&self, stream: &Stream) -> HipResult<()> {
        // SAFETY: live executable graph and stream.
        check("hipGraphLaunch", unsafe {
            (self.ctx.api().hipGraphLaunch)(self.raw, stream.raw)
        })
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: live executable graph destroyed once.
        let _ = unsafe { (self.ctx.api().hipGraphExecDestroy)(self.raw) };
    }
}
