//! The simulator's side of the engine's pump ([`nvwc_core::pump`]), and the
//! per-step device pops that feed it completions.
//!
//! Both skip calls that cannot change anything, so that an event step costs
//! only what it does:
//! * a device is popped only when its [`DeviceModel::next_completion`] is
//!   due (the trait's contract: nothing completes and no internal event
//!   happens before it);
//! * a pump runs only when the engine holds a command or a reply, an
//!   immediate completion waits, or a queued backing command could start:
//!   otherwise a pass would take nothing, feed nothing and drain only
//!   events, which the simulator drops (they wait in the engine until the
//!   next pump that runs).

use nvwc_core::pump::{self, Driver};
use nvwc_core::{Engine, IoCmd, Phantom, Reply};
use nvwc_trace::{TraceError, TraceRecord};

use super::Simulator;
use crate::device::{DeviceModel, Nanos};

impl<I: Iterator<Item = Result<TraceRecord, TraceError>>> Simulator<I> {
    /// Drains every engine output at the current instant (the one pump,
    /// [`pump::pump`], through [`Pumped`]), when it has anything to do.
    pub(super) fn pump(&mut self) {
        debug_assert!(self.immediate.is_empty(), "a pump left completions behind");
        if self.pump_has_work() {
            pump::pump(&mut Pumped(self));
        }
        self.dirty_peak = self.dirty_peak.max(self.engine.dirty_versions());
    }

    /// Whether a pump could take or feed anything (module docs).
    fn pump_has_work(&self) -> bool {
        self.engine.has_output()
            || !self.immediate.is_empty()
            || (!self.bqueue.is_empty() && self.backing_outstanding < self.cfg.backing_qd.max(1))
    }

    /// Hands the engine every completion of the cache (`backing == false`)
    /// or backing device due by `t`, if any is due.
    pub(super) fn pop_device(&mut self, t: Nanos, backing: bool) {
        let dev: &mut dyn DeviceModel = if backing {
            &mut *self.backing
        } else {
            &mut *self.cache
        };
        if dev.next_completion().is_none_or(|n| n > t) {
            return;
        }
        let mut buf = std::mem::take(&mut self.done_buf);
        buf.clear();
        dev.pop_completions(t, &mut buf);
        for &id in &buf {
            self.dev_done(id, backing);
        }
        self.done_buf = buf;
    }
}

/// The simulator as the engine's pump sees it: commands go to the device
/// models (those that cost nothing complete when the pass is over), the
/// queued backing commands start once the engine has no more, and replies
/// end their requests (in closed loop, issuing the client's next one).
struct Pumped<'a, I: Iterator<Item = Result<TraceRecord, TraceError>>>(&'a mut Simulator<I>);

impl<I: Iterator<Item = Result<TraceRecord, TraceError>>> Driver<Phantom> for Pumped<'_, I> {
    fn engine(&mut self) -> &mut Engine<Phantom> {
        &mut self.0.engine
    }
    fn command(&mut self, cmd: IoCmd<Phantom>) {
        self.0.submit(cmd);
    }
    fn commands_taken(&mut self) -> bool {
        self.0.dispatch_backing();
        false
    }
    fn reply(&mut self, r: Reply<Phantom>) {
        self.0.on_reply(r.id, r.result.is_ok());
    }
    fn pass_done(&mut self) -> bool {
        let s = &mut *self.0;
        let fed = !s.immediate.is_empty();
        while let Some(io) = s.immediate.pop_front() {
            s.engine.handle_completion(s.now, io, Ok(None));
        }
        fed
    }
}
