//! Device statistics.

use serde::{Deserialize, Serialize};

use super::{DevOpKind, Nanos};

/// Number of buckets of the queue-depth histogram: bucket `d` counts time at
/// depth `d`, the last bucket counts time at depth `>= QD_BUCKETS - 1`.
pub const QD_BUCKETS: usize = 65;

/// Per-command-kind counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KindStats {
    /// Completed commands.
    pub ops: u64,
    /// Bytes of completed commands (0 for FLUSH).
    pub bytes: u64,
    /// Sum over completed commands of (completion − start of service), where
    /// service starts when the command leaves the device queue.
    pub service_ns: u128,
    /// Sum over completed commands of (completion − submission).
    pub response_ns: u128,
    /// Largest single response time.
    pub max_response_ns: Nanos,
}

impl KindStats {
    /// Mean response time in ns (0 when no command completed).
    pub fn mean_response_ns(&self) -> f64 {
        crate::metrics::per(self.response_ns as f64, self.ops)
    }
    /// Mean service time in ns (0 when no command completed).
    pub fn mean_service_ns(&self) -> f64 {
        crate::metrics::per(self.service_ns as f64, self.ops)
    }
}

/// Statistics of a device model.
///
/// "Outstanding" commands are submitted but not yet completed (queued or in
/// service). Time integrals run from the first submission to the last event
/// the model processed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// READ counters.
    pub read: KindStats,
    /// WRITE counters.
    pub write: KindStats,
    /// FLUSH counters.
    pub flush: KindStats,
    /// TRIM counters.
    pub trim: KindStats,
    /// Commands submitted (completed or not).
    pub submitted: u64,
    /// Time covered by the integrals below.
    pub elapsed_ns: Nanos,
    /// Time during which at least one command was outstanding.
    pub busy_ns: Nanos,
    /// Time during which at least one internal server (disk arm, flash unit,
    /// backend) was working, including background work such as destaging.
    pub media_busy_ns: Nanos,
    /// Time-weighted histogram of the number of outstanding commands, in ns
    /// per depth (see [`QD_BUCKETS`]).
    pub qd_time_ns: Vec<Nanos>,
    /// Time-weighted mean number of outstanding commands.
    pub mean_queue_depth: f64,
    /// Largest number of outstanding commands seen.
    pub max_queue_depth: u64,
    /// Background media operations (write-cache destages) completed.
    pub background_ops: u64,
    /// Bytes written by background media operations.
    pub background_bytes: u64,
}

impl DeviceStats {
    /// Counters for one kind.
    pub fn kind(&self, kind: DevOpKind) -> &KindStats {
        match kind {
            DevOpKind::Read => &self.read,
            DevOpKind::Write => &self.write,
            DevOpKind::Flush => &self.flush,
            DevOpKind::Trim => &self.trim,
        }
    }
    /// Completed commands of all kinds.
    pub fn completed(&self) -> u64 {
        self.read.ops + self.write.ops + self.flush.ops + self.trim.ops
    }
}

/// Incremental recorder used by the models.
#[derive(Clone, Debug)]
pub(crate) struct StatsRecorder {
    kinds: [KindStats; 4],
    submitted: u64,
    started: Option<Nanos>,
    last: Nanos,
    depth: u64,
    max_depth: u64,
    depth_integral: u128,
    qd_time: Vec<Nanos>,
    busy: Nanos,
    servers_busy: usize,
    media_busy: Nanos,
    background_ops: u64,
    background_bytes: u64,
}

impl Default for StatsRecorder {
    fn default() -> Self {
        StatsRecorder {
            kinds: Default::default(),
            submitted: 0,
            started: None,
            last: 0,
            depth: 0,
            max_depth: 0,
            depth_integral: 0,
            qd_time: vec![0; QD_BUCKETS],
            busy: 0,
            servers_busy: 0,
            media_busy: 0,
            background_ops: 0,
            background_bytes: 0,
        }
    }
}

impl StatsRecorder {
    /// Advance the time integrals to `t` (caller guarantees `t` is not before
    /// the previous call's `t`).
    pub fn tick(&mut self, t: Nanos) {
        let Some(_) = self.started else {
            self.last = t;
            return;
        };
        assert!(
            t >= self.last,
            "stats time went backwards: {} < {}",
            t,
            self.last
        );
        let dt = t - self.last;
        if dt > 0 {
            let b = (self.depth as usize).min(QD_BUCKETS - 1);
            self.qd_time[b] += dt;
            self.depth_integral += self.depth as u128 * dt as u128;
            if self.depth > 0 {
                self.busy += dt;
            }
            if self.servers_busy > 0 {
                self.media_busy += dt;
            }
        }
        self.last = t;
    }

    pub fn on_submit(&mut self, t: Nanos) {
        if self.started.is_none() {
            self.started = Some(t);
            self.last = t;
        }
        self.tick(t);
        self.submitted += 1;
        self.depth += 1;
        self.max_depth = self.max_depth.max(self.depth);
    }

    pub fn on_complete(
        &mut self,
        t: Nanos,
        kind: DevOpKind,
        bytes: u64,
        submitted: Nanos,
        started: Nanos,
    ) {
        self.tick(t);
        assert!(self.depth > 0, "completion without outstanding command");
        assert!(
            submitted <= started && started <= t,
            "bad op timeline {submitted} {started} {t}"
        );
        self.depth -= 1;
        let k = &mut self.kinds[kind.index()];
        k.ops += 1;
        k.bytes += if kind == DevOpKind::Flush { 0 } else { bytes };
        k.service_ns += (t - started) as u128;
        k.response_ns += (t - submitted) as u128;
        k.max_response_ns = k.max_response_ns.max(t - submitted);
    }

    pub fn on_server(&mut self, t: Nanos, busy: bool) {
        self.tick(t);
        if busy {
            self.servers_busy += 1;
        } else {
            assert!(self.servers_busy > 0);
            self.servers_busy -= 1;
        }
    }

    pub fn on_background(&mut self, bytes: u64) {
        self.background_ops += 1;
        self.background_bytes += bytes;
    }

    pub fn snapshot(&self) -> DeviceStats {
        let elapsed = self.started.map_or(0, |s| self.last - s);
        let [read, write, flush, trim] = self.kinds.clone();
        DeviceStats {
            read,
            write,
            flush,
            trim,
            submitted: self.submitted,
            elapsed_ns: elapsed,
            busy_ns: self.busy,
            media_busy_ns: self.media_busy,
            qd_time_ns: self.qd_time.clone(),
            mean_queue_depth: if elapsed == 0 {
                0.0
            } else {
                self.depth_integral as f64 / elapsed as f64
            },
            max_queue_depth: self.max_depth,
            background_ops: self.background_ops,
            background_bytes: self.background_bytes,
        }
    }
}
