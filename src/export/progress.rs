//! Progress of a long export or `inspect` on stderr (stdout is left as it
//! is). Nothing is shown for the first seconds; then on a terminal a spinner
//! with the calls read and rollouts done, and otherwise (a log file, CI) a
//! plain line every ten seconds, e.g. `export rl: 420,000 calls read, 9,000
//! rollouts done`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::cell::Cell;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Nothing is shown before this.
pub const HIDDEN_FOR: Duration = Duration::from_millis(2_500);
/// Plain lines (stderr not a terminal) this often.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Bar,
    Plain,
}

/// Counts of calls read and rollouts done, shown on stderr when slow.
pub struct Progress {
    label: String,
    mode: Mode,
    start: Instant,
    calls: Cell<u64>,
    rollouts: Cell<u64>,
    events: Cell<u64>,
    bar: std::cell::RefCell<Option<ProgressBar>>,
    last_line: Cell<Option<Instant>>,
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::with_capacity(d.len() + d.len() / 3);
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Progress {
    /// Progress labelled `label` (e.g. `export rl`): a spinner when stderr
    /// is a terminal, plain lines otherwise.
    pub fn new(label: &str) -> Progress {
        let mode = if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Plain
        };
        Progress::with_mode(label, mode)
    }

    /// Progress that never shows.
    pub fn hidden() -> Progress {
        Progress::with_mode("", Mode::Off)
    }

    fn with_mode(label: &str, mode: Mode) -> Progress {
        Progress {
            label: label.to_owned(),
            mode,
            start: Instant::now(),
            calls: Cell::new(0),
            rollouts: Cell::new(0),
            events: Cell::new(0),
            bar: std::cell::RefCell::new(None),
            last_line: Cell::new(None),
        }
    }

    /// One more call read.
    pub fn call(&self) {
        self.calls.set(self.calls.get() + 1);
        self.event();
    }

    /// One more rollout done.
    pub fn rollout(&self) {
        self.rollouts.set(self.rollouts.get() + 1);
        self.event();
    }

    fn event(&self) {
        let n = self.events.get() + 1;
        self.events.set(n);
        if n.is_multiple_of(256) {
            self.tick();
        }
    }

    /// The status line.
    pub fn line(&self) -> String {
        format!(
            "{}: {} calls read, {} rollouts done",
            self.label,
            thousands(self.calls.get()),
            thousands(self.rollouts.get())
        )
    }

    fn tick(&self) {
        if self.mode == Mode::Off || self.start.elapsed() < HIDDEN_FOR {
            return;
        }
        match self.mode {
            Mode::Off => {}
            Mode::Bar => {
                let mut bar = self.bar.borrow_mut();
                let b = bar.get_or_insert_with(|| {
                    let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                    if let Ok(style) =
                        ProgressStyle::with_template("{spinner} {msg} [{elapsed_precise}]")
                    {
                        b.set_style(style);
                    }
                    b.enable_steady_tick(Duration::from_millis(200));
                    b
                });
                b.set_message(self.line());
            }
            Mode::Plain => {
                let now = Instant::now();
                let due = match self.last_line.get() {
                    None => self.start.elapsed() >= PLAIN_EVERY,
                    Some(t) => now.duration_since(t) >= PLAIN_EVERY,
                };
                if due {
                    eprintln!("{}", self.line());
                    self.last_line.set(Some(now));
                }
            }
        }
    }

    /// Clear the spinner; after plain lines, print a last one.
    pub fn finish(&self) {
        if let Some(b) = self.bar.borrow_mut().take() {
            b.finish_and_clear();
        }
        if self.last_line.take().is_some() {
            eprintln!(
                "{} in {:.0}s",
                self.line(),
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.get_mut().take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(420_000), "420,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
        let p = Progress::with_mode("export rl", Mode::Plain);
        for _ in 0..1_000 {
            p.call();
        }
        p.rollout();
        // Quick: nothing was printed, so finishing prints nothing either.
        assert!(p.last_line.get().is_none());
        assert_eq!(p.line(), "export rl: 1,000 calls read, 1 rollouts done");
        p.finish();
    }
}
