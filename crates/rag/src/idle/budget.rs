//! The idle budget (PerCache §4.3 adapts its population to system load): the share of wall
//! time idle units may take, from the CPU load and, where the platform reports one, the
//! battery. After a unit of `u` ms the engine thread rests `u · (1 − share) / share` ms
//! before the next one (interruptible: a request never waits for the rest).
//!
//! ```text
//!  inputs (LoadSource):  load1 = /proc/loadavg's first field, cores = available parallelism,
//!                        battery = /sys/class/power_supply/*/ with type "Battery": status, capacity
//!  share(load, cores, battery, own):
//!      others = max(0, load1 − own)            (own: the threads idle units themselves run)
//!      cpu    = clamp((cores − others) / cores, floor, 1)
//!      × 1                      on AC, charging or full (or no battery reported)
//!      × DISCHARGING_FACTOR     discharging
//!      = LOW_BATTERY_SHARE      discharging at or below LOW_BATTERY_PERCENT
//!  an input that is absent (no such file) adjusts nothing
//! ```
//! NOTE: the engine's own queue is not an input: the idle hook runs only while no request
//! waits or runs, so that queue is always empty when a budget is read.
//!
//! Invariant: [`share`] is a pure function, in `[LOW_BATTERY_SHARE.min(floor), 1]`,
//! non-increasing in the load and lower on battery than on AC for the same load
//! (`budget.rs` tests); with every input absent it is 1 (idle work as before).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Share while discharging (times the CPU share).
pub const DISCHARGING_FACTOR: f64 = 0.5;
/// At or below this charge, discharging, idle work drops to [`LOW_BATTERY_SHARE`].
pub const LOW_BATTERY_PERCENT: u8 = 20;
/// The share on a low battery.
pub const LOW_BATTERY_SHARE: f64 = 0.05;
/// The least share CPU load alone leaves (idle work slows down, it never stops for load).
pub const DEFAULT_FLOOR: f64 = 0.2;
/// How often the inputs are read again.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// A battery's state, as the platform reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Battery {
    /// `status` is "Discharging".
    pub discharging: bool,
    /// `capacity`, percent (`None`: not reported).
    pub capacity: Option<u8>,
}

/// One reading of the inputs; `None` where the platform reports nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadSample {
    /// The 1-minute load average.
    pub load1: Option<f64>,
    /// Cores available to this process.
    pub cores: Option<usize>,
    pub battery: Option<Battery>,
}

/// Where a [`LoadSample`] comes from (the system, or a test's values).
pub trait LoadSource: Send {
    /// Reads the inputs now.
    fn sample(&mut self) -> LoadSample;
}

/// The share of wall time idle units may take (see the module doc); `own` is the threads the
/// units run on (their own load), `floor` the least share load alone leaves.
pub fn share(s: &LoadSample, own: f64, floor: f64) -> f64 {
    let cpu = match (s.load1, s.cores) {
        (Some(load), Some(cores)) if cores > 0 && load.is_finite() => {
            let others = (load - own).max(0.0);
            ((cores as f64 - others) / cores as f64).clamp(floor, 1.0)
        }
        _ => 1.0,
    };
    match s.battery {
        Some(b) if b.discharging && b.capacity.is_some_and(|c| c <= LOW_BATTERY_PERCENT) => LOW_BATTERY_SHARE.min(cpu),
        Some(b) if b.discharging => cpu * DISCHARGING_FACTOR,
        _ => cpu,
    }
}

/// How long to rest after a unit of `unit_ms` at `share` (0 at share 1).
pub fn rest_after(unit_ms: f64, share: f64) -> Duration {
    let share = share.clamp(LOW_BATTERY_SHARE.min(DEFAULT_FLOOR), 1.0);
    Duration::from_secs_f64((unit_ms * (1.0 - share) / share).max(0.0) / 1e3)
}

/// The system's readings: `/proc/loadavg`, the available parallelism and
/// `/sys/class/power_supply` (roots configurable so a test can point them at files it wrote).
pub struct SystemLoad {
    loadavg: PathBuf,
    power_supply: PathBuf,
}

impl Default for SystemLoad {
    fn default() -> Self {
        SystemLoad::at(Path::new("/proc/loadavg"), Path::new("/sys/class/power_supply"))
    }
}

impl SystemLoad {
    /// Readings from `loadavg` (a `/proc/loadavg`-shaped file) and `power_supply` (a folder of
    /// supplies, each with `type`, `status`, `capacity`).
    pub fn at(loadavg: &Path, power_supply: &Path) -> SystemLoad {
        SystemLoad { loadavg: loadavg.to_path_buf(), power_supply: power_supply.to_path_buf() }
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

impl LoadSource for SystemLoad {
    fn sample(&mut self) -> LoadSample {
        let load1 = read_trim(&self.loadavg).and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
        let cores = std::thread::available_parallelism().ok().map(|n| n.get());
        let mut battery = None;
        if let Ok(dir) = std::fs::read_dir(&self.power_supply) {
            let mut supplies: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
            supplies.sort();
            for s in supplies {
                if read_trim(&s.join("type")).as_deref() != Some("Battery") {
                    continue;
                }
                let discharging = read_trim(&s.join("status")).is_some_and(|v| v.eq_ignore_ascii_case("discharging"));
                let capacity = read_trim(&s.join("capacity")).and_then(|v| v.parse::<u8>().ok());
                battery = Some(Battery { discharging, capacity });
                break;
            }
        }
        LoadSample { load1, cores, battery }
    }
}

/// Fixed readings (tests, and callers that measure load themselves).
pub struct FixedLoad(pub LoadSample);

impl LoadSource for FixedLoad {
    fn sample(&mut self) -> LoadSample {
        self.0
    }
}

/// The budget as the engine thread keeps it: the last reading (taken again every
/// [`SAMPLE_EVERY`]), the share, and until when idle work rests.
pub struct Throttle {
    source: Box<dyn LoadSource>,
    own: f64,
    floor: f64,
    sampled: Option<Instant>,
    sample: LoadSample,
    share: f64,
    rest_until: Option<Instant>,
}

impl Throttle {
    /// A throttle over `source`; idle units run on `own` threads.
    pub fn new(source: Box<dyn LoadSource>, own: f64) -> Throttle {
        Throttle { source, own, floor: DEFAULT_FLOOR, sampled: None, sample: LoadSample::default(), share: 1.0, rest_until: None }
    }

    /// The share now (reading the inputs again if the last reading is old); `Some(old)` as
    /// well when it moved by at least 0.1 since the last call that said so.
    pub fn refresh(&mut self) -> (f64, Option<f64>) {
        if self.sampled.is_none_or(|t| t.elapsed() >= SAMPLE_EVERY) {
            self.sample = self.source.sample();
            self.sampled = Some(Instant::now());
            let new = share(&self.sample, self.own, self.floor);
            let old = self.share;
            self.share = new;
            if (new - old).abs() >= 0.1 {
                return (new, Some(old));
            }
        }
        (self.share, None)
    }

    /// The last reading.
    pub fn sample(&self) -> LoadSample {
        self.sample
    }

    /// Records a unit of `unit_ms`: idle work rests for [`rest_after`] it.
    pub fn ran(&mut self, unit_ms: f64) -> Duration {
        let rest = rest_after(unit_ms, self.share);
        self.rest_until = (!rest.is_zero()).then(|| Instant::now() + rest);
        rest
    }

    /// How long idle work still rests (zero: a unit may run).
    pub fn resting(&self) -> Duration {
        self.rest_until.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(load1: Option<f64>, cores: Option<usize>, battery: Option<Battery>) -> LoadSample {
        LoadSample { load1, cores, battery }
    }
    const AC: Option<Battery> = Some(Battery { discharging: false, capacity: Some(80) });
    const DIS: Option<Battery> = Some(Battery { discharging: true, capacity: Some(80) });
    const LOW: Option<Battery> = Some(Battery { discharging: true, capacity: Some(15) });

    #[test]
    fn share_follows_load_and_battery() {
        // Nothing reported: no adjustment.
        assert_eq!(share(&LoadSample::default(), 2.0, DEFAULT_FLOOR), 1.0);
        assert_eq!(share(&s(Some(6.0), None, None), 2.0, DEFAULT_FLOOR), 1.0, "no core count: no CPU term");
        // Our own threads are not load.
        assert_eq!(share(&s(Some(2.0), Some(4), None), 2.0, DEFAULT_FLOOR), 1.0);
        assert_eq!(share(&s(Some(3.0), Some(4), None), 2.0, DEFAULT_FLOOR), 0.75);
        assert_eq!(share(&s(Some(4.0), Some(4), None), 2.0, DEFAULT_FLOOR), 0.5);
        assert_eq!(share(&s(Some(40.0), Some(4), None), 2.0, DEFAULT_FLOOR), DEFAULT_FLOOR, "load never stops it");
        // Non-increasing in the load.
        let mut last = 1.0;
        for l in 0..40 {
            let v = share(&s(Some(l as f64 * 0.5), Some(8), None), 1.0, DEFAULT_FLOOR);
            assert!(v <= last && (DEFAULT_FLOOR..=1.0).contains(&v));
            last = v;
        }
        // Battery: AC changes nothing, discharging halves, low and discharging nearly stops.
        assert_eq!(share(&s(Some(3.0), Some(4), AC), 2.0, DEFAULT_FLOOR), 0.75);
        assert_eq!(share(&s(Some(3.0), Some(4), DIS), 2.0, DEFAULT_FLOOR), 0.375);
        assert_eq!(share(&s(None, None, DIS), 2.0, DEFAULT_FLOOR), DISCHARGING_FACTOR);
        assert_eq!(share(&s(Some(0.0), Some(4), LOW), 2.0, DEFAULT_FLOOR), LOW_BATTERY_SHARE);
        let charging_low = Some(Battery { discharging: false, capacity: Some(5) });
        assert_eq!(share(&s(Some(0.0), Some(4), charging_low), 2.0, DEFAULT_FLOOR), 1.0, "low but charging");
        let unknown = Some(Battery { discharging: true, capacity: None });
        assert_eq!(share(&s(None, None, unknown), 2.0, DEFAULT_FLOOR), DISCHARGING_FACTOR);
    }

    #[test]
    fn rest_keeps_units_to_their_share() {
        assert_eq!(rest_after(100.0, 1.0), Duration::ZERO);
        assert_eq!(rest_after(100.0, 0.5), Duration::from_millis(100));
        assert_eq!(rest_after(100.0, 0.2), Duration::from_millis(400));
        let mut t = Throttle::new(Box::new(FixedLoad(s(Some(4.0), Some(4), None))), 2.0);
        assert_eq!(t.refresh(), (0.5, Some(1.0)), "the first reading that lowers the share is reported");
        assert_eq!(t.refresh(), (0.5, None), "read again only after SAMPLE_EVERY");
        assert_eq!(t.resting(), Duration::ZERO);
        assert_eq!(t.ran(50.0), Duration::from_millis(50));
        assert!(t.resting() > Duration::ZERO && t.resting() <= Duration::from_millis(50));
    }

    #[test]
    fn system_readings_from_files_and_absent_files() {
        let tmp = tempfile::tempdir().unwrap();
        let load = tmp.path().join("loadavg");
        std::fs::write(&load, "3.25 2.00 1.00 2/345 6789\n").unwrap();
        let ps = tmp.path().join("power_supply");
        for (name, ty, status, cap) in [("AC", "Mains", "", ""), ("BAT0", "Battery", "Discharging\n", "42\n")] {
            let d = ps.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("type"), format!("{ty}\n")).unwrap();
            if !status.is_empty() {
                std::fs::write(d.join("status"), status).unwrap();
                std::fs::write(d.join("capacity"), cap).unwrap();
            }
        }
        let r = SystemLoad::at(&load, &ps).sample();
        assert_eq!(r.load1, Some(3.25));
        assert_eq!(r.battery, Some(Battery { discharging: true, capacity: Some(42) }));
        let none = SystemLoad::at(&tmp.path().join("no-loadavg"), &tmp.path().join("no-ps")).sample();
        assert_eq!((none.load1, none.battery), (None, None));
        assert_eq!(share(&none, 2.0, DEFAULT_FLOOR), 1.0);
    }
}
