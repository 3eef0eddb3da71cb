//! Ordered device work: `Stream` (with capture into a graph), `Event` (waits and timing), and the
//! captured `Graph` / instantiated `GraphExec` a decode step replays.

use super::super::ffi;
use super::context::HipContext;
use super::{HipResult, check};
use std::ffi::c_int;

/// A HIP handle owned by a struct with the context it belongs to, released by `$destroy` when the
/// struct is dropped (the one place each kind of handle is released).
macro_rules! owned_handle {
    ($(#[$doc:meta])* $name:ident, $raw:ty, $destroy:ident) => {
        $(#[$doc])*
        pub struct $name {
            pub(super) ctx: HipContext,
            pub(super) raw: $raw,
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the handle is live (made by this context) and released only here.
                let _ = unsafe { (self.ctx.api().$destroy)(self.raw) };
            }
        }
    };
}

owned_handle!(
    /// An ordered queue of device work.
    Stream,
    ffi::RawStream,
    hipStreamDestroy
);
owned_handle!(
    /// A marker in a stream: for waiting and timing.
    Event,
    ffi::RawEvent,
    hipEventDestroy
);
owned_handle!(
    /// A captured graph (a template; instantiate it to run it).
    Graph,
    ffi::RawGraph,
    hipGraphDestroy
);
owned_handle!(
    /// An instantiated graph: replay it with `launch`.
    GraphExec,
    ffi::RawGraphExec,
    hipGraphExecDestroy
);

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

    /// Make this stream's later work wait for the work `event` marks (`Event::record`). While
    /// another stream captures, waiting for an event recorded there brings this stream into the
    /// same capture: its work becomes a parallel branch of that graph, which must be joined back
    /// (an event recorded here, waited for there) before the capture ends.
    pub fn wait_event(&self, event: &Event) -> HipResult<()> {
        // SAFETY: live stream and event; flags must be 0.
        check("hipStreamWaitEvent", unsafe {
            (self.ctx.api().hipStreamWaitEvent)(self.raw, event.raw, 0)
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
