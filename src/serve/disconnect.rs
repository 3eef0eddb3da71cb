//! Noticing a client that hangs up while its request is served. Once the request is read, a client
//! sends nothing more (every response closes the connection), so a watcher thread blocks on a read
//! of the socket: end of stream or an error there means the client closed or reset it. The request
//! thread checks the flag while it waits for the engine and cancels the generation, so a hang-up
//! stops the engine within one decode step whether or not anything is being written.
//!
//! Owns the watcher thread and its flag.

use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

pub struct HangupWatch {
    gone: Arc<AtomicBool>,
    /// Our handle on the socket, to wake the watcher's read when the exchange is over.
    socket: Option<TcpStream>,
    thread: Option<JoinHandle<()>>,
}

impl HangupWatch {
    /// Watch `stream` (a clone of it is read). Without a clone (out of descriptors) nothing is
    /// watched and a hang-up is only noticed when a write fails.
    pub fn start(stream: &TcpStream) -> HangupWatch {
        let gone = Arc::new(AtomicBool::new(false));
        let (Ok(mut reader), Ok(socket)) = (stream.try_clone(), stream.try_clone()) else {
            return HangupWatch {
                gone,
                socket: None,
                thread: None,
            };
        };
        let _ = reader.set_read_timeout(None);
        let flag = gone.clone();
        let thread = std::thread::Builder::new()
            .name("ds4-serve-hangup".into())
            .spawn(move || {
                let mut buf = [0u8; 512];
                loop {
                    match reader.read(&mut buf) {
                        // Bytes after the request (a pipelined request) are not ours to serve.
                        Ok(n) if n > 0 => continue,
                        _ => break,
                    }
                }
                flag.store(true, Ordering::Release);
            })
            .ok();
        HangupWatch {
            gone,
            socket: Some(socket),
            thread,
        }
    }

    /// Whether the client has closed or reset the connection.
    pub fn gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Stop watching (the response is complete): wakes the watcher's read and joins it.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(s) = self.socket.take() {
            let _ = s.shutdown(Shutdown::Read);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HangupWatch {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    #[test]
    fn a_closed_client_is_noticed_and_an_open_one_is_not() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let w = HangupWatch::start(&s);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!w.gone());
        drop(client);
        let t = Instant::now();
        while !w.gone() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(w.gone(), "hang-up not noticed");
        w.stop();
    }
}
