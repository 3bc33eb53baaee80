//! The one pump: the loop that drains the engine's outputs, shared by every
//! driver (the server host, the simulator and its application models, the
//! VOPR, the testkit).
//!
//! A driver says what it does with each output by implementing [`Driver`];
//! [`pump`] takes the outputs in the one order below until nothing more
//! comes out. How a command runs (inline, batched, on a worker pool, on a
//! simulated device) is the driver's; the order and the loop live here.
//!
//! One pass takes, in order:
//! 1. every device command ([`Engine::poll_io`]), each to
//!    [`Driver::command`];
//! 2. [`Driver::commands_taken`]: the driver starts the commands it held
//!    back; if that completed any, the pass goes back to 1 (those
//!    completions may bring more commands) before any reply;
//! 3. every reply ([`Engine::poll_reply`]), each to [`Driver::reply`];
//! 4. every event ([`Engine::poll_event`]), each to [`Driver::event`];
//! 5. [`Driver::pass_done`]: the driver feeds the engine what is due once a
//!    pass is over (a timeout, completions it deferred).
//!
//! Passes repeat while one takes a command or a reply, or feeds the engine
//! in step 5. When [`pump`] returns, the engine holds no command and no
//! reply (asserted).

use crate::engine::{Engine, Event};
use crate::payload::Payload;
use crate::types::{IoCmd, Reply};

/// What a driver does with the engine's outputs (see the module docs). The
/// driver holds the engine ([`Driver::engine`]) with whatever its hooks use.
///
/// Contract:
/// - every command handed to [`Driver::command`] MUST get exactly one
///   completion ([`Engine::handle_completion`]), now or later (the engine's
///   own contract);
/// - [`Driver::commands_taken`] and [`Driver::pass_done`] MUST return `true`
///   when they fed the engine (called one of its `handle_*`), and MAY
///   return `true` otherwise;
/// - [`Driver::event`] MUST NOT feed the engine (events are not progress:
///   what it fed would stay undrained).
pub trait Driver<P: Payload> {
    /// The engine this driver drives.
    fn engine(&mut self) -> &mut Engine<P>;

    /// Run, queue or hold back one device command. It MAY be completed into
    /// the engine at once; the commands that brings are taken in the same
    /// step.
    fn command(&mut self, cmd: IoCmd<P>);

    /// The engine has no more commands for now: start the ones
    /// [`Driver::command`] held back. `true`: it completed some (see the
    /// trait's contract).
    fn commands_taken(&mut self) -> bool {
        false
    }

    /// A reply to a client request. It MAY feed the engine (e.g. issue the
    /// client's next request).
    fn reply(&mut self, reply: Reply<P>);

    /// An event; dropped unless the driver wants it.
    fn event(&mut self, _ev: Event) {}

    /// A pass is over: feed the engine what is due now (a timeout,
    /// completions deferred to here). `true`: it fed the engine.
    fn pass_done(&mut self) -> bool {
        false
    }
}

/// Drain the driver's engine through the driver until nothing more comes
/// out (see the module docs for the order). Returns whether anything came
/// out or was fed in.
pub fn pump<P: Payload, D: Driver<P> + ?Sized>(drv: &mut D) -> bool {
    let mut any = false;
    loop {
        let mut progress = take_commands(drv);
        while let Some(r) = drv.engine().poll_reply() {
            drv.reply(r);
            progress = true;
        }
        while let Some(ev) = drv.engine().poll_event() {
            drv.event(ev);
        }
        progress |= drv.pass_done();
        any |= progress;
        if !progress {
            break;
        }
    }
    assert!(
        !drv.engine().has_output(),
        "the pump left commands or replies in the engine: a driver fed it without saying so"
    );
    any
}

/// Steps 1 and 2 of a pass: every command, and the held-back ones started,
/// until starting those brings no more. Returns whether any came out.
fn take_commands<P: Payload, D: Driver<P> + ?Sized>(drv: &mut D) -> bool {
    let mut took = false;
    loop {
        while let Some(cmd) = drv.engine().poll_io() {
            drv.command(cmd);
            took = true;
        }
        if !drv.commands_taken() {
            return took;
        }
        took = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{IoOp, ReqId, ReqOp, Request, Tag};
    use crate::{Config, WritePolicyKind};
    use bytes::Bytes;

    /// Where a test driver completes its commands.
    #[derive(Clone, Copy, PartialEq)]
    enum When {
        Inline,
        Taken,
        PassDone,
    }

    /// Completes every command with success (zeros for reads), at `when`;
    /// logs what the pump called.
    struct Log {
        eng: Engine<Bytes>,
        when: When,
        held: Vec<IoCmd<Bytes>>,
        log: Vec<&'static str>,
        replies: Vec<ReqId>,
    }

    impl Log {
        fn new(when: When) -> Log {
            let cfg = Config::new(4096, 16, 64 * 4096, WritePolicyKind::WriteThrough);
            Log {
                eng: Engine::new(cfg).expect("valid config"),
                when,
                held: Vec::new(),
                log: Vec::new(),
                replies: Vec::new(),
            }
        }
        fn complete(&mut self, cmd: IoCmd<Bytes>) {
            let res = match cmd.op {
                IoOp::Read { len, .. } => Some(Bytes::from(vec![0; len as usize])),
                _ => None,
            };
            self.eng.handle_completion(1, cmd.id, Ok(res));
        }
        fn complete_held(&mut self) -> bool {
            let held = std::mem::take(&mut self.held);
            let fed = !held.is_empty();
            held.into_iter().for_each(|c| self.complete(c));
            fed
        }
        fn write(&mut self, id: ReqId) {
            let op = ReqOp::Write {
                offset: 0,
                data: Bytes::from(vec![7; 4096]),
                fua: false,
            };
            let tag = Tag::default();
            self.eng.handle_request(1, Request { id, op, tag });
        }
    }

    impl Driver<Bytes> for Log {
        fn engine(&mut self) -> &mut Engine<Bytes> {
            &mut self.eng
        }
        fn command(&mut self, cmd: IoCmd<Bytes>) {
            self.log.push("command");
            match self.when {
                When::Inline => self.complete(cmd),
                _ => self.held.push(cmd),
            }
        }
        fn commands_taken(&mut self) -> bool {
            self.log.push("taken");
            self.when == When::Taken && self.complete_held()
        }
        fn reply(&mut self, r: Reply<Bytes>) {
            self.log.push("reply");
            self.replies.push(r.id);
        }
        fn pass_done(&mut self) -> bool {
            self.log.push("pass");
            self.when == When::PassDone && self.complete_held()
        }
    }

    #[test]
    fn a_write_is_answered_in_one_pump_wherever_its_commands_complete() {
        for when in [When::Inline, When::Taken, When::PassDone] {
            let mut d = Log::new(when);
            d.write(1);
            assert!(pump(&mut d));
            assert_eq!(d.replies, vec![1]);
            assert!(d.held.is_empty());
            assert!(!pump(&mut d), "nothing more comes out");
        }
    }

    #[test]
    fn held_back_commands_complete_before_replies_are_taken() {
        let mut d = Log::new(When::Taken);
        d.write(1);
        pump(&mut d);
        let first_reply = d.log.iter().position(|&s| s == "reply").unwrap();
        let first_pass = d.log.iter().position(|&s| s == "pass").unwrap();
        assert!(first_reply < first_pass, "{:?}", d.log);
        assert_eq!(d.log.last(), Some(&"pass"), "a pass ends the pump");
    }

    #[test]
    fn completions_deferred_to_the_end_of_a_pass_start_another() {
        let mut d = Log::new(When::PassDone);
        d.write(1);
        pump(&mut d);
        let passes = d.log.iter().filter(|&&s| s == "pass").count();
        assert!(passes >= 2, "{:?}", d.log);
        let first_reply = d.log.iter().position(|&s| s == "reply").unwrap();
        let first_pass = d.log.iter().position(|&s| s == "pass").unwrap();
        assert!(first_pass < first_reply, "{:?}", d.log);
    }
}
