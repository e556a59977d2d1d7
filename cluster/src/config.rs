//! Cluster settings, with Flink's defaults where Flink has one.

use std::time::Duration;

/// What a job does after a failure (Flink's restart strategies).
#[derive(Debug, Clone, PartialEq)]
pub enum RestartStrategy {
    /// `attempts` restarts in all, `delay` apart; then the job stays failed.
    FixedDelay { attempts: u32, delay: Duration },
    /// Restarts for ever, the delay growing by `multiplier` from `initial`
    /// up to `max`; it returns to `initial` once the job has run for
    /// `reset_after` without failing.
    ExponentialDelay {
        initial: Duration,
        max: Duration,
        multiplier: f64,
        reset_after: Duration,
    },
}

impl RestartStrategy {
    /// The delay before restart number `restarts` (1-based), or `None` to
    /// give up.
    pub fn delay(&self, restarts: u32) -> Option<Duration> {
        match self {
            RestartStrategy::FixedDelay { attempts, delay } => {
                (restarts <= *attempts).then_some(*delay)
            }
            RestartStrategy::ExponentialDelay {
                initial,
                max,
                multiplier,
                ..
            } => {
                let factor = multiplier
                    .max(1.0)
                    .powi(restarts.saturating_sub(1).min(64) as i32);
                Some(initial.mul_f64(factor).min(*max))
            }
        }
    }

    /// After how long without failure the restart count starts over.
    pub fn reset_after(&self) -> Option<Duration> {
        match self {
            RestartStrategy::FixedDelay { .. } => None,
            RestartStrategy::ExponentialDelay { reset_after, .. } => Some(*reset_after),
        }
    }

    /// Parses `fixed-delay` or `exponential-delay` with the given numbers.
    pub fn parse(
        name: &str,
        attempts: u32,
        delay: Duration,
        max_delay: Duration,
    ) -> Result<Self, String> {
        match name {
            "fixed-delay" => Ok(RestartStrategy::FixedDelay { attempts, delay }),
            "exponential-delay" => Ok(RestartStrategy::ExponentialDelay {
                initial: delay,
                max: max_delay.max(delay),
                multiplier: 2.0,
                reset_after: max_delay.max(delay) * 2,
            }),
            other => Err(format!(
                "unknown restart strategy {other:?}: use fixed-delay or exponential-delay"
            )),
        }
    }
}

/// Settings of the JobManager and TaskManagers.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Slots of each TaskManager (`taskmanager.numberOfTaskSlots`).
    pub slots_per_task_manager: usize,
    /// Time between checkpoints (`execution.checkpointing.interval`); 1 s.
    pub checkpoint_interval: Duration,
    /// A checkpoint not complete after this is aborted; 10 min as in Flink.
    pub checkpoint_timeout: Duration,
    /// Least time from the end of one checkpoint to the start of the next
    /// (`execution.checkpointing.min-pause`); 0.
    pub min_pause_between_checkpoints: Duration,
    /// Failed or expired checkpoints in a row a job tolerates; one more
    /// fails it over (`execution.checkpointing.tolerable-failed-checkpoints`).
    pub tolerable_checkpoint_failures: u32,
    /// Completed checkpoints kept per job (`state.checkpoints.num-retained`,
    /// 1 in Flink; 3 here, so a damaged one has two to fall back to).
    pub checkpoints_retained: usize,
    /// Where completed checkpoints are kept (`state.checkpoints.dir`); every
    /// TaskManager must reach it. `None`: `<data-dir>/checkpoints`.
    pub checkpoint_dir: Option<String>,
    /// TaskManager heartbeat interval (`heartbeat.interval`); 10 s.
    pub heartbeat_interval: Duration,
    /// A TaskManager silent this long is lost (`heartbeat.timeout`); 50 s.
    pub heartbeat_timeout: Duration,
    /// A TaskManager that cannot register within this time gives up
    /// (`taskmanager.registration.timeout`); 5 min.
    pub registration_timeout: Duration,
    /// What a job does after a failure; fixed delay, 3 attempts 1 s apart.
    pub restart_strategy: RestartStrategy,
    /// A job that cannot get its slots within this time fails (Flink's
    /// `slot.request.timeout`, 5 min there; short here, where the
    /// TaskManagers of a playground are all there from the start).
    pub slot_request_timeout: Duration,
    /// Memory of a TaskManager for state (`taskmanager.memory.managed.size`);
    /// each slot owns an equal share, half for its RocksDB block cache and
    /// write buffers, half for its operators' state caches
    /// (`storage::SlotMemory`).
    pub managed_memory_bytes: usize,
}

/// Managed memory when none is configured: an eighth of the machine's
/// memory (`/proc/meminfo`), at least 128 MiB. Flink gives 40 % of a
/// TaskManager's configured memory; a Weir process also serves pgwire,
/// tables and queries, so it takes less of the machine.
pub fn default_managed_memory() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map(|kb| kb << 10)
        .unwrap_or(0);
    (total / 8).max(128 << 20)
}

impl ClusterConfig {
    /// The share of managed memory each slot owns.
    pub fn managed_memory_per_slot(&self) -> usize {
        self.managed_memory_bytes / self.slots_per_task_manager.max(1)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            slots_per_task_manager: 4,
            checkpoint_interval: Duration::from_secs(1),
            checkpoint_timeout: Duration::from_secs(600),
            min_pause_between_checkpoints: Duration::ZERO,
            tolerable_checkpoint_failures: 3,
            checkpoints_retained: 3,
            checkpoint_dir: None,
            heartbeat_interval: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(50),
            registration_timeout: Duration::from_secs(300),
            restart_strategy: RestartStrategy::FixedDelay {
                attempts: 3,
                delay: Duration::from_secs(1),
            },
            slot_request_timeout: Duration::from_secs(10),
            managed_memory_bytes: 128 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_delays() {
        let fixed = RestartStrategy::FixedDelay {
            attempts: 2,
            delay: Duration::from_secs(1),
        };
        assert_eq!(fixed.delay(2), Some(Duration::from_secs(1)));
        assert_eq!(fixed.delay(3), None);
        let exp = RestartStrategy::parse(
            "exponential-delay",
            0,
            Duration::from_millis(100),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(exp.delay(1), Some(Duration::from_millis(100)));
        assert_eq!(exp.delay(3), Some(Duration::from_millis(400)));
        assert_eq!(exp.delay(30), Some(Duration::from_secs(1)));
    }
}
